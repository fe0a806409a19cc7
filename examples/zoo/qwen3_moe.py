#!/usr/bin/env python3
"""Zoo: Hugging Face Qwen3MoeForCausalLM, a mixture of experts with a softmax top-k router
(renormalised over the chosen experts), random weights from a config (nothing downloaded), the model
set-up of examples/train_qwen3_moe.py at zoo sizes, trained by common.train's loop.

Stands for: fine-tuning a Qwen3-MoE / Mixtral-style sparse model on one GPU.
Defaults: 8 layers, hidden 1024, 16 experts, top-4, moe ffn 768, 16 heads (4 KV heads, head dim 64),
vocab 32000, seq 4096, batch 4 (twice the tokens of FACTS.md's 66-73 ms run, so a step is long enough
to measure), bf16 weights, AdamW, SDPA attention, 12 steps (3 warm-up).
Methods: none, checkpointing (Hugging Face gradient checkpointing, non-reentrant), save_on_cpu,
stream_offload (default --offload-modules SparseMoeBlock: Qwen3MoeSparseMoeBlock).
Deterministic with --deterministic (FACTS.md: two runs of Qwen3-MoE repeated their losses).
--tiny: a pure-torch stand-in with the same router family (tiny_models.py), no transformers.

    python3 examples/zoo/qwen3_moe.py --deterministic
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo_common  # noqa: E402  (puts examples/ on the path)
import common  # noqa: E402

NAME = "qwen3_moe"
METHODS = ("none", "checkpointing", "save_on_cpu", "stream_offload")
TINY = dict(layers=2, hidden=32, experts=4, top_k=2, moe_ffn=16, heads=4, kv_heads=2, head_dim=8, vocab=64, seq=16,
            batch=2)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("model (Qwen3MoeConfig)")
    group.add_argument("--layers", type=int, default=8, help="num_hidden_layers (default 8)")
    group.add_argument("--hidden", type=int, default=1024, help="hidden_size (default 1024)")
    group.add_argument("--experts", type=int, default=16, help="num_experts (default 16)")
    group.add_argument("--top-k", type=int, default=4, help="num_experts_per_tok (default 4)")
    group.add_argument("--moe-ffn", type=int, default=768, help="moe_intermediate_size (default 768)")
    group.add_argument("--heads", type=int, default=16, help="num_attention_heads (default 16)")
    group.add_argument("--kv-heads", type=int, default=4, help="num_key_value_heads (default 4)")
    group.add_argument("--head-dim", type=int, default=64, help="head_dim (default 64)")
    group.add_argument("--vocab", type=int, default=32000, help="vocab_size (default 32000)")
    zoo_common.add_zoo_arguments(parser, METHODS, default_offload_modules="SparseMoeBlock", default_seq=4096,
                                 default_batch=4)
    return zoo_common.parse_zoo_args(parser, argv, TINY)


def build_model(args, device, dtype):
    """(model, described): the Hugging Face model (as examples/train_qwen3_moe.py builds it), or the
    pure-torch stand-in with --tiny."""
    import torch

    torch.manual_seed(args.seed)
    sizes = dict(layers=args.layers, hidden=args.hidden, experts=args.experts, top_k=args.top_k,
                 moe_ffn=args.moe_ffn, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                 vocab=args.vocab)
    if args.tiny:
        import tiny_models

        model = tiny_models.tiny_qwen3_moe(args.vocab, args.hidden, args.layers, args.heads, args.kv_heads,
                                           args.experts, args.top_k, args.moe_ffn).to(device=device, dtype=dtype)
        return model, dict(sizes, model="TinyQwen3MoeForCausalLM (pure-torch stand-in, --tiny)",
                           parameters=sum(p.numel() for p in model.parameters()))
    transformers = zoo_common.import_transformers("Hugging Face's Qwen3-MoE")

    import hf_models

    Qwen3MoeConfig, Qwen3MoeForCausalLM = transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM

    # As examples/train_qwen3_moe.py: every layer sparse, no router logits (so no auxiliary loss).
    config_kwargs = dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3072,
                         moe_intermediate_size=args.moe_ffn, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                         num_experts=args.experts, num_experts_per_tok=args.top_k, norm_topk_prob=True,
                         decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False,
                         max_position_embeddings=max(args.seq, 4096), rms_norm_eps=1e-6)
    model, config = hf_models.build_causal_lm(Qwen3MoeConfig, Qwen3MoeForCausalLM, config_kwargs, dtype, device)
    return model, hf_models.describe(model, config, sizes)


def main(argv=None, out=None):
    args = parse_args(argv)
    common.prepare_process(args)
    device = common.pick_device(args)
    model, described = build_model(args, device, common.torch_dtype(args.dtype))
    described.update(router="softmax top-k, renormalised", seq=args.seq, batch=args.batch, dtype=args.dtype)
    job = common.Job(NAME, model, common.random_token_batches(args.vocab, args.batch, args.seq, args.seed, device),
                     zoo_common.causal_lm_loss, described, result_fields=zoo_common.determinism_fields(args))
    return common.train(job, args, out=out)


if __name__ == "__main__":
    main()
    sys.exit(0)
