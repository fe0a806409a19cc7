#!/usr/bin/env python3
"""Zoo: a long-context job, Hugging Face LlamaForCausalLM at seq 32768, batch 1, with the job's own
gradient checkpointing ON by default (as long-context fine-tuning recipes do), so what stays on the
device between forward and backward is mostly the decoder layers' inputs, 128 MiB each here; the
backward recomputes one layer at a time.

Stands for: long-context fine-tuning (context extension) of a small Llama on one GPU.
Defaults: hidden 2048, ffn 5632, 12 layers, 16 heads, vocab 32000, seq 32768, batch 1, bf16 weights,
AdamW (common.train's loop), SDPA attention, 12 steps (3 warm-up). Layer inputs: 12 x 128 MiB.
The loss: the head and cross-entropy run in --loss-chunk 4096-token chunks, each chunk a checkpointed
region returning its summed loss (so the [seq, vocab] logits, 2 GiB in bf16 and twice that in fp32
for the loss, never exist whole); the mean is their sum over the token count. --loss-chunk 0 uses the
model's own loss instead (labels passed to the model: whole logits).
--method none is the job as its author wrote it (checkpointing on); --no-checkpointing turns it off.
Methods: none, save_on_cpu, stream_offload. With checkpointing on, torch saves each checkpointed
layer's inputs through the saved-tensor hooks active outside it, so save_on_cpu moves the layer inputs
to the host (what transformers' offloaded checkpointing and Unsloth do), and stream_offload does the
same on a side stream for the default --offload-modules LlamaModel (the decoder stack).
Deterministic with --deterministic (the Llama of FACTS.md; the chunked loss adds only ordinary ops).

    python3 examples/zoo/long_context.py --deterministic
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo_common  # noqa: E402  (puts examples/ on the path)
import common  # noqa: E402

NAME = "long_context"
METHODS = ("none", "save_on_cpu", "stream_offload")
TINY = dict(zoo_common.LLAMA_TINY, seq=32, loss_chunk=8)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    zoo_common.add_llama_arguments(parser, layers=12, hidden=2048, ffn=5632, heads=16)
    parser.add_argument("--no-checkpointing", action="store_true",
                        help="turn the job's own gradient checkpointing off (it is on by default; there is no "
                             "--method checkpointing here)")
    parser.add_argument("--loss-chunk", type=int, default=4096,
                        help="tokens per chunk of the head and loss, each chunk checkpointed; 0: the model's own "
                             "loss over whole logits (default %(default)s)")
    zoo_common.add_zoo_arguments(parser, METHODS, default_offload_modules="LlamaModel", default_seq=32768,
                                 default_batch=1)
    args = zoo_common.parse_zoo_args(parser, argv, TINY)
    if args.loss_chunk < 0:
        parser.error("--loss-chunk must be 0 or more")
    return args


def chunked_causal_lm_loss(chunk):
    """compute_loss: the decoder stack's hidden states, then the head and cross-entropy per chunk of
    `chunk` positions under non-reentrant checkpointing, summed and divided by the token count."""
    import torch
    import torch.nn.functional as F
    import torch.utils.checkpoint

    def chunk_loss_sum(head, hidden, labels):
        logits = head(hidden).float()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), reduction="sum")

    def compute_loss(model, batch):
        hidden = model.model(input_ids=batch["input_ids"], use_cache=False).last_hidden_state
        hidden, labels = hidden[:, :-1], batch["labels"][:, 1:]  # position t predicts token t+1
        total = None
        for start in range(0, hidden.size(1), chunk):
            part = torch.utils.checkpoint.checkpoint(chunk_loss_sum, model.lm_head, hidden[:, start:start + chunk],
                                                     labels[:, start:start + chunk], use_reentrant=False)
            total = part if total is None else total + part
        return total / labels.numel()

    return compute_loss


def main(argv=None, out=None):
    args = parse_args(argv)
    common.prepare_process(args)
    device = common.pick_device(args)
    model, described = zoo_common.build_llama(args, device, common.torch_dtype(args.dtype),
                                              max_positions=max(args.seq, 4096))
    checkpointing = not args.no_checkpointing
    if checkpointing:
        common.enable_checkpointing(model)  # the job's own, as common.train's checkpointing method does it
    described.update(seq=args.seq, batch=args.batch, dtype=args.dtype, loss_chunk=args.loss_chunk,
                     checkpointing="gradient checkpointing per decoder layer, non-reentrant (the job's default)"
                     if checkpointing else "off (--no-checkpointing)")
    loss = chunked_causal_lm_loss(args.loss_chunk) if args.loss_chunk else zoo_common.causal_lm_loss
    job = common.Job(NAME, model, common.random_token_batches(args.vocab, args.batch, args.seq, args.seed, device),
                     loss, described,
                     result_fields=dict(zoo_common.determinism_fields(args), checkpointing=checkpointing))
    return common.train(job, args, out=out)


if __name__ == "__main__":
    main()
    sys.exit(0)
