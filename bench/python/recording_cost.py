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
import random
import statistics
import sys
import time


def abba_recorded(index):
    """Block `index` is recorded in the order R P P R R P P R ...: a drift favours neither side."""
    first_recorded = (index // 2) % 2 == 0
    return first_recorded if index % 2 == 0 else not first_recorded


def pairs_of(times, recorded):
    """(recorded, paused) per consecutive pair of blocks."""
    pairs = []
    for first in range(0, len(times) - 1, 2):
        a, b = times[first], times[first + 1]
        if recorded[first] == recorded[first + 1]:
            continue
        pairs.append((a, b) if recorded[first] else (b, a))
    return pairs


def median_ratio(pairs):
    return statistics.median(r / p for r, p in pairs)


def bootstrap(pairs, rounds=2000, seed=1):
    rng = random.Random(seed)
    values = sorted(median_ratio([rng.choice(pairs) for _ in pairs]) for _ in range(rounds))
    return values[int(0.025 * rounds)], values[int(0.975 * rounds) - 1]


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

    recorded, times = [], []
    for index in range(-args.warmup, args.blocks):
        on = abba_recorded(index) if index >= 0 else index % 2 == 0
        switch(1 if on else 0)
        start = time.perf_counter()
        block()
        elapsed = time.perf_counter() - start
        if index >= 0:
            recorded.append(on)
            times.append(elapsed)
    switch(1)

    pairs = pairs_of(times, recorded)
    ratio = median_ratio(pairs)
    low, high = bootstrap(pairs)
    paused_ms = statistics.median(p for _, p in pairs) * 1e3
    recorded_ms = statistics.median(r for r, _ in pairs) * 1e3
    per_op_ns = (recorded_ms - paused_ms) / args.ops * 1e6
    result = {
        "pairs": len(pairs), "ops": args.ops, "ranges_every": every,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "sample_ms": os.environ.get("ACTPAGE_TRACE_SAMPLE_MS", "default"),
        "paused_block_ms": round(paused_ms, 4), "recorded_block_ms": round(recorded_ms, 4),
        "ratio": round(ratio, 4), "ratio_ci95": [round(low, 4), round(high, 4)],
        "added_ns_per_op": round(per_op_ns, 1),
    }
    print("recording cost: recorded/paused x%.4f [%.4f, %.4f] over %d pairs; block %.3f / %.3f ms; "
          "%+.1f ns per op (%d ops a block, ranges every %s)" % (
              ratio, low, high, len(pairs), recorded_ms, paused_ms, per_op_ns, args.ops, every or "-"))
    print("RECORDING_COST " + json.dumps(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
