"""Does a VMM call on a worker thread wait for the kernels the job has queued, and for how many?

A reload in backward maps pages back at the activation's address (cuMemMap + cuMemSetAccess) on the
reload worker, and the job's thread waits until the copy is issued. On long_context (seq 32768,
kernels of tens of ms) the workers' VMM calls took ~38 ms each, 0.92 s an iteration, and the job's
thread stalled as long (trace of 2026-11-29). If a map waits for the whole queue, every reload
drains the GPU's queue and the host loses its lead at each layer; if it waits for the kernel that
runs, it costs the host time only.

The job's side: a batch of kernels queued at once on the default stream (the host far ahead), long
(matmuls of --long-ms each) or short (elementwise on 256 MiB, ~0.13 ms each), --queued-ms in all. Meanwhile a
worker thread makes each call once on --mib MiB: cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap,
and a map + access of pages mapped elsewhere before (a range cache's pages, recycled). For each call:
its host time, and how much of the queue was left when it returned (an event recorded behind the
batch, and one after each kernel: the count done). Also with the GPU idle.

    python3 bench/python/vmm_map_wait.py [--mib 128] [--queued-ms 200] [--long-ms 20] [--reps 3]

Prints one line per case and call: "map_wait <queue> <call> host_ms=<> queue_left=<fraction>".
"""
import argparse
import ctypes
import os
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vmm_under_compute import AccessDesc, AllocationProp, Location, check  # noqa: E402


def load_cuda():
    cuda = ctypes.CDLL("libcuda.so.1")
    for name in ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease", "cuMemAddressReserve",
                 "cuMemAddressFree", "cuCtxGetCurrent", "cuCtxSetCurrent"):
        getattr(cuda, name).restype = ctypes.c_int
    return cuda


class Calls:
    """The worker's calls, each timed; `left()` says how much of the job's queue is still to run."""

    def __init__(self, cuda, device, size):
        self.cuda, self.size = cuda, size
        self.prop = AllocationProp(type=1, requestedHandleTypes=0, location=Location(1, device))
        self.access = AccessDesc(location=Location(1, device), flags=3)

    def reserve(self):
        va = ctypes.c_uint64()
        check(self.cuda.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                                            ctypes.c_uint64(0), ctypes.c_uint64(0)), "cuMemAddressReserve")
        return va.value

    def create(self):
        handle = ctypes.c_uint64()
        check(self.cuda.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(self.size), ctypes.byref(self.prop),
                                    ctypes.c_uint64(0)), "cuMemCreate")
        return handle

    def map(self, va, handle):
        check(self.cuda.cuMemMap(ctypes.c_uint64(va), ctypes.c_size_t(self.size), ctypes.c_size_t(0), handle,
                                 ctypes.c_uint64(0)), "cuMemMap")

    def grant(self, va):
        check(self.cuda.cuMemSetAccess(ctypes.c_uint64(va), ctypes.c_size_t(self.size), ctypes.byref(self.access),
                                       ctypes.c_size_t(1)), "cuMemSetAccess")

    def unmap(self, va):
        check(self.cuda.cuMemUnmap(ctypes.c_uint64(va), ctypes.c_size_t(self.size)), "cuMemUnmap")

    def release(self, handle):
        check(self.cuda.cuMemRelease(handle), "cuMemRelease")

    def free(self, va):
        check(self.cuda.cuMemAddressFree(ctypes.c_uint64(va), ctypes.c_size_t(self.size)), "cuMemAddressFree")


def queue_batch(kind, queued_ms, long_ms, work):
    """Queues the batch; returns one event after each kernel (the last ends the batch)."""
    a, b, x = work
    events = []
    if kind == "long":
        per = max(1, round(queued_ms / long_ms))
        for _ in range(per):
            torch.matmul(a, b)
            events.append(torch.cuda.Event())
            events[-1].record()
    else:
        count = int(queued_ms / 0.13)  # a 256 MiB elementwise kernel: ~0.13 ms on an H200
        for i in range(count):
            x.mul_(1.0000001)
            if i % 50 == 49:
                events.append(torch.cuda.Event())
                events[-1].record()
    return events


def left(events):
    return sum(1 for e in events if not e.query()) / len(events)


def one_case(calls, context, kind, args, work, results):
    """Each call made once by a worker thread, a fresh batch queued before it (none: kind 'idle'),
    the pages it needs made beforehand on an idle GPU."""
    va, other_va = calls.reserve(), calls.reserve()
    recycled = calls.create()
    calls.map(other_va, recycled)
    calls.grant(other_va)
    state = {}
    steps = [
        ("create", lambda: state.__setitem__("handle", calls.create())),
        ("map", lambda: calls.map(va, state["handle"])),
        ("grant", lambda: calls.grant(va)),
        ("unmap", lambda: calls.unmap(va)),
        ("unmap_recycled", lambda: calls.unmap(other_va)),
        ("map_recycled", lambda: calls.map(va, recycled)),
        ("grant_recycled", lambda: calls.grant(va)),
    ]
    for name, call in steps:
        torch.cuda.synchronize()
        events = queue_batch(kind, args.queued_ms, args.long_ms, work) if kind != "idle" else []
        row = {}

        def worker():
            check(calls.cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
            time.sleep(0.002)  # the batch's first kernel runs
            begun = time.perf_counter()
            call()
            row["ms"] = (time.perf_counter() - begun) * 1e3
            row["left"] = left(events) if events else 0.0

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        results.setdefault((kind, name), []).append((row["ms"], row["left"]))
    torch.cuda.synchronize()
    calls.unmap(va)
    calls.release(state["handle"])
    calls.release(recycled)
    calls.free(va)
    calls.free(other_va)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--queued-ms", type=float, default=200.0)
    parser.add_argument("--long-ms", type=float, default=20.0)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    cuda = load_cuda()
    context = ctypes.c_void_p()
    check(cuda.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
    calls = Calls(cuda, torch.cuda.current_device(), args.mib << 20)
    # A matmul of about --long-ms: n^3 * 2 flops at ~600 TFLOP/s in bf16.
    n = int(round((args.long_ms * 1e-3 * 6e14 / 2) ** (1 / 3) / 256)) * 256
    work = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16), torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
            torch.zeros(64 << 20, device="cuda"))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.matmul(work[0], work[1])
    end.record()
    torch.cuda.synchronize()
    print(f"map_wait setup n={n} matmul_ms={start.elapsed_time(end):.2f} mib={args.mib}", flush=True)
    results = {}
    for _ in range(args.reps):
        for kind in ("idle", "long", "short"):
            one_case(calls, context, kind, args, work, results)
    for (kind, name), rows in results.items():
        ms = statistics.median(r[0] for r in rows)
        queue_left = statistics.median(r[1] for r in rows)
        print(f"map_wait {kind} {name} host_ms={ms:.3f} queue_left={queue_left:.2f}", flush=True)


if __name__ == "__main__":
    main()
