"""The nn.Module hooks: one NVTX range per module forward, one marker per module backward.

Imported only once torch is (the package's __init__ imports this lazily).

Forward: global forward pre-hooks push a range named by the module's path ("model.layers.3.mlp"),
global forward hooks pop it. Names come from the first tree a module is seen in: when a module with
no name runs, its whole tree is named from named_modules() (the root by its class name,
"LlamaForCausalLM"; children by their dotted path). A per-thread stack of the modules we pushed keeps
pushes and pops balanced even when a forward raises (on torch without `always_call`).

Backward: when a module's forward returns tensors that require grad, a pre-hook on their grad_fn
pushes and pops "<path>.backward" when the autograd engine reaches that node: the moment the
module's backward begins. Nothing is added to the graph, so results cannot change and in-place ops
on the output keep working (unlike full backward hooks). Several modules returning the same node (a
wrapper returning its last child's output) fire outermost first, so the markers come in the reverse
order of forward completion. Each forward call's marker fires once, at the first of its output nodes
the engine reaches.

Every hook body is wrapped: an exception is reported once on stderr and never reaches the job.
"""

import dataclasses
import sys
import threading
import weakref

import torch

from . import _log, _mode

# Output containers are searched this far for tensors that need a backward marker.
_MAX_OUTPUT_TENSORS = 64
_MAX_OUTPUT_OBJECTS = 1024


def _real_push(name):
    torch.cuda.nvtx.range_push(name)


def _real_pop():
    torch.cuda.nvtx.range_pop()


def _is_compiling():
    try:
        compiler = getattr(torch, "compiler", None)
        if compiler is not None and hasattr(compiler, "is_compiling"):
            return compiler.is_compiling()
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None and hasattr(dynamo, "is_compiling"):
            return dynamo.is_compiling()
    except Exception:
        pass
    return False


def find_grad_tensors(output, limit=_MAX_OUTPUT_TENSORS):
    """Tensors with a grad_fn inside `output`: a tensor, tuples/lists/dicts (ModelOutput is an
    OrderedDict) and dataclasses, searched depth-first in order, at most `limit` of them."""
    found = []
    pending = [output]
    visited = 0
    while pending and len(found) < limit and visited < _MAX_OUTPUT_OBJECTS:
        item = pending.pop()
        visited += 1
        if isinstance(item, torch.Tensor):
            if item.requires_grad and item.grad_fn is not None:
                found.append(item)
        elif isinstance(item, (tuple, list)):
            pending.extend(reversed(item))
        elif isinstance(item, dict):
            pending.extend(reversed(list(item.values())))
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            pending.extend(reversed([getattr(item, f.name, None) for f in dataclasses.fields(item)]))
    return found


class _Marker:
    """One module forward call's "<path>.backward" marker; fires at most once."""

    __slots__ = ("name", "fired")

    def __init__(self, name):
        self.name = name
        self.fired = False


class _OutputRecord:
    """The markers hooked for one output tensor during the current outermost forward. It lives only
    as long as the tensor (a weakref callback drops it), so it never keeps a graph node alive that
    the job has let go."""

    __slots__ = ("tensor_ref", "node", "markers", "__weakref__")

    def __init__(self, tensor, node, markers, table, key):
        def forget(_ref, table=table, key=key, record=weakref.ref(self)):
            if table.get(key) is record():
                table.pop(key, None)

        self.tensor_ref = weakref.ref(tensor, forget)
        self.node = node
        self.markers = markers


