"""What the zoo's jobs share: their arguments (examples/common.py's, with the job's own --method
choices, 12 steps, and a --tiny preset for the CPU tests), what a result says about determinism, the
timing of the phases of a step with CUDA events, the methods' forward contexts, and the result of a
job that runs its own loop (gpt_accum.py, compiled.py, hf_trainer.py) in the keys common.train uses.
"""

import contextlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES_DIR = os.path.dirname(HERE)
for _path in (HERE, EXAMPLES_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import common  # noqa: E402

DEFAULT_STEPS = 12
# Relative loss tolerance for runs that are not bit-identical (no --deterministic, or an op without a
# deterministic kernel). FACTS.md: the same Llama job agreed to ~1e-4 across allocator backends; 12
# steps in bf16 drift further. A first guess, to be calibrated on the GPU from two plain runs.
NONDETERMINISTIC_LOSS_TOLERANCE = 2e-3
NOT_DETERMINISTIC_MODE = ("run without --deterministic: cuBLAS and attention kernels may reduce in a different "
                          "order from run to run (FACTS.md: two identical runs differ from step 2)")

LLAMA_TINY = dict(layers=2, hidden=32, ffn=64, heads=4, kv_heads=None, vocab=64, seq=16, batch=2)


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------
def add_zoo_arguments(parser, methods, default_offload_modules, default_seq, default_batch):
    """examples/common.py's flags with this job's --method choices and 12 steps, plus --tiny."""
    common.add_common_arguments(parser, default_offload_modules=default_offload_modules, default_seq=default_seq,
                                default_batch=default_batch, methods=methods)
    parser.set_defaults(steps=DEFAULT_STEPS)
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny model for the CPU tests: the same job at toy sizes (its defaults change, flags "
                             "given still win); a Hugging Face model becomes a pure-torch stand-in with the same "
                             "interface, so transformers is not needed")
    return parser


def add_llama_arguments(parser, layers, hidden, ffn, heads, vocab=32000, kv_heads=None):
    group = parser.add_argument_group("model (LlamaConfig)")
    group.add_argument("--layers", type=int, default=layers, help="num_hidden_layers (default %(default)s)")
    group.add_argument("--hidden", type=int, default=hidden, help="hidden_size (default %(default)s)")
    group.add_argument("--ffn", type=int, default=ffn, help="intermediate_size (default %(default)s)")
    group.add_argument("--heads", type=int, default=heads, help="num_attention_heads (default %(default)s)")
    group.add_argument("--kv-heads", type=int, default=kv_heads, help="num_key_value_heads (default: --heads)")
    group.add_argument("--vocab", type=int, default=vocab, help="vocab_size (default %(default)s)")
    return group


def parse_zoo_args(parser, argv, tiny_preset, own_loop=False, dtypes=None):
    """Parses argv; with --tiny the preset replaces the defaults first (explicit flags still win).

    own_loop: the job runs its own loop, not common.train, so common.train's --profile-step and
    --alternate-actpage do nothing there: asking for them is an error. dtypes: the --dtype values
    the job supports."""
    probe, _ = parser.parse_known_args(argv)
    if probe.tiny:
        parser.set_defaults(**tiny_preset)
    args = parser.parse_args(argv)
    if args.warmup >= args.steps:
        # The median and the steady peak would silently take in the warm-up (and auto mode's start).
        parser.error("--warmup %d is not below --steps %d: no step would be measured after the warm-up"
                     % (args.warmup, args.steps))
    if own_loop and args.profile_step is not None:
        parser.error("--profile-step is common.train's; this job runs its own loop")
    if own_loop and args.alternate_actpage:
        parser.error("--alternate-actpage is common.train's; this job runs its own loop")
    if dtypes is not None and args.dtype not in dtypes:
        parser.error("--dtype %s: this job supports %s" % (args.dtype, ", ".join(dtypes)))
    return args


# ---------------------------------------------------------------------------------------------
# Determinism, as the result states it
# ---------------------------------------------------------------------------------------------
def determinism_fields(args, blocker=None, tolerance=NONDETERMINISTIC_LOSS_TOLERANCE):
    """deterministic: whether two runs of this command give the same loss bits (--deterministic and
    nothing in the job that prevents it); loss_tolerance: 0 then, else the relative tolerance to
    compare losses with; nondeterministic_reason: why not (blocker: what in the job prevents it)."""
    mode = bool(args.deterministic)
    if mode and blocker is None:
        return {"deterministic": True, "deterministic_mode": True, "loss_tolerance": 0.0,
                "nondeterministic_reason": None}
    reason = blocker if mode else (NOT_DETERMINISTIC_MODE + ("; and " + blocker if blocker else ""))
    return {"deterministic": False, "deterministic_mode": mode, "loss_tolerance": tolerance,
            "nondeterministic_reason": reason}


# ---------------------------------------------------------------------------------------------
# Models shared by several jobs
# ---------------------------------------------------------------------------------------------
def build_llama(args, device, dtype, max_positions=None):
    """(model, described): Hugging Face's LlamaForCausalLM with random weights from a config (SDPA
    attention), or with --tiny the pure-torch stand-in. Seeds with args.seed first."""
    import torch

    torch.manual_seed(args.seed)
    kv_heads = args.kv_heads or args.heads
    sizes = dict(layers=args.layers, hidden=args.hidden, ffn=args.ffn, heads=args.heads, kv_heads=kv_heads,
                 vocab=args.vocab)
    if args.tiny:
        import tiny_models

        model = tiny_models.tiny_llama(args.vocab, args.hidden, args.ffn, args.layers, args.heads, kv_heads)
        model = model.to(device=device, dtype=dtype)
        return model, dict(sizes, model="TinyLlamaForCausalLM (pure-torch stand-in, --tiny)",
                           parameters=sum(p.numel() for p in model.parameters()))
    transformers = import_transformers("a Hugging Face Llama")

    import hf_models

    LlamaConfig, LlamaForCausalLM = transformers.LlamaConfig, transformers.LlamaForCausalLM

    config_kwargs = dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_positions or max(args.seq, 4096), rms_norm_eps=1e-5)
    model, config = hf_models.build_causal_lm(LlamaConfig, LlamaForCausalLM, config_kwargs, dtype, device)
    return model, hf_models.describe(model, config, sizes)


