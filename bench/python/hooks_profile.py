"""Where actpage's Python side spends a training step's time, on a real model: forward+backward of
the Qwen3-MoE example model (or, with --fake, a small stack of torch modules on the CPU) with the
module hooks paused, on, on with no-op range functions (the hooks' own Python work alone) and on
without backward markers, the four rotated step by step in one process so that drift cancels out.
Prints how many module calls were hooked and markers fired per step, and per variant the median
forward and step time and the median of the paired ratios against the paused steps.

Run it under `actpage run` so that the hooks are the ones the job gets and their ranges reach
libactpage.so:
    actpage run --policy config/observe.json -- python3 bench/python/hooks_profile.py --layers 4
    python3 bench/python/hooks_profile.py --fake            # CPU, installs the hooks itself
"""
import argparse
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "..", "examples"))
sys.path.insert(0, os.path.join(_HERE, "..", "..", "python"))
sys.path.insert(0, _HERE)  # hooks_overhead's model, for --fake

import torch  # noqa: E402

import actpage_hooks  # noqa: E402
from actpage_hooks import _hooks  # noqa: E402

# paused: no hooks, no wrappers (the job as without actpage's Python side). on: as a job runs.
# bare: wrappers and the root's hooks in place but doing nothing (the cost of being in the call path).
# noop-ranges: everything but the NVTX calls. no-markers: no backward markers. no-pass: without the
# library's forward-pass calls (ctypes: they release and retake the GIL). minimal: instead of the
# wrappers, the least a Python wrapper can do (a closure per module: push, call, pop in a finally),
# the floor of any Python-level way of pushing ranges. python: as on, but the modules that the C
# forward (actpage_hooks._fastrange) enters get the Python wrapper instead (how the hooks ran before it).
VARIANTS = ("paused", "on", "bare", "noop-ranges", "no-markers", "no-pass", "minimal", "python")


def minimal_wrapper(module, push, pop):
    """A closure that pushes the module's range around its class's forward, and nothing else."""
    original = type(module).forward
    name = module.__dict__.get(_hooks._NAME_ATTR) or type(module).__name__

    def forward(*args, **kwargs):
        push(name)
        try:
            return original(module, *args, **kwargs)
        finally:
            pop()

    return forward


def build_fake(layers):
    """hooks_overhead.py's decoder-shaped stack (a ModuleList of layers with attention, MLP and
    norms) on the CPU."""
    import hooks_overhead

    model = hooks_overhead.Model(layers)
    batch = torch.randn(4, 8)
    return model, lambda: model(batch).float().pow(2).mean(), torch.device("cpu")


def build_qwen(layers, seq, batch_size):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    import hf_models

    device = torch.device("cuda")
    torch.manual_seed(1234)
    config_kwargs = dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=768,
                         num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                         num_experts=16, num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=1,
                         mlp_only_layers=[], output_router_logits=False, max_position_embeddings=4096,
                         rms_norm_eps=1e-6)
    model, _ = hf_models.build_causal_lm(Qwen3MoeConfig, Qwen3MoeForCausalLM, config_kwargs, torch.bfloat16, device)
    ids = torch.randint(0, 32000, (batch_size, seq), device=device)
    batch = {"input_ids": ids, "labels": ids}
    return model, lambda: hf_models.causal_lm_loss(model, batch), device


class Counting:
    """Range functions that count (and pass on to `push`/`pop`)."""

    def __init__(self, push, pop):
        self.push_fn, self.pop_fn = push, pop
        self.pushes = 0
        self.markers = 0

    def push(self, name):
        self.pushes += 1
        if name.endswith(".backward"):
            self.markers += 1
        self.push_fn(name)

    def pop(self):
        self.pop_fn()


