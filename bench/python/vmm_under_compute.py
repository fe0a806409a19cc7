"""What a worker thread's VMM calls cost the kernels running on the GPU meanwhile.

In the zoo's paged passes the forward's GPU time grows (qwen3_moe 47 -> 57 ms, deepseek_moe 243 ->
416 ms) while the job's thread spends little time in actpage, and the VMM worker makes thousands of
calls a pass (deepseek_moe ~2300: unmap, release, create, map, access). This asks whether those calls
slow the kernels themselves: a batch of kernels is queued at once on the default stream (the host far
ahead, as in a GPU-bound job) and timed with CUDA events, alone and while another thread cycles
create + map + access + unmap + release of --mib MiB through the driver (ctypes, libcuda), while a
side stream copies to pinned host memory, and with both. Two batches: matmuls (compute-bound, ~0.2 ms
each) and small elementwise kernels on 8 MiB tensors (a few us each, like an MoE's). Prints the GPU
time of each case, the median of --reps, its ratio to the batch alone, and the VMM cycles done
meanwhile.

With --pieces, it also asks what grouping a pass's pages would save: one pass's calls for
--total-mib (a paged pass's ~2 GiB) made once during the elementwise batch, as N ranges (create +
map + access each, then unmap + release each), for each N given: the per-tensor windows of a
launch-bound job (hf_trainer: ~55 a pass) against one per layer (2-3).

    python3 bench/python/vmm_under_compute.py [--mib 16] [--reps 5] [--pieces 64,3 --total-mib 2048]
"""
import argparse
import ctypes
import statistics
import sys
import threading
import time


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def check(result, call):
    if result != 0:
        raise RuntimeError(f"{call} failed: CUresult {result}")


class Vmm:
    """The driver's VMM calls both threads make, on `device`, each checked."""

    def __init__(self, cuda, device):
        self.cuda = cuda
        self.prop = AllocationProp(type=1, requestedHandleTypes=0, location=Location(1, device))
        self.access = AccessDesc(location=Location(1, device), flags=3)

    def reserve(self, size):
        va = ctypes.c_uint64()
        check(self.cuda.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                            ctypes.c_uint64(0), ctypes.c_uint64(0)), "cuMemAddressReserve")
        return va.value

    def free(self, va, size):
        check(self.cuda.cuMemAddressFree(ctypes.c_uint64(va), ctypes.c_size_t(size)), "cuMemAddressFree")

    def create_and_map(self, va, size):
        """cuMemCreate + cuMemMap + cuMemSetAccess of `size` bytes at `va`; returns the handle."""
        cuda, at = self.cuda, ctypes.c_uint64(va)
        handle = ctypes.c_uint64()
        check(cuda.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(self.prop),
                               ctypes.c_uint64(0)), "cuMemCreate")
        check(cuda.cuMemMap(at, ctypes.c_size_t(size), ctypes.c_size_t(0), handle, ctypes.c_uint64(0)), "cuMemMap")
        check(cuda.cuMemSetAccess(at, ctypes.c_size_t(size), ctypes.byref(self.access), ctypes.c_size_t(1)),
              "cuMemSetAccess")
        return handle

    def unmap_and_release(self, va, size, handle):
        check(self.cuda.cuMemUnmap(ctypes.c_uint64(va), ctypes.c_size_t(size)), "cuMemUnmap")
        check(self.cuda.cuMemRelease(handle), "cuMemRelease")


