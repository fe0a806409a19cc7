"""The training loop shared by the example jobs (train_llama.py, train_qwen3_moe.py).

Model construction is the scripts' business (Hugging Face, random weights from a config); this file
knows nothing of transformers, so the tests drive it with a tiny pure-torch model on the CPU.

What a run reports: one final line on stdout,
    ACTPAGE_RESULT {"losses": [float.hex, ...], "step_ms": [...], "median_step_ms": ..., ...}
with the losses as exact hex strings (compare bits, not rounded prints), per-step times (the step is
bracketed by torch.cuda.synchronize), the median after --warmup steps, the peak of the device memory
in use (total - free from cudaMemGetInfo, sampled every 2 ms by a thread, as FACTS.md measured it)
and torch's own peak (max_memory_allocated). examples/compare_runs.py collects these lines.

Methods (--method), the things a user would do instead of actpage:
  none            nothing
  checkpointing   model.gradient_checkpointing_enable() (Hugging Face activation checkpointing)
  save_on_cpu     torch.autograd.graph.save_on_cpu(pin_memory=True) around the forward pass
  stream_offload  StreamOffload (stream_offload.py): saved-tensor hooks copying the activations of selected
                  module classes to pinned host memory on a side stream (torchtune-style)
  cuda_graph      the whole training step captured once with torch.cuda.graph and replayed
"""

import argparse
import contextlib
import ctypes
import json
import math
import os
import random
import statistics
import sys
import threading
import time

RESULT_PREFIX = "ACTPAGE_RESULT "
METHODS = ("none", "checkpointing", "save_on_cpu", "stream_offload", "cuda_graph")
MIB = 1 << 20

# --method stream_offload's hooks (stream_offload.py), where the jobs find them: common.StreamOffload.
from stream_offload import StreamOffload  # noqa: E402


# ---------------------------------------------------------------------------------------------
# Arguments and process set-up
# ---------------------------------------------------------------------------------------------
def parse_size(text):
    """'1MiB', '512KiB', '2GiB', '1048576' -> bytes."""
    units = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6,
             "gb": 10**9}
    text = str(text).strip()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    unit = text[len(number):].strip().lower()
    if unit not in units or not number:
        raise argparse.ArgumentTypeError("expected a size such as 1MiB, got %r" % text)
    return int(float(number) * units[unit])


def parse_steps(text):
    """'6' or '6,11': the steps --profile-step names, ascending, each at least 0."""
    try:
        steps = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError("expected step numbers separated by commas, got %r" % text)
    if not steps or steps[0] < 0:
        raise argparse.ArgumentTypeError("expected step numbers of at least 0, got %r" % text)
    return steps


def profile_path(keep, step, several):
    """Where --profile-out keeps a profiled step's trace: the path itself for one step, else with
    '.stepN' before its extension (.json or .json.gz)."""
    if not keep or not several:
        return keep
    for extension in (".json.gz", ".json"):
        if keep.endswith(extension):
            return "%s.step%d%s" % (keep[:-len(extension)], step, extension)
    return "%s.step%d" % (keep, step)


