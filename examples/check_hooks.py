#!/usr/bin/env python3
"""Checks actpage's Python module hooks on a real Hugging Face model (GPU machine: torch 2.x).

Builds a small LlamaForCausalLM (or Qwen3MoeForCausalLM) from a config with random weights, installs
the hooks with a recorder in place of NVTX, runs one training step and checks that
  - every pushed range is popped, forward ranges nest like the modules,
  - names are module paths (root = class name, "model.layers.1.mlp", ...),
  - each module's "<path>.backward" marker fires once, in the reverse order of forward completion,
  - the loss and gradients are bit-identical to a run without hooks.
Prints a summary and exits 1 on a failed check.

    python3 examples/check_hooks.py [--model llama|qwen3_moe] [--layers 2] [--device cuda]
"""

import argparse
import copy
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "python"))


class Recorder:
    def __init__(self):
        self.events = []
        self.depth = 0
        self.max_depth = 0
        self.underflow = False

    def push(self, name):
        self.events.append(name)
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)

    def pop(self):
        self.events.append(None)
        self.depth -= 1
        self.underflow = self.underflow or self.depth < 0


def build(kind, layers, device):
    import torch

    if kind == "llama":
        from transformers import LlamaConfig as Config, LlamaForCausalLM as Model

        config = Config(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512, use_cache=False)
    else:
        from transformers import Qwen3MoeConfig as Config, Qwen3MoeForCausalLM as Model

        config = Config(vocab_size=1000, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                        num_experts=4, num_experts_per_tok=2, max_position_embeddings=512, use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Model(config).to(device)


def step(model, ids):
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("llama", "qwen3_moe"), default="llama")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)

    import torch

    import actpage_hooks

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.use_deterministic_algorithms(True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    reference = build(args.model, args.layers, device)
    hooked = copy.deepcopy(reference)
    ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1)).to(device)
    loss_a, grads_a = step(reference, ids)

    rec = Recorder()
    hooks = actpage_hooks.install(mode="on", push=rec.push, pop=rec.pop)
    print("torch %s, device %s, backward markers via %s" % (
        torch.__version__, device, "grad_fn pre-hooks" if hooks.use_node_prehook else "tensor hooks"))
    loss_b, grads_b = step(hooked, ids)
    torch.cuda.synchronize() if device.type == "cuda" else None

    failures = []
    stack, completed, backward = [], [], []
    for event in rec.events:
        if event is None:
            if stack:
                completed.append(stack.pop())
        elif event.endswith(".backward"):
            backward.append(event[: -len(".backward")])
        else:
            stack.append(event)
    pushes = sum(1 for e in rec.events if e is not None)
    if rec.depth != 0 or rec.underflow or pushes != len(rec.events) - pushes:
        failures.append("unbalanced ranges: depth %d, underflow %s" % (rec.depth, rec.underflow))
    forward = [e for e in rec.events if e is not None and not e.endswith(".backward")]
    expected_root = type(hooked).__name__
    if not forward or forward[0] != expected_root:
        failures.append("first range is %r, expected %r" % (forward[:1], expected_root))
    if "model.layers.%d.mlp" % (args.layers - 1) not in forward:
        failures.append("no range named model.layers.%d.mlp" % (args.layers - 1))
    # Markers come in reverse completion order, for the modules whose outputs needed grad.
    want = [name for name in reversed(completed) if name in set(backward)]
    if backward != want:
        first = next((i for i, (a, b) in enumerate(zip(backward, want)) if a != b), None)
        failures.append("backward markers out of order at %s: got %s, expected %s" % (
            first, backward[first:first + 4] if first is not None else backward,
            want[first:first + 4] if first is not None else want))
    if len(set(backward)) != len(backward) and len(set(forward)) == len(forward):
        failures.append("a marker fired twice")
    missing = [name for name in completed if name not in set(backward)]
    if not torch.equal(loss_a, loss_b):
        failures.append("loss differs with hooks: %r vs %r" % (loss_a.item(), loss_b.item()))
    differing = [n for n in grads_a if not torch.equal(grads_a[n], grads_b.get(n))]
    if differing:
        failures.append("gradients differ with hooks: %s" % differing[:5])

    print("forward ranges: %d (max depth %d), backward markers: %d, modules without a marker: %d" % (
        len(forward), rec.max_depth, len(backward), len(missing)))
    print("first ranges: %s" % forward[:8])
    print("first markers: %s" % backward[:8])
    if missing:
        print("no marker (outputs need no grad, or shared with a module that marks): %s" % sorted(set(missing))[:10])
    return report("hooks check", failures)


def report(check, failures):
    """Prints each failure and the check's verdict; the exit code (1 on a failure)."""
    for failure in failures:
        print("FAILED: " + failure)
    print("%s: %s" % (check, "FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
