"""Per-module cost of actpage's Python hooks: forward+backward of a deep stack of small modules,
with and without the hooks (push/pop replaced by no-op functions, so only the hooks' own Python work
is measured). Run with a torch that has the hooks' features; prints microseconds per module call.

    python3 bench/python/hooks_overhead.py [--layers 200] [--reps 20]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import torch  # noqa: E402

import actpage_hooks  # noqa: E402


class Attention(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.q_proj = torch.nn.Linear(width, width)
        self.k_proj = torch.nn.Linear(width, width)
        self.v_proj = torch.nn.Linear(width, width)
        self.o_proj = torch.nn.Linear(width, width)

    def forward(self, x):
        weights = torch.softmax(self.q_proj(x) @ self.k_proj(x).transpose(-1, -2), dim=-1)
        return self.o_proj(weights @ self.v_proj(x))


class MLP(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.gate_proj = torch.nn.Linear(width, 2 * width)
        self.up_proj = torch.nn.Linear(width, 2 * width)
        self.down_proj = torch.nn.Linear(2 * width, width)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Block(torch.nn.Module):
    """A decoder layer's shape: 13 modules, as in Llama."""

    def __init__(self, width):
        super().__init__()
        self.input_layernorm = torch.nn.LayerNorm(width)
        self.self_attn = Attention(width)
        self.post_attention_layernorm = torch.nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(torch.nn.Module):
    def __init__(self, layers, width=8):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(width) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def run(model, x, reps):
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        model(x).sum().backward()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(2, 8, requires_grad=True)
    calls = [0]

    def push(name):
        calls[0] += 1

    def pop():
        pass

    # A model of transformer shape: layers in a ModuleList, each with a few leaves.
    model = Model(args.layers)
    modules = sum(1 for _ in model.modules()) - 1  # the ModuleList is never called
    for scope, backward, call in (("all", "hooked", "hooks"), ("blocks", "hooked", "hooks"),
                                  ("blocks", "layers", "hooks"), ("blocks", "layers", "wrap")):
        plain = run(model, x, args.reps)  # measured next to each variant: the host drifts
        actpage_hooks.install(mode="on", push=push, pop=pop, scope=scope, backward=backward, call=call)
        hooked = run(model, x, args.reps)
        hooks = actpage_hooks.installed()
        hooked_modules = len(hooks.hooked) if scope == "blocks" else modules
        marked = modules if scope == "all" else sum(1 for m in hooks.hooked if m.__dict__.get("_actpage_marks_backward"))
        actpage_hooks.uninstall()
        print("scope %-6s backward %-6s call %-5s: %d of %d module calls hooked, %d mark backward: plain %.2f ms, hooked %.2f ms, "
              "+%.2f us per module call, +%.2f us per hooked call"
              % (scope, backward, call, hooked_modules, modules, marked, plain * 1e3, hooked * 1e3,
                 (hooked - plain) / modules * 1e6, (hooked - plain) / hooked_modules * 1e6))


if __name__ == "__main__":
    main()
