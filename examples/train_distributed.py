#!/usr/bin/env python3
"""Data-parallel training under torchrun: DistributedDataParallel or FSDP2 (fully_shard), one GPU per
rank, NCCL, a Hugging Face Llama with random weights from a config (no download).

Each rank prints its own ACTPAGE_RESULT line (examples/common.py) with its rank, its losses (exact
hex), the median step time, its device's used-memory peak (cudaMemGetInfo, sampled) and torch's
peak; --result-json PATH writes it to a file too, "%r" in PATH replaced by the rank. Examples:

    torchrun --nproc-per-node 2 examples/train_distributed.py --parallel ddp --deterministic
    actpage run --policy tests/policies/llama-mlp.json -- \\
        torchrun --nproc-per-node 2 examples/train_distributed.py --parallel fsdp2 --deterministic

Every rank builds the same weights (same seed) and trains on its own batches (seed + rank). Without
torchrun's variables it runs as a single process (rank 0 of 1). `--model tiny` is a small pure-torch
model (no transformers), used by the CPU tests with `--device cpu` (gloo).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

PARALLEL = ("ddp", "fsdp2")
PARAMS_PREFIX = "ACTPAGE_PARAMS "


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parallel", choices=PARALLEL, default="ddp",
                        help="ddp: DistributedDataParallel; fsdp2: fully_shard on each layer and the model")
    parser.add_argument("--model", choices=("llama", "tiny"), default="llama",
                        help="llama: Hugging Face LlamaForCausalLM; tiny: a small pure-torch model (tests)")
    parser.add_argument("--backend", default=None, help="process group backend (default: nccl on CUDA, gloo on CPU)")
    model = parser.add_argument_group("model (LlamaConfig)")
    model.add_argument("--layers", type=int, default=8, help="num_hidden_layers (default 8)")
    model.add_argument("--hidden", type=int, default=2048, help="hidden_size (default 2048)")
    model.add_argument("--ffn", type=int, default=5632, help="intermediate_size (default 5632)")
    model.add_argument("--heads", type=int, default=16, help="num_attention_heads (default 16)")
    model.add_argument("--vocab", type=int, default=32000, help="vocab_size (default 32000)")
    common.add_common_arguments(parser, default_offload_modules="MLP")
    return parser.parse_args(argv)


def distributed_environment(environ=None):
    """(rank, world_size, local_rank) from torchrun's variables; (0, 1, 0) without them."""
    environ = os.environ if environ is None else environ
    rank = int(environ.get("RANK", "0"))
    world = int(environ.get("WORLD_SIZE", "1"))
    local = int(environ.get("LOCAL_RANK", str(rank)))
    return rank, world, local


def result_path(pattern, rank):
    """--result-json with %r replaced by the rank (and %% by %)."""
    if not pattern:
        return pattern
    return pattern.replace("%%", "\0").replace("%r", str(rank)).replace("\0", "%")


def init_process_group(torch, backend, device, rank, world):
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    kwargs = dict(backend=backend, rank=rank, world_size=world)
    if device.type == "cuda":
        try:
            dist.init_process_group(device_id=device, **kwargs)  # eager NCCL communicator (torch >= 2.3)
            return dist
        except TypeError:
            pass
    dist.init_process_group(**kwargs)
    return dist


def tiny_model(torch, vocab, width, layers):
    from torch import nn
    import torch.nn.functional as F

    class TinyMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up_proj = nn.Linear(width, 4 * width)
            self.down_proj = nn.Linear(4 * width, width)

        def forward(self, x):
            return self.down_proj(F.silu(self.up_proj(x)))

    class TinyLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.LayerNorm(width)
            self.mlp = TinyMLP()

        def forward(self, x):
            return x + self.mlp(self.input_layernorm(x))

    class TinyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, width)
            self.layers = nn.ModuleList(TinyLayer() for _ in range(layers))

        def forward(self, input_ids):
            x = self.embed_tokens(input_ids)
            for layer in self.layers:
                x = layer(x)
            return x

    class TinyCausalLM(nn.Module):
        """Module paths as in Hugging Face's Llama: model.layers.N.mlp."""

        def __init__(self):
            super().__init__()
            self.model = TinyModel()
            self.lm_head = nn.Linear(width, vocab)

        def forward(self, input_ids, labels, use_cache=False):
            logits = self.lm_head(self.model(input_ids))
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), labels[:, 1:].reshape(-1))
            return type("Output", (), {"loss": loss})()

    return TinyCausalLM()


