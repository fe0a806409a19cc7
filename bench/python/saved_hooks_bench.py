"""What the saved-tensor hooks (python/actpage_hooks/_saved.py) cost the job's thread: a chain of
small ops that each save a tensor for backward (y = y * w, w not requiring grad: one saved tensor
an op), forward and backward timed with no hooks, with the Python hooks and with the C hooks
(actpage_hooks._fastsaved), the three rotated rep by rep in one process so that drift cancels out.
Prints per variant the median microseconds an op, the ratio to no hooks, and what the hooks add per
saved tensor; then each path's pack and unpack called directly on one tensor (no op around them).

The library's functions are played by do-nothing C functions of the extension (saved answers 1, so
every unpack asks; unpacking answers 0: no wait), called by the C hooks directly and by the Python
hooks through ctypes, as each path calls libactpage.so: the figures are the hooks' own cost. With
--library (under `actpage run`, offloading) the library's real functions are called instead.

It imports actpage_hooks from the build tree (<repository>/build/python, where the extension is
built; --python-dir or ACTPAGE_BENCH_PYTHON_DIR for another). From the repository root:
    python3 bench/python/saved_hooks_bench.py [--ops 4000] [--reps 15] [--device cuda]
"""
import argparse
import ctypes
import gc
import os
import platform
import statistics
import sys
import time
import timeit

_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
VARIANTS = ("none", "python", "c")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=4000, help="ops in the chain (one saved tensor each)")
    parser.add_argument("--reps", type=int, default=15, help="timed reps of each variant")
    parser.add_argument("--warmup", type=int, default=2, help="reps of each variant not counted")
    parser.add_argument("--size", type=int, default=256, help="elements of each tensor (small: launch-bound)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: the hooks skip the sink)")
    parser.add_argument("--library", action="store_true",
                        help="call libactpage.so's functions (under `actpage run`) instead of do-nothing ones")
    parser.add_argument("--python-dir", default=os.environ.get("ACTPAGE_BENCH_PYTHON_DIR")
                        or os.path.join(_ROOT, "build", "python"),
                        help="where actpage_hooks is imported from (default: <repository>/build/python)")
    return parser.parse_args()


def import_package(python_dir):
    if not os.path.isdir(os.path.join(python_dir, "actpage_hooks")):
        sys.exit("saved_hooks_bench: no actpage_hooks in %s (build first: cmake --build build)" % python_dir)
    sys.path.insert(0, python_dir)
    from actpage_hooks import _saved

    if _saved._fastsaved is None:
        sys.exit("saved_hooks_bench: actpage_hooks._fastsaved is not built in %s (Python headers missing?)"
                 % python_dir)
    return _saved


def stub_sink(_saved):
    """A LibrarySink over the extension's do-nothing C functions: ctypes functions for the Python
    hooks (what LibrarySink.find() gives them), the addresses for the C hooks."""
    addresses = _saved._fastsaved.stub_functions()
    saved = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_ulonglong)(addresses[0])
    unpacking = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_ulonglong)(addresses[1])
    wait = ctypes.CFUNCTYPE(None, ctypes.c_ulonglong, ctypes.c_ulonglong)(addresses[2])
    return _saved.LibrarySink(saved, unpacking, wait, addresses=addresses)


