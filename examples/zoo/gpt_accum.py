#!/usr/bin/env python3
"""Zoo: a hand-written GPT training script in the style of nanoGPT's train.py, with its own loop:
gradient accumulation (several forward/backward passes per optimizer step), fp32 master weights
under torch.autocast(bfloat16), gradient clipping, AdamW with weight decay on the matrices only,
warm-up then cosine learning rate, and an evaluation pass under torch.no_grad() every few steps.

Stands for: the public GPT-style training scripts people copy and edit (nanoGPT, minGPT, course code).
Defaults: GPT-2 medium's shape (24 layers, n_embd 1024, 16 heads, ~350M parameters), vocab 50304,
tied head, seq (block size) 1024, micro-batch 8, --accum 4 micro-batches per optimizer step,
--eval-every 4 steps over --eval-batches 2 fixed held-out batches, lr 6e-4, clip 1.0, bf16 autocast,
12 optimizer steps (3 warm-up).
Methods: none, checkpointing (torch.utils.checkpoint per Block, non-reentrant), save_on_cpu and
stream_offload (default --offload-modules MLP) around each micro-batch's forward pass.
Under autocast the bf16 copies of the fp32 weights are saved tensors too: stream_offload (which skips
only parameters) and save_on_cpu copy them with the activations, once per micro-batch.
Deterministic with --deterministic (SDPA, embedding, fused AdamW and clipping have deterministic
CUDA kernels in that mode).

The result adds: microbatches, microbatch_losses (hex, per step), eval_losses (hex), eval_steps,
eval_ms, grad_norms, lrs. `losses` are per optimizer step: the mean of its micro-batches' losses.

    python3 examples/zoo/gpt_accum.py --deterministic
"""

import argparse
import inspect
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo_common  # noqa: E402  (puts examples/ on the path)
import common  # noqa: E402
import gpt_model  # noqa: E402

NAME = "gpt_accum"
METHODS = ("none", "checkpointing", "save_on_cpu", "stream_offload")
TINY = dict(gpt_model.GPT_TINY, accum=2, eval_every=2, eval_batches=1)
EVAL_SEED_OFFSET = 10 ** 12  # held-out batches come from a seed range the training batches never use


def add_loop_arguments(parser, accum):
    group = parser.add_argument_group("training loop (nanoGPT-style)")
    if accum is not None:
        group.add_argument("--accum", type=int, default=accum,
                           help="gradient_accumulation_steps: micro-batches per optimizer step (default %(default)s)")
        group.add_argument("--eval-every", type=int, default=4,
                           help="evaluate after every N optimizer steps, 0 never (default %(default)s)")
        group.add_argument("--eval-batches", type=int, default=2, help="held-out batches per evaluation (default 2)")
    group.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient norm, 0 off (default 1.0)")
    group.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay of matrices (default 0.1)")
    group.add_argument("--lr-warmup", type=int, default=2, help="linear warm-up steps, then cosine (default 2)")
    return group


NANOGPT_LR = 6e-4  # set after add_zoo_arguments: set_defaults changes the default of a flag already added


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gpt_model.add_gpt_arguments(parser, layers=24, n_embd=1024, n_head=16)
    add_loop_arguments(parser, accum=4)
    zoo_common.add_zoo_arguments(parser, METHODS, default_offload_modules="MLP", default_seq=1024, default_batch=8)
    parser.set_defaults(lr=NANOGPT_LR)
    args = zoo_common.parse_zoo_args(parser, argv, TINY, own_loop=True, dtypes=("bf16", "fp32"))
    if args.accum < 1 or args.eval_every < 0 or args.eval_batches < 1:
        parser.error("--accum and --eval-batches must be at least 1, --eval-every at least 0")
    return args


def token_batch(vocab, batch, seq, seed, device):
    """(inputs, targets): random tokens from a generator seeded by `seed` (the same on every machine),
    targets the inputs shifted by one; pinned and copied asynchronously on CUDA, as nanoGPT's get_batch."""
    import torch

    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(int(seed)))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    if device.type == "cuda":
        return inputs.pin_memory().to(device, non_blocking=True), targets.pin_memory().to(device, non_blocking=True)
    return inputs.to(device), targets.to(device)


def train_seed(seed, step, micro):
    return int(seed) * 1000003 + step * 4099 + micro


def learning_rate(step, args):
    """nanoGPT's schedule: linear warm-up, then cosine decay to a tenth over the run."""
    if step < args.lr_warmup:
        return args.lr * (step + 1) / args.lr_warmup
    span = max(1, args.steps - args.lr_warmup)
    ratio = min(1.0, (step - args.lr_warmup) / span)
    return args.lr / 10 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.lr - args.lr / 10)