def add_common_arguments(parser, default_offload_modules="MLP", default_seq=2048, default_batch=4, methods=METHODS):
    """The loop's flags. `methods`: the --method values this job supports (a job without its own
    checkpointing leaves that out, so asking for it is an argument error, not a silent no-op)."""
    if "none" not in methods or any(m not in METHODS for m in methods):
        raise ValueError("methods must include 'none' and come from %s, got %r" % (METHODS, methods))
    group = parser.add_argument_group("training loop (examples/common.py)")
    group.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    group.add_argument("--warmup", type=int, default=3,
                       help="steps left out of the median step time (default 3)")
    group.add_argument("--seq", type=int, default=default_seq, help="sequence length")
    group.add_argument("--batch", type=int, default=default_batch, help="batch size")
    group.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate")
    group.add_argument("--seed", type=int, default=1234, help="seed of the weights and the data")
    group.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16",
                       help="parameter and activation dtype (default bf16)")
    group.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    group.add_argument("--method", choices=tuple(methods), default="none",
                       help="what the job does about activation memory (default none)")
    group.add_argument("--deterministic", action="store_true",
                       help="torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG=:4096:8, "
                            "so losses compare bit for bit across runs")
    group.add_argument("--offload-modules", default=default_offload_modules,
                       help="stream_offload: comma-separated class names (or parts of them) whose "
                            "saved tensors are offloaded (default %(default)s)")
    group.add_argument("--offload-min-bytes", type=parse_size, default=MIB,
                       help="stream_offload: smallest tensor offloaded (default 1MiB)")
    group.add_argument("--offload-max-bytes", type=parse_size, default=None,
                       help="stream_offload: the most bytes offloaded a forward pass, the first saved "
                            "first (default: no limit); e.g. auto mode's bytes a pass, to compare the two "
                            "at the same bytes")
    group.add_argument("--graph-warmup", type=int, default=3,
                       help="cuda_graph: eager steps before the capture (default 3)")
    group.add_argument("--sample-ms", type=float, default=2.0,
                       help="device-memory sampling interval in ms (default 2)")
    group.add_argument("--result-json", default=None, help="also write the result to this file")
    group.add_argument("--profile-step", type=parse_steps, default=None, metavar="N[,M...]",
                       help="profile these steps with torch.profiler and add a GPU-time summary of each to the "
                            "result (e.g. a paged and an unpaged pass of auto mode's governor: 6,11)")
    group.add_argument("--profile-out", default=None,
                       help="with --profile-step: also keep the profiled steps' Chrome traces here (.json, or "
                            ".json.gz compressed; with several steps, FILE.stepN.json[.gz]); "
                            "scripts/copy_timeline.py reads them")
    group.add_argument("--alternate-actpage", action="store_true",
                       help="under actpage run: pause what actpage records (module ranges, allocation "
                            "records) every other step, in pairs ordered ABBA, and report the step-time ratio "
                            "recorded/paused of each pair: actpage's cost measured inside one process")
    return parser


def prepare_process(args):
    """Seeds and determinism. Call before anything initialises CUDA (cuBLAS reads
    CUBLAS_WORKSPACE_CONFIG when its first handle is made)."""
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    if args.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    return torch