def main():
    args = parse_args()
    _saved = import_package(args.python_dir)
    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("saved_hooks_bench: no CUDA device (use --device cpu for a smoke run)")
    if _saved.installed() is not None:  # sitecustomize installed them under `actpage run`: none means none
        _saved.uninstall()
    if args.library:
        sink = _saved.LibrarySink.find()
        if sink is None:
            sys.exit("saved_hooks_bench: --library: libactpage.so's functions are not in this process")
        sink_text = "libactpage.so's functions"
    else:
        sink = stub_sink(_saved)
        sink_text = "do-nothing C functions (the hooks' own cost)"
    hooks = {"python": _saved.SavedTensorHooks(sink, torch, fast=False),
             "c": _saved.SavedTensorHooks(sink, torch, fast=_saved._fastsaved)}
    assert hooks["c"].fast and not hooks["python"].fast

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    x = torch.randn(args.size, device=device, requires_grad=True)
    w = torch.randn(args.size, device=device)

    def run(variant):
        """(forward seconds, backward seconds) of one chain under `variant`."""
        installed = hooks.get(variant)
        if installed is not None:
            installed.install()
        try:
            gc.collect()
            sync()
            start = time.perf_counter()
            y = x
            for _ in range(args.ops):
                y = y * w
            loss = y.sum()
            sync()
            middle = time.perf_counter()
            loss.backward()
            sync()
            end = time.perf_counter()
        finally:
            if installed is not None:
                installed.remove()
        x.grad = None
        return middle - start, end - middle

    times = {variant: ([], []) for variant in VARIANTS}
    before = hooks["python"].saved_count
    for rep in range(args.warmup + args.reps):
        shift = rep % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            forward, backward = run(variant)
            if rep >= args.warmup:
                times[variant][0].append(forward)
                times[variant][1].append(backward)
    told = (hooks["python"].saved_count - before) / float((args.warmup + args.reps) * args.ops)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print("device: %s; torch %s; Python %s" % (name, torch.__version__, platform.python_version()))
    print("package: %s" % os.path.dirname(_saved.__file__))
    print("sink: %s; %d ops a chain, tensors of %d elements; median of %d reps"
          % (sink_text, args.ops, args.size, args.reps))
    print("tensors told to the sink per op: %.2f%s" % (told, "" if told else " (not CUDA tensors: the sink is skipped)"))
    print()
    per_saved = told if told > 0 else 1.0  # without saved tensors told: what the hooks add per op
    added = "+us/saved" if told > 0 else "+us/op"
    print("%-8s %12s %8s %12s %8s %16s %16s" % ("hooks", "fwd us/op", "x none", "bwd us/op", "x none",
                                              "fwd " + added, "bwd " + added))
    per_op = {variant: [statistics.median(series) * 1e6 / args.ops for series in times[variant]] for variant in VARIANTS}
    base_forward, base_backward = per_op["none"]
    for variant in VARIANTS:
        forward, backward = per_op[variant]
        print("%-8s %12.2f %8.3f %12.2f %8.3f %16s %16s" % (
            variant, forward, forward / base_forward, backward, backward / base_backward,
            "-" if variant == "none" else "%.2f" % ((forward - base_forward) / per_saved),
            "-" if variant == "none" else "%.2f" % ((backward - base_backward) / per_saved)))
    python_forward, c_forward = per_op["python"][0] - base_forward, per_op["c"][0] - base_forward
    print()
    print("C hooks against Python hooks: forward x%.3f, backward x%.3f; added forward cost x%s"
          % (per_op["c"][0] / per_op["python"][0], per_op["c"][1] / per_op["python"][1],
             "%.3f" % (c_forward / python_forward) if python_forward > 0 else "-"))
    print()
    direct = {}
    for variant in ("python", "c"):
        pack, unpack = hooks[variant].pack, hooks[variant].unpack
        packed = pack(w)
        number = 20000
        direct[variant] = (min(timeit.repeat(lambda: pack(w), number=number, repeat=5)) * 1e9 / number,
                           min(timeit.repeat(lambda: unpack(packed), number=number, repeat=5)) * 1e9 / number)
        print("direct calls, %-6s: pack %8.0f ns, unpack %8.0f ns (one %s tensor; best of 5 x %d, a lambda's call "
              "included)" % (variant, direct[variant][0], direct[variant][1], device.type, number))
    print("direct calls, C against Python: pack x%.3f, unpack x%.3f"
          % (direct["c"][0] / direct["python"][0], direct["c"][1] / direct["python"][1]))


if __name__ == "__main__":
    main()
