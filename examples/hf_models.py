"""Hugging Face pieces shared by the example jobs: building a model with random weights from a
config (nothing is downloaded) and its loss. Imported only by train_*.py, never by the tests."""

import torch

import common


def build_causal_lm(config_class, model_class, config_kwargs, dtype, device):
    """model_class(config_class(**config_kwargs)) with SDPA attention, random weights seeded by the
    caller (torch.manual_seed), on `device` in `dtype`, in train mode."""
    config = config_class(use_cache=False, tie_word_embeddings=False, **config_kwargs)
    try:
        config._attn_implementation = "sdpa"
    except Exception:  # very old or very new config classes: the constructor keyword then
        config = config_class(use_cache=False, tie_word_embeddings=False, attn_implementation="sdpa",
                              **config_kwargs)
    # Initialise on the device (fast, and the same random weights every run for a given seed), in
    # fp32 as the library's init functions expect, then cast; empty the cache so that the fp32
    # copies do not count as memory in use.
    with torch.device(device):
        model = model_class(config)
    model = model.to(dtype=dtype)
    model.train()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    return model, config


def causal_lm_loss(model, batch):
    return model(input_ids=batch["input_ids"], labels=batch["labels"], use_cache=False).loss


def describe(model, config, extra):
    parameters = sum(p.numel() for p in model.parameters())
    described = {"model": type(model).__name__, "parameters": parameters,
                 "attn_implementation": getattr(config, "_attn_implementation", None)}
    described.update(extra)
    return described


def run(name, args, config_class, model_class, config_kwargs, describe_extra):
    torch.manual_seed(args.seed)  # the same random weights every run (prepare_process ran earlier)
    device = common.pick_device(args)
    dtype = common.torch_dtype(args.dtype)
    model, config = build_causal_lm(config_class, model_class, config_kwargs, dtype, device)
    job = common.Job(name, model,
                     common.random_token_batches(config_kwargs["vocab_size"], args.batch, args.seq,
                                                 args.seed, device),
                     causal_lm_loss,
                     describe(model, config, dict(describe_extra, seq=args.seq, batch=args.batch,
                                                  dtype=args.dtype)))
    return common.train(job, args)
