"""Saved-tensor hooks: which device tensors autograd saved in forward, and when backward reads each.

torch calls a pack hook for every tensor an operation saves for backward, on the thread running the
forward (inside the module ranges of the module that saved it), and an unpack hook on autograd's
thread when backward is about to read it. These hooks tell libactpage.so both, by the address of
the tensor's storage (the allocation the library served):

  installed()            once, before the hooks are pushed: the library answers whether it uses them
                         (an offload engine runs and the policy selects a module); when it does not,
                         they are left out (they would only cost time);
  saved(address)         the allocation is read by backward: only such allocations are worth moving,
                         and the module saving it now reads it in forward, so its pages may not leave
                         before that module ends. It answers whether the library serves the address;
  unpacking(address)     (only for those) backward is about to read it: True when its pages are not (yet) back for
                         sure, and then
  wait(address, stream)  the library brings it back now if it is not on its way, and makes `stream`
                         (the stream the reading op runs on) wait for it. A reload that comes late
                         costs time, never a wrong value.

pack returns (tensor.detach(), its version, whether the library serves it), never the tensor itself: an output saved by its own
grad_fn (exp, relu's result) would then hold itself through the graph, a cycle that nothing frees
(seen on torch 1.13: alive after the graph and a gc.collect()). And autograd does not check a hooked
saved tensor for in-place changes (torch 1.13 computed wrong gradients, silently, with hooks that
return the tensor as is), so unpack does: detach() shares the version counter, and a tensor changed
since it was saved raises the error autograd raises without hooks.

The hooks are torch's default saved-tensor hooks, pushed on the thread that imports torch (the
bottom of that thread's stack): a job's own hooks (save_on_cpu, non-reentrant checkpointing) take
precedence inside their regions, as they should (what they save does not stay on the device).
Every hook body is wrapped: a failure is reported once and the tensor goes through untouched.
"""

import threading

from . import _log

_lock = threading.Lock()
_installed = None


def _storage_address_function(torch):
    """tensor -> the address of its storage (the allocation), for this torch."""
    if hasattr(torch.Tensor, "untyped_storage"):
        return lambda tensor: tensor.untyped_storage().data_ptr()
    return lambda tensor: tensor.storage().data_ptr()  # torch < 2.0


def _current_stream_function(torch):
    """device index -> the raw handle of that device's current CUDA stream, for this torch."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


class LibrarySink:
    """The library's entry points (include/actpage/c_api.h), or None from `find()` without them.
    A sink may leave out `installed` (tests): it is then taken to want the hooks."""

    def __init__(self, saved, unpacking, wait, installed=None):
        self.saved = saved
        self.unpacking = unpacking
        self.wait = wait
        if installed is not None:
            self.installed = installed

    @classmethod
    def find(cls):
        import ctypes

        from . import _mode

        installed = _mode._process_symbol("actpage_saved_tensor_hooks_installed", ctypes.c_int, [])
        saved = _mode._process_symbol("actpage_tensor_saved", ctypes.c_int, [ctypes.c_ulonglong])
        unpacking = _mode._process_symbol("actpage_tensor_unpacking", ctypes.c_int, [ctypes.c_ulonglong])
        wait = _mode._process_symbol("actpage_tensor_wait", None, [ctypes.c_ulonglong, ctypes.c_ulonglong])
        if installed is None or saved is None or unpacking is None or wait is None:
            return None
        return cls(saved, unpacking, wait, installed)


class SavedTensorHooks:
    """The pack and unpack hooks over a sink; install() pushes them as torch's default hooks."""

    def __init__(self, sink, torch_module=None):
        if torch_module is None:
            import torch as torch_module
        self._torch = torch_module
        self._sink = sink
        self._address = _storage_address_function(torch_module)
        self._stream = _current_stream_function(torch_module)
        self._pushed = False
        self.saved_count = 0
        self.waits = 0

    def pack(self, tensor):
        ours = False
        try:
            if tensor.is_cuda:
                ours = bool(self._sink.saved(self._address(tensor)))
                self.saved_count += 1
        except Exception as error:
            _log.warn_once("saved-pack", "saved-tensor hook: %r" % (error,))
        return tensor.detach(), tensor._version, ours

    def unpack(self, packed):
        tensor, version, ours = packed
        if tensor._version != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace "
                "operation: [%s %s] is at version %d; expected version %d instead (checked by actpage's "
                "saved-tensor hooks, as autograd checks it without hooks)"
                % (tensor.type(), list(tensor.shape), tensor._version, version))
        try:
            if ours:  # a tensor the library does not serve is none of its business: no call
                address = self._address(tensor)
                if self._sink.unpacking(address):
                    self._sink.wait(address, self._stream(tensor.device.index))
                    self.waits += 1
        except Exception as error:
            _log.warn_once("saved-unpack", "saved-tensor hook: %r" % (error,))
        return tensor

    def install(self):
        self._torch._C._autograd._push_saved_tensors_default_hooks(self.pack, self.unpack)
        self._pushed = True
        return self

    def remove(self):
        """Pops them again: call on the thread that installed them, with nothing pushed since."""
        if self._pushed:
            self._torch._C._autograd._pop_saved_tensors_default_hooks()
            self._pushed = False


def supported(torch_module):
    """Whether this torch has default saved-tensor hooks (1.10 and later)."""
    return hasattr(getattr(torch_module._C, "_autograd", None), "_push_saved_tensors_default_hooks")


def install(sink=None, torch_module=None):
    """Installs the hooks over `sink` (default: the library's entry points) and returns them, or
    None when there is nothing to tell: no library entry points, a library that does not use them
    (its installed() answers 0: observe mode), or a torch without default saved-tensor hooks.
    Idempotent."""
    global _installed
    with _lock:
        if _installed is not None:
            return _installed
        sink = LibrarySink.find() if sink is None else sink
        if sink is None:
            return None
        if torch_module is None:
            import torch as torch_module
        if not supported(torch_module):
            _log.debug("saved-tensor hooks: torch %s has no default hooks; backward is not watched"
                       % (getattr(torch_module, "__version__", "?"),))
            return None
        notify = getattr(sink, "installed", None)
        if notify is not None and not notify():
            _log.debug("saved-tensor hooks: the library does not use them (not offloading)")
            return None
        _installed = SavedTensorHooks(sink, torch_module).install()
        return _installed


def installed():
    return _installed


def uninstall():
    global _installed
    with _lock:
        if _installed is not None:
            _installed.remove()
            _installed = None
