"""Whether a side thread's copies (or VMM calls, or event polling) slow a launch-bound job's op dispatch.

In the paged runs a job's forward host time grew ~1.5x while actpage copied its activations to pinned
host memory from a side stream (D2H). If the copies themselves slow the host's dispatch (driver locks,
the copy thread's wake-ups, the GIL), pacing the copies may help only in proportion, or more. This
measures it without actpage: the main thread runs a fixed loop of small torch ops (mul_, add_, a 64x64
mm, silu on 4096 elements; --ops of them, then a sync) while one "disturber" thread works on its own
stream: back-to-back D2H copies of --chunk-mib (two in flight, waiting on the oldest's event, as the
offload worker does), the same paced to ~50% / ~25% busy, H2D copies, D2H copies of
--small-chunk-mib (many more launches and wake-ups), VMM create/map/access/unmap/release cycles of
--vmm-mib through libcuda (ctypes), an event recorded and polled every 0.2 ms, and a thread that only
sleeps 0.5 ms and wakes (the GIL and thread cost alone). Events block (CU_EVENT_BLOCKING_SYNC, like
actpage's) unless --spin-events. Each round runs every variant once in a shuffled order (fixed --seed),
so drifts in CPU speed hit all alike; per variant it prints the median over --rounds of the host's
launch time per op (loop only), the total per op (with the sync), the GPU time of the loop (events on
the job's stream), their ratios to `alone`, and the disturber's work rate during the loop (GB/s for
copies, so the pacing shares can be checked). With --op-size-large it repeats all on a GPU-bound shape
(--large-elements tensors, a --large-mm matmul, ~20-50 us an op on an H200).

    python3 bench/python/launch_under_copies.py [--ops 20000] [--rounds 5] [--op-size-large] [--json out.json]
"""
import argparse
import ctypes
import json
import platform
import random
import statistics
import sys
import os
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vmm_under_compute import Vmm, VmmPass, check  # noqa: E402  (the VMM calls; vmm_map_wait.py shares them too)

VARIANTS = ("alone", "gil_only", "event_poll", "d2h", "d2h_paced50", "d2h_paced25", "h2d", "d2h_small", "vmm")
COPY_VARIANTS = ("d2h", "d2h_paced50", "d2h_paced25", "h2d", "d2h_small")


def vmm_cycles(cuda, context, vmm, size, should_stop, on_cycle):
    """On `context`, reserve a range of `size` bytes, then create + map + set access + unmap + release it
    (vmm_under_compute.Vmm's calls, each checked) until should_stop()."""
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    va = vmm.reserve(size)
    try:
        while not should_stop():
            handle = vmm.create_and_map(va, size)
            vmm.unmap_and_release(va, size, handle)
            on_cycle()
    finally:
        vmm.free(va, size)


