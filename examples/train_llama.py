#!/usr/bin/env python3
"""An unmodified-style Hugging Face Llama training job, random weights from a config (no download).

Defaults: hidden 2048, ffn 5632, 16 layers, 16 heads, vocab 32000, seq 2048, batch 4, bf16, AdamW,
SDPA attention. Prints one ACTPAGE_RESULT line (examples/common.py). Examples:
    python3 examples/train_llama.py --steps 10
    actpage run -- python3 examples/train_llama.py --deterministic
    python3 examples/train_llama.py --method stream_offload --offload-modules MLP
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = parser.add_argument_group("model (LlamaConfig)")
    model.add_argument("--layers", type=int, default=16, help="num_hidden_layers (default 16)")
    model.add_argument("--hidden", type=int, default=2048, help="hidden_size (default 2048)")
    model.add_argument("--ffn", type=int, default=5632, help="intermediate_size (default 5632)")
    model.add_argument("--heads", type=int, default=16, help="num_attention_heads (default 16)")
    model.add_argument("--kv-heads", type=int, default=None, help="num_key_value_heads (default: --heads)")
    model.add_argument("--vocab", type=int, default=32000, help="vocab_size (default 32000)")
    common.add_common_arguments(parser, default_offload_modules="MLP")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    common.prepare_process(args)  # before transformers or CUDA: determinism settings first
    from transformers import LlamaConfig, LlamaForCausalLM

    import hf_models

    config_kwargs = dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads or args.heads,
                         max_position_embeddings=max(args.seq, 4096), rms_norm_eps=1e-5)
    hf_models.run("llama", args, LlamaConfig, LlamaForCausalLM, config_kwargs,
                  dict(layers=args.layers, hidden=args.hidden, ffn=args.ffn, heads=args.heads,
                       kv_heads=args.kv_heads or args.heads, vocab=args.vocab))
    return 0


if __name__ == "__main__":
    sys.exit(main())