def configure_optimizer(model, args, cuda):
    """AdamW with weight decay on the matrices (dim >= 2) only, fused on CUDA where torch has it."""
    import torch

    parameters = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in parameters if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}]
    extra = {}
    if cuda and "fused" in inspect.signature(torch.optim.AdamW).parameters:
        extra["fused"] = True
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), **extra)


def estimate_loss(model, batches, device, dtype):
    """Mean loss over fixed held-out batches, in eval mode under torch.no_grad(); train mode after."""
    import torch

    model.eval()
    try:
        with torch.no_grad():
            values = []
            for inputs, targets in batches:
                with zoo_common.autocast_context(device, dtype):
                    _, loss = model(inputs, targets)
                values.append(float(loss.float().item()))
    finally:
        model.train()
    return sum(values) / len(values)


def train_loop(args, model, device, name, config, microbatches, eval_every, eval_batches, extra=None):
    """Runs args.steps optimizer steps of `microbatches` forward/backward passes each and returns the
    result (the caller prints it). checkpointing must already be enabled on the model (before
    compiling it)."""
    import torch

    cuda = device.type == "cuda"
    optimizer = configure_optimizer(model, args, cuda)
    forward_context, offload = zoo_common.method_forward_context(args.method, model, args, device)
    held_out = [token_batch(args.vocab, args.batch, args.seq, args.seed * 1000003 + EVAL_SEED_OFFSET + i, device)
                for i in range(eval_batches if eval_every else 0)]
    sampler = zoo_common.start_memory_sampler(device, args)
    model.train()
    losses, microbatch_losses, step_ms, fwd_ms, bwd_ms, grad_norms, lrs = [], [], [], [], [], [], []
    eval_losses, eval_steps, eval_ms = [], [], []
    try:
        for step in range(args.steps):
            lr = learning_rate(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr
            timer = zoo_common.PhaseTimer(cuda)
            zoo_common.synchronize(device)
            start = time.perf_counter()
            step_losses = []
            for micro in range(microbatches):
                inputs, targets = token_batch(args.vocab, args.batch, args.seq, train_seed(args.seed, step, micro),
                                              device)
                timer.start("forward")
                with zoo_common.autocast_context(device, args.dtype), forward_context():
                    _, loss = model(inputs, targets)
                timer.stop("forward")
                step_losses.append(loss.detach())
                timer.start("backward")
                (loss / microbatches).backward()  # gradients of the mean over the micro-batches
                timer.stop("backward")
                del loss
            grad_norm = None
            if args.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            zoo_common.synchronize(device)
            step_ms.append((time.perf_counter() - start) * 1000.0)
            sampler.step_ended()
            fwd_ms.append(timer.total_ms("forward"))
            bwd_ms.append(timer.total_ms("backward"))
            values = [float(v.float().item()) for v in step_losses]
            losses.append(sum(values) / len(values))
            microbatch_losses.append([v.hex() for v in values])
            grad_norms.append(None if grad_norm is None else float(grad_norm))
            lrs.append(lr)
            if eval_every and (step + 1) % eval_every == 0:
                eval_start = time.perf_counter()
                eval_losses.append(estimate_loss(model, held_out, device, args.dtype))
                zoo_common.synchronize(device)
                eval_ms.append(round((time.perf_counter() - eval_start) * 1000.0, 3))
                eval_steps.append(step)
    finally:
        sampler.stop()
    fields = {"microbatches": microbatches, "microbatch_losses": microbatch_losses,
              "eval_every": eval_every, "eval_losses": [v.hex() for v in eval_losses],
              "eval_loss_values": eval_losses, "eval_steps": eval_steps, "eval_ms": eval_ms,
              "grad_norms": grad_norms, "lrs": lrs}
    if offload is not None:
        fields["stream_offload"] = offload.stats()
    fields.update(extra or {})
    return zoo_common.loop_result(name, args, device, config, losses, step_ms, fwd_ms, bwd_ms, sampler, fields)


def main(argv=None, out=None):
    args = parse_args(argv)
    common.prepare_process(args)
    device = common.pick_device(args)
    model, config = gpt_model.build_gpt(args, device)
    if args.method == "checkpointing":
        model.gradient_checkpointing_enable()
        config["checkpointing"] = "per Block: torch.utils.checkpoint, non-reentrant"
    config.update(accum=args.accum, eval_every=args.eval_every, eval_batches=args.eval_batches,
                  grad_clip=args.grad_clip, lr=args.lr)
    result = train_loop(args, model, device, NAME, config, args.accum, args.eval_every, args.eval_batches,
                        extra=zoo_common.determinism_fields(args))
    common.emit_result(result, out, args.result_json)
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