def build_model(args, torch, device, dtype):
    """(model, describe dict, vocab) with the same random weights on every rank."""
    torch.manual_seed(args.seed)
    if args.model == "tiny":
        model = tiny_model(torch, args.vocab, args.hidden, args.layers).to(device=device, dtype=dtype)
        return model, {"model": "tiny", "layers": args.layers, "hidden": args.hidden, "vocab": args.vocab}
    from transformers import LlamaConfig, LlamaForCausalLM

    import hf_models

    config_kwargs = dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, max_position_embeddings=max(args.seq, 4096),
                         rms_norm_eps=1e-5)
    model, config = hf_models.build_causal_lm(LlamaConfig, LlamaForCausalLM, config_kwargs, dtype, device)
    return model, hf_models.describe(model, config, dict(layers=args.layers, hidden=args.hidden, ffn=args.ffn,
                                                         heads=args.heads, vocab=args.vocab))


def parameter_checksum(torch, model):
    """The sum of every parameter in float64, as exact hex (local tensors only)."""
    with torch.no_grad():
        total = sum(float(p.detach().double().sum()) for p in model.parameters())
    return float(total).hex()


def layers_of(model):
    """The repeated decoder layers (model.model.layers for Llama and the tiny model)."""
    inner = getattr(model, "model", model)
    return list(getattr(inner, "layers", []))


def fully_shard_function():
    # Old torch may fail to import these with other errors than ImportError (torch 1.13 on Python
    # 3.11 raises ValueError inside torch.distributed.fsdp).
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
        return fully_shard
    except Exception:
        pass
    try:
        from torch.distributed._composable.fsdp import fully_shard  # torch 2.4-2.5
        return fully_shard
    except Exception:
        raise SystemExit("--parallel fsdp2 needs torch >= 2.4 (fully_shard); this is an older torch")


def wrap(args, model, device):
    """The model as the job trains it: DDP around it, or fully_shard applied per layer and at the root
    (the module paths stay those of the model; DDP's gain a 'module.' prefix)."""
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    fully_shard = fully_shard_function()
    for layer in layers_of(model):
        fully_shard(layer)
    fully_shard(model)
    return model


def rank_device(torch, args, local_rank):
    """This rank's device: --device, else its local rank's GPU (made current), else the CPU."""
    if args.device is None and torch.cuda.is_available():
        args.device = "cuda:%d" % local_rank
    device = common.pick_device(args)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    return device


def main(argv=None):
    args = parse_args(argv)
    rank, world, local_rank = distributed_environment()
    torch = common.prepare_process(args)  # determinism settings before CUDA is initialised
    device = rank_device(torch, args, local_rank)
    backend = args.backend or ("nccl" if device.type == "cuda" else "gloo")
    dist = init_process_group(torch, backend, device, rank, world)
    try:
        dtype = common.torch_dtype(args.dtype)
        model, described = build_model(args, torch, device, dtype)
        model = wrap(args, model, device)
        described.update(parallel=args.parallel, rank=rank, world_size=world, local_rank=local_rank,
                         backend=backend, seq=args.seq, batch=args.batch, dtype=args.dtype)
        # The same weights everywhere, each rank its own data.
        batches = common.random_token_batches(args.vocab, args.batch, args.seq, args.seed + 7919 * rank, device)

        def compute_loss(m, batch):
            return m(input_ids=batch["input_ids"], labels=batch["labels"], use_cache=False).loss

        job = common.Job("%s-%s" % (args.model, args.parallel), model, batches, compute_loss, described)
        args.result_json = result_path(args.result_json, rank)
        result = common.train(job, args)
        if args.parallel == "ddp":
            # DDP keeps every rank's replica identical: the same checksum on every rank.
            print(PARAMS_PREFIX + json.dumps({"rank": rank, "checksum": parameter_checksum(torch, model)}), flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0 if result["steps"] == args.steps else 1


if __name__ == "__main__":
    sys.exit(main())
