"""What each piece of the forward wrapper's fast path (python/actpage_hooks/_hooks.py) costs on this
host, in nanoseconds per call, timed with timeit in a loop of many calls: to see which of them the
~15-20 us a hooked module call costs on the H100 machine's CPU (docs/findings.md, section 6) comes from.
Run it under `actpage run` so that the NVTX calls reach libactpage.so:
    actpage run --policy config/observe.json -- python3 bench/python/wrapper_parts.py
"""
import os
import sys
import threading
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402


def main():
    number = int(os.environ.get("WRAPPER_PARTS_NUMBER", "200000"))
    local = threading.local()
    local.stack = []
    attrs = {"_actpage_name": "model.layers.0.mlp", "_actpage_marks_backward": False}
    try:
        from torch._C import _nvtx
        push, pop = _nvtx.rangePushA, _nvtx.rangePop
    except ImportError:
        push, pop = (lambda name: None), (lambda: None)
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
    is_grad_enabled = torch.is_grad_enabled

    def original(module, *args, **kwargs):
        return module

    def plain(module, *args, **kwargs):
        return original(module, *args, **kwargs)

    module = torch.nn.Identity()
    x = torch.ones(1)
    parts = {
        "empty loop": lambda: None,
        "call through *args/**kwargs": lambda: plain(module, x, mask=None),
        "torch.compiler.is_compiling()": compiling,
        "torch.is_grad_enabled()": is_grad_enabled,
        "threading.local attribute": lambda: local.stack,
        "dict.get of the name": lambda: attrs.get("_actpage_name"),
        "NVTX push + pop (torch._C._nvtx)": lambda: (push("model.layers.0.mlp"), pop()),
        "nn.Identity()(x) (a module call)": lambda: module(x),
        "tensor.grad_fn of a leaf": lambda: x.grad_fn,
    }
    base = None
    for name, function in parts.items():
        best = min(timeit.repeat(function, number=number, repeat=5)) / number * 1e9
        if base is None:
            base = best
        print("%-36s %8.1f ns  (%+.1f ns over the empty loop)" % (name, best, best - base))


if __name__ == "__main__":
    main()