def import_transformers(what, hint="--tiny runs a pure-torch stand-in"):
    """transformers, or a clear exit naming what needed it and the way round."""
    try:
        import transformers
    except ImportError:
        raise SystemExit("%s needs transformers, which this Python cannot import; %s" % (what, hint))
    return transformers


def causal_lm_loss(model, batch):
    """Hugging Face's way: the model shifts the labels and returns the mean loss."""
    return model(input_ids=batch["input_ids"], labels=batch["labels"], use_cache=False).loss


def autocast_context(device, dtype_name):
    """torch.autocast to bf16/fp16 on the device (fp32 master weights), or nothing for fp32."""
    import torch

    if dtype_name == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=common.torch_dtype(dtype_name))


# ---------------------------------------------------------------------------------------------
# Methods and timing inside a loop the zoo owns (or hooks into)
# ---------------------------------------------------------------------------------------------
def method_forward_context(method, model, args, device):
    """(factory, offload): factory() gives the context to run each forward pass in for `method`
    (as common.train does); offload is the StreamOffload for stream_offload, else None.
    checkpointing is the model's business (gradient_checkpointing_enable), not a context."""
    import torch

    if method == "save_on_cpu":
        return (lambda: torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")), None
    if method == "stream_offload":
        offload = common.StreamOffload(model, args.offload_modules, args.offload_min_bytes, device,
                                       args.offload_max_bytes)
        return (lambda: offload), offload
    return contextlib.nullcontext, None


class ForwardContextHooks:
    """Runs every forward pass of `module` inside factory()'s context, entered by a forward pre-hook
    and left by a forward hook: a loop the zoo does not own (the Trainer's) then runs its forward
    passes inside save_on_cpu or StreamOffload, as common.train runs its own."""

    def __init__(self, module, factory):
        self._factory = factory
        self._open = []
        self._handles = [module.register_forward_pre_hook(self._enter), module.register_forward_hook(self._leave)]

    def _enter(self, module, inputs):
        context = self._factory()
        context.__enter__()
        self._open.append(context)

    def _leave(self, module, inputs, output):
        self._open.pop().__exit__(None, None, None)

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []


class PhaseTimer:
    """Time of named phases of one step (forward, backward), summed over repeats (micro-batches):
    CUDA events on the current stream on the GPU, so the GPU's time and no extra synchronisation;
    perf_counter on the CPU. Read the totals after synchronising."""

    def __init__(self, cuda):
        self.cuda = cuda
        self._open = {}
        self._spans = {}

    def _mark(self):
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self, name):
        self._open[name] = self._mark()

    def stop(self, name):
        self._spans.setdefault(name, []).append((self._open.pop(name), self._mark()))

    def running(self, name):
        return name in self._open

    def count(self, name):
        return len(self._spans.get(name, []))

    def total_ms(self, name):
        """The phase's summed time in ms, or NaN if it never ran."""
        spans = self._spans.get(name)
        if not spans:
            return float("nan")
        if self.cuda:
            return sum(a.elapsed_time(b) for a, b in spans)
        return sum((b - a) * 1000.0 for a, b in spans)

    def reset(self):
        self._open = {}
        self._spans = {}


