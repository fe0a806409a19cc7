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
                         before that module ends. It answers whether the library serves the address
                         (0 or 1), or 2: it does, and the pack came outside any layer (the inputs a
                         job's non-reentrant checkpointing saves, packed in the parent module before
                         the layer's pre-hook), so nothing tells it when forward stops reading them:
                         it keeps them until a range with no layer ends (the forward's end) unless
  unreferenced(address)  (optional; older libraries lack it) tells it, on the forward thread, that no
                         tensor but autograd's saved copies holds the storage any more: nothing in
                         forward can read it, it may leave now. UnreferencedWatch finds when;
  unpacking(address)     (only for the library's) backward is about to read it: True when its pages
                         are not (yet) back for sure, and then
  wait(address, stream)  the library brings it back now if it is not on its way, and makes `stream`
                         (the stream the reading op runs on) wait for it. A reload that comes late
                         costs time, never a wrong value.

pack returns (tensor.detach(), its version, whether the library serves it), never the tensor itself: an output saved by its own
grad_fn (exp, relu's result) would then hold itself through the graph, a cycle that nothing frees
(seen on torch 1.13: alive after the graph and a gc.collect()). And autograd does not check a hooked
saved tensor for in-place changes (torch 1.13 computed wrong gradients, silently, with hooks that
return the tensor as is), so unpack does: detach() shares the version counter, and a tensor changed
since it was saved raises the error autograd raises without hooks. On an answer 2, pack also calls
held(tensor, detached, address) once the detach is made (an UnreferencedWatch, see there).

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

import importlib
import threading
import weakref

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


OURS_HELD = 2  # saved()'s answer: the library's, and it waits for unreferenced(address)


def _held_answer(answer):
    """Whether saved()'s answer is OURS_HELD: the int 2 exactly (True is an int too, but 1)."""
    return isinstance(answer, int) and answer == OURS_HELD


def _storage_watch_functions(torch_module):
    """(use_count, weak_storage) for this torch, or None where it lacks them (Debian's 1.13):
    use_count(handle) is the strong use count of the storage behind a weak handle, 0 once it is freed,
    without adding one (torch._C._storage_Use_Count); weak_storage(tensor) a weak reference to the
    tensor's storage whose .cdata is such a handle (StorageWeakRef: it frees its handle when
    collected)."""
    use_count = getattr(getattr(torch_module, "_C", None), "_storage_Use_Count", None)
    if use_count is None:
        return None
    weak_class = None
    for module in ("torch.utils.weak", "torch.multiprocessing.reductions"):
        try:
            weak_class = getattr(importlib.import_module(module), "StorageWeakRef", None)
        except Exception:
            weak_class = None
        if weak_class is not None:
            break
    if weak_class is None:
        return None
    storage = _storage_method(torch_module)
    return use_count, lambda tensor: weak_class(getattr(tensor, storage)())


def calibrate_unreferenced(torch_module, pack, use_count, weak_storage):
    """What a saved tensor's storage counts besides our packed copy once the job dropped the tensor
    (E), measured through `pack` (the real one) for two savers: a custom autograd.Function's
    save_for_backward of its input, and torch.sin (saves its input). A tuple of two ints, an entry
    None where its measurement did not go as planned (not exactly one pack, the packed copy not
    alive with the graph).

    Measured, not assumed: on torch 2.11 it is 1 for save_for_backward, `x @ w`, F.linear and
    torch.utils.checkpoint, and nothing Python-visible holds that one; another torch may differ.
    CPU tensors: pack tells the library nothing of them (and held is not called)."""
    torch = torch_module

    class SavesItsInput(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    def measure(saver):
        packed, storages = [], []

        def wrapped_pack(tensor):
            result = pack(tensor)
            packed.append(weakref.ref(result[0]))
            storages.append(weak_storage(tensor))  # after the pack, as held() takes it
            return result

        with torch.enable_grad():
            x = torch.ones(4, device="cpu", dtype=torch.float32, requires_grad=True) * 1.0  # non-leaf
            with torch.autograd.graph.saved_tensors_hooks(wrapped_pack, lambda result: result[0]):
                y = saver(x)
            del x
            live = sum(1 for ref in packed if ref() is not None)
            if len(storages) != 1 or live != 1:
                return None
            extra = use_count(storages[0].cdata) - live
            del y
        return extra

    return measure(SavesItsInput.apply), measure(torch.sin)


class UnreferencedWatch:
    """The `held` of the pack hooks: tells the library (unreferenced(address)) when no tensor but
    autograd's saved copies holds the storage of a tensor it answered OURS_HELD for.

    Why it is safe: a forward op can read an allocation only through a tensor (or storage) object
    that references its storage, and each one counts in the storage's strong use count. Once the
    count is what autograd's saved copy accounts for alone (our packed detach, plus E: what a saved
    tensor's storage counts besides it, calibrated at creation, see calibrate_unreferenced), no
    forward op can be enqueued on it any more. Being conservative is always safe (the allocation
    just stays on the device until the range with no layer ends, as without the watch); the one
    unsafe error is telling while the job still holds a tensor, so only equality counts, never
    "<=". Hence too: only tensors of the calibrated kind are watched (non-leaf, requiring grad, not
    a view); a storage saved twice counts two packed copies and is never told (held to the range's
    end); an entry whose packed copy died (its graph freed) or whose storage is gone is dropped.

    Each call (a pack answered OURS_HELD, on the forward thread) first checks the earlier entries of
    the calling thread, then watches the new tensor: entry = (address, a weak reference to its
    storage, a weakref to our packed detach, the thread). At most `limit` entries (the oldest go:
    never told, held to the range's end).

    use_count and weak_storage: as _storage_watch_functions gives them (tests pass fakes)."""

    LIMIT = 4096

    def __init__(self, unreferenced, extra, use_count, weak_storage, limit=LIMIT):
        self._unreferenced = unreferenced
        self.extra = extra
        self._use_count = use_count
        self._weak_storage = weak_storage
        self._limit = limit
        self._entries = []
        self._lock = threading.Lock()

    @classmethod
    def create(cls, unreferenced, torch_module, pack, use_count=None, weak_storage=None, calibrate=None,
               limit=LIMIT):
        """The watch over `unreferenced`, or None where it cannot be trusted: a torch without the
        storage use count (then behaviour is as without it), or a calibration whose two savers
        disagree or give an E outside {0, 1, 2}. Logged once at debug level.
        use_count, weak_storage: default this torch's; calibrate(pack, use_count, weak_storage) ->
        the savers' E (default calibrate_unreferenced over this torch)."""
        if use_count is None or weak_storage is None:
            functions = _storage_watch_functions(torch_module)
            if functions is None:
                _log.debug_once("saved-watch",
                                "saved-tensor hooks: torch %s has no storage use count; saved tensors packed outside a "
                                "layer stay until the forward's end" % (getattr(torch_module, "__version__", "?"),))
                return None
            use_count = functions[0] if use_count is None else use_count
            weak_storage = functions[1] if weak_storage is None else weak_storage
        if calibrate is None:
            calibrate = lambda pack, use_count, weak_storage: calibrate_unreferenced(  # noqa: E731
                torch_module, pack, use_count, weak_storage)
        try:
            measured = tuple(calibrate(pack, use_count, weak_storage))
        except Exception as error:
            _log.debug_once("saved-watch",
                            "saved-tensor hooks: no unreferenced watch: its calibration failed (%r)" % (error,))
            return None
        if len(set(measured)) != 1 or measured[0] not in (0, 1, 2):
            _log.debug_once("saved-watch",
                            "saved-tensor hooks: no unreferenced watch: the calibration's savers measured %r "
                            "(expected one value in 0..2)" % (measured,))
            return None
        return cls(unreferenced, measured[0], use_count, weak_storage, limit)

    @staticmethod
    def watched_kind(tensor):
        """Whether `tensor` is of the kind the calibration measured: non-leaf, requiring grad, not a view."""
        return bool(tensor.requires_grad) and not tensor.is_leaf and tensor._base is None

    @property
    def watched(self):
        """How many saved tensors it watches (not a __len__: an empty watch must not be falsy)."""
        return len(self._entries)

    def __call__(self, tensor, detached, address):
        thread = threading.get_ident()
        told = []
        with self._lock:
            kept = []
            for entry in self._entries:
                if entry[3] != thread:
                    kept.append(entry)
                    continue
                if entry[2]() is None:  # its graph freed it: nothing left to release
                    continue
                count = self._use_count(entry[1].cdata)
                if count == 0:  # the storage is gone
                    continue
                if count == 1 + self.extra:  # our packed copy and autograd's E: nothing else
                    told.append(entry[0])
                    continue
                kept.append(entry)
            if self.watched_kind(tensor):
                kept.append((address, self._weak_storage(tensor), weakref.ref(detached), thread))
                if len(kept) > self._limit:
                    del kept[:len(kept) - self._limit]
            self._entries = kept
        for told_address in told:
            self._unreferenced(told_address)


class LibrarySink:
    """The library's entry points (include/actpage/c_api.h), or None from `find()` without them.
    A sink may leave out `installed` (tests): it is then taken to want the hooks. `addresses`, when
    not None, are those of C functions doing what saved, unpacking and wait do (the library's, as
    ctypes found them): the C hooks call them directly; without, they call the three methods.
    `unreferenced` is None where the library lacks it (older ones): no UnreferencedWatch then.
    `wanted` (a forward begins: are its packs wanted?) is None where the library lacks it: the
    hooks then stay pushed for good."""

    addresses = None
    unreferenced = None
    wanted = None

    def __init__(self, saved, unpacking, wait, installed=None, addresses=None, unreferenced=None, wanted=None):
        self.saved = saved
        self.unpacking = unpacking
        self.wait = wait
        if installed is not None:
            self.installed = installed
        if addresses is not None:
            self.addresses = tuple(addresses)
        if unreferenced is not None:
            self.unreferenced = unreferenced
        if wanted is not None:
            self.wanted = wanted

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
        unreferenced = _mode._process_symbol("actpage_tensor_unreferenced", None, [ctypes.c_ulonglong])
        wanted = _mode._process_symbol("actpage_saved_tensor_hooks_wanted", ctypes.c_int, [])
        addresses = [ctypes.cast(function, ctypes.c_void_p).value for function in (saved, unpacking, wait)]
        return cls(saved, unpacking, wait, installed, addresses, unreferenced, wanted)


class SavedTensorHooks:
    """The pack and unpack hooks over a sink; install() pushes them as torch's default hooks.

    fast: the module of the C hooks (default: _fastsaved where built), or False for the Python ones.
    current_stream: device index -> raw stream handle (default: this torch's current stream).
    held: callable(tensor, detached, address) for the packs the sink answers OURS_HELD (default: an
    UnreferencedWatch over the sink's unreferenced, where the sink has it and torch can count a
    storage's users, calibrated through the pack torch gets; else none: such tensors stay until the
    range with no layer ends)."""

    def __init__(self, sink, torch_module=None, fast=None, current_stream=None, held=None):
        if torch_module is None:
            import torch as torch_module
        self._torch = torch_module
        self._sink = sink
        self._address = _storage_address_function(torch_module)
        self._stream = current_stream if current_stream is not None else _current_stream_function(torch_module)
        self._pushed = False
        self._pushed_pack = None
        self._below = None  # the top of the stack when forward_begins() took them off
        self._thread = None
        # torch 2.x: the hooks on top of this thread's stack (None: none), or None without it.
        self._top = getattr(getattr(torch_module._C, "_autograd", None), "_top_saved_tensors_default_hooks", None)
        self._saved_count = 0
        self._waits = 0
        self._held = None
        self._fast = None
        fast = _fastsaved if fast is None else fast
        storage = _storage_method(torch_module)
        if fast:
            self._fast = self._fast_hooks(fast, sink, storage)
        if held is None and getattr(sink, "unreferenced", None) is not None:
            # Calibrated through the pack torch will get (CPU tensors: held is not involved yet).
            held = UnreferencedWatch.create(sink.unreferenced, torch_module,
                                            self._fast.pack if self._fast is not None else self.pack)
        if held is not None and self._fast is not None:
            watched = self._fast_hooks(fast, sink, storage, held)
            if watched is None:  # an extension older than `held`: its C hooks, without the watch
                held = None
            else:
                self._fast = watched
        self._held = held
        if self._fast is not None:  # what install() pushes and callers call: the C methods
            self.pack = self._fast.pack
            self.unpack = self._fast.unpack

    def _fast_hooks(self, fast, sink, storage, held=None):
        """The C hooks over `sink`: its C functions when it has them, else its methods."""
        addresses = getattr(sink, "addresses", None)
        functions = tuple(addresses) if addresses is not None else (sink.saved, sink.unpacking, sink.wait)
        keywords = {} if held is None else {"held": held}
        try:
            return fast.Hooks(*functions, current_stream=self._stream, warn=_warn, storage=storage, keep=sink,
                              **keywords)
        except Exception as error:  # an extension of another version: the Python hooks do
            _log.warn_once("saved-fast-held" if held is not None else "saved-fast",
                           "saved-tensor hooks: the C hooks are unavailable%s (%r)"
                           % (" with held" if held is not None else "", error))
            return None

    @property
    def held(self):
        """What the packs answered OURS_HELD call (an UnreferencedWatch), or None."""
        return self._held

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
        ours = held = False
        address = None
        try:
            if tensor.is_cuda:
                address = self._address(tensor)
                answer = self._sink.saved(address)
                ours, held = bool(answer), _held_answer(answer)
                self._saved_count += 1
        except Exception as error:
            _warn("saved-pack", error)
        detached, version = tensor.detach(), tensor._version
        if held and self._held is not None:
            try:
                self._held(tensor, detached, address)
            except Exception as error:
                _warn("saved-pack", error)
        return detached, version, ours

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
        self._push()
        self._thread = threading.get_ident()
        return self

    @property
    def pushed(self):
        """Whether torch has them now (forward_begins() takes them off where they are not wanted)."""
        return self._pushed

    @property
    def scoped(self):
        """Whether forward_begins() may take them off and put them back: the sink says which forwards
        want them and torch tells whose hooks are on top (_top_saved_tensors_default_hooks)."""
        return self._top is not None and getattr(self._sink, "wanted", None) is not None

    def forward_begins(self):
        """An outermost module call begins on the calling thread (ModuleHooks.on_forward_begin).
        Where the library says nothing of this forward can be served (auto mode's cap is 0), the
        hooks come off, and they go back on when a forward wants them: every saved tensor's pack and
        unpack costs the job's threads time (gpt_accum, H200: +11% a step with nothing paged; its
        backward's host thread is as busy as the GPU). Only on the thread that installed them, and
        only where no hooks are above ours (a job's own, save_on_cpu or checkpointing, keep
        precedence: ours are not pushed over them, nor theirs popped). Never raises."""
        if not self.scoped or threading.get_ident() != self._thread:
            return
        try:
            wanted = bool(self._sink.wanted())
            if wanted == self._pushed:
                return
            top = self._top_hooks()
            if wanted:
                # Back on only over what was under them when they came off (a job's hooks pushed
                # since would lose their precedence).
                below = self._below
                if (top is None) if below is None else (top is not None and top[0] is below[0]):
                    self._push()
            elif top is not None and top[0] is self._pushed_pack:
                self._torch._C._autograd._pop_saved_tensors_default_hooks()
                self._pushed = False
                self._below = self._top_hooks()
        except Exception as error:
            self._top = None  # no more toggling: the hooks stay as they are now
            _warn("saved-scope", error)

    def _push(self):
        # The very object pushed: a method's bound object is a new one at each attribute access, and
        # forward_begins() knows ours on top of the stack by identity.
        self._pushed_pack = self.pack
        self._torch._C._autograd._push_saved_tensors_default_hooks(self._pushed_pack, self.unpack)
        self._pushed = True

    def _top_hooks(self):
        try:
            return self._top(True)  # ignore_is_tracing: the eager stack, as the job's code sees it
        except TypeError:
            return self._top()

    def remove(self):
        """Pops them again: call on the thread that installed them, with nothing pushed since. No
        forward puts them back on after."""
        self._top = None
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