class ModuleHooks:
    """The installed global hooks. One instance per process (see actpage_hooks.install)."""

    def __init__(self, mode, push=None, pop=None, force=False, use_node_prehook=None):
        self.mode = mode
        self.force = force
        self._push = push or _real_push
        self._pop = pop or _real_pop
        self._custom_functions = push is not None
        if use_node_prehook is None:
            use_node_prehook = hasattr(torch.autograd.graph, "Node") or _node_has_prehook()
        self.use_node_prehook = use_node_prehook
        self.names = weakref.WeakKeyDictionary()
        self._roots = weakref.WeakSet()
        self._names_lock = threading.Lock()
        self._local = threading.local()
        self._handles = []
        self.active = False
        self.decided = False
        self.pushing = False
        self.disabled_reason = None

    # ---- installation -------------------------------------------------------------------------
    def install(self):
        module_mod = torch.nn.modules.module
        self._handles.append(module_mod.register_module_forward_pre_hook(self._pre_hook))
        try:
            handle = module_mod.register_module_forward_hook(self._post_hook, always_call=True)
        except TypeError:  # torch < 2.1: no always_call; the per-thread stack keeps balance
            handle = module_mod.register_module_forward_hook(self._post_hook)
        self._handles.append(handle)
        self.active = True
        return self

    def remove(self):
        """Removes the global hooks. Call outside a forward pass (torch < 2 iterates the hook dict)."""
        self.active = False
        for handle in self._handles:
            try:
                handle.remove()
            except Exception:
                pass
        self._handles = []

    def set_range_functions(self, push, pop):
        self._push = push or _real_push
        self._pop = pop or _real_pop
        self._custom_functions = push is not None
        if self._custom_functions and self.decided and not self.pushing and self.disabled_reason is None:
            self.pushing = True

    def deactivate(self, reason):
        """Turns every hook into a no-op (safe inside a forward pass, unlike remove())."""
        self.active = False
        self.disabled_reason = reason

    # ---- names --------------------------------------------------------------------------------
    def name_of(self, module):
        name = self.names.get(module)
        if name is None:
            self._name_tree(module)
            name = self.names.get(module) or type(module).__name__
        return name

    def _name_tree(self, root):
        with self._names_lock:
            if root in self.names:
                return
            self.names[root] = type(root).__name__
            self._roots.add(root)
            for path, module in root.named_modules():
                if module is root:
                    continue
                if module in self._roots:
                    # It ran on its own before (and was named as a root): its place in this tree is
                    # the better name. Rename it and its subtree.
                    self._roots.discard(module)
                    for sub_path, sub in module.named_modules():
                        self.names[sub] = path + "." + sub_path if sub_path else path
                    continue
                if module not in self.names:  # shared under two paths: the first one stays
                    self.names[module] = path

    # ---- per-thread state ---------------------------------------------------------------------
    def _stack(self):
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
            self._local.nodes = {}
        return stack

    # ---- first forward: decide whether to do anything at all -----------------------------------
    def _decide(self):
        self.decided = True
        if self.mode == _mode.AUTO and _mode.job_emits_own_ranges(sys.modules):
            self.deactivate("the job emits its own ranges (Transformer Engine or Megatron core)")
            _log.info("off: the job emits its own NVTX ranges (Transformer Engine or Megatron core)")
            return
        if self._custom_functions or self.force:
            self.pushing = True
            return
        try:
            self.pushing = bool(torch.cuda.is_available())
        except Exception:
            self.pushing = False
        if not self.pushing:
            self.deactivate("CUDA is not available")
            _log.info("off: CUDA is not available")

    # ---- the hooks ----------------------------------------------------------------------------
    def _pre_hook(self, module, args):
        if not self.active:
            return None
        try:
            if not self.decided:
                self._decide()
                if not self.active:
                    return None
            if not self.pushing or _is_compiling():
                return None
            name = self.name_of(module)
            stack = self._stack()
            try:
                self._push(name)
            except Exception as error:
                self.deactivate("pushing a range failed")
                _log.warn_once("push", "pushing an NVTX range failed, module ranges are off: %r" % (error,))
                return None
            stack.append(module)
        except Exception as error:
            _log.warn_once("pre-hook", "forward pre-hook failed (ignored): %r" % (error,))
        return None

    def _post_hook(self, module, args, output):
        if not self.active or not self.pushing:
            return None
        try:
            stack = self._stack()
            index = len(stack) - 1
            while index >= 0 and stack[index] is not module:
                index -= 1
            if index < 0:
                return None  # not pushed by us (hooks installed mid-forward, or compiling)
            # Pop what is above it too: inner forwards that raised never ran their post hooks.
            while len(stack) > index:
                stack.pop()
                self._pop()
            if torch.is_grad_enabled():
                self._hook_backward(self.names.get(module) or type(module).__name__, output)
            if not stack:
                self._local.nodes = {}
        except Exception as error:
            _log.warn_once("post-hook", "forward hook failed (ignored): %r" % (error,))
        return None

    # ---- backward markers ---------------------------------------------------------------------
    def _hook_backward(self, name, output):
        tensors = find_grad_tensors(output)
        if not tensors:
            return
        marker = _Marker(name + ".backward")
        table = self._local.nodes
        for tensor in tensors:
            node = tensor.grad_fn
            if node is None:
                continue
            # A wrapper module often returns its last child's output tensor itself: add to the
            # child's hook (same tensor, same node) so that one hook fires both, outermost first.
            key = id(tensor)
            record = table.get(key)
            if record is not None and record.tensor_ref() is tensor and record.node is node:
                if not any(m is marker for m in record.markers):
                    record.markers.append(marker)
                continue
            markers = [marker]
            if self.use_node_prehook:
                node.register_prehook(self._make_hook(markers))
            else:
                tensor.register_hook(self._make_hook(markers))
            table[key] = _OutputRecord(tensor, node, markers, table, key)

    def _fire(self, markers):
        try:
            for marker in reversed(markers):  # outermost module first
                if not marker.fired:
                    marker.fired = True
                    self._push(marker.name)
                    self._pop()
        except Exception as error:
            _log.warn_once("backward-marker", "backward marker failed (ignored): %r" % (error,))

    def _make_hook(self, markers):
        # Used as a grad_fn pre-hook (argument: grad_outputs) or a tensor hook (argument: grad).
        def backward_marker_hook(_grads):
            if self.active:
                self._fire(markers)
            return None

        return backward_marker_hook


def _node_has_prehook():
    try:
        probe = torch.zeros(1, requires_grad=True) * 1
        return hasattr(probe.grad_fn, "register_prehook")
    except Exception:
        return False
