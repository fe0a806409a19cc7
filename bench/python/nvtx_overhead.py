"""Cost of one NVTX range push+pop as a PyTorch job makes it (torch._C._nvtx), in microseconds:
run it plain and under `actpage run` (libactpage.so as the NVTX injection library) and compare.
Needs a CUDA build of torch (the CPU build has no _nvtx).

    python3 bench/python/nvtx_overhead.py [--calls 200000]
"""
import argparse
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200000)
    args = parser.parse_args()
    try:
        from torch._C import _nvtx
    except ImportError as error:
        raise SystemExit("no torch._C._nvtx (a CPU build of torch?): %s" % error)
    push, pop = _nvtx.rangePushA, _nvtx.rangePop
    names = ["model.layers.%d.mlp" % i for i in range(16)]
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for i in range(args.calls):
            push(names[i & 15])
            pop()
        best = min(best, time.perf_counter() - start)
    print("nvtx push+pop: %.3f us (best of 5 rounds of %d)" % (best / args.calls * 1e6, args.calls))


if __name__ == "__main__":
    main()
