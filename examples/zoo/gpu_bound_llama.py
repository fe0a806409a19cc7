#!/usr/bin/env python3
"""Zoo: a GPU-bound transformer, Hugging Face LlamaForCausalLM with a large hidden size and long
sequences, whose host thread runs far ahead of the GPU (the common case of real training, unlike the
launch-bound 16-layer Llama of examples/train_llama.py).

Stands for: pre-training or fine-tuning a 7B-class-width model on one GPU, cut to 8 layers.
Defaults: hidden 4096, ffn 11008, 8 layers, 32 heads, vocab 32000, seq 4096, batch 2, bf16 weights,
AdamW, SDPA attention, random weights from a config (nothing downloaded), 12 steps (3 warm-up).
FACTS.md measured this shape on an H100: 231 ms a step, 29.7 GiB in use.
Methods: none, checkpointing (Hugging Face gradient checkpointing, non-reentrant), save_on_cpu,
stream_offload (default --offload-modules MLP: the LlamaMLP blocks).
Deterministic with --deterministic (FACTS.md: this Llama with SDPA repeats its losses bit for bit).

    python3 examples/zoo/gpu_bound_llama.py --deterministic
    actpage run -- python3 examples/zoo/gpu_bound_llama.py --deterministic
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo_common  # noqa: E402  (puts examples/ on the path)
import common  # noqa: E402

NAME = "gpu_bound_llama"
METHODS = ("none", "checkpointing", "save_on_cpu", "stream_offload")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    zoo_common.add_llama_arguments(parser, layers=8, hidden=4096, ffn=11008, heads=32)
    zoo_common.add_zoo_arguments(parser, METHODS, default_offload_modules="MLP", default_seq=4096, default_batch=2)
    return zoo_common.parse_zoo_args(parser, argv, zoo_common.LLAMA_TINY)


def main(argv=None, out=None):
    args = parse_args(argv)
    common.prepare_process(args)  # determinism settings before CUDA starts
    device = common.pick_device(args)
    model, described = zoo_common.build_llama(args, device, common.torch_dtype(args.dtype))
    described.update(seq=args.seq, batch=args.batch, dtype=args.dtype)
    job = common.Job(NAME, model, common.random_token_batches(args.vocab, args.batch, args.seq, args.seed, device),
                     zoo_common.causal_lm_loss, described, result_fields=zoo_common.determinism_fields(args))
    return common.train(job, args, out=out)


if __name__ == "__main__":
    main()
    sys.exit(0)