def synchronize(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def start_memory_sampler(device, args):
    """Resets torch's peak counters and starts sampling the device memory in use (as common.train)."""
    import torch

    cuda = device.type == "cuda"
    index = device.index if device.index is not None else (torch.cuda.current_device() if cuda else 0)
    sampler = common.MemorySampler(index, interval_ms=args.sample_ms, enabled=cuda)
    sampler.steady_after = args.warmup  # the loop calls sampler.step_ended() after each step
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    return sampler.start()


def loop_result(name, args, device, config, losses, step_ms, fwd_ms, bwd_ms, sampler, extra=None):
    """The result of a job with its own loop, with common.train's keys and meanings."""
    import torch

    cuda = device.type == "cuda"
    warmup = args.warmup

    def measured(values):
        return values[warmup:] if len(values) > warmup else values

    result = {
        "job": name,
        "method": args.method,
        "config": config,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "seed": args.seed,
        "steps": len(losses),
        "warmup": warmup,
        "losses": [float(v).hex() for v in losses],
        "loss_values": [common._finite_or_none(v) for v in losses],
        "step_ms": common._ms(step_ms),
        "fwd_ms": common._ms(fwd_ms),
        "bwd_ms": common._ms(bwd_ms),
        "median_step_ms": common._median(measured(step_ms)),
        "median_fwd_ms": common._median(measured(fwd_ms)),
        "median_bwd_ms": common._median(measured(bwd_ms)),
        "device_used_peak_mib": sampler.peak_mib(),
        "device_used_steady_peak_mib": sampler.steady_peak_mib(),
        "device_used_start_mib": None if sampler.first_bytes is None else round(sampler.first_bytes / common.MIB, 1),
        "device_memory_samples": sampler.samples,
        "device_memory_source": sampler.source,
        "torch_peak_mib": round(torch.cuda.max_memory_allocated(device) / common.MIB, 1) if cuda else None,
        "torch_reserved_peak_mib": round(torch.cuda.max_memory_reserved(device) / common.MIB, 1) if cuda else None,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "actpage": common.actpage_status(),
    }
    result.update(extra or {})
    return result
