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

Micro-batches (pipeline parallelism): each outermost forward call on a thread gets an id from
libactpage.so (actpage_begin_forward_pass), and each marker tells the library the id of the forward
call it belongs to just before it is pushed (actpage_set_backward_pass), so that a stage holding
several micro-batches' activations brings back only the one backward is about to read. Without the
library these calls are skipped.

Entering a module (python_hooks_call): with `hooks`, torch forward pre-hooks and forward hooks run the
two bodies, which sends every call of a hooked module through torch's slower hooked call path. With
`wrap`, each hooked module's forward is replaced on the instance by a wrapper around its class's
forward that runs the same two bodies (torch then keeps its fast path); the wrapper carries the
original as `__wrapped__`, so inspect.signature(module.forward) is unchanged, it rebinds to the copy
under copy.deepcopy, and it goes on removal. The model's root, whose first call is the one that finds
the tree, and modules whose forward is already replaced on the instance (accelerate) keep hooks.

Without a Python frame (_fastrange): where the package's C extension is built, a hooked module that
marks no backward gets, instead of the Python wrapper, a _FastForward: functools.partial(
_fastrange.forward, module), which pushes the range, calls the class's forward and pops the range in
C (a Python frame costs ~10 us amid a training step on a slow host; docs/findings.md, section 6). It looks
like the bound method it replaces (__self__, __func__, __wrapped__, inspect.signature, pickling, deep
copies). Whatever the C path does not handle (before the first call decides, custom range functions,
marked modules, hooks turned off) it hands to the Python wrapper. torch.compile cannot trace C: a
Python stand-in that calls the class's forward is registered with torch.compiler.substitute_in_graph
once torch._dynamo is imported; torch 2.0-2.4 (no substitute_in_graph) keep the Python wrapper.

Every hook body is wrapped: an exception is reported once on stderr and never reaches the job.
"""

import dataclasses
import functools
import sys
import threading
import types
import weakref

import torch

from . import _log, _mode
from ._fast_forward import (  # noqa: F401 (the C forward's parts; tests and examples reach them here)
    _FastForward,
    _in_graph_forward,
    _is_our_forward,
    _rebind_forward,
    _register_compile_stand_in,
    _stand_in_state,
    fast_forward_support,
)

try:
    from . import _fastrange  # built from python/ext/fastrange.cpp where Python's headers were found
except ImportError:
    _fastrange = None

# Output containers are searched this far for tensors that need a backward marker.
_MAX_OUTPUT_TENSORS = 64
_MAX_OUTPUT_OBJECTS = 1024


def _nvtx_functions():
    """The NVTX push and pop the hooks call: the C extension's (nvtxRangePushA/nvtxRangePop, no
    pybind11 layer, and there on a CPU-only torch too), else torch's own entry points called directly
    (one Python frame less per range than torch.cuda.nvtx.range_push), else its wrappers."""
    if _fastrange is not None:
        return _fastrange.push, _fastrange.pop
    try:
        from torch._C import _nvtx
        return _nvtx.rangePushA, _nvtx.rangePop
    except Exception:
        return (lambda name: torch.cuda.nvtx.range_push(name)), (lambda: torch.cuda.nvtx.range_pop())


_real_push, _real_pop = _nvtx_functions()

# Where a module's name is cached on the module itself: one dict lookup on the hot path instead of a
# WeakKeyDictionary probe (which builds a weak reference per lookup). The WeakKeyDictionary stays
# the record of which modules were named.
_NAME_ATTR = "_actpage_name"
# Set on a module (to True) whose backward the hooks mark (see ModuleHooks.backward).
_MARK_ATTR = "_actpage_marks_backward"


def _compiling_probe():
    """A function telling whether torch.compile is tracing, resolved once (it is asked per module)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        return compiler.is_compiling
    return _is_compiling


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
    """One module forward call's "<path>.backward" marker; fires at most once. `forward_pass` is the
    id of the outermost forward call it ran in (0: unknown)."""

    __slots__ = ("name", "fired", "forward_pass")

    def __init__(self, name, forward_pass=0):
        self.name = name
        self.fired = False
        self.forward_pass = forward_pass