def pick_device(args):
    import torch

    if args.device:
        return torch.device(args.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def torch_dtype(name):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


# ---------------------------------------------------------------------------------------------
# Device memory in use: total - free from cudaMemGetInfo, sampled by a thread
# ---------------------------------------------------------------------------------------------
def find_process_library(fragment, maps_path="/proc/self/maps"):
    """Path of a shared library already mapped into this process whose name contains `fragment`."""
    try:
        with open(maps_path) as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    if fragment in os.path.basename(path):
                        return path
    except OSError:
        pass
    return None


class CudaRuntime:
    """cudaSetDevice/cudaMemGetInfo of the libcudart the process already uses (torch's), via ctypes."""

    def __init__(self, path):
        self.path = path
        self._lib = ctypes.CDLL(path)
        self._lib.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
        self._lib.cudaMemGetInfo.restype = ctypes.c_int
        self._lib.cudaSetDevice.argtypes = [ctypes.c_int]
        self._lib.cudaSetDevice.restype = ctypes.c_int

    @classmethod
    def find(cls):
        path = find_process_library("libcudart.so")
        if path is None:
            return None
        try:
            return cls(path)
        except (OSError, AttributeError):
            return None

    def set_device(self, index):
        return self._lib.cudaSetDevice(int(index))

    def used_bytes(self):
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        if self._lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
            return None
        return total.value - free.value


class MemorySampler:
    """Peak of the device memory in use, sampled every `interval_ms` on a thread of its own.

    Two peaks: over the whole run (`peak_bytes`: what decides whether a job fits), and over the
    steady steps only (`steady_peak_bytes`: from the end of the `steady_after` warm-up steps, told by
    step_ended(); what a method holds once it runs as it will for the rest of the run: a method that
    watches the first steps before it acts, as actpage's auto mode does, lowers only this one).
    Without CUDA (or without a libcudart in the process) it does nothing and reports None. `query`
    can be given a callable returning the bytes in use (tests)."""

    def __init__(self, device_index=0, interval_ms=2.0, query=None, runtime=None, enabled=True):
        self.interval = max(interval_ms, 0.1) / 1000.0
        self.device_index = device_index
        self.peak_bytes = None
        self.first_bytes = None
        self.steady_peak_bytes = None
        self.steady_after = None  # warm-up steps; None: no steady peak
        self.steps_ended = 0
        self._steady = False
        self.samples = 0
        self.source = None
        self._stop = threading.Event()
        self._thread = None
        self._query = query
        self._runtime = runtime
        if self._query is None and enabled:
            self._query = self._default_query()

    def _default_query(self):
        try:
            import torch

            if not torch.cuda.is_available():
                return None
        except Exception:
            return None
        runtime = self._runtime or CudaRuntime.find()
        if runtime is not None:
            self.source = "cudaMemGetInfo (%s)" % os.path.basename(runtime.path)
            self._runtime = runtime
            return runtime.used_bytes
        import torch  # no libcudart mapped (static runtime): torch's own wrapper of the same call

        self.source = "torch.cuda.mem_get_info"

        def query():
            free, total = torch.cuda.mem_get_info(self.device_index)
            return total - free

        return query

    @property
    def available(self):
        return self._query is not None

    def sample(self):
        if self._query is None:
            return None
        used = self._query()
        if used is not None:
            self.samples += 1
            if self.first_bytes is None:
                self.first_bytes = used
            if self.peak_bytes is None or used > self.peak_bytes:
                self.peak_bytes = used
            if self._steady and (self.steady_peak_bytes is None or used > self.steady_peak_bytes):
                self.steady_peak_bytes = used
        return used

    def step_ended(self):
        """A training step has ended (its work synchronised). After `steady_after` of them, the
        samples count toward the steady peak too, from one taken here."""
        self.steps_ended += 1
        if self.steady_after is not None and self.steps_ended == self.steady_after and not self._steady:
            self._steady = True
            self.sample()

    def _run(self):
        if self._runtime is not None:
            self._runtime.set_device(self.device_index)
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:
                return
            self._stop.wait(self.interval)

    def start(self):
        if self._query is None or self._thread is not None:
            return self
        self.sample()
        self._thread = threading.Thread(target=self._run, name="actpage-memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample()
        return self.peak_mib()

    def peak_mib(self):
        return None if self.peak_bytes is None else round(self.peak_bytes / MIB, 1)

    def steady_peak_mib(self):
        return None if self.steady_peak_bytes is None else round(self.steady_peak_bytes / MIB, 1)


# ---------------------------------------------------------------------------------------------
# The job and the loop
# ---------------------------------------------------------------------------------------------
class Job:
    """What the loop needs to know about a model.

    name          a label for the result ("llama")
    model         an nn.Module on its device, in train mode
    make_batch    step -> dict of tensors on the device (deterministic in the step)
    compute_loss  (model, batch) -> scalar loss tensor
    config        a dict describing the model, copied into the result
    result_fields more keys for the result (e.g. what the job says about its own determinism); they
                  are added last, so they replace the loop's own keys of the same name
    """

    def __init__(self, name, model, make_batch, compute_loss, config=None, result_fields=None):
        self.name = name
        self.model = model
        self.make_batch = make_batch
        self.compute_loss = compute_loss
        self.config = dict(config or {})
        self.result_fields = dict(result_fields or {})


def random_token_batches(vocab, batch, seq, seed, device):
    """make_batch for a causal LM: random token ids from a generator seeded by (seed, step), on the
    CPU (identical everywhere), then moved to the device; labels are the inputs (HF shifts them)."""
    import torch

    def make_batch(step):
        generator = torch.Generator().manual_seed(int(seed) * 1000003 + int(step))
        ids = torch.randint(0, vocab, (batch, seq), generator=generator)
        ids = ids.to(device)
        return {"input_ids": ids, "labels": ids}

    return make_batch


def enable_checkpointing(model):
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise SystemExit("--method checkpointing needs a model with gradient_checkpointing_enable()")
    try:
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    except TypeError:
        enable()


def actpage_status():
    """Whether libactpage.so is in this process, and whether it says it is active."""
    try:
        process = ctypes.CDLL(None)
        active = process.actpage_is_active
    except (OSError, AttributeError):
        return {"loaded": False, "active": False}
    active.restype = ctypes.c_int
    return {"loaded": True, "active": bool(active())}


def alternate_recorded(step, warmup):
    """--alternate-actpage: whether actpage records during `step`. Warm-up steps alternate; measured
    steps come in pairs, ordered recorded-paused, paused-recorded, ... (ABBA), so that a drift
    within the run favours neither."""
    if step < warmup:
        return step % 2 == 0
    index = step - warmup
    first_recorded = (index // 2) % 2 == 0
    return first_recorded if index % 2 == 0 else not first_recorded


def alternate_summary(step_ms, recorded, warmup):
    """The pairs of measured steps (see alternate_recorded): each pair's ratio recorded/paused, their
    median with a 95% bootstrap interval (compare_runs' method), and each side's median step."""
    # compare_runs imports this module at its top, so it is imported here, when first needed.
    from compare_runs import bootstrap_interval, median_of_ratios

    pairs = []
    for first in range(warmup, len(step_ms) - 1, 2):
        a, b = step_ms[first], step_ms[first + 1]
        if recorded[first] == recorded[first + 1]:
            continue
        pairs.append((a, b) if recorded[first] else (b, a))
    interval = bootstrap_interval(pairs, median_of_ratios)
    return {
        "pairs": len(pairs),
        "recorded_median_ms": _median([mine for mine, _ in pairs]),
        "paused_median_ms": _median([theirs for _, theirs in pairs]),
        "paired_ratio_median": round(median_of_ratios(pairs), 4) if pairs else None,
        "paired_ratio_ci95": None if interval is None else [round(v, 4) for v in interval],
    }


CPU_PROBE_ROUNDS = 4000


def cpu_probe_us_now(rounds=CPU_PROBE_ROUNDS):
    """Microseconds this thread takes for a fixed Python loop (~0.1-0.3 ms), outside a step's timing.

    Why: the GPU machines' CPUs run at one of two speeds, about 1.6x apart, changing within seconds
    (docs/findings.md, sections 6 and 9), and a launch-bound step follows its thread's speed. Read
    at every step's start, it tells a step slowed by the host from one slowed by what it ran."""
    began = time.perf_counter()
    total = 0
    for value in range(rounds):
        total += value
    return (time.perf_counter() - began) * 1e6


def _median(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return round(statistics.median(values), 3) if values else None


def _finite_or_none(value):
    return value if math.isfinite(value) else None


def _ms(values):
    return [round(v, 3) if math.isfinite(v) else None for v in values]


class _Timer:
    """Marks inside a step: CUDA events on the GPU (no extra synchronisation), perf_counter on CPU."""

    def __init__(self, torch, cuda):
        self._torch = torch
        self.cuda = cuda
        self.marks = []

    def mark(self):
        if self.cuda:
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def spans_ms(self):
        """Milliseconds between consecutive marks (call after synchronising)."""
        if self.cuda:
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1000.0 for a, b in zip(self.marks, self.marks[1:])]


def _start_profiler(torch, cuda):
    """torch.profiler around one step: kernel and copy activity of the whole process (CUPTI sees
    libactpage's own copies too)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    profiler.__enter__()
    return profiler


def _phase(profiler, name):
    """A named CPU range in the profiled step (the forward, the backward), so that a reader of the kept
    trace finds the GPU work each launched (scripts/copy_timeline.py); nothing when not profiling."""
    if profiler is None:
        return contextlib.nullcontext()
    import torch
    return torch.profiler.record_function(name)


def _stop_profiler(profiler, keep=None):
    """GPU time of the profiled step: kernels (sum and the union of their intervals, i.e. how long the
    GPU computed), copies by kind, the longest kernels. Times in ms. keep: a path to write the Chrome
    trace to as well (gzip-compressed when it ends in .gz)."""
    import tempfile
    profiler.__exit__(None, None, None)
    with tempfile.NamedTemporaryFile(suffix=".json") as chrome:
        profiler.export_chrome_trace(chrome.name)
        with open(chrome.name, "rb") as raw:
            text = raw.read()
    if keep:
        import gzip
        with (gzip.open(keep, "wb") if keep.endswith(".gz") else open(keep, "wb")) as kept:
            kept.write(text)
    loaded = json.loads(text)
    # Newer torch writes {"traceEvents": [...]}; older versions a bare list.
    events = loaded.get("traceEvents", []) if isinstance(loaded, dict) else loaded
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    copies = [e for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset") and "dur" in e]
    busy = 0.0
    end = None
    for e in sorted(kernels, key=lambda e: e["ts"]):
        start, stop = e["ts"], e["ts"] + e["dur"]
        if end is None or start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    by_name = {}
    for e in kernels:
        by_name[e["name"]] = by_name.get(e["name"], 0.0) + e["dur"]
    copy_ms = {}
    for e in copies:
        copy_ms[e["name"]] = round(copy_ms.get(e["name"], 0.0) + e["dur"] / 1000.0, 3)
    span = (max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)) if kernels else 0.0
    # The host's side: CUDA API calls (a paged pass's host may be slowed in its launches, not in its
    # kernels) and the step's phases as the host ran them.
    calls = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in e:
            calls.setdefault(e["name"], []).append(e["dur"])
    host_calls = {name: {"calls": len(d), "ms": round(sum(d) / 1000.0, 3),
                         "p50_us": round(sorted(d)[len(d) // 2], 1)}
                  for name, d in sorted(calls.items(), key=lambda item: -sum(item[1]))[:8]}
    phases_ms = {}
    for e in events:
        if e.get("cat", "user_annotation") == "user_annotation" and str(e.get("name", "")).startswith("step.") \
                and "dur" in e:
            phases_ms[e["name"]] = round(phases_ms.get(e["name"], 0.0) + e["dur"] / 1000.0, 3)
    return {
        "kernels": len(kernels),
        "kernel_ms": round(sum(e["dur"] for e in kernels) / 1000.0, 3),
        "gpu_busy_ms": round(busy / 1000.0, 3),
        "kernel_span_ms": round(span / 1000.0, 3),
        "copies_ms": copy_ms,
        "top_kernels_ms": sorted(((round(v / 1000.0, 3), k[:80]) for k, v in by_name.items()), reverse=True)[:8],
        "host_calls": host_calls,
        "host_phases_ms": phases_ms,
    }


def train(job, args, out=None):
    """Runs args.steps training steps of `job` with args.method; prints and returns the result."""
    import torch

    out = sys.stdout if out is None else out
    model = job.model
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    device_index = device.index if device.index is not None else (torch.cuda.current_device() if cuda else 0)
    sampler = MemorySampler(device_index, interval_ms=args.sample_ms, enabled=cuda)
    sampler.steady_after = max(args.warmup, args.graph_warmup + 1) if args.method == "cuda_graph" else args.warmup
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    sampler.start()
    model.train()
    method = args.method
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr,
                                  **({"capturable": True} if method == "cuda_graph" else {}))
    offload = None
    forward_context = contextlib.nullcontext
    if method == "checkpointing":
        enable_checkpointing(model)
    elif method == "save_on_cpu":
        def forward_context():
            return torch.autograd.graph.save_on_cpu(pin_memory=cuda)
    elif method == "stream_offload":
        offload = StreamOffload(model, args.offload_modules, args.offload_min_bytes, device, args.offload_max_bytes)

        def forward_context():
            return offload
    elif method == "cuda_graph" and not cuda:
        raise SystemExit("--method cuda_graph needs a CUDA device")

    losses, step_ms, fwd_ms, bwd_ms = [], [], [], []
    cpu_probe_us = []  # the job thread's CPU speed at each step's start (cpu_probe_us())
    alternate = bool(getattr(args, "alternate_actpage", False))
    recorded = []
    set_paused = None
    if alternate:
        if method == "cuda_graph":
            raise SystemExit("--alternate-actpage needs an eager method, not cuda_graph")
        try:
            from actpage_hooks import set_paused
        except ImportError:
            raise SystemExit("--alternate-actpage needs the job to run under `actpage run`")

    def synchronize():
        if cuda:
            torch.cuda.synchronize(device)

    profiles = {}
    profile_steps = set(args.profile_step or []) if method != "cuda_graph" else set()
    try:
        if method == "cuda_graph":
            _train_cuda_graph(job, args, optimizer, losses, step_ms, fwd_ms, bwd_ms, sampler)
        else:
            for step in range(args.steps):
                if alternate:
                    recorded.append(alternate_recorded(step, args.warmup))
                    set_paused(not recorded[-1])
                batch = job.make_batch(step)
                timer = _Timer(torch, cuda)
                synchronize()
                profiler = _start_profiler(torch, cuda) if step in profile_steps else None
                cpu_probe_us.append(cpu_probe_us_now())
                start = time.perf_counter()
                timer.mark()
                with _phase(profiler, "step.forward"), forward_context():
                    loss = job.compute_loss(model, batch)
                timer.mark()
                with _phase(profiler, "step.backward"):
                    loss.backward()
                timer.mark()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                synchronize()
                if profiler is not None:
                    profiles[step] = _stop_profiler(profiler, profile_path(args.profile_out, step,
                                                                           len(profile_steps) > 1))
                elapsed = (time.perf_counter() - start) * 1000.0
                spans = timer.spans_ms()
                losses.append(float(loss.detach().float().item()))
                step_ms.append(elapsed)
                sampler.step_ended()
                fwd_ms.append(spans[0])
                bwd_ms.append(spans[1])
                del loss, batch
    finally:
        sampler.stop()
        if set_paused is not None:
            set_paused(False)  # the rest of the process records again

    warmup = args.warmup
    # The first profiled step's summary, and every profiled step's by its number.
    profile_summary = profiles[min(profiles)] if profiles else None
    if method == "cuda_graph":
        warmup = max(warmup, args.graph_warmup + 1)  # the capture step is no steady-state step
    measured = step_ms[warmup:] if len(step_ms) > warmup else step_ms
    result = {
        "job": job.name,
        "method": method,
        "config": job.config,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "deterministic": bool(args.deterministic),
        "seed": args.seed,
        "steps": len(losses),
        "warmup": warmup,
        "losses": [float(v).hex() for v in losses],
        "loss_values": [_finite_or_none(v) for v in losses],
        "step_ms": _ms(step_ms),
        "fwd_ms": _ms(fwd_ms),
        "bwd_ms": _ms(bwd_ms),
        "cpu_probe_us": [round(v, 1) for v in cpu_probe_us],
        "median_step_ms": _median(measured),
        "median_fwd_ms": _median(fwd_ms[warmup:] if len(fwd_ms) > warmup else fwd_ms),
        "device_used_peak_mib": sampler.peak_mib(),
        "device_used_steady_peak_mib": sampler.steady_peak_mib(),
        "device_used_start_mib": None if sampler.first_bytes is None else round(sampler.first_bytes / MIB, 1),
        "device_memory_samples": sampler.samples,
        "device_memory_source": sampler.source,
        "torch_peak_mib": round(torch.cuda.max_memory_allocated(device) / MIB, 1) if cuda else None,
        "torch_reserved_peak_mib": round(torch.cuda.max_memory_reserved(device) / MIB, 1) if cuda else None,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "actpage": actpage_status(),
        "profile": profile_summary,
        "profiles": {str(step): summary for step, summary in sorted(profiles.items())},
    }
    if offload is not None:
        result["stream_offload"] = offload.stats()
    if alternate:
        result["actpage_recorded"] = recorded
        result["alternate"] = alternate_summary(step_ms, recorded, warmup)
        result["alternate_fwd"] = alternate_summary(fwd_ms, recorded, warmup)
    result.update(job.result_fields)
    emit_result(result, out, args.result_json)
    return result


def _train_cuda_graph(job, args, optimizer, losses, step_ms, fwd_ms, bwd_ms, sampler):
    """Eager steps on a side stream (torch's recipe for whole-network capture), then one captured
    training step (forward, backward, optimizer step) replayed for every later step."""
    import torch

    model = job.model
    static = job.make_batch(0)
    side = torch.cuda.Stream()
    graph = None
    static_loss = None
    for step in range(args.steps):
        batch = job.make_batch(step)
        for key, value in batch.items():
            static[key].copy_(value)
        torch.cuda.synchronize()
        start = time.perf_counter()
        if step < args.graph_warmup:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss = job.compute_loss(model, static)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            torch.cuda.current_stream().wait_stream(side)
            value = loss.detach()
            del loss  # its graph would keep the eager AccumulateGrad nodes alive into the capture
        else:
            if graph is None:
                graph = torch.cuda.CUDAGraph()
                optimizer.zero_grad(set_to_none=True)
                with torch.cuda.graph(graph):
                    static_loss = job.compute_loss(model, static)
                    static_loss.backward()
                    optimizer.step()
            graph.replay()
            value = static_loss.detach()
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - start) * 1000.0)
        sampler.step_ended()
        losses.append(float(value.float().item()))
        fwd_ms.append(float("nan"))
        bwd_ms.append(float("nan"))


def emit_result(result, out=None, path=None):
    out = sys.stdout if out is None else out
    line = RESULT_PREFIX + json.dumps(result, sort_keys=True, allow_nan=False, default=_json_default)
    out.write(line + "\n")
    out.flush()
    if path:
        with open(path, "w") as handle:
            json.dump(result, handle, indent=2, sort_keys=True, default=_json_default)
            handle.write("\n")


def _json_default(value):
    if isinstance(value, float):
        return None
    return str(value)


def parse_result_lines(text):
    """Every ACTPAGE_RESULT object in `text` (a job's stdout), in order."""
    results = []
    for line in text.splitlines():
        index = line.find(RESULT_PREFIX)
        if index < 0:
            continue
        try:
            results.append(json.loads(line[index + len(RESULT_PREFIX):]))
        except ValueError:
            continue
    return results
