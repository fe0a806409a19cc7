"""stream_offload: a torchtune-style streamed offload written inside the job (examples/common.py's
--method stream_offload): saved-tensor hooks that copy the activations of selected module classes to
pooled pinned host memory on a side stream and back on unpack, with no VMM call. common.py
re-exports StreamOffload and PinnedPool."""
import threading
import weakref

MIB = 1 << 20


def _storage_ptr(tensor):
    try:
        return tensor.untyped_storage().data_ptr()
    except AttributeError:  # torch < 2.0
        return tensor.storage().data_ptr()


def _parameter_storages(model):
    """The data pointers of the model's parameters' storages. A sharded parameter (FSDP2's DTensor)
    has no storage of its own to read: its local shard's is taken, and one that still has none is
    left out (the parameter FSDP2 gathers for the forward is an nn.Parameter, kept by `wants`)."""
    storages = set()
    for parameter in model.parameters():
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        try:
            storages.add(_storage_ptr(local))
        except RuntimeError:  # "invalid python storage": a wrapper subclass without data
            pass
    return storages


def _dense_strides(tensor):
    """The tensor's strides when it covers its elements densely without overlap (a permuted
    contiguous layout), else the contiguous strides: the layout of its host copy."""
    if tensor.is_contiguous():
        return tuple(tensor.stride())
    order = sorted(range(tensor.dim()), key=lambda d: tensor.stride(d))
    expected = 1
    for dim in order:
        if tensor.size(dim) == 1:
            continue
        if tensor.stride(dim) != expected:
            strides, running = [0] * tensor.dim(), 1
            for d in reversed(range(tensor.dim())):
                strides[d] = running
                running *= tensor.size(d)
            return tuple(strides)
        expected *= tensor.size(dim)
    return tuple(tensor.stride())


class PinnedPool:
    """Host buffers pooled by exact size (a training loop asks for the same sizes every step).

    A buffer comes back with the event after which it is free (its last copy); it is handed out again
    only once that event has completed, so a copy never reads or writes a reused buffer."""

    def __init__(self, pin):
        import torch

        self._torch = torch
        self.pin = pin
        self._free = {}
        self._returning = []
        self._lock = threading.Lock()
        self.allocated_bytes = 0
        self.allocations = 0

    def get(self, nbytes):
        with self._lock:
            self._reap()
            bucket = self._free.get(nbytes)
            if bucket:
                return bucket.pop()
        self.allocations += 1
        self.allocated_bytes += nbytes
        return self._torch.empty(nbytes, dtype=self._torch.uint8, pin_memory=self.pin)

    def put(self, buffer, event=None):
        with self._lock:
            if event is None:
                self._free.setdefault(buffer.numel(), []).append(buffer)
            else:
                self._returning.append((event, buffer))

    def _reap(self):
        still = []
        for event, buffer in self._returning:
            if event.query():
                self._free.setdefault(buffer.numel(), []).append(buffer)
            else:
                still.append((event, buffer))
        self._returning = still

    def free_buffers(self):
        with self._lock:
            self._reap()
            return sum(len(b) for b in self._free.values())


class _Offloaded:
    """What the pack hook hands autograd for an offloaded tensor; gives its buffer back when freed."""

    __slots__ = ("owner", "buffer", "host", "size", "stride", "dtype", "device", "d2h_event", "h2d_event")

    def __init__(self, owner, buffer, host, tensor, stride, d2h_event):
        self.owner = owner
        self.buffer = buffer
        self.host = host
        self.size = tuple(tensor.size())
        self.stride = stride
        self.dtype = tensor.dtype
        self.device = tensor.device
        self.d2h_event = d2h_event
        self.h2d_event = None

    def __del__(self):
        try:
            self.owner.pool.put(self.buffer, self.h2d_event or self.d2h_event)
        except Exception:
            pass