class Disturber(threading.Thread):
    """Runs body(self) on its own thread until `stop` is set. The body counts its work in `work` and
    sets `ready` after its first iteration, so the timed loop starts with the disturber in steady state."""

    def __init__(self, body):
        super().__init__(daemon=True)
        self.body, self.stop, self.ready = body, threading.Event(), threading.Event()
        self.work, self.error = 0, None

    def did(self, amount):
        self.work += amount
        self.ready.set()

    def run(self):
        try:
            self.body(self)
        except Exception as error:  # reported by the main thread, which skips the variant
            self.error = str(error)
        finally:
            self.ready.set()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=20000, help="small ops per measurement (launch-bound shape)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each runs every variant once")
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-round variant order")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of: " + ",".join(VARIANTS))
    parser.add_argument("--chunk-mib", type=int, default=64, help="copy chunk of d2h, d2h_paced*, h2d, MiB")
    parser.add_argument("--small-chunk-mib", type=int, default=2, help="copy chunk of d2h_small, MiB")
    parser.add_argument("--vmm-mib", type=int, default=64, help="allocation of each VMM cycle, MiB")
    parser.add_argument("--spin-events", action="store_true", help="disturbers wait on spinning, not blocking, events")
    parser.add_argument("--op-size-large", action="store_true", help="also run the GPU-bound shape")
    parser.add_argument("--large-elements", type=int, default=8 << 20, help="tensor elements of the GPU-bound shape")
    parser.add_argument("--large-mm", type=int, default=1024, help="matmul side of the GPU-bound shape")
    parser.add_argument("--large-ops", type=int, default=8000, help="ops per measurement of the GPU-bound shape")
    parser.add_argument("--json", metavar="PATH", help="write all per-round figures and the medians here")
    args = parser.parse_args(argv)
    variants = [name for name in args.variants.split(",") if name]
    if any(name not in VARIANTS for name in variants) or "alone" not in variants:
        parser.error("--variants: names from the list above, including alone")
    if args.ops < 4 or args.large_ops < 4 or args.rounds < 1 or min(args.chunk_mib, args.small_chunk_mib) < 1:
        parser.error("--ops/--large-ops at least 4, --rounds and chunks at least 1")
    if args.small_chunk_mib > args.chunk_mib:
        parser.error("--small-chunk-mib: at most --chunk-mib (the buffers are --chunk-mib long)")

    try:
        import torch
    except ImportError as error:
        print(f"launch_under_copies: needs torch ({error})")
        return 2
    if not torch.cuda.is_available():
        print("launch_under_copies: needs a CUDA device")
        return 2
    torch.manual_seed(args.seed)
    device = torch.device("cuda", torch.cuda.current_device())
    torch.empty(1, device=device)  # creates the primary context, current on this thread (for Vmm)
    blocking = not args.spin_events
    chunk, small_chunk = args.chunk_mib << 20, args.small_chunk_mib << 20
    device_buffer = torch.empty(chunk, dtype=torch.uint8, device=device)
    host_buffer = torch.empty(chunk, dtype=torch.uint8).pin_memory()
    streams = {name: torch.cuda.Stream(device=device) for name in variants if name not in ("alone", "gil_only", "vmm")}
    skipped = {}

    def copies(name, target, source, share):
        """Copies of source into target on the variant's stream: back to back, two in flight (share 1),
        or one at a time with an idle gap after each, so the copy engine is busy `share` of the time."""
        nbytes = source.numel()

        def body(me):
            torch.cuda.set_device(device)
            stream = streams[name]
            events = [torch.cuda.Event(blocking=blocking) for _ in range(2)]
            issued = 0
            with torch.cuda.stream(stream):
                while not me.stop.is_set():
                    if share >= 1.0:
                        if issued >= 2:
                            events[issued % 2].synchronize()  # the oldest of the two in flight
                            me.did(nbytes)
                        target.copy_(source, non_blocking=True)
                        events[issued % 2].record(stream)
                        issued += 1
                    else:
                        started = time.perf_counter()
                        target.copy_(source, non_blocking=True)
                        events[0].record(stream)
                        events[0].synchronize()
                        busy = time.perf_counter() - started
                        me.did(nbytes)
                        me.stop.wait(busy * (1.0 / share - 1.0))  # sleeps, GIL released
                for event in events:
                    event.synchronize()
        return body

    def event_poll(me):
        torch.cuda.set_device(device)
        stream, event = streams["event_poll"], torch.cuda.Event(blocking=blocking)
        while not me.stop.is_set():  # a clock worker: record, poll, sleep 0.2 ms
            event.record(stream)
            event.query()
            me.did(1)
            time.sleep(0.0002)

    def gil_only(me):
        while not me.stop.is_set():  # wakes 2000 times a second and takes the GIL for trivial Python
            time.sleep(0.0005)
            sum(range(16))
            me.did(1)

    bodies = {"gil_only": gil_only, "event_poll": event_poll,
              "d2h": copies("d2h", host_buffer, device_buffer, 1.0),
              "d2h_paced50": copies("d2h_paced50", host_buffer, device_buffer, 0.5),
              "d2h_paced25": copies("d2h_paced25", host_buffer, device_buffer, 0.25),
              "h2d": copies("h2d", device_buffer, host_buffer, 1.0),
              "d2h_small": copies("d2h_small", host_buffer[:small_chunk], device_buffer[:small_chunk], 1.0)}
    if "vmm" in variants:
        try:  # one cycle here first, so a driver without VMM skips the variant rather than the run
            cuda = ctypes.CDLL("libcuda.so.1")  # CDLL: calls release the GIL
            # The context torch made current on this (main) thread; the cycling thread makes it current there.
            context = ctypes.c_void_p()
            check(cuda.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
            vmm = Vmm(cuda, device.index)
            size = -(-(args.vmm_mib << 20) // VmmPass.GRANULARITY) * VmmPass.GRANULARITY
            once = iter((False, True))  # should_stop: no, then yes: exactly one cycle
            vmm_cycles(cuda, context, vmm, size, lambda: next(once), lambda: None)
            bodies["vmm"] = lambda me: vmm_cycles(cuda, context, vmm, size, me.stop.is_set, lambda: me.did(1))
        except (OSError, RuntimeError) as error:
            print(f"vmm: skipped: {error}")
            skipped["vmm"] = str(error)
            variants.remove("vmm")

    def make_job(elements, mm_side, ops):
        x = torch.ones(elements, device=device)
        s = torch.randn(elements, device=device)
        a, b = torch.randn(mm_side, mm_side, device=device), torch.randn(mm_side, mm_side, device=device)
        silu = torch.nn.functional.silu

        def job():  # x stays near 1 (fixed point of x*0.9999+0.0001); mm and silu allocate, as a forward does
            for _ in range(ops // 4):
                x.mul_(0.9999)
                x.add_(0.0001)
                torch.mm(a, b)
                silu(s)
        return job

    def measure(job, ops, name):
        torch.cuda.synchronize()
        disturber = None
        if name != "alone":
            disturber = Disturber(bodies[name])
            disturber.start()
            if not disturber.ready.wait(10.0) or disturber.error:
                disturber.stop.set()
                disturber.join(10.0)
                return None, disturber.error or "no first iteration within 10 s"
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work_before = disturber.work if disturber else 0
        began = time.perf_counter()
        job()
        launched = time.perf_counter()
        work_after = disturber.work if disturber else 0
        end.record()
        end.synchronize()  # the job's stream only: torch.cuda.synchronize() would wait for the side copies too
        finished = time.perf_counter()
        if disturber:
            disturber.stop.set()
            disturber.join()
        torch.cuda.synchronize()
        if disturber and disturber.error:
            return None, disturber.error
        rate = (work_after - work_before) / (launched - began)
        return {"launch_us": (launched - began) / ops * 1e6, "total_us": (finished - began) / ops * 1e6,
                "gpu_ms": start.elapsed_time(end), "side_rate": rate / 1e9 if name in COPY_VARIANTS else rate}, None

    shapes = [("small", "4096-element tensors, 64x64 mm, launch-bound", make_job(4096, 64, args.ops), args.ops)]
    if args.op_size_large:
        shapes.append(("large", f"{args.large_elements}-element tensors, {args.large_mm}^2 mm, GPU-bound",
                       make_job(args.large_elements, args.large_mm, args.large_ops), args.large_ops))
    print(f"launch_under_copies: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
          f"{args.rounds} rounds, {'spinning' if args.spin_events else 'blocking'} events, "
          f"chunks {args.chunk_mib}/{args.small_chunk_mib} MiB, vmm {args.vmm_mib} MiB")
    order_rng = random.Random(args.seed)
    report = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(device),
              "python": platform.python_version(), "switch_interval_s": sys.getswitchinterval(), "args": vars(args),
              "skipped": skipped, "shapes": {}}
    fields = ("launch_us", "total_us", "gpu_ms", "side_rate")
    for shape, title, job, count in shapes:
        ops = count - count % 4
        for _ in range(3):  # warm-up: kernels loaded, allocator cache filled, clocks up
            job()
        torch.cuda.synchronize()
        rounds = []
        for round_index in range(args.rounds):
            order = list(variants)
            order_rng.shuffle(order)
            figures = {}
            for name in order:
                if name in skipped:
                    continue
                result, error = measure(job, ops, name)
                if error:
                    print(f"{name}: skipped: {error}")
                    skipped[name] = error
                else:
                    figures[name] = result
            rounds.append({"order": order, "figures": figures})
        medians = {name: {field: statistics.median(r["figures"][name][field] for r in rounds if name in r["figures"])
                          for field in fields}
                   for name in variants if any(name in r["figures"] for r in rounds)}
        report["shapes"][shape] = {"title": title, "ops": ops, "rounds": rounds, "medians": medians}

        alone = medians["alone"]
        print(f"\n== {shape}: {title}, {ops} ops; medians of {args.rounds} rounds ==")
        print(f"{'variant':<13} {'launch us/op':>12} {'x alone':>8} {'total us/op':>12} {'x alone':>8} "
              f"{'gpu ms':>9} {'x alone':>8}  side work during loop")
        for name in variants:
            if name not in medians:
                print(f"{name:<13} skipped: {skipped.get(name, '')}")
                continue
            m = medians[name]
            side = ("-" if name == "alone" else f"{m['side_rate']:.1f} GB/s" if name in COPY_VARIANTS
                    else f"{m['side_rate']:.0f} cycles/s" if name == "vmm" else f"{m['side_rate']:.0f} wakes/s")
            print(f"{name:<13} {m['launch_us']:>12.2f} {m['launch_us'] / alone['launch_us']:>8.3f} "
                  f"{m['total_us']:>12.2f} {m['total_us'] / alone['total_us']:>8.3f} "
                  f"{m['gpu_ms']:>9.2f} {m['gpu_ms'] / alone['gpu_ms']:>8.3f}  {side}")
        if "d2h" in medians and medians["d2h"]["side_rate"] > 0:  # pacing check: the achieved share of d2h's rate
            for name in ("d2h_paced50", "d2h_paced25"):
                if name in medians:
                    print(f"pacing: {name} copied at {medians[name]['side_rate'] / medians['d2h']['side_rate']:.2f}"
                          f" of d2h's rate; its launch slowdown is "
                          f"{medians[name]['launch_us'] / alone['launch_us'] - 1:+.3f} against d2h's "
                          f"{medians['d2h']['launch_us'] / alone['launch_us'] - 1:+.3f}")

    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
