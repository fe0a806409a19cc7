#!/usr/bin/env python3
"""Zoo: a 2-GPU FSDP2 job under torchrun: Hugging Face LlamaForCausalLM with random weights (the same
on every rank), fully_shard applied to each decoder layer and to the root (examples/
train_distributed.py's wrap), NCCL, each rank on its own batches, common.train's loop on every rank.

Stands for: data-parallel training with parameter sharding (FSDP2, torchtitan-style) on one node.
Defaults: hidden 2048, ffn 5632, 16 layers, 16 heads, vocab 32000, seq 4096, batch 2 per rank, bf16
weights, AdamW, SDPA attention, 12 steps (3 warm-up).
Methods: none, checkpointing (Hugging Face gradient checkpointing, enabled before sharding),
save_on_cpu, stream_offload (default --offload-modules MLP).
Deterministic with --deterministic, on a fixed machine and rank count (NCCL's reductions repeat their
order); to be confirmed on the GPUs.

Only rank 0 prints the ACTPAGE_RESULT line: its own fields (losses, step times are rank 0's: the
ranks step together), `ranks` with each rank's {rank, device_used_peak_mib, device_used_steady_peak_mib,
torch_peak_mib, median_step_ms, median_fwd_ms, losses}, and the aggregates device_used_peak_mib,
device_used_steady_peak_mib and torch_peak_mib as the maximum over the ranks, median_step_ms_slowest_rank the slowest rank's median.

--parallel ddp (DistributedDataParallel, no sharding) is for a torch without fully_shard: the CPU
tests run two gloo processes that way on torch 1.13. On such a torch, --parallel fsdp2 stops with a
clear message before anything starts.

    torchrun --nproc-per-node 2 examples/zoo/fsdp2.py --deterministic
"""

import argparse
import copy
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo_common  # noqa: E402  (puts examples/ on the path)
import common  # noqa: E402
import train_distributed  # noqa: E402

NAME = "fsdp2"
METHODS = ("none", "checkpointing", "save_on_cpu", "stream_offload")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parallel", choices=("fsdp2", "ddp"), default="fsdp2",
                        help="fsdp2: fully_shard per decoder layer and the root (default); ddp: "
                             "DistributedDataParallel, for a torch without fully_shard (CPU tests)")
    parser.add_argument("--backend", default=None, help="process group backend (default: nccl on CUDA, gloo on CPU)")
    zoo_common.add_llama_arguments(parser, layers=16, hidden=2048, ffn=5632, heads=16)
    zoo_common.add_zoo_arguments(parser, METHODS, default_offload_modules="MLP", default_seq=4096, default_batch=2)
    args = zoo_common.parse_zoo_args(parser, argv, zoo_common.LLAMA_TINY)
    if args.parallel == "ddp" and args.method == "checkpointing":
        parser.error("--method checkpointing is for --parallel fsdp2 (DistributedDataParallel hides the model's "
                     "gradient_checkpointing_enable from the loop)")
    return args


SUMMARY_FIELDS = ("device_used_peak_mib", "device_used_steady_peak_mib", "torch_peak_mib", "median_step_ms",
                  "median_fwd_ms")


def gather_summaries(dist, torch, result, rank, world, device):
    """Every rank's {rank, SUMMARY_FIELDS..., losses}, gathered as float64 tensors (exact for the loss
    values). Returns (summaries, tensors): keep the tensors referenced until the process group is
    destroyed. (all_gather_object let a gloo worker thread free the last Python-owned tensor while the
    main thread, holding the GIL, joined it at teardown: torch 1.13 hung there.)"""
    nan = float("nan")
    values = [float(rank)] + [nan if result.get(key) is None else float(result[key]) for key in SUMMARY_FIELDS]
    values += [float.fromhex(h) for h in result["losses"]]
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    summaries = []
    for gathered in everyone:
        row = gathered.tolist()
        summary = {"rank": int(row[0])}
        for key, value in zip(SUMMARY_FIELDS, row[1:1 + len(SUMMARY_FIELDS)]):
            summary[key] = None if value != value else value
        summary["losses"] = [float(v).hex() for v in row[1 + len(SUMMARY_FIELDS):]]
        summaries.append(summary)
    return summaries, (mine, everyone)


def merge_ranks(rank0_result, summaries):
    """Rank 0's result with every rank's summary and the aggregates (peaks: the maximum over ranks)."""
    def largest(key):
        values = [s[key] for s in summaries if s.get(key) is not None]
        return max(values) if values else None

    merged = dict(rank0_result)
    merged["ranks"] = sorted(summaries, key=lambda s: s["rank"])
    merged["world_size"] = len(summaries)
    merged["device_used_peak_mib"] = largest("device_used_peak_mib")
    merged["device_used_steady_peak_mib"] = largest("device_used_steady_peak_mib")
    merged["torch_peak_mib"] = largest("torch_peak_mib")
    merged["median_step_ms_slowest_rank"] = largest("median_step_ms")
    return merged


def main(argv=None, out=None):
    args = parse_args(argv)
    rank, world, local_rank = train_distributed.distributed_environment()
    if args.parallel == "fsdp2":
        train_distributed.fully_shard_function()  # a clear exit on a torch without it, before anything starts
    torch = common.prepare_process(args)
    device = train_distributed.rank_device(torch, args, local_rank)
    backend = args.backend or ("nccl" if device.type == "cuda" else "gloo")
    dist = train_distributed.init_process_group(torch, backend, device, rank, world)
    try:
        model, described = zoo_common.build_llama(args, device, common.torch_dtype(args.dtype))
        if args.method == "checkpointing":
            common.enable_checkpointing(model)  # before sharding, as torchtitan applies it
        model = train_distributed.wrap(args, model, device)
        described.update(parallel=args.parallel, world_size=world, backend=backend, seq=args.seq, batch=args.batch,
                         dtype=args.dtype)
        batches = common.random_token_batches(args.vocab, args.batch, args.seq, args.seed + 7919 * rank, device)
        job = common.Job(NAME, model, batches, zoo_common.causal_lm_loss, described,
                         result_fields=zoo_common.determinism_fields(args))
        rank_args = copy.copy(args)
        rank_args.result_json = None  # rank 0 writes the merged result below
        result = common.train(job, rank_args, out=io.StringIO())  # every rank's own line stays unprinted
        summaries, gathered = gather_summaries(dist, torch, result, rank, world, device)  # noqa: F841 (kept alive)
        merged = merge_ranks(result, summaries)
        if rank == 0:
            common.emit_result(merged, out, args.result_json)
    finally:
        dist.destroy_process_group()
    return merged


if __name__ == "__main__":
    main()
    sys.exit(0)