class VmmCycler(threading.Thread):
    """Cycles create + map + access + unmap + release of `size` bytes until stopped."""

    def __init__(self, cuda, context, size, device):
        super().__init__(daemon=True)
        self.cuda, self.context, self.size, self.vmm = cuda, context, size, Vmm(cuda, device)
        self.stop = threading.Event()
        self.cycles = 0

    def run(self):
        check(self.cuda.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        va = self.vmm.reserve(self.size)
        while not self.stop.is_set():
            handle = self.vmm.create_and_map(va, self.size)
            self.vmm.unmap_and_release(va, self.size, handle)
            self.cycles += 1
        self.vmm.free(va, self.size)


class VmmPass(threading.Thread):
    """One pass's calls, once: `pieces` ranges of `total` bytes in all created, mapped and granted,
    then unmapped and released (what a paged pass's reloads and offloads make)."""

    GRANULARITY = 2 << 20

    def __init__(self, cuda, context, total, pieces, device):
        super().__init__(daemon=True)
        self.cuda, self.context, self.vmm = cuda, context, Vmm(cuda, device)
        self.pieces = pieces
        self.piece = -(-(total // pieces) // self.GRANULARITY) * self.GRANULARITY
        self.seconds = 0.0

    def run(self):
        check(self.cuda.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        span = self.piece * self.pieces
        va = self.vmm.reserve(span)
        started = time.perf_counter()
        handles = [self.vmm.create_and_map(va + index * self.piece, self.piece) for index in range(self.pieces)]
        for index, handle in enumerate(handles):
            self.vmm.unmap_and_release(va + index * self.piece, self.piece, handle)
        self.seconds = time.perf_counter() - started
        self.vmm.free(va, span)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=16, help="size of each VMM cycle's allocation, MiB")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--pieces", default="", help="comma-separated range counts for one pass's calls (e.g. 64,3)")
    parser.add_argument("--total-mib", type=int, default=2048, help="the pass's bytes in all, MiB (with --pieces)")
    args = parser.parse_args(argv)
    pieces = [int(count) for count in args.pieces.split(",") if count]
    if any(count <= 0 for count in pieces):
        parser.error("--pieces: counts must be positive")

    import torch

    if not torch.cuda.is_available():
        print("vmm_under_compute: needs a CUDA device")
        return 2
    device = torch.device("cuda")
    torch.cuda.init()
    torch.empty(1, device=device)
    cuda = ctypes.CDLL("libcuda.so.1")
    context = ctypes.c_void_p()
    check(cuda.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
    size = args.mib << 20

    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    small = torch.randn(4 << 20, device=device, dtype=torch.bfloat16)  # 8 MiB
    source = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    target = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    copy_stream = torch.cuda.Stream()

    def matmuls():
        for _ in range(200):
            torch.mm(a, b)

    def elementwise():
        for _ in range(4000):
            small.mul_(1.0000001)

    def time_batch(batch, with_vmm, with_copies):
        cycler = None
        if with_vmm:
            cycler = VmmCycler(cuda, context, size, torch.cuda.current_device())
            cycler.start()
        if with_copies:
            with torch.cuda.stream(copy_stream):
                for _ in range(8):
                    target.copy_(source, non_blocking=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        batch()
        end.record()
        end.synchronize()
        cycles = 0
        if cycler is not None:
            cycler.stop.set()
            cycler.join()
            cycles = cycler.cycles
        torch.cuda.synchronize()
        return start.elapsed_time(end), cycles

    print(f"vmm_under_compute: {torch.cuda.get_device_name()}, VMM cycles of {args.mib} MiB, {args.reps} reps")
    for name, batch in (("matmul 4096 x200", matmuls), ("elementwise 8 MiB x4000", elementwise)):
        batch()
        torch.cuda.synchronize()
        alone = None
        for case, vmm, copies in (("alone", False, False), ("+vmm", True, False), ("+d2h", False, True),
                                  ("+vmm+d2h", True, True)):
            runs = [time_batch(batch, vmm, copies) for _ in range(args.reps)]
            ms = statistics.median(r[0] for r in runs)
            cycles = statistics.median(r[1] for r in runs)
            alone = ms if alone is None else alone
            print(f"case {name} | {case} | gpu_ms={ms:.2f} | x{ms / alone:.3f} | vmm_cycles={cycles:.0f}")

    def time_pass(count):
        calls = VmmPass(cuda, context, args.total_mib << 20, count, torch.cuda.current_device())
        calls.start()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        elementwise()
        end.record()
        end.synchronize()
        calls.join()
        torch.cuda.synchronize()
        return start.elapsed_time(end), calls.seconds * 1e3

    if pieces:
        alone = statistics.median(time_batch(elementwise, False, False)[0] for _ in range(args.reps))
        print(f"case elementwise 8 MiB x4000 | alone | gpu_ms={alone:.2f} | x1.000 | pass_ms=-")
        for count in pieces:
            runs = [time_pass(count) for _ in range(args.reps)]
            ms = statistics.median(r[0] for r in runs)
            pass_ms = statistics.median(r[1] for r in runs)
            print(f"case elementwise 8 MiB x4000 | one pass of {args.total_mib} MiB as {count} ranges | "
                  f"gpu_ms={ms:.2f} | x{ms / alone:.3f} | pass_ms={pass_ms:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
