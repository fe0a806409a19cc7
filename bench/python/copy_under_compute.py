"""Device-to-host copy bandwidth into pinned host memory, with the GPU idle and while it computes.

Offloading every MLP of the Llama job moves ~5 GiB a forward; in the job the copies ran at 45-49 GB/s
where the link probe (GPU idle) measured 54.8 GB/s (docs/gpu-results.md, session 14). This asks
whether the difference is the GPU's own work: the same chunked copies (a side stream, chunks of
--chunk-mib, like actpage's offload worker) timed alone, beside compute-bound matmuls and beside a
memory-bound elementwise loop on the default stream; then fed the way the offload worker feeds them
(a few chunks queued, the CPU waiting on the oldest's event, blocking or spinning). Prints GB/s per
case, each the median of --reps, and the ratio to the idle case.

    python3 bench/python/copy_under_compute.py [--gib 4] [--chunk-mib 8] [--reps 5]
"""
import argparse
import statistics
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=4.0, help="bytes copied per measurement, GiB")
    parser.add_argument("--chunk-mib", type=int, default=8, help="copy chunk, MiB")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("copy_under_compute: needs a CUDA device")
        return 2
    device = torch.device("cuda")
    total = int(args.gib * (1 << 30))
    chunk = args.chunk_mib << 20
    total -= total % chunk
    source = torch.empty(total, dtype=torch.uint8, device=device)
    target = torch.empty(total, dtype=torch.uint8).pin_memory()
    copy_stream = torch.cuda.Stream()
    side = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    weight = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    big_a = torch.empty(1 << 30, dtype=torch.bfloat16, device=device)  # 2 GiB each: HBM-bound adds
    big_b = torch.empty_like(big_a)

    def matmuls(count):
        out = side
        for _ in range(count):
            out = torch.matmul(out, weight)
            out = out / 90.0  # keeps the values finite
        return out

    def adds(count):
        for _ in range(count):
            big_b.add_(big_a)

    def timed_copy(background=None):
        """Milliseconds for the chunked copy on the side stream, with `background` queued on the
        default stream first (long enough to outlast the copy)."""
        torch.cuda.synchronize()
        if background is not None:
            background()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(copy_stream):
            start.record(copy_stream)
            for offset in range(0, total, chunk):
                target[offset:offset + chunk].copy_(source[offset:offset + chunk], non_blocking=True)
            end.record(copy_stream)
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    # How long the backgrounds take, to queue enough of each to outlast a copy at the idle rate.
    timed_copy()
    idle_ms = timed_copy()

    def calibrate(function):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function(10)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 10

    matmul_ms = calibrate(matmuls)
    add_ms = calibrate(adds)
    matmul_count = int(3 * idle_ms / matmul_ms) + 1
    add_count = int(3 * idle_ms / add_ms) + 1
    print("copy %.2f GiB in %d MiB chunks; one matmul %.3f ms (%d queued), one 2 GiB add %.3f ms (%d queued)" % (
        total / (1 << 30), args.chunk_mib, matmul_ms, matmul_count, add_ms, add_count))
    cases = (("idle", None), ("beside matmuls", lambda: matmuls(matmul_count)),
             ("beside HBM-bound adds", lambda: adds(add_count)))
    results = {}
    for name, background in cases:
        times = [timed_copy(background) for _ in range(args.reps)]
        results[name] = total / (statistics.median(times) / 1e3) / 1e9
    for name, _ in cases:
        print("%-22s %6.1f GB/s  x%.3f of idle" % (name, results[name], results[name] / results["idle"]))

    # Fed the way actpage's offload worker feeds the copy stream: at most `depth` chunks queued, the
    # CPU waiting for the oldest before it issues the next, on events that block (interrupt-driven
    # wake-up, as CU_EVENT_BLOCKING_SYNC) or that spin.
    def fed_copy(depth, blocking):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        queued = []
        with torch.cuda.stream(copy_stream):
            start.record(copy_stream)
            for offset in range(0, total, chunk):
                if len(queued) >= depth:
                    queued.pop(0).synchronize()
                target[offset:offset + chunk].copy_(source[offset:offset + chunk], non_blocking=True)
                done = torch.cuda.Event(blocking=blocking)
                done.record(copy_stream)
                queued.append(done)
            end.record(copy_stream)
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    for depth in (1, 2, 4):
        for blocking in (True, False):
            times = [fed_copy(depth, blocking) for _ in range(args.reps)]
            rate = total / (statistics.median(times) / 1e3) / 1e9
            print("fed %d deep, %-8s events %6.1f GB/s  x%.3f of idle" % (
                depth, "blocking" if blocking else "spinning", rate, rate / results["idle"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