def _library_pass_functions():
    """(begin_forward_pass, set_backward_pass) of the preloaded libactpage.so, or (None, None)."""
    import ctypes

    from . import _mode as mode

    begin = mode._process_symbol("actpage_begin_forward_pass", ctypes.c_ulonglong, [])
    mark = mode._process_symbol("actpage_set_backward_pass", None, [ctypes.c_ulonglong])
    if begin is None or mark is None:
        return None, None
    return begin, mark


class ModuleHooks:
    """The installed global hooks. One instance per process (see actpage_hooks.install)."""

    def __init__(self, mode, push=None, pop=None, force=False, use_node_prehook=None, scope=None,
                 rule_matches=None, pass_functions=None, backward=None, call=None, fast=None):
        self.mode = mode
        # Forward-call ids for micro-batches (see the module docstring): the library's functions,
        # or a pair of stand-ins (tests).
        self._begin_pass, self._set_backward_pass = pass_functions or _library_pass_functions()
        # Called at each outermost call, after _begin_pass (the saved-tensor hooks' forward_begins:
        # they come off for forwards the library cannot serve in); None: nothing.
        self.on_forward_begin = None
        # blocks: only the model, modules with children, the direct children of each repeated layer
        # and modules a policy rule names get hooks; the other leaves keep torch's fast call path
        # (global hooks would push every module call through the slow one). all: every module.
        self.scope = scope or _mode.BLOCKS
        # Which hooked modules mark their backward (blocks scope): each marker costs a grad_fn
        # pre-hook registered in forward and a Python callback in backward, about three quarters of
        # a hooked call's cost. layers: the root, each repeated layer and every module a policy rule
        # matches (the engine reloads by the selected module and its layer); hooked: all of them;
        # none: no module (observe mode, where nothing reads them). all scope marks every module
        # unless none.
        self.backward = backward or _mode.LAYERS
        self._marks_every_module = self.scope == _mode.ALL and self.backward != _mode.NONE
        if self.backward == _mode.NONE:
            # The ids serve only the markers (which group a marker reloads): without markers the
            # library's call per outermost forward (a ctypes call, ~10 us on the H100 machine) is spared.
            self._begin_pass = self._set_backward_pass = None
        # wrap: hooked modules (blocks scope) are entered through a forward wrapper on the instance
        # instead of torch's hooks (see the module docstring). One wrapper function per class
        # forward, bound to each module; `wrapped` holds the modules that have one.
        self.call = call or _mode.WRAP
        self._wrappers = {}
        self.wrapped = weakref.WeakSet()
        # The C forward (see the module docstring): the _fastrange module, or None (fast=False, no
        # extension, or a torch.compile that could not trace it). Process-wide state in the
        # extension: the installed instance owns it.
        fast = _fastrange if fast is None else fast
        self._fast_module = fast if fast and fast_forward_support(fast) else None
        self._fast = self._fast_module  # what _wrap uses now (set_fast)
        self._fast_owner = False
        self._stand_in_hook = None
        # Per hooked module (blocks scope): its torch hook handles, when it has hooks. Pausing
        # takes the hooks and wrappers off (set_paused) and resuming puts them back.
        self._module_handles = weakref.WeakKeyDictionary()
        self._tree_roots = weakref.WeakSet()  # roots found by _discover: they keep hooks
        self._rule_matches = rule_matches
        self._discovery_handle = None
        self.hooked = weakref.WeakSet()
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
        # live: active, decided, pushing and not paused, kept by the four flags' setters so that a
        # forward wrapper asks one attribute on its fast path.
        self.live = False
        self._active = False
        self._paused = False  # set_paused(): no new ranges until resumed (a measurement switch)
        self._decided = False
        self._pushing = False
        self.disabled_reason = None
        self._compiling = _compiling_probe()

    # ---- the flags behind `live` ---------------------------------------------------------------
    def _flag(attr):  # noqa: N805 (a property factory used in the class body)
        def get(self):
            return getattr(self, attr)

        def set_(self, value):
            setattr(self, attr, value)
            self.live = self._active and self._decided and self._pushing and not self._paused
            self._sync_fast()

        return property(get, set_)

    def _sync_fast(self):
        """Tells the C forward whether it may push by itself: ranges live, NVTX's own functions."""
        if self._fast_module is not None and self._fast_owner:
            self._fast_module.set_enabled(self.live and not self._custom_functions)

    active = _flag("_active")
    paused = _flag("_paused")
    decided = _flag("_decided")
    pushing = _flag("_pushing")
    del _flag

    # ---- copies of hooked modules -------------------------------------------------------------
    # A hooked module holds bound methods of this object (its torch hooks): copy.deepcopy(model)
    # and torch.save(model) would copy or pickle it with its lock and thread-local state, and fail.
    # A copied module keeps these hooks; an unpickled one gets the hooks installed where it loads.
    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return (_hooks_for_unpickled_module, ())

    # ---- installation -------------------------------------------------------------------------
    def install(self):
        module_mod = torch.nn.modules.module
        if self.scope == _mode.ALL:
            self._handles.append(module_mod.register_module_forward_pre_hook(self._pre_hook))
            try:
                handle = module_mod.register_module_forward_hook(self._post_hook, always_call=True)
            except TypeError:  # torch < 2.1: no always_call; the per-thread stack keeps balance
                handle = module_mod.register_module_forward_hook(self._post_hook)
            self._handles.append(handle)
        else:
            # One global pre-hook finds the model at its first call, hooks the modules of its tree
            # that matter and removes itself: from then on unhooked modules run at full speed.
            self._discovery_handle = module_mod.register_module_forward_pre_hook(self._discover)
            self._handles.append(self._discovery_handle)
        if self._fast_module is not None:
            self._take_fast()
        self._patch_replicate()
        self.active = True
        return self

    def _patch_replicate(self):
        """nn.DataParallel copies each module's __dict__ into a replica per device: our forward,
        bound to the original module, would run the original (its parameters, on the first device)
        for every replica. Module._replicate_for_data_parallel is wrapped to bind it to the replica."""
        module_type = torch.nn.Module
        original = module_type.__dict__.get("_replicate_for_data_parallel")
        if original is None or getattr(original, "_actpage_replicate", False):
            return

        def _replicate_for_data_parallel(module):
            replica = original(module)
            try:
                _rebind_forward(replica, module)
            except Exception as error:
                _log.warn_once("replicate", "rebinding a DataParallel replica's forward failed: %r" % (error,))
            return replica

        _replicate_for_data_parallel._actpage_replicate = True
        _replicate_for_data_parallel.__wrapped__ = original
        module_type._replicate_for_data_parallel = _replicate_for_data_parallel
        self._handles.append(_Restore(module_type, "_replicate_for_data_parallel", original))

    def _take_fast(self):
        """Makes the C forward this instance's: its fallback, and under a torch with torch.compile the
        stand-in registered once torch._dynamo is imported."""
        self._fast_module.configure(self._fast_fallback, _NAME_ATTR, _MARK_ATTR)
        self._fast_owner = True
        if fast_forward_support(self._fast_module) == "stand-in":
            from . import _importhook

            self._stand_in_hook = _importhook.install(self._on_dynamo_imported, "torch._dynamo")

    def _on_dynamo_imported(self, _dynamo):
        if self._fast_module is None:
            return
        failure = _register_compile_stand_in(self._fast_module)
        if failure is not None:
            _log.warn_once("stand-in", "torch.compile could not be given a stand-in for the C forward, "
                           "hooked modules go back to the Python wrapper: %s" % failure)
            self.set_fast(False)
            self._fast_module.set_enabled(False)
            self._fast_module = None  # for good

    def set_fast(self, enabled):
        """Enters the wrapped modules through the C forward (True, where available) or the Python
        wrapper (False). Returns whether the C forward is in use. Safe inside a forward pass: calls
        in progress finish on what they started with."""
        self._fast = self._fast_module if enabled else None
        for module in list(self.wrapped):
            self._unwrap(module)
            self.wrapped.discard(module)
            self._wrap(module)
        return self._fast is not None

    def _fast_fallback(self, module, *args, **kwargs):
        """What the C forward hands over when it does not push by itself: the Python wrapper."""
        original = type(module).forward
        wrapper = self._wrappers.get(original)
        if wrapper is None:
            wrapper = self._wrappers[original] = self._make_wrapper(original)
        return wrapper(module, *args, **kwargs)

    def _discover(self, module, args):
        if not self.active:
            return None
        try:
            if module in self.hooked or not any(True for _ in module.children()):
                return None  # already ours, or a lone leaf called on its own: keep looking
            self.name_of(module)
            self._hook_tree(module)
            if self._discovery_handle is not None:
                self._discovery_handle.remove()
                self._discovery_handle = None
            # Its own pre-hook was registered during this call, too late for torch to run it.
            self._pre_hook(module, args)
        except Exception as error:
            _log.warn_once("discover", "finding the model's modules failed (ignored): %r" % (error,))
        return None

    @staticmethod
    def _layer_ids(root):
        """The ids of the layers of `root`'s tree: the entries of a ModuleList, ModuleDict or Sequential."""
        containers = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)
        layers = set()
        for module in root.modules():
            if isinstance(module, containers):
                layers.update(id(child) for child in module.children())
        return layers

    def _rule_matches_module(self, module):
        """Whether a policy rule matches the module's name (named modules only)."""
        name = module.__dict__.get(_NAME_ATTR)
        return name is not None and self._rule_matches is not None and self._rule_matches(name)

    def selected_modules(self, root):
        """The modules of `root`'s tree that get hooks in blocks scope: the root, every module with
        children, each layer (an entry of a ModuleList, ModuleDict or Sequential) and its direct
        children, and every module whose name a policy rule matches."""
        layers = self._layer_ids(root)
        selected = [root]
        for module in root.modules():
            if module is root:
                continue
            if id(module) in layers:
                selected.append(module)
                selected.extend(module.children())
                continue
            if any(True for _ in module.children()) or self._rule_matches_module(module):
                selected.append(module)
        unique = []
        seen = set()
        for module in selected:
            if id(module) not in seen:
                seen.add(id(module))
                unique.append(module)
        return unique

    def marked_modules(self, root):
        """The ids of the modules of `root`'s tree whose backward the hooks mark with backward
        'layers': the root, each layer (an entry of a ModuleList, ModuleDict or Sequential) and every
        module whose name a policy rule matches."""
        marked = self._layer_ids(root)
        marked.add(id(root))
        marked.update(id(module) for module in root.modules() if self._rule_matches_module(module))
        return marked

    def _hook_tree(self, root):
        if self.backward == _mode.NONE:
            marked = set()
        elif self.backward == _mode.HOOKED:
            marked = None  # every hooked module
        else:
            marked = self.marked_modules(root)
        added = []
        for module in self.selected_modules(root):
            if module in self.hooked:
                continue
            self.hooked.add(module)
            module.__dict__[_MARK_ATTR] = marked is None or id(module) in marked
            added.append(module)
        self._tree_roots.add(root)
        if not self.paused:
            for module in added:
                self._attach(module)

    def _attach(self, module):
        """Puts a hooked module's wrapper or hooks on."""
        # A root is in its first call, which already looked its forward up: it keeps hooks.
        if self.call == _mode.WRAP and module not in self._tree_roots and self._wrap(module):
            return
        handles = [module.register_forward_pre_hook(self._pre_hook)]
        try:
            handles.append(module.register_forward_hook(self._post_hook, always_call=True))
        except TypeError:  # torch < 2.1
            handles.append(module.register_forward_hook(self._post_hook))
        self._module_handles[module] = handles
        self._handles.extend(handles)

    def _detach(self, module):
        """Takes a hooked module's wrapper or hooks off: it runs as if never hooked."""
        if module in self.wrapped:
            self._unwrap(module)
            self.wrapped.discard(module)
        for handle in self._module_handles.pop(module, ()):
            handle.remove()

    def set_paused(self, paused):
        """Pauses (True) or resumes the ranges. In blocks scope a pause takes every module's hooks
        and wrappers off, so that paused steps run as the job without actpage's Python side; call it
        between steps (a forward in progress would lose its pops)."""
        paused = bool(paused)
        if paused == self.paused:
            return
        if self.scope != _mode.ALL:
            for module in list(self.hooked):
                if paused:
                    self._detach(module)
                else:
                    self._attach(module)
        self.paused = paused

    def _wrap(self, module):
        """Replaces `module`'s forward on the instance with the wrapper of its class's forward;
        False (nothing done) when the instance already has its own forward or the class's is not
        a plain function."""
        if "forward" in module.__dict__:
            return False
        original = getattr(type(module), "forward", None)
        if not isinstance(original, types.FunctionType) or original is torch.nn.Module.forward:
            return False  # (a container's forward, which raises, is never called)
        if self._fast is not None and not module.__dict__.get(_MARK_ATTR):
            module.__dict__["forward"] = _FastForward(self._fast.forward, module)
        else:  # (a module that marks its backward: the markers are the Python wrapper's work)
            wrapper = self._wrappers.get(original)
            if wrapper is None:
                wrapper = self._wrappers[original] = self._make_wrapper(original)
            module.__dict__["forward"] = types.MethodType(wrapper, module)
        self.wrapped.add(module)
        return True

    def _make_wrapper(self, original):
        """The forward wrapper of one class's forward. Its fast path (ranges on, not compiling, the
        module on top of the stack when it returns) does the hooks' work inline: a Python call into
        _pre_hook and _post_hook each, and their flag checks, cost as much as the push and pop
        (bench/python/hooks_overhead.py). Everything else goes through the hooks themselves."""
        hooks = self
        local = self._local
        compiling = self._compiling
        is_grad_enabled = torch.is_grad_enabled
        pre_hook, post_hook = self._pre_hook, self._post_hook

        def forward(module, *args, **kwargs):
            if not hooks.live:
                if hooks.decided or not hooks.active:
                    return original(module, *args, **kwargs)
                return slow_forward(module, args, kwargs)  # the first hooked call decides
            if compiling():
                return original(module, *args, **kwargs)
            attrs = module.__dict__
            try:
                name = attrs.get(_NAME_ATTR) or hooks.name_of(module)
                try:
                    stack = local.stack
                except AttributeError:
                    stack = hooks._stack()
                if not stack and hooks._begin_pass is not None:
                    local.forward_pass = hooks._begin_pass()  # an outermost call: a new micro-batch
                    if hooks.on_forward_begin is not None:
                        hooks.on_forward_begin()
            except Exception as error:  # nothing here may break the job: run it without a range
                _log.warn_once("pre-hook", "forward pre-hook failed (ignored): %r" % (error,))
                return original(module, *args, **kwargs)
            try:
                hooks._push(name)
            except Exception as error:
                hooks.deactivate("pushing a range failed")
                _log.warn_once("push", "pushing an NVTX range failed, module ranges are off: %r" % (error,))
                return original(module, *args, **kwargs)
            stack.append(module)
            try:
                output = original(module, *args, **kwargs)
            except BaseException:
                post_hook(module, args, None)  # what always_call gives the hooks: balance on raise
                raise
            if stack and stack[-1] is module:
                stack.pop()
                try:
                    hooks._pop()
                    if attrs.get(_MARK_ATTR) and is_grad_enabled():
                        hooks._hook_backward(name, output)
                except Exception as error:
                    _log.warn_once("post-hook", "forward hook failed (ignored): %r" % (error,))
                if not stack:
                    local.nodes = {}
            else:
                post_hook(module, args, output)  # inner calls left ranges open: the hook pops them
            return output

        def slow_forward(module, args, kwargs):
            pre_hook(module, args)
            try:
                output = original(module, *args, **kwargs)
            except BaseException:
                post_hook(module, args, None)
                raise
            post_hook(module, args, output)
            return output

        functools.update_wrapper(forward, original)
        # A bound method pickles as getattr(module, __name__): "forward" finds the class's again.
        forward.__name__ = "forward"
        forward._actpage_wrapper = True
        return forward

    @staticmethod
    def _unwrap(module):
        bound = module.__dict__.get("forward")
        if _is_our_forward(bound):
            del module.__dict__["forward"]

    def _unwrap_all(self):
        for module in list(self.wrapped):
            self._unwrap(module)
        self.wrapped = weakref.WeakSet()

    def remove(self):
        """Removes the global hooks and the forward wrappers. Call outside a forward pass (torch < 2
        iterates the hook dict)."""
        self.active = False
        for handle in self._handles:
            try:
                handle.remove()
            except Exception:
                pass
        self._handles = []
        self._unwrap_all()  # (active False has turned the C forward's fast path off: _sync_fast)
        if self._stand_in_hook is not None:
            self._stand_in_hook.remove()

    def set_range_functions(self, push, pop):
        self._push = push or _real_push
        self._pop = pop or _real_pop
        self._custom_functions = push is not None
        if self._custom_functions and self.decided and not self.pushing and self.disabled_reason is None:
            self.pushing = True
        self._sync_fast()

    def deactivate(self, reason):
        """Turns every hook into a no-op (safe inside a forward pass, unlike remove())."""
        self.active = False
        self.disabled_reason = reason

    # ---- names --------------------------------------------------------------------------------
    def name_of(self, module):
        name = module.__dict__.get(_NAME_ATTR)
        if name is None:
            self._name_tree(module)
            name = self.names.get(module) or type(module).__name__
        return name

    def _set_name(self, module, name):
        self.names[module] = name
        module.__dict__[_NAME_ATTR] = name

    def _name_tree(self, root):
        with self._names_lock:
            if root in self.names:
                return
            self._set_name(root, type(root).__name__)
            self._roots.add(root)
            for path, module in root.named_modules():
                if module is root:
                    continue
                if module in self._roots:
                    # It ran on its own before (and was named as a root): its place in this tree is
                    # the better name. Rename it and its subtree.
                    self._roots.discard(module)
                    for sub_path, sub in module.named_modules():
                        self._set_name(sub, path + "." + sub_path if sub_path else path)
                    continue
                if module not in self.names:  # shared under two paths: the first one stays
                    self._set_name(module, path)

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
        if not self.active or self.paused:
            return None
        try:
            if not self.decided:
                self._decide()
                if not self.active:
                    return None
            if not self.pushing or self._compiling():
                return None
            name = module.__dict__.get(_NAME_ATTR) or self.name_of(module)
            stack = self._stack()
            if not stack and self._begin_pass is not None:
                self._local.forward_pass = self._begin_pass()  # an outermost call: a new micro-batch
                if self.on_forward_begin is not None:
                    self.on_forward_begin()
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
            if stack and stack[-1] is module:
                stack.pop()
                self._pop()
            else:
                index = len(stack) - 1
                while index >= 0 and stack[index] is not module:
                    index -= 1
                if index < 0:
                    return None  # not pushed by us (hooks installed mid-forward, or compiling)
                # Pop what is above it too: inner forwards that raised never ran their post hooks.
                while len(stack) > index:
                    stack.pop()
                    self._pop()
            if torch.is_grad_enabled() and (self._marks_every_module or module.__dict__.get(_MARK_ATTR)):
                self._hook_backward(module.__dict__.get(_NAME_ATTR) or type(module).__name__, output)
            if not stack:
                self._local.nodes = {}
        except Exception as error:
            _log.warn_once("post-hook", "forward hook failed (ignored): %r" % (error,))
        return None

    # ---- backward markers ---------------------------------------------------------------------
    def _hook_backward(self, name, output):
        if isinstance(output, torch.Tensor):  # the common case, without the container walk
            tensors = (output,) if output.grad_fn is not None and output.requires_grad else ()
        else:
            tensors = find_grad_tensors(output)
        if not tensors:
            return
        marker = _Marker(name + ".backward", getattr(self._local, "forward_pass", 0))
        # Graph nodes hooked during the current outermost forward (cleared when it ends): a wrapper
        # module often returns its last child's output, so both modules' markers share one hook on
        # that node, which fires them outermost first. The table holds the nodes only as long as
        # the forward pass, which holds them anyway.
        table = self._local.nodes
        for tensor in tensors:
            node = tensor.grad_fn
            if node is None:
                continue
            entry = table.get(id(node))
            if entry is not None and entry[0] is node:
                markers = entry[1]
                if not any(m is marker for m in markers):
                    markers.append(marker)
                continue
            markers = [marker]
            if self.use_node_prehook:
                node.register_prehook(self._make_hook(markers))
            else:
                tensor.register_hook(self._make_hook(markers))
            table[id(node)] = (node, markers)

    def _fire(self, markers):
        try:
            for marker in reversed(markers):  # outermost module first
                if not marker.fired:
                    marker.fired = True
                    if marker.forward_pass and self._set_backward_pass is not None:
                        self._set_backward_pass(marker.forward_pass)
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


class _Restore:
    """A handle whose remove() puts an attribute back (kept with the torch hook handles)."""

    def __init__(self, owner, name, value):
        self.owner, self.name, self.value = owner, name, value

    def remove(self):
        setattr(self.owner, self.name, self.value)


def _hooks_for_unpickled_module():
    """What the hook methods of an unpickled module are bound to: the installed hooks, else an
    inactive instance (its hooks do nothing)."""
    from . import installed

    hooks = installed()
    if hooks is None:
        hooks = ModuleHooks(_mode.OFF, pass_functions=(None, None))
        hooks.active = False
    return hooks


def _node_has_prehook():
    try:
        probe = torch.zeros(1, requires_grad=True) * 1
        return hasattr(probe.grad_fn, "register_prehook")
    except Exception:
        return False
