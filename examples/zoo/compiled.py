#!/usr/bin/env python3
"""Zoo: a torch.compile'd job, the GPT of gpt_accum.py without gradient accumulation or evaluation,
compiled whole with torch.compile(model) (default mode, inductor), trained by gpt_accum.py's loop.

Stands for: a training script that turned on torch.compile for speed (the 2.x default advice).
Defaults: GPT with 4 layers (a short compile), n_embd 2048, 16 heads, vocab 50304, tied head, seq
2048, batch 8, one micro-batch per step, fp32 master weights under bf16 autocast, lr 6e-4, clip 1.0,
12 steps, of which the first --warmup 3 (the compiling ones: the first step compiles forward and
backward) are left out of the medians; `compile_step_ms` is the first step's time.
Methods: none, checkpointing (torch.utils.checkpoint per Block inside the compiled model).
save_on_cpu and stream_offload are not offered: saved-tensor hooks and module hooks inside a
compiled graph are a different thing from the eager job's, and were not checked.

Compiled losses are comparable to compiled runs only (inductor's kernels differ from eager ones):
the result says `compiled: true`. Deterministic: with --deterministic, torch sets inductor's own
deterministic mode (torch._inductor.config.deterministic, no benchmark-based kernel choice), which
aims at bit-identical runs; the result records that setting, and where this torch's inductor has no
such mode the result says the run is not deterministic and gives a tolerance. --no-compile runs the
same job eagerly (what the CPU tests run: torch 1.13 has no torch.compile).

    python3 examples/zoo/compiled.py --deterministic
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo_common  # noqa: E402  (puts examples/ on the path)
import common  # noqa: E402
import gpt_accum  # noqa: E402
import gpt_model  # noqa: E402

NAME = "compiled"
METHODS = ("none", "checkpointing")
NO_INDUCTOR_DETERMINISM = ("this torch's inductor has no deterministic mode: Triton kernels tuned by timing may differ "
                           "from run to run")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gpt_model.add_gpt_arguments(parser, layers=4, n_embd=2048, n_head=16)
    gpt_accum.add_loop_arguments(parser, accum=None)
    parser.add_argument("--no-compile", action="store_true", help="run the same job eagerly")
    zoo_common.add_zoo_arguments(parser, METHODS, default_offload_modules="MLP", default_seq=2048, default_batch=8)
    parser.set_defaults(lr=gpt_accum.NANOGPT_LR)
    return zoo_common.parse_zoo_args(parser, argv, gpt_model.GPT_TINY, own_loop=True, dtypes=("bf16", "fp32"))


def compile_model(torch, model):
    """torch.compile(model), or a clear exit on a torch without it."""
    if not hasattr(torch, "compile"):
        raise SystemExit("compiled.py: torch.compile needs torch >= 2.0, this is torch %s; --no-compile runs the "
                         "same job eagerly" % torch.__version__)
    return torch.compile(model)


def inductor_deterministic(torch):
    """torch._inductor.config.deterministic (set by torch.use_deterministic_algorithms on recent
    torch), or None where this torch has no such setting."""
    try:
        import torch._inductor.config as inductor_config
    except Exception:
        return None
    value = getattr(inductor_config, "deterministic", None)
    return None if value is None else bool(value)


def main(argv=None, out=None):
    args = parse_args(argv)
    torch = common.prepare_process(args)
    device = common.pick_device(args)
    model, config = gpt_model.build_gpt(args, device)
    if args.method == "checkpointing":
        model.gradient_checkpointing_enable()  # before compiling: the compiled graph includes it
        config["checkpointing"] = "per Block: torch.utils.checkpoint, non-reentrant, inside the compiled graph"
    compiled = not args.no_compile
    extra = {"compiled": compiled}
    blocker = None
    if compiled:
        model = compile_model(torch, model)
        extra["compile_mode"] = "default"
        extra["inductor_deterministic"] = inductor_deterministic(torch)
        if args.deterministic and not extra["inductor_deterministic"]:
            blocker = NO_INDUCTOR_DETERMINISM
    config.update(compiled=compiled, grad_clip=args.grad_clip, lr=args.lr)
    extra.update(zoo_common.determinism_fields(args, blocker))
    result = gpt_accum.train_loop(args, model, device, NAME, config, microbatches=1, eval_every=0, eval_batches=0,
                                  extra=extra)
    result["compile_step_ms"] = result["step_ms"][0] if result["step_ms"] else None
    common.emit_result(result, out, args.result_json)
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
