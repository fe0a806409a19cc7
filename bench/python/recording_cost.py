"""What actpage's recording costs a launch-bound job, without the model's noise: a loop of tiny CUDA
ops (each a launch, and under `backend:cudaMallocAsync` an allocation and a free through the
interposer) in short blocks, recorded and paused blocks alternating in ABBA order inside one process
(actpage_set_recording, which also pauses the memory sampler). Prints the median of the pairs'
ratios recorded/paused with a 95% bootstrap interval, and the per-op cost it implies.

Run it under `actpage run` with Python hooks off, so that only the library's side changes:
    ACTPAGE_PYTHON_HOOKS=off actpage run --policy config/observe.json -- \
        python3 bench/python/recording_cost.py [--blocks 400] [--ops 1000] [--ranges-every 0]
Compare runs with ACTPAGE_TRACE_SAMPLE_MS=0 (no sampler) against the default to see the sampler's
share. --ranges-every N pushes and pops an NVTX range every N ops (ranges are recorded too).
"""
import argparse
import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
# The example jobs' --alternate-actpage order (ABBA) and pair statistics (median of the pairs'
# ratios, its bootstrap interval), on blocks instead of steps.
from common import alternate_recorded, alternate_summary  # noqa: E402


def library_switch():
    """actpage_set_recording of the preloaded libactpage.so, or None."""
    try:
        function = ctypes.CDLL(None).actpage_set_recording
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_int]
    return function


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=400)
    parser.add_argument("--ops", type=int, default=1000, help="tiny ops per block")
    parser.add_argument("--warmup", type=int, default=20, help="blocks before the measured ones")
    parser.add_argument("--ranges-every", type=int, default=0, help="an NVTX range around every N ops (0: none)")
    parser.add_argument("--size", type=int, default=4096, help="elements of each op's result")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args(argv)
    if args.blocks < 4 or args.blocks % 2:
        parser.error("--blocks must be an even number of at least 4")

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("recording_cost.py needs a CUDA device")
    switch = library_switch()
    if switch is None:
        raise SystemExit("recording_cost.py needs libactpage.so in the process (run it under `actpage run`)")
    from torch._C import _nvtx

    push, pop = _nvtx.rangePushA, _nvtx.rangePop
    device = torch.device("cuda")
    x = torch.ones(args.size, device=device)
    every = args.ranges_every

    def block():
        y = x
        if every:
            for i in range(args.ops):
                if i % every == 0:
                    push("bench.block")
                y = y + 1
                if i % every == every - 1:
                    pop()
            if args.ops % every:
                pop()
        else:
            for _ in range(args.ops):
                y = y + 1
        torch.cuda.synchronize(device)
        return y

    recorded, times_ms = [], []
    for index in range(args.warmup + args.blocks):
        on = alternate_recorded(index, args.warmup)
        switch(1 if on else 0)
        start = time.perf_counter()
        block()
        times_ms.append((time.perf_counter() - start) * 1e3)
        recorded.append(on)
    switch(1)

    summary = alternate_summary(times_ms, recorded, args.warmup)
    ratio, interval = summary["paired_ratio_median"], summary["paired_ratio_ci95"]
    recorded_ms, paused_ms = summary["recorded_median_ms"], summary["paused_median_ms"]
    per_op_ns = (recorded_ms - paused_ms) / args.ops * 1e6
    result = {
        "pairs": summary["pairs"], "ops": args.ops, "ranges_every": every,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "sample_ms": os.environ.get("ACTPAGE_TRACE_SAMPLE_MS", "default"),
        "paused_block_ms": paused_ms, "recorded_block_ms": recorded_ms,
        "ratio": ratio, "ratio_ci95": interval,
        "added_ns_per_op": round(per_op_ns, 1),
    }
    print("recording cost: recorded/paused x%s %s over %d pairs; block %.3f / %.3f ms; "
          "%+.1f ns per op (%d ops a block, ranges every %s)" % (
              ratio, interval, summary["pairs"], recorded_ms, paused_ms, per_op_ns, args.ops, every or "-"))
    print("RECORDING_COST " + json.dumps(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
