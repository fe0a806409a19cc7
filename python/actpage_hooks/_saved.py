"""Saved-tensor hooks: which device tensors autograd saved in forward, and when backward reads each.

torch calls a pack hook for every tensor an operation saves for backward, on the thread running the
forward (inside the module ranges of the module that saved it), and an unpack hook on autograd's
thread when backward is about to read it. These hooks tell libactpage.so both, by the address of
the tensor's storage (the allocation the library served):

  installed()            once, before the hooks are pushed: the library answers whether it uses them
                         (an offload engine runs and the policy selects a module, or auto mode runs)
                         or records them (a trace is being written, observe mode included: each
                         pack is a SAVED record); when it does neither, they are left out (they
                         would only cost time);
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

Pack and unpack run for every saved tensor, and in Python (frames, ctypes calls that convert their
arguments and drop the GIL) they cost ~15 us each on the H100 machine. So where the package's
extension actpage_hooks._fastsaved (python/ext/fastsaved.cpp) is built, SavedTensorHooks
gives torch its C pack and unpack instead, which do the same (same tuple, same checks, same error
text, same once-only reports) with no Python frame and call the library's functions directly, by
the addresses ctypes resolved once. The Python methods below stay the reference and the fallback
(fast=False, or no extension); tests/python/test_saved.py runs the same tests over both.
"""

import threading

from . import _log

try:
    from . import _fastsaved  # built from python/ext/fastsaved.cpp where Python's headers were found
except ImportError:
    _fastsaved = None

_lock = threading.Lock()
_installed = None


def _storage_method(torch):
    """The name of the tensor method giving its storage (the allocation), for this torch."""
    return "untyped_storage" if hasattr(torch.Tensor, "untyped_storage") else "storage"  # torch < 2.0


def _storage_address_function(torch):
    """tensor -> the address of its storage (the allocation), for this torch."""
    if _storage_method(torch) == "untyped_storage":
        return lambda tensor: tensor.untyped_storage().data_ptr()
    return lambda tensor: tensor.storage().data_ptr()


def _current_stream_function(torch):
    """device index -> the raw handle of that device's current CUDA stream, for this torch."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


def _warn(key, error):
    """How the C hooks report a failure: as the Python ones do."""
    _log.warn_once(key, "saved-tensor hook: %r" % (error,))


class LibrarySink:
    """The library's entry points (include/actpage/c_api.h), or None from `find()` without them.
    A sink may leave out `installed` (tests): it is then taken to want the hooks. `addresses`, when
    not None, are those of C functions doing what saved, unpacking and wait do (the library's, as
    ctypes found them): the C hooks call them directly; without, they call the three methods."""

    addresses = None

    def __init__(self, saved, unpacking, wait, installed=None, addresses=None):
        self.saved = saved
        self.unpacking = unpacking
        self.wait = wait
        if installed is not None:
            self.installed = installed
        if addresses is not None:
            self.addresses = tuple(addresses)

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
        addresses = [ctypes.cast(function, ctypes.c_void_p).value for function in (saved, unpacking, wait)]
        return cls(saved, unpacking, wait, installed, addresses)


class SavedTensorHooks:
    """The pack and unpack hooks over a sink; install() pushes them as torch's default hooks.

    fast: the module of the C hooks (default: _fastsaved where built), or False for the Python ones.
    current_stream: device index -> raw stream handle (default: this torch's current stream)."""

    def __init__(self, sink, torch_module=None, fast=None, current_stream=None):
        if torch_module is None:
            import torch as torch_module
        self._torch = torch_module
        self._sink = sink
        self._address = _storage_address_function(torch_module)
        self._stream = current_stream if current_stream is not None else _current_stream_function(torch_module)
        self._pushed = False
        self._saved_count = 0
        self._waits = 0
        self._fast = None
        fast = _fastsaved if fast is None else fast
        if fast:
            self._fast = self._fast_hooks(fast, sink, _storage_method(torch_module))
        if self._fast is not None:  # what install() pushes and callers call: the C methods
            self.pack = self._fast.pack
            self.unpack = self._fast.unpack

    def _fast_hooks(self, fast, sink, storage):
        """The C hooks over `sink`: its C functions when it has them, else its methods."""
        addresses = getattr(sink, "addresses", None)
        functions = tuple(addresses) if addresses is not None else (sink.saved, sink.unpacking, sink.wait)
        try:
            return fast.Hooks(*functions, current_stream=self._stream, warn=_warn, storage=storage, keep=sink)
        except Exception as error:  # an extension of another version: the Python hooks do
            _log.warn_once("saved-fast", "saved-tensor hooks: the C hooks are unavailable (%r)" % (error,))
            return None

    @property
    def fast(self):
        """Whether torch gets the C hooks."""
        return self._fast is not None

    @property
    def saved_count(self):
        """CUDA tensors told to the sink."""
        return self._fast.counters()[0] if self._fast is not None else self._saved_count

    @property
    def waits(self):
        """Unpacks that waited for a reload."""
        return self._fast.counters()[1] if self._fast is not None else self._waits

    def pack(self, tensor):
        ours = False
        try:
            if tensor.is_cuda:
                ours = bool(self._sink.saved(self._address(tensor)))
                self._saved_count += 1
        except Exception as error:
            _warn("saved-pack", error)
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
                    self._waits += 1
        except Exception as error:
            _warn("saved-unpack", error)
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
    None when there is nothing to tell: no library entry points, a library that neither uses nor
    records them (its installed() answers 0: observe mode without a trace), or a torch without
    default saved-tensor hooks.
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
            _log.debug("saved-tensor hooks: the library does not use them (not offloading, not tracing)")
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
