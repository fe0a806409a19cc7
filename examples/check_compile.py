#!/usr/bin/env python3
"""Checks that actpage's C forward (actpage_hooks._fastrange) keeps a job's behaviour, torch.compile
included (GPU machine: torch 2.x; runs on the CPU too, where torch has no torch.compile the compile
checks are skipped).

Run it under `actpage run` so that the hooks are the ones a job gets:
    actpage run --policy config/observe.json -- python3 examples/check_compile.py

  1. eager: a small Llama's loss and gradients, hooks paused against on, bit-identical; the hooked
     modules are entered through the C forward (counted), inspect.signature of a wrapped forward is
     the class's;
  2. torch.compile (backend "eager"): a toy stack whose blocks have the C forward compiles with
     fullgraph=True to the same output (the registered stand-in is what dynamo traces);
  3. torch.compile of the Llama: as many graphs and graph breaks with the hooks on as paused, and
     the same loss.
Exits 1 on a failed check.
"""

import argparse
import inspect
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _TinyLM(nn, layers):
    """A decoder-shaped stand-in for the Llama where transformers is missing: embedding, layers of
    (norm, attention-ish, norm, MLP), head; called like a causal LM, returns an object with .loss."""
    import types

    import torch

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.LayerNorm(64)
            self.self_attn = nn.Linear(64, 64)
            self.post_attention_layernorm = nn.LayerNorm(64)
            self.mlp = nn.Sequential(nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 64))

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(1000, 64)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, input_ids):
            x = self.embed_tokens(input_ids)
            for layer in self.layers:
                x = layer(x)
            return x

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.model = Body()
            self.lm_head = nn.Linear(64, 1000)

        def forward(self, input_ids, labels=None, use_cache=False):
            logits = self.lm_head(self.model(input_ids))
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
            return types.SimpleNamespace(loss=loss, logits=logits)

    return TinyLM()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)

    import torch
    from torch import nn

    import actpage_hooks
    from actpage_hooks import _hooks
    from check_hooks import build, report

    failures = []
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    hooks = actpage_hooks.installed()
    if hooks is None:  # not under `actpage run`: install them here (ranges go to NVTX, nowhere)
        hooks = actpage_hooks.install(mode="on", force=True)
    fast = hooks._fast
    print("torch %s, device %s, C forward: %s (support: %s)" % (
        torch.__version__, device, fast is not None, _hooks.fast_forward_support(fast)))
    if fast is None:
        failures.append("the C forward is not in use (extension missing, or this torch cannot trace it)")

    try:
        model = build("llama", args.layers, device)
    except ImportError:  # no transformers (the CPU machine): a stand-in with the same call
        model = _TinyLM(nn, args.layers).to(device)
        print("no transformers: a stand-in language model")
    ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1)).to(device)

    def loss_and_grads(call=None):
        model.zero_grad(set_to_none=True)
        loss = (call if call is not None else model)(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    # 1. eager
    actpage_hooks.set_paused(False)
    loss_and_grads()  # the first call finds the model and wraps its modules
    before = fast.counters() if fast is not None else (0, 0)
    loss_on, grads_on = loss_and_grads()
    after = fast.counters() if fast is not None else (0, 0)
    actpage_hooks.set_paused(True)
    loss_off, grads_off = loss_and_grads()
    actpage_hooks.set_paused(False)
    fast_wrapped = [m for m in model.modules() if isinstance(m.__dict__.get("forward"), _hooks._FastForward)]
    fast_calls, fallback_calls = after[0] - before[0], after[1] - before[1]
    print("eager: modules with the C forward %d of %d wrapped; one step: %d C calls, %d handed to Python"
          % (len(fast_wrapped), len(hooks.wrapped), fast_calls, fallback_calls))
    if fast is not None and (not fast_wrapped or fast_calls == 0):
        failures.append("no module went through the C forward")
    if not torch.equal(loss_on, loss_off):
        failures.append("eager loss differs with the hooks: %r vs %r" % (loss_on.item(), loss_off.item()))
    differing = [n for n in grads_off if not torch.equal(grads_off[n], grads_on.get(n))]
    if differing:
        failures.append("eager gradients differ with the hooks: %s" % differing[:5])
    if fast_wrapped:
        module = fast_wrapped[0]
        got = inspect.signature(module.forward)
        want = inspect.signature(type(module).forward.__get__(module))
        if got != want:
            failures.append("signature of a C-wrapped forward is %s, expected %s" % (got, want))

    if not hasattr(torch, "compile"):
        print("torch.compile: not in this torch, skipped")
    else:
        import torch._dynamo

        print("stand-in registered: %s" % (_hooks._stand_in_state,))

        # 2. toy stack, fullgraph
        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(32)
                self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

            def forward(self, x, scale=1.0):
                return x + scale * self.mlp(self.norm(x))

        class Toy(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList(Block() for _ in range(3))

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x, scale=0.5)
                return x

        toy = Toy().to(device)
        x = torch.randn(4, 32, device=device)
        hooks.name_of(toy)
        hooks._hook_tree(toy)  # (the hooks found their model already: this one is handed to them)
        expected = toy(x)
        toy_fast = [m for m in toy.modules() if isinstance(m.__dict__.get("forward"), _hooks._FastForward)]
        torch._dynamo.reset()
        try:
            got = torch.compile(toy, backend="eager", fullgraph=True)(x)
            same = torch.equal(got, expected)
            print("toy: %d modules with the C forward, fullgraph compile ok, same output: %s" % (len(toy_fast), same))
            if not same:
                failures.append("toy: compiled output differs")
            if fast is not None and not toy_fast:
                failures.append("toy: no module has the C forward")
        except Exception as error:
            failures.append("toy: fullgraph compile failed: %s" % (str(error).splitlines()[0][:300],))

        # 3. the Llama, compiled, paused against on
        def explain():
            torch._dynamo.reset()
            report = torch._dynamo.explain(model)(input_ids=ids, labels=ids, use_cache=False)
            return report.graph_count, report.graph_break_count, [str(b.reason)[:160] for b in report.break_reasons[:3]]

        actpage_hooks.set_paused(True)
        plain = explain()
        actpage_hooks.set_paused(False)
        hooked = explain()
        print("llama explain, paused: %d graphs, %d breaks %s" % plain)
        print("llama explain, on:     %d graphs, %d breaks %s" % hooked)
        if hooked[:2] != plain[:2]:
            failures.append("torch.compile splits the hooked model differently: %s vs %s" % (hooked[:2], plain[:2]))
        torch._dynamo.reset()
        loss_compiled, _ = loss_and_grads(torch.compile(model, backend="eager"))
        print("llama compiled loss %r, eager %r" % (loss_compiled.item(), loss_on.item()))
        if not torch.equal(loss_compiled, loss_on):
            failures.append("compiled loss differs: %r vs %r" % (loss_compiled.item(), loss_on.item()))

    return report("compile check", failures)


if __name__ == "__main__":
    sys.exit(main())