class StreamOffload:
    """Saved-tensor hooks that move the activations of selected module classes to pinned host memory.

    Inside a forward of a selected module, each saved tensor of at least `min_bytes` that is not a
    parameter (or a view of one) is copied device-to-host on a side stream into a pooled pinned buffer;
    the device tensor is let go once its copy is done (checked without blocking at the next pack, and
    at the end of the forward after making the compute stream wait for the copy stream, so freed blocks
    are reused only after the copies). Backward's unpack copies it back host-to-device on the compute
    stream, after the D2H event. A tensor saved twice in one forward is copied once. On the CPU (tests)
    the same logic runs with plain synchronous copies.

    With `max_bytes`, a forward offloads its saved tensors in the order they come until the next
    would take it past `max_bytes`; the rest stay (the earliest have the most forward left to hide
    their copies behind, as auto mode's choice).

    Use: `with offload: loss = model(batch)`, then `loss.backward()` outside.
    """

    def __init__(self, model, module_classes, min_bytes=MIB, device=None, max_bytes=None):
        import torch

        self._torch = torch
        self.model = model
        self.patterns = [p.strip() for p in (module_classes.split(",") if isinstance(module_classes, str)
                                             else module_classes) if p.strip()]
        self.min_bytes = int(min_bytes)
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        self._bytes_this_forward = 0
        if device is None:
            first = next(model.parameters(), None)
            device = first.device if first is not None else torch.device("cpu")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.pool = PinnedPool(pin=self.cuda)
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.selected = [m for m in model.modules() if self.matches(type(m).__name__)]
        if not self.selected:
            raise ValueError("stream_offload: no module class matches %r" % (self.patterns,))
        self._depth = 0
        self._pending = []
        self._packed_this_forward = {}
        self._param_storages = set()
        self._handles = []
        for module in self.selected:
            self._handles.append(module.register_forward_pre_hook(self._enter_module))
            self._handles.append(module.register_forward_hook(self._leave_module))
        self._saved_hooks = None
        self.offloaded_bytes = 0
        self.offloaded_tensors = 0
        self.shared_tensors = 0
        self.kept_tensors = 0
        self.reloaded_tensors = 0

    def matches(self, class_name):
        return any(p == class_name or p in class_name for p in self.patterns)

    def _enter_module(self, module, args):
        self._depth += 1

    def _leave_module(self, module, args, output):
        self._depth = max(0, self._depth - 1)

    def __enter__(self):
        self._param_storages = _parameter_storages(self.model)
        self._saved_hooks = self._torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._saved_hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._saved_hooks.__exit__(*exc)
        self._saved_hooks = None
        self.finish_forward()
        return False

    def finish_forward(self):
        """Lets go of every device tensor still being copied: the compute stream waits for the copy
        stream first, so whatever reuses their blocks runs after the copies."""
        if self.cuda and self._pending:
            self._torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)
        self._pending = []
        self._packed_this_forward = {}
        self._bytes_this_forward = 0

    def _reap(self):
        if self._pending:
            self._pending = [(event, tensor) for event, tensor in self._pending if not event.query()]

    def wants(self, tensor):
        if self._depth == 0 or tensor.device != self.device:
            return False
        if tensor.numel() * tensor.element_size() < self.min_bytes:
            return False
        # A parameter the job swaps in during the forward (FSDP2's gathered weights) is not one of
        # model.parameters() at __enter__: it is a weight all the same, never an activation.
        if isinstance(tensor, self._torch.nn.Parameter):
            return False
        return _storage_ptr(tensor) not in self._param_storages

    def pack(self, tensor):
        if not self.wants(tensor):
            self.kept_tensors += 1
            return tensor
        # One tensor saved twice (the input of gate_proj and up_proj, seen through two views) is copied
        # once: same address, shape, strides and dtype as a tensor packed earlier in this forward that
        # is still alive (so the memory is still its) and unmodified since (views share the version).
        key = (tensor.data_ptr(), tuple(tensor.size()), tuple(tensor.stride()), tensor.dtype)
        seen = self._packed_this_forward.get(key)
        if seen is not None:
            first = seen[0]()
            if first is not None and first._version == seen[1] == tensor._version:
                self.shared_tensors += 1
                return seen[2]
        torch = self._torch
        nbytes = tensor.numel() * tensor.element_size()
        if self.max_bytes is not None and self._bytes_this_forward + nbytes > self.max_bytes:
            self.kept_tensors += 1
            return tensor
        self._bytes_this_forward += nbytes
        stride = _dense_strides(tensor)
        buffer = self.pool.get(nbytes)
        host = buffer.view(tensor.dtype).as_strided(tensor.size(), stride)
        event = None
        if self.cuda:
            self._reap()
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.copy_stream):
                host.copy_(tensor, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.copy_stream)
            self._pending.append((event, tensor))
        else:
            host.copy_(tensor)
        self.offloaded_bytes += nbytes
        self.offloaded_tensors += 1
        packed = _Offloaded(self, buffer, host, tensor, stride, event)
        self._packed_this_forward[key] = (weakref.ref(tensor), tensor._version, packed)
        return packed

    def unpack(self, packed):
        if not isinstance(packed, _Offloaded):
            return packed
        torch = self._torch
        result = torch.empty_strided(packed.size, packed.stride, dtype=packed.dtype, device=packed.device)
        if self.cuda:
            stream = torch.cuda.current_stream(packed.device)
            if packed.d2h_event is not None:
                stream.wait_event(packed.d2h_event)
            result.copy_(packed.host, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
            packed.h2d_event = event
        else:
            result.copy_(packed.host)
        self.reloaded_tensors += 1
        return result

    def stats(self):
        return {"modules": sorted({type(m).__name__ for m in self.selected}),
                "selected_modules": len(self.selected),
                "offloaded_tensors": self.offloaded_tensors, "offloaded_mib": round(self.offloaded_bytes / MIB, 1),
                "shared_tensors": self.shared_tensors,
                "kept_tensors": self.kept_tensors, "reloaded_tensors": self.reloaded_tensors,
                "pinned_mib": round(self.pool.allocated_bytes / MIB, 1)}

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []
