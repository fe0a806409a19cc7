#!/usr/bin/env python3
"""An unmodified-style Hugging Face Qwen3-MoE training job, random weights from a config (no download).

Defaults: hidden 1024, 8 layers, 16 experts, top-4, moe ffn 768, 16 heads (4 KV heads, head dim 64),
vocab 32000, seq 2048, batch 4, bf16, AdamW, SDPA attention. Prints one ACTPAGE_RESULT line
(examples/common.py). Examples:
    python3 examples/train_qwen3_moe.py --steps 10
    python3 examples/train_qwen3_moe.py --method stream_offload   # offloads the sparse MoE blocks
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = parser.add_argument_group("model (Qwen3MoeConfig)")
    model.add_argument("--layers", type=int, default=8, help="num_hidden_layers (default 8)")
    model.add_argument("--hidden", type=int, default=1024, help="hidden_size (default 1024)")
    model.add_argument("--experts", type=int, default=16, help="num_experts (default 16)")
    model.add_argument("--top-k", type=int, default=4, help="num_experts_per_tok (default 4)")
    model.add_argument("--moe-ffn", type=int, default=768, help="moe_intermediate_size (default 768)")
    model.add_argument("--ffn", type=int, default=3072,
                       help="intermediate_size of dense MLP layers, if any (default 3072)")
    model.add_argument("--heads", type=int, default=16, help="num_attention_heads (default 16)")
    model.add_argument("--kv-heads", type=int, default=4, help="num_key_value_heads (default 4)")
    model.add_argument("--head-dim", type=int, default=64, help="head_dim (default 64)")
    model.add_argument("--vocab", type=int, default=32000, help="vocab_size (default 32000)")
    common.add_common_arguments(parser, default_offload_modules="SparseMoeBlock")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    common.prepare_process(args)
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    import hf_models

    config_kwargs = dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                         moe_intermediate_size=args.moe_ffn, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         head_dim=args.head_dim, num_experts=args.experts,
                         num_experts_per_tok=args.top_k, norm_topk_prob=True, decoder_sparse_step=1,
                         mlp_only_layers=[], output_router_logits=False,
                         max_position_embeddings=max(args.seq, 4096), rms_norm_eps=1e-6)
    hf_models.run("qwen3_moe", args, Qwen3MoeConfig, Qwen3MoeForCausalLM, config_kwargs,
                  dict(layers=args.layers, hidden=args.hidden, experts=args.experts, top_k=args.top_k,
                       moe_ffn=args.moe_ffn, heads=args.heads, kv_heads=args.kv_heads,
                       head_dim=args.head_dim, vocab=args.vocab))
    return 0


if __name__ == "__main__":
    sys.exit(main())