class OwnTime:
    """Where the hooks' own time goes inside one step: perf_counter_ns shims around each wrapped
    module's forward (outer) and the class forward it calls (inner, swapped into the wrapper's
    closure), around the range functions, the backward-marker registration and firing and the
    library's forward-pass call. A wrapper's own time is outer minus inner, per call (nesting
    included). Each shim adds its own two clock reads (~0.1 us), counted in what it times."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.ns = {}
        self.calls = {}
        self._undo = []

    def _add(self, key, ns):
        self.ns[key] = self.ns.get(key, 0) + ns
        self.calls[key] = self.calls.get(key, 0) + 1

    def _timed(self, key, function):
        clock, add = time.perf_counter_ns, self._add

        def shim(*args, **kwargs):
            start = clock()
            try:
                return function(*args, **kwargs)
            finally:
                add(key, clock() - start)

        return shim

    def install(self):
        hooks = self.hooks
        clock = time.perf_counter_ns
        inner_ns = [0]
        for wrapper in list(hooks._wrappers.values()):
            names = wrapper.__code__.co_freevars
            cell = wrapper.__closure__[names.index("original")]
            original = cell.cell_contents

            def inner(*args, _original=original, **kwargs):
                start = clock()
                try:
                    return _original(*args, **kwargs)
                finally:
                    inner_ns[0] += clock() - start

            cell.cell_contents = inner
            self._undo.append(lambda cell=cell, original=original: setattr(cell, "cell_contents", original))
        for module in list(hooks.wrapped):
            bound = module.__dict__["forward"]

            def outer(*args, _bound=bound, **kwargs):
                saved = inner_ns[0]
                inner_ns[0] = 0
                start = clock()
                try:
                    return _bound(*args, **kwargs)
                finally:
                    elapsed = clock() - start
                    self._add("wrapper own (outer - class forward)", elapsed - inner_ns[0])
                    inner_ns[0] = saved  # the parent's class-forward shim times this call whole

            module.__dict__["forward"] = outer
            self._undo.append(lambda module=module, bound=bound: module.__dict__.__setitem__("forward", bound))
        for attr, key in (("_push", "range push (NVTX + library)"), ("_pop", "range pop (NVTX + library)"),
                          ("_hook_backward", "marker registration (forward)"), ("_fire", "marker firing (backward)"),
                          ("_begin_pass", "begin_forward_pass (ctypes)"),
                          ("_set_backward_pass", "set_backward_pass (ctypes)")):
            function = getattr(hooks, attr, None)
            if function is None:
                continue
            had = attr in hooks.__dict__
            setattr(hooks, attr, self._timed(key, function))
            self._undo.append(lambda attr=attr, function=function, had=had: setattr(hooks, attr, function)
                              if had else delattr(hooks, attr))
        return self

    def remove(self):
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    def report(self, steps):
        print("own time of the hooks per step (mean of %d steps; shims included):" % steps)
        for key in sorted(self.ns, key=lambda k: -self.ns[k]):
            print("  %-40s %9.1f us  %6.1f calls  %6.2f us a call" % (
                key, self.ns[key] / steps / 1e3, self.calls[key] / steps, self.ns[key] / self.calls[key] / 1e3))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake", action="store_true", help="a small CPU model instead of Qwen3-MoE")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=40, help="rounds of the variants")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated, from: %s (paused is always measured)" % ", ".join(VARIANTS))
    parser.add_argument("--own-time", type=int, default=0, metavar="STEPS",
                        help="after the rounds, time the hooks' own work over STEPS steps (OwnTime)")
    parser.add_argument("--block", type=int, default=1,
                        help="steps per variant in a round; with more than 1 the first step after a switch is "
                             "not counted (what switching costs stays out)")
    parser.add_argument("--sampler-ms", type=float, default=0.0,
                        help="run the example jobs' Python memory sampler thread at this interval (0: none)")
    args = parser.parse_args()
    variants = ["paused"] + [v for v in args.variants.split(",") if v and v != "paused"]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error("unknown variants: %s" % ", ".join(unknown))

    hooks = actpage_hooks.installed()
    if hooks is None:  # not under `actpage run`: install them here, ranges going nowhere (NVTX without
        # an injection library, through the C extension; else no-op functions) and, as in observe mode,
        # without backward markers
        if _hooks._fastrange is not None:
            hooks = actpage_hooks.install(mode="on", force=True, backward="none", pass_functions=(None, None))
        else:
            hooks = actpage_hooks.install(mode="on", push=lambda name: None, pop=lambda: None)
    model, compute_loss, device = build_fake(args.layers) if args.fake else build_qwen(args.layers, args.seq, args.batch)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    real_push, real_pop = hooks._push, hooks._pop
    custom = hooks._custom_functions
    real_pass = hooks._begin_pass, hooks._set_backward_pass

    minimal = {}
    has_fast = getattr(hooks, "_fast_module", None) is not None
    print("C forward: %s" % ("available" if has_fast else "not available (python = on)"))

    def set_variant(variant):
        for module, bound in minimal.items():  # the wrappers back where minimal replaced them
            module.__dict__["forward"] = bound
        minimal.clear()
        if has_fast:
            hooks.set_fast(variant != "python")
        actpage_hooks.set_paused(variant == "paused")
        if variant == "minimal":
            hooks.pushing = False  # the root's torch hooks do nothing either
            for module in list(hooks.wrapped):
                minimal[module] = module.__dict__["forward"]
                module.__dict__["forward"] = minimal_wrapper(module, real_push, real_pop)
            return
        if variant == "noop-ranges":
            hooks.set_range_functions(lambda name: None, lambda: None)
        else:
            hooks._push, hooks._pop, hooks._custom_functions = real_push, real_pop, custom
        hooks.pushing = variant != "bare"
        hooks._begin_pass, hooks._set_backward_pass = (None, None) if variant == "no-pass" else real_pass
        marks = variant != "no-markers"
        for module in list(hooks.hooked):
            saved = module.__dict__.setdefault("_actpage_profile_marks", module.__dict__.get(_hooks._MARK_ATTR, False))
            module.__dict__[_hooks._MARK_ATTR] = saved and marks

    def step():
        sync()
        start = time.perf_counter()
        cpu_start = time.thread_time()
        loss = compute_loss()
        forward_done = time.perf_counter()
        forward_cpu = time.thread_time() - cpu_start
        loss.backward()
        sync()
        end = time.perf_counter()
        model.zero_grad(set_to_none=True)
        return (forward_done - start) * 1e3, forward_cpu * 1e3, (end - start) * 1e3

    sampler = None
    if args.sampler_ms > 0:
        from common import MemorySampler  # the example jobs' sampler thread

        sampler = MemorySampler(device.index or 0, interval_ms=args.sampler_ms, enabled=device.type == "cuda").start()

    # What one step hooks: counted with counting range functions (one step, not timed).
    set_variant("on")
    for _ in range(args.warmup):
        step()
    counting = Counting(real_push, real_pop)
    hooks.set_range_functions(counting.push, counting.pop)
    step()
    set_variant("on")
    print("hooked modules %d (wrapped %d), ranges pushed per step %d, of them backward markers %d"
          % (len(hooks.hooked), len(hooks.wrapped), counting.pushes, counting.markers))

    forward = {v: [] for v in variants}
    forward_cpu = {v: [] for v in variants}
    total = {v: [] for v in variants}
    count = len(variants)
    for round_index in range(args.rounds):
        shift = round_index % count
        order = variants[shift:] + variants[:shift]  # rotated: no fixed position
        for variant in order:
            set_variant(variant)
            for index in range(max(1, args.block)):
                fwd_ms, cpu_ms, step_ms = step()
                if args.block > 1 and index == 0:
                    continue  # the step right after the switch
                forward[variant].append(fwd_ms)
                forward_cpu[variant].append(cpu_ms)
                total[variant].append(step_ms)
    set_variant("on")
    if args.own_time > 0:
        if has_fast:
            hooks.set_fast(False)  # the shims time the Python wrapper's pieces
        own = OwnTime(hooks).install()
        for _ in range(args.own_time):
            step()
        own.remove()
        own.report(args.own_time)
        if has_fast:
            hooks.set_fast(True)
    if sampler is not None:
        sampler.stop()
        print("memory sampler: %d samples every %.1f ms" % (sampler.samples, args.sampler_ms))

    def ratio(values, variant):
        return statistics.median(a / b for a, b in zip(values[variant], values["paused"]))

    print("%-12s %9s %9s %9s %11s %11s %11s %11s" % ("variant", "fwd ms", "fwd cpu", "step ms", "fwd x", "fwd cpu x",
                                                   "step x", "step +ms"))
    for variant in variants:
        added = statistics.median(a - b for a, b in zip(total[variant], total["paused"]))
        print("%-12s %9.3f %9.3f %9.3f %11.4f %11.4f %11.4f %+11.3f" % (
            variant, statistics.median(forward[variant]), statistics.median(forward_cpu[variant]),
            statistics.median(total[variant]), ratio(forward, variant), ratio(forward_cpu, variant),
            ratio(total, variant), added))
    return 0


if __name__ == "__main__":
    sys.exit(main())
