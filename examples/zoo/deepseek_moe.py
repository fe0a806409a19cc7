#!/usr/bin/env python3
"""Zoo: a DeepSeek-style mixture of experts written in pure torch (moe_model.py), the second router
family beside Qwen3-MoE's softmax: sigmoid scores, top-k selection, gates normalised over the chosen
experts, one shared expert beside the routed ones, DeepSeek-V3's sequence-wise balance loss, and
token dispatch by a stable sort and index_select/index_add_ (no expert parallelism). Multi-head
attention with rotary embeddings (not DeepSeek's MLA); every layer is an MoE layer.

Stands for: fine-tuning or pre-training a fine-grained MoE (DeepSeek-V2/V3-like) on one GPU.
Defaults: 8 layers, hidden 1024, 16 heads, 32 routed experts of ffn 704, top-6, 1 shared expert of
the same width, routed scaling 1.0, balance alpha 1e-4, vocab 32000, seq 4096, batch 4, bf16 weights,
AdamW (common.train's loop), 12 steps (3 warm-up). One host synchronisation per MoE layer (the
per-expert token counts), as the reference implementations have.
Methods: none, checkpointing (per decoder layer, non-reentrant), save_on_cpu, stream_offload
(default --offload-modules MoEBlock: the DeepSeekMoEBlock modules, router, experts and shared expert).

Deterministic with --deterministic, by the choice of ops: index_select, index_add_, gather, sort,
bincount without weights, topk for indices only (see moe_model.py). Checked on the CPU (two runs give
the same bits); that the CUDA kernels of these ops repeat bit for bit in deterministic mode is what
torch documents, and must be checked on the GPU (two runs of this script).

    python3 examples/zoo/deepseek_moe.py --deterministic
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo_common  # noqa: E402  (puts examples/ on the path)
import common  # noqa: E402

NAME = "deepseek_moe"
METHODS = ("none", "checkpointing", "save_on_cpu", "stream_offload")
TINY = dict(layers=2, hidden=32, heads=4, experts=6, top_k=2, expert_ffn=16, vocab=64, seq=16, batch=2)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("model (DeepSeek-style MoE, moe_model.py)")
    group.add_argument("--layers", type=int, default=8, help="decoder layers, all MoE (default 8)")
    group.add_argument("--hidden", type=int, default=1024, help="hidden size (default 1024)")
    group.add_argument("--heads", type=int, default=16, help="attention heads (default 16)")
    group.add_argument("--experts", type=int, default=32, help="routed experts (default 32)")
    group.add_argument("--top-k", type=int, default=6, help="routed experts per token (default 6)")
    group.add_argument("--expert-ffn", type=int, default=704, help="each expert's ffn width (default 704)")
    group.add_argument("--shared-experts", type=int, default=1,
                       help="shared experts, as one SwiGLU of this many expert widths (default 1)")
    group.add_argument("--routed-scaling", type=float, default=1.0, help="routed_scaling_factor (default 1.0)")
    group.add_argument("--balance-alpha", type=float, default=1e-4,
                       help="sequence-wise balance loss weight, 0 off (default 1e-4)")
    group.add_argument("--vocab", type=int, default=32000, help="vocab size (default 32000)")
    zoo_common.add_zoo_arguments(parser, METHODS, default_offload_modules="MoEBlock", default_seq=4096,
                                 default_batch=4)
    args = zoo_common.parse_zoo_args(parser, argv, TINY)
    if not 1 <= args.top_k <= args.experts:
        parser.error("--top-k must be between 1 and --experts")
    return args


def main(argv=None, out=None):
    args = parse_args(argv)
    torch = common.prepare_process(args)
    import moe_model

    device = common.pick_device(args)
    torch.manual_seed(args.seed)
    model = moe_model.deepseek_moe(args.vocab, args.hidden, args.layers, args.heads, args.experts, args.top_k,
                                   args.expert_ffn, args.shared_experts, args.routed_scaling, args.balance_alpha)
    model = model.to(device=device, dtype=common.torch_dtype(args.dtype))
    config = {"model": "DeepSeekForCausalLM (pure torch, moe_model.py)", "router": "sigmoid top-k, normalised gates",
              "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "experts": args.experts,
              "top_k": args.top_k, "expert_ffn": args.expert_ffn, "shared_experts": args.shared_experts,
              "routed_scaling": args.routed_scaling, "balance_alpha": args.balance_alpha, "vocab": args.vocab,
              "seq": args.seq, "batch": args.batch, "dtype": args.dtype,
              "parameters": sum(p.numel() for p in model.parameters())}
    job = common.Job(NAME, model, common.random_token_batches(args.vocab, args.batch, args.seq, args.seed, device),
                     zoo_common.causal_lm_loss, config, result_fields=zoo_common.determinism_fields(args))
    return common.train(job, args, out=out)


if __name__ == "__main__":
    main()
    sys.exit(0)
