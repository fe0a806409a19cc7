#!/usr/bin/env python3
"""Runs one job command several ways and compares them: losses, step time, device memory.

    compare_runs.py [--policy P] [--reps 3] [--out DIR] -- python3 examples/train_llama.py --deterministic

Each variant is a way of running the command: plain (as is) or under `actpage run --policy P`, with
an allocator setting (PYTORCH_CUDA_ALLOC_CONF). The default variants are the cross product of
--modes (plain, actpage) and --allocators (native, async, expandable): native is an explicit
`backend:native` (actpage run would otherwise select the async backend), async is
`backend:cudaMallocAsync`, expandable is `expandable_segments:True`; any other text is used as the
value itself, and `unset` removes the variable. --variant "NAME;MODE;ALLOC[;OPTION...][;EXTRA ARGS]"
adds a variant of your own (EXTRA ARGS are appended to the command), e.g.
    --variant "ckpt;plain;async;--method checkpointing"
    --variant "auto;actpage;async;policy=none"
    --variant "mlp;actpage;async;policy=tests/policies/llama-mlp.json"
    --variant "slow;plain;async;reps=1;--method save_on_cpu --steps 6"
An OPTION is a part that starts with `policy=` (this variant's policy instead of --policy;
`policy=none` runs `actpage run` with no --policy and no ACTPAGE_POLICY, what a new user types),
`reps=` (fewer repetitions than --reps for this variant), `env=NAME=VALUE` (an environment
variable for this variant's runs; repeatable) or `actpage=PATH` (this variant's actpage executable
instead of --actpage: two builds side by side, e.g. before and after a change).

With --trace-dir, actpage variants run with `actpage run --trace DIR/NAME.repN.trace`, and each run's
trace is summarised (`actpage dump --json`): the bytes off the device at actpage's peak, offloads,
reloads and stalls go into results.json and the summary. With --ranks N (the command starts N ranks,
e.g. through torchrun), each rank writes DIR/NAME.repN.rank%r.trace (actpage puts the rank for %r):
a run's `trace_summary` is rank 0's, `trace_summaries` every rank's.

With --thread-stats S, each run's process tree is watched through /proc every S seconds
(examples/thread_stats.py): each thread's CPU time, context switches, faults and the CPUs it ran
on, and the steal time of the CPUs the job may use; into results.json (`threads` of each run) and
OUT/logs/NAME.repN.threads.txt. actpage's threads are named actpage-*.

With --cpu-probe S, right before and right after each run a fixed Python loop is timed for S seconds
on each CPU the job may use (its leading `taskset -c`, else this process's CPUs; examples/thread_stats.py
cpu_speed): `cpu_probe` of each run in results.json, {"before": {cpu: rate}, "after": ...}. A CPU
of a virtual machine can run slower for a while with no steal accounted; a CPU-bound job's step then
moves with it.

actpage variants run with ACTPAGE_LOG_LEVEL=info unless it is set (a variant's env= or the caller's),
so that the engine's counters, logged at the end of the run, come back: each run's `engine` in
results.json (its stalls, the GPU's waits for reloads, the reload schedule's asks, auto mode's
choice and the forward's GPU time unpaged and paged) and auto mode's end-of-run line; results.md
adds a table of them ("actpage's own account").

Repetitions are interleaved (rep 1 of every variant, then rep 2, each rep in a rotated order) so
that drift of the machine hits every variant alike. Each run must print an ACTPAGE_RESULT line
(examples/common.py); the last one counts.

Every variant is compared with a reference: an actpage variant with the plain variant of the same
allocator setting (FACTS.md: losses are bit-identical only within one allocator backend), any other
with the baseline (--baseline, default the first variant). The table says whether the losses are
bit-identical (their float.hex strings, over the steps both ran) to the reference's and within the
variant's repetitions, the median step time (median over repetitions of each run's median) and its
ratio to the reference, the device-used peak and torch's peak. Written to OUT/results.json and OUT/results.md, logs in OUT/logs/.

Paired ratios: a job whose step time varies a few % from one process to the next (Qwen3-MoE) needs
more than a ratio of two medians to show a 1% effect. Runs of the same rep ran next to each other, so
each rep where both a variant and its reference succeeded gives one ratio of their median step times
(`paired_reps`, `paired_ratios`; a failed run drops its rep's pair only). The summary row gives their
median (`paired_ratio_median`) with a 95% percentile bootstrap interval of that median
(`paired_ratio_ci95`: 2000 resamples of the pairs, a fixed seed, so the same runs give the same
interval; None with fewer than 3 pairs), and the pooled ratio of the paired runs' mean step times
(`ratio_of_means`, `ratio_of_means_ci95`, the same resamples). The table shows both as
"x1.004 [0.996, 1.012]". With --within T (e.g. 0.01), one line per actpage variant says whether its
paired interval lies inside [1-T, 1+T] (`paired_within` in the row); the exit code does not depend on it.
"""

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULT_PREFIX, parse_result_lines as parse_results  # noqa: E402  (one parser of result lines)
from thread_stats import ThreadWatch, cpu_speed, cpus_of_command, format_summary as format_thread_summary  # noqa: E402
ALLOCATORS = {"native": "backend:native", "async": "backend:cudaMallocAsync",
              "expandable": "expandable_segments:True", "unset": None}
MODES = ("plain", "actpage")
MIB = 1 << 20
NO_POLICY = "none"  # policy=none: `actpage run` with no --policy at all
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261124  # fixed: the same runs always give the same interval
MIN_PAIRS_FOR_INTERVAL = 3  # fewer pairs than this give no interval worth printing


class Variant:
    def __init__(self, name, mode, alloc, extra_args=(), policy=None, reps=None, env=None, actpage=None):
        if mode not in MODES:
            raise ValueError("variant %s: mode must be plain or actpage, got %r" % (name, mode))
        if reps is not None and reps < 1:
            raise ValueError("variant %s: reps must be at least 1, got %r" % (name, reps))
        self.name = name
        self.mode = mode
        self.alloc_label = alloc
        self.alloc = ALLOCATORS.get(alloc, alloc)
        self.extra_args = list(extra_args)
        self.policy = policy  # None: the --policy of the whole comparison; NO_POLICY: none at all
        self.reps = reps  # None: --reps
        self.env = dict(env or {})
        self.actpage = actpage  # None: the comparison's --actpage

    @property
    def without_policy(self):
        return self.mode == "actpage" and self.policy == NO_POLICY

    def to_json(self):
        return {"name": self.name, "mode": self.mode, "alloc": self.alloc_label, "alloc_conf": self.alloc,
                "extra_args": self.extra_args, "policy": self.policy, "reps": self.reps, "env": self.env, "actpage": self.actpage}


VARIANT_OPTIONS = ("policy=", "reps=", "env=", "actpage=")


def parse_variant(spec):
    parts = spec.split(";")
    if len(parts) < 3:
        raise argparse.ArgumentTypeError("expected NAME;MODE;ALLOC[;OPTION...][;EXTRA ARGS], got %r" % spec)
    name, mode, alloc = (p.strip() for p in parts[:3])
    options = [p.strip() for p in parts[3:] if p.strip().startswith(VARIANT_OPTIONS)]
    rest = [p for p in parts[3:] if not p.strip().startswith(VARIANT_OPTIONS)]
    extra = shlex.split(";".join(rest)) if rest else []
    policy, reps, env, actpage = None, None, {}, None
    for option in options:
        key, _, value = option.partition("=")
        if key == "policy":
            policy = value
        elif key == "actpage":
            if not value:
                raise argparse.ArgumentTypeError("variant %s: actpage= needs the executable's path" % name)
            actpage = value
        elif key == "reps":
            try:
                reps = int(value)
            except ValueError:
                raise argparse.ArgumentTypeError("variant %s: reps=%s is not a whole number" % (name, value))
        else:
            env_name, equals, env_value = value.partition("=")
            if not env_name or not equals:
                raise argparse.ArgumentTypeError("variant %s: expected env=NAME=VALUE, got %r" % (name, option))
            env[env_name] = env_value
    try:
        return Variant(name, mode, alloc, extra, policy, reps, env, actpage)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error))


def default_variants(modes, allocators):
    return [Variant("%s-%s" % (mode, alloc), mode, alloc) for mode in modes for alloc in allocators]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default=None, help="policy for the actpage variants")
    parser.add_argument("--actpage", default=None,
                        help="the actpage executable (default: ../build/bin/actpage beside this script, "
                             "else actpage on PATH)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each variant (default 3)")
    parser.add_argument("--out", default="out/compare", help="output folder (default out/compare)")
    parser.add_argument("--modes", default="plain,actpage", help="default variants' modes")
    parser.add_argument("--allocators", default="native,async,expandable",
                        help="default variants' allocator settings (native, async, expandable, unset, or a value)")
    parser.add_argument("--variant", action="append", type=parse_variant, default=[],
                        help="NAME;MODE;ALLOC[;EXTRA ARGS]: a variant of your own (repeatable); with any "
                             "--variant, the defaults are used only if --with-defaults is given")
    parser.add_argument("--with-defaults", action="store_true", help="keep the default variants with --variant")
    parser.add_argument("--baseline", default=None, help="reference for plain variants (default: the first)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run (default 1800)")
    parser.add_argument("--trace-dir", default=None,
                        help="trace each actpage run into this folder and summarise the trace")
    parser.add_argument("--ranks", type=int, default=None, metavar="N",
                        help="the command starts N ranks (a launcher such as torchrun): traces are written "
                             "per rank (NAME.repN.rank%%r.trace) and rank 0's is summarised")
    parser.add_argument("--thread-stats", type=float, default=None, metavar="S",
                        help="watch each run's threads through /proc every S seconds (thread_stats.py): "
                             "CPU time, context switches, CPUs; into results.json and logs/*.threads.txt")
    parser.add_argument("--cpu-probe", type=float, default=None, metavar="S",
                        help="time a fixed Python loop for S seconds on each of the job's CPUs before and after each "
                             "run (thread_stats.cpu_speed); into results.json")
    parser.add_argument("--within", type=float, default=None, metavar="T",
                        help="say for each actpage variant whether the 95%% interval of its paired step-time "
                             "ratio lies inside [1-T, 1+T], e.g. 0.01 (the exit code does not depend on it)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the job command")
    args = parser.parse_args(argv)
    if args.ranks is not None and args.ranks < 1:
        parser.error("--ranks must be at least 1, got %d" % args.ranks)
    if args.within is not None and not 0 < args.within < 1:
        parser.error("--within must lie between 0 and 1 (a fraction, e.g. 0.01), got %g" % args.within)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("no job command given (after --)")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    allocators = [a.strip() for a in args.allocators.split(",") if a.strip()]
    variants = list(args.variant)
    if not variants or args.with_defaults:
        variants = default_variants(modes, allocators) + variants
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        parser.error("variant names must be unique: %s" % ", ".join(names))
    if any(v.mode == "actpage" and not v.policy for v in variants) and not args.policy:
        parser.error("actpage variants need --policy (or policy= in their --variant)")
    if args.baseline is not None and args.baseline not in names:
        parser.error("--baseline %s is not a variant (%s)" % (args.baseline, ", ".join(names)))
    args.variants = variants
    return args


def find_actpage(explicit=None):
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    candidate = os.path.join(here, os.pardir, "build", "bin", "actpage")
    if os.access(candidate, os.X_OK):
        return os.path.normpath(candidate)
    return "actpage"


def command_for(variant, command, actpage, policy, trace=None):
    job = list(command) + variant.extra_args
    if variant.mode == "actpage":
        traced = ["--trace", trace] if trace else []
        chosen = variant_policy(variant, policy)
        policy_args = [] if chosen is None else ["--policy", chosen]
        return [variant.actpage or actpage, "run"] + policy_args + traced + ["--"] + job
    return job


def variant_policy(variant, policy):
    """The policy an actpage variant runs with: its own (policy=), else the comparison's --policy;
    None for policy=none."""
    if variant.without_policy:
        return None
    return os.path.abspath(variant.policy) if variant.policy else policy


def environment_for(variant, base=None):
    env = dict(os.environ if base is None else base)
    env.pop("PYTORCH_ALLOC_CONF", None)  # one variable, so that each variant says what it runs with
    if variant.alloc is None:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    else:
        env["PYTORCH_CUDA_ALLOC_CONF"] = variant.alloc
    if variant.without_policy:
        env.pop("ACTPAGE_POLICY", None)  # actpage run would take it: a new user's shell has none
    if variant.mode == "actpage":
        env.setdefault("ACTPAGE_LOG_LEVEL", "info")  # the engine's counters at the end (engine_account)
    env.update(variant.env)
    return env


# The counters of the engine's end-of-run line (`[actpage] info: engine: {...}`) that say where the
# time went, kept in a run's `engine`: job_thread_ns split by where the job's thread was
# (job_thread_*_ns), and the waits and driver calls on its thread that may explain it (the lock,
# the gates before a marker's reloads, the backlog, the job pool's trims); and auto mode's inputs
# to issue 37's link floor (its link budget and rate, device memory where backward began).
ENGINE_COUNTERS = ("stalls", "stall_ns", "reload_gpu_waits", "reload_gpu_wait_ns", "scheduled_reloads",
                   "scheduled_reload_bytes", "offloads_completed", "bytes_offloaded", "iterations",
                   "auto_bytes_chosen", "auto_forward_gpu_ns", "auto_forward_gpu_paged_ns", "job_thread_ns",
                   "job_thread_vmm_calls", "auto_peak_watched_bytes", "auto_peak_paged_bytes", "grant_waits",
                   "grant_wait_ns", "job_thread_allocate_ns", "job_thread_free_ns", "job_thread_range_ns",
                   "job_thread_saved_ns", "job_thread_observe_ns", "job_thread_lock_wait_ns", "gpu_waits",
                   "gpu_wait_ns", "room_gate_ns", "pool_waits", "pool_wait_ns", "pool_trims", "pool_trim_ns",
                   "backlog_waits", "backlog_wait_ns", "job_thread_vmm_ns", "job_thread_window_ns",
                   "job_thread_pass_start_ns", "job_thread_pool_mark_ns", "job_thread_watched_ns", "auto_bytes_paged",
                   "auto_sheds",
                   "auto_cycle_base_ns", "auto_cycle_judged_ns", "auto_cycle_whole_ns", "auto_cycle_settled_ns",
                   "auto_budget_bytes",
                   "auto_link_bytes_per_s", "auto_used_unpaged_bytes", "auto_used_paged_bytes",
                   "auto_peak_unpaged_bytes",
                   # what became of the saved tensors' release points (a job's own checkpointing)
                   "offloads_cancelled", "release_points_moved", "released_unreferenced")


def engine_account(stderr_text):
    """The engine's own account of a run, from its stderr: {"counters": {...ENGINE_COUNTERS},
    "auto": auto mode's end-of-run line or None}; None when the run logged no engine line (log
    level above info, or actpage not loaded). The last line of each kind counts."""
    counters, auto = None, None
    for line in stderr_text.splitlines():
        at = line.find("engine: {")
        if line.startswith("[actpage]") and at >= 0:
            try:
                everything = json.loads(line[at + len("engine: "):])
            except ValueError:
                continue
            counters = {name: everything[name] for name in ENGINE_COUNTERS if name in everything}
        elif line.startswith("[actpage] warning: auto ("):
            auto = line[len("[actpage] warning: "):]
    if counters is None:
        return None
    return {"counters": counters, "auto": auto}


def schedule(variants, reps):
    """(rep, variant) pairs, interleaved: every variant once per rep, each rep rotated by one. A
    variant with fewer repetitions of its own (reps=) sits out the later reps."""
    order = []
    for rep in range(reps):
        shift = rep % len(variants) if variants else 0
        for variant in variants[shift:] + variants[:shift]:
            if variant.reps is None or rep < variant.reps:
                order.append((rep, variant))
    return order


def summarize_trace(actpage, trace):
    """The figures of one run's trace that a comparison reports, from `actpage dump --json`; None
    when there is no trace or it cannot be read (the run's record says why)."""
    if not trace or not os.path.isfile(trace):
        return None
    try:
        done = subprocess.run([actpage, "dump", "--json", trace], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=300)
        dump = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired) as error:
        return {"error": str(error)}
    if not isinstance(dump, dict):
        return {"error": "actpage dump --json failed: %s" % (done.stderr.strip().splitlines() or ["?"])[-1]}
    memory = dump.get("memory") or {}
    offload, reload, stalls = dump.get("offload") or {}, dump.get("reload") or {}, dump.get("stalls") or {}

    def mib(value):
        return None if value is None else round(value / MIB, 1)

    return {
        "offloaded_at_peak_mib": mib(memory.get("offloaded_at_peak_bytes")),
        "peak_offloaded_mib": mib(memory.get("peak_offloaded_bytes")),
        "peak_used_mib": mib(memory.get("peak_used_bytes")),
        "offloads": offload.get("count"), "offloaded_mib": mib(offload.get("bytes")),
        "reloads": reload.get("count"), "reloaded_mib": mib(reload.get("bytes")),
        "stalls": stalls.get("count"),
        "stall_ms": None if stalls.get("total_ns") is None else round(stalls["total_ns"] / 1e6, 2),
    }


def run_once(variant, rep, command, actpage, policy, out_dir, timeout, log=None, trace_dir=None,
             thread_stats=None, cpu_probe=None, ranks=None):
    log = sys.stderr if log is None else log
    trace, rank_traces = None, []
    if trace_dir and variant.mode == "actpage":
        os.makedirs(trace_dir, exist_ok=True)
        trace_stem = os.path.join(os.path.abspath(trace_dir), "%s.rep%d" % (variant.name, rep + 1))
        if ranks:
            trace = trace_stem + ".rank%r.trace"  # actpage writes the rank for %r
            rank_traces = [trace_stem + ".rank%d.trace" % rank for rank in range(ranks)]
        else:
            trace = trace_stem + ".trace"
            rank_traces = [trace]
        for path in rank_traces:
            if os.path.exists(path):
                os.remove(path)  # a trace left by an earlier comparison must not pass for this run's
    argv = command_for(variant, command, actpage, policy, trace)
    env = environment_for(variant)
    logs = os.path.join(out_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    stem = os.path.join(logs, "%s.rep%d" % (variant.name, rep + 1))
    log.write("[compare] %s rep %d: %s\n" % (variant.name, rep + 1, " ".join(shlex.quote(a) for a in argv)))
    log.flush()
    record = {"variant": variant.name, "rep": rep + 1, "argv": argv, "alloc_conf": variant.alloc}
    probe_cpus = cpus_of_command(command) if cpu_probe else None
    if cpu_probe:
        record["cpu_probe"] = {"before": cpu_speed(probe_cpus, cpu_probe)}
    start = time.time()
    watch = None
    try:
        with open(stem + ".err", "w") as err:
            child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, universal_newlines=True)
            if thread_stats:
                watch = ThreadWatch(child.pid, thread_stats).start()
            try:
                stdout, _ = child.communicate(timeout=timeout)
                record["rc"] = child.returncode
            except subprocess.TimeoutExpired:
                child.kill()
                stdout, _ = child.communicate()
                record["rc"] = "timeout"
    except OSError as error:
        stdout, record["rc"] = "", "error: %s" % error
    if watch is not None:
        record["threads"] = watch.stop()
        with open(stem + ".threads.txt", "w") as handle:
            handle.write(format_thread_summary(record["threads"]) + "\n")
    record["wall_s"] = round(time.time() - start, 2)
    if cpu_probe:
        record["cpu_probe"]["after"] = cpu_speed(probe_cpus, cpu_probe)
    with open(stem + ".out", "w") as handle:
        handle.write(stdout)
    if variant.mode == "actpage":
        with open(stem + ".err") as handle:
            record["engine"] = engine_account(handle.read())
    results = parse_results(stdout)
    record["result"] = results[-1] if results else None
    record["ok"] = record["rc"] == 0 and record["result"] is not None
    if trace:
        record["trace"] = rank_traces[0]
        record["trace_summary"] = summarize_trace(variant.actpage or actpage, rank_traces[0])
        if ranks:
            record["trace_summaries"] = [summarize_trace(variant.actpage or actpage, path) for path in rank_traces]
    if not record["ok"]:
        log.write("[compare] %s rep %d FAILED (rc %s%s); see %s.err\n" % (
            variant.name, rep + 1, record["rc"], "" if record["result"] else ", no ACTPAGE_RESULT", stem))
    return record


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _first_difference(a, b):
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return min(len(a), len(b)) if len(a) != len(b) else None


def reference_of(variant, variants, baseline_name):
    if variant.mode == "actpage":
        for other in variants:
            if other.mode == "plain" and other.alloc == variant.alloc and other.extra_args == variant.extra_args:
                return other.name
    baseline = baseline_name or (variants[0].name if variants else None)
    return None if baseline == variant.name else baseline


def paired_step_times(runs, reference_runs):
    """[(rep, variant's median step ms, reference's)] for each rep in which both succeeded, by rep
    number: a failed run on either side drops that rep's pair and no other."""
    def by_rep(records):
        return {r["rep"]: r["result"].get("median_step_ms") for r in records
                if r["ok"] and r["result"].get("median_step_ms") is not None}
    mine, theirs = by_rep(runs), by_rep(reference_runs)
    return [(rep, mine[rep], theirs[rep]) for rep in sorted(mine) if rep in theirs and theirs[rep]]


def median_of_ratios(pairs):
    return statistics.median(mine / theirs for mine, theirs in pairs)


def ratio_of_means(pairs):
    """sum(variant) / sum(reference) over the pairs: the pooled ratio of mean step times."""
    return sum(mine for mine, _ in pairs) / sum(theirs for _, theirs in pairs)


def bootstrap_interval(pairs, statistic, level=0.95, resamples=BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED):
    """Percentile bootstrap interval [lo, hi] of statistic(pairs): the statistic of `resamples`
    resamples of the pairs (n drawn with replacement from n), sorted; lo is the k-th smallest and hi
    the k-th largest, k = round(resamples * (1 - level) / 2) (50 of 2000 at 95%). None with fewer
    than MIN_PAIRS_FOR_INTERVAL pairs. Deterministic: its own random.Random(seed)."""
    if len(pairs) < MIN_PAIRS_FOR_INTERVAL:
        return None
    rng = random.Random(seed)
    n = len(pairs)
    values = sorted(statistic([pairs[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    k = max(1, int(round(resamples * (1 - level) / 2)))
    return [values[k - 1], values[resamples - k]]


def paired_statistics(runs, reference_runs):
    """The paired fields of a summary row (see the module's docstring)."""
    paired = paired_step_times(runs, reference_runs)
    pairs = [(mine, theirs) for _, mine, theirs in paired]

    def rounded(values):
        return None if values is None else [round(v, 6) for v in values]

    return {
        "paired_reps": [rep for rep, _, _ in paired],
        "paired_ratios": rounded([mine / theirs for mine, theirs in pairs]),
        "paired_ratio_median": _round(median_of_ratios(pairs), 6) if pairs else None,
        "paired_ratio_ci95": rounded(bootstrap_interval(pairs, median_of_ratios)),
        "ratio_of_means": _round(ratio_of_means(pairs), 6) if pairs else None,
        "ratio_of_means_ci95": rounded(bootstrap_interval(pairs, ratio_of_means)),
    }


def interval_within(interval, tolerance):
    """True when [lo, hi] lies inside [1 - tolerance, 1 + tolerance]; None without an interval."""
    if interval is None:
        return None
    return 1 - tolerance <= interval[0] and interval[1] <= 1 + tolerance


def summarize(variants, records, baseline_name=None, within=None):
    """One row per variant (see the module's docstring); with `within`, each row with a reference
    also says whether its paired interval lies inside [1 - within, 1 + within]."""
    by_variant = {v.name: [r for r in records if r["variant"] == v.name] for v in variants}
    rows = []
    medians = {}
    first_losses = {}
    for variant in variants:
        ok = [r for r in by_variant[variant.name] if r["ok"]]
        medians[variant.name] = _median([r["result"].get("median_step_ms") for r in ok])
        first_losses[variant.name] = ok[0]["result"].get("losses") if ok else None
    for variant in variants:
        runs = by_variant[variant.name]
        ok = [r for r in runs if r["ok"]]
        losses = [r["result"].get("losses") for r in ok]
        stable = None if not losses else all(l == losses[0] for l in losses)
        ref = reference_of(variant, variants, baseline_name)
        identical, differs_at = None, None
        if ref is not None and losses and first_losses.get(ref) is not None:
            ref_losses = first_losses[ref]
            # Over the steps both ran: a variant may run fewer steps (a slow one, --steps in its
            # extra args); a run that stops early prints no result at all, so it cannot pass.
            identical = all(l[:len(ref_losses)] == ref_losses[:len(l)] for l in losses)
            if not identical:
                differs_at = min(d for d in (_first_difference(l, ref_losses) for l in losses) if d is not None)
        median_ms = medians[variant.name]
        ref_ms = medians.get(ref) if ref is not None else None
        rows.append({
            "variant": variant.name, "mode": variant.mode, "alloc": variant.alloc_label,
            "alloc_conf": variant.alloc, "extra_args": variant.extra_args,
            "runs": len(runs), "ok": len(ok),
            "reference": ref,
            "losses_identical_to_reference": identical,
            "losses_first_difference_step": differs_at,
            "losses_stable_across_reps": stable,
            "median_step_ms": None if median_ms is None else round(median_ms, 3),
            "step_ms_min": _min([r["result"].get("median_step_ms") for r in ok]),
            "step_ms_max": _max([r["result"].get("median_step_ms") for r in ok]),
            "ratio_to_reference": (round(median_ms / ref_ms, 4) if median_ms is not None and ref_ms else None),
            "device_used_peak_mib": _round(_median([r["result"].get("device_used_peak_mib") for r in ok])),
            "device_used_steady_peak_mib": _round(_median([r["result"].get("device_used_steady_peak_mib")
                                                          for r in ok])),
            "torch_peak_mib": _round(_median([r["result"].get("torch_peak_mib") for r in ok])),
            "actpage_active": _any([((r["result"].get("actpage") or {}).get("active")) for r in ok]),
            "policy": variant.policy,
            "offloaded_at_peak_mib": _round(_median([(r.get("trace_summary") or {}).get("offloaded_at_peak_mib")
                                                     for r in ok])),
            "peak_offloaded_mib": _round(_median([(r.get("trace_summary") or {}).get("peak_offloaded_mib")
                                                  for r in ok])),
            "median_fwd_ms": _round(_median([r["result"].get("median_fwd_ms") for r in ok]), 3),
            # Forward passes a step (gradient accumulation's micro-batches; the jobs' `microbatches`).
            "forward_passes": _round(_median([r["result"].get("microbatches") for r in ok]), 0),
            "engine": engine_medians([r.get("engine") for r in ok]),
        })
        rows[-1].update(paired_statistics(runs, by_variant[ref] if ref is not None else []))
        if within is not None:
            rows[-1]["paired_within"] = interval_within(rows[-1]["paired_ratio_ci95"], within)
    return rows


def engine_medians(accounts):
    """Per counter, the median over the runs that logged it (None without any); auto mode's line of
    the first run that has one."""
    accounts = [a for a in accounts if a]
    if not accounts:
        return None
    names = sorted({name for a in accounts for name in a["counters"]})
    medians = {name: _median([a["counters"].get(name) for a in accounts]) for name in names}
    auto = next((a["auto"] for a in accounts if a.get("auto")), None)
    return {"counters": medians, "auto": auto}


def format_engine_table(rows):
    """actpage's own account, a line per variant that logged it: the medians of its counters."""
    rows = [row for row in rows if row.get("engine")]
    if not rows:
        return None
    header = ["variant", "paged a pass GiB (chosen -> after the governor)", "forward GPU ms unpaged -> paged",
              "pass cycle GPU ms unpaged -> paged (judged; since settled)", "stalls (ms)",
              "GPU waits for reloads (ms)", "scheduled reloads (GiB)", "job thread VMM calls",
              "job thread in actpage, ms a pass (allocating; of that, paged passes' starts [their job pool marks])",
              "its peaks MiB, unpaged (the governor's passes, else 1-2) -> paged (measured: whole run, after warm-up)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]

    def ms(value):
        return _cell(None if value is None else value / 1e6, "%.1f")

    def mib(value):
        return _cell(value / float(1 << 20) if value else None, "%.0f")

    def per_pass(counters, name):
        value, passes = counters.get(name), counters.get("iterations")
        return None if value is None or not passes else value / float(passes)

    for row in rows:
        c = row["engine"]["counters"]
        chosen = c.get("auto_bytes_chosen")
        forward = "-"
        if c.get("auto_forward_gpu_ns"):
            forward = "%s -> %s" % (ms(c.get("auto_forward_gpu_ns")), ms(c.get("auto_forward_gpu_paged_ns") or None))
        paged = c.get("auto_bytes_paged")
        gib = "%s -> %s" % (_cell(None if chosen is None else chosen / float(1 << 30), "%.2f"),
                            _cell(None if paged is None else paged / float(1 << 30), "%.2f"))
        cycle = "-"
        if c.get("auto_cycle_judged_ns"):
            # No base where the governor had no room for unpaged passes: "-".
            cycle = "%s -> %s" % (ms(c.get("auto_cycle_base_ns") or None), ms(c.get("auto_cycle_judged_ns")))
            if c.get("auto_cycle_whole_ns") and c.get("auto_cycle_whole_ns") != c.get("auto_cycle_judged_ns"):
                cycle += " (whole %s)" % ms(c.get("auto_cycle_whole_ns"))
            if c.get("auto_cycle_settled_ns"):
                # The passes after the governor settled: what the median step measures.
                cycle += "; since %s" % ms(c.get("auto_cycle_settled_ns"))
        cells = [
            row["variant"],
            gib,
            forward,
            cycle,
            "%s (%s)" % (_cell(c.get("stalls"), "%d"), ms(c.get("stall_ns"))),
            "%s (%s)" % (_cell(c.get("reload_gpu_waits"), "%d"), ms(c.get("reload_gpu_wait_ns"))),
            "%s (%s)" % (_cell(c.get("scheduled_reloads"), "%d"),
                         _cell(None if c.get("scheduled_reload_bytes") is None
                               else c["scheduled_reload_bytes"] / float(1 << 30), "%.2f")),
            _cell(c.get("job_thread_vmm_calls"), "%d"),
            "%s (%s; %s [%s])" % (ms(per_pass(c, "job_thread_ns")), ms(per_pass(c, "job_thread_allocate_ns")),
                                  ms(per_pass(c, "job_thread_pass_start_ns")), ms(per_pass(c, "job_thread_pool_mark_ns"))),
            "%s -> %s (%s, %s)" % (mib(c.get("auto_peak_unpaged_bytes") or c.get("auto_peak_watched_bytes")),
                                   mib(c.get("auto_peak_paged_bytes")),
                                   _cell(row.get("device_used_peak_mib"), "%.0f"),
                                   _cell(row.get("device_used_steady_peak_mib"), "%.0f")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _min(values):
    values = [v for v in values if v is not None]
    return min(values) if values else None


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _round(value, digits=1):
    return None if value is None else round(value, digits)


def _any(values):
    values = [v for v in values if v is not None]
    return any(values) if values else None


def _cell(value, fmt="%s"):
    if value is None:
        return "-"
    return fmt % value


def _yes_no(flag, detail=None):
    if flag is None:
        return "-"
    if flag:
        return "yes"
    return "no" if detail is None else "no (step %d)" % detail


def format_ratio(value, interval):
    """"x1.004 [0.996, 1.012]"; without an interval (fewer than 3 pairs) just "x1.004"."""
    if value is None:
        return "-"
    if interval is None:
        return "x%.3f" % value
    return "x%.3f [%.3f, %.3f]" % (value, interval[0], interval[1])


def within_lines(rows, tolerance):
    """One line per actpage variant with a reference: does its paired interval lie inside
    [1 - tolerance, 1 + tolerance]?"""
    lo, hi = 1 - tolerance, 1 + tolerance
    lines = []
    for row in rows:
        if row["mode"] != "actpage" or row["reference"] is None:
            continue
        pairs = len(row["paired_ratios"])
        head = "within %g%%: %s vs %s: %s over %d pair%s" % (
            tolerance * 100, row["variant"], row["reference"],
            format_ratio(row["paired_ratio_median"], row["paired_ratio_ci95"]), pairs, "" if pairs == 1 else "s")
        verdict = interval_within(row["paired_ratio_ci95"], tolerance)
        if verdict is None:
            tail = "not established (an interval needs %d pairs)" % MIN_PAIRS_FOR_INTERVAL
        elif verdict:
            tail = "yes, the 95%% interval lies inside [%.3f, %.3f]" % (lo, hi)
        else:
            tail = "no, the 95%% interval is not inside [%.3f, %.3f]" % (lo, hi)
        lines.append("%s: %s" % (head, tail))
    return lines


def format_table(rows):
    header = ["variant", "actpage", "allocator", "ok/runs", "losses = ref", "ref", "stable", "median step ms",
              "x ref", "device used peak MiB", "after warm-up MiB", "torch peak MiB", "paired x ref [95%]",
              "x ref of means [95%]"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for row in rows:
        cells = [
            row["variant"] + (" " + " ".join(row["extra_args"]) if row["extra_args"] else ""),
            "yes" if row["mode"] == "actpage" else "no",
            row["alloc_conf"] or "unset",
            "%d/%d" % (row["ok"], row["runs"]),
            _yes_no(row["losses_identical_to_reference"], row["losses_first_difference_step"]),
            row["reference"] or "-",
            _yes_no(row["losses_stable_across_reps"]),
            _cell(row["median_step_ms"], "%.1f"),
            _cell(row["ratio_to_reference"], "%.3f"),
            _cell(row["device_used_peak_mib"], "%.0f"),
            _cell(row.get("device_used_steady_peak_mib"), "%.0f"),
            _cell(row["torch_peak_mib"], "%.0f"),
            format_ratio(row["paired_ratio_median"], row["paired_ratio_ci95"]),
            format_ratio(row["ratio_of_means"], row["ratio_of_means_ci95"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_outputs(out_dir, args_record, rows, records, within=None):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as handle:
        json.dump({"settings": args_record, "summary": rows, "runs": records}, handle, indent=2, sort_keys=True)
        handle.write("\n")
    table = format_table(rows)
    with open(os.path.join(out_dir, "results.md"), "w") as handle:
        handle.write("# compare_runs\n\n")
        handle.write("Command: `%s`\n\n" % " ".join(shlex.quote(a) for a in args_record["command"]))
        if args_record.get("policy"):
            handle.write("Policy: `%s`\n\n" % args_record["policy"])
        handle.write("Repetitions: %d, interleaved. Losses compared bit for bit (float.hex) with the reference "
                     "run; step time is the median over repetitions of each run's median after warm-up. Device used: "
                     "cudaMemGetInfo's peak over the whole run, and over the steps after warm-up.\n\n"
                     % args_record["reps"])
        handle.write(table + "\n")
        handle.write("\nPaired: the median over reps of each rep's ratio to the reference's run of the same rep, "
                     "and the ratio of the paired runs' mean step times; in brackets a 95%% bootstrap "
                     "interval (%d resamples, fixed seed; none under %d pairs).\n"
                     % (BOOTSTRAP_RESAMPLES, MIN_PAIRS_FOR_INTERVAL))
        if within is not None:
            handle.write("\n" + "".join("- %s\n" % line for line in within_lines(rows, within)))
        engine = format_engine_table(rows)
        if engine is not None:
            handle.write("\n## actpage's own account\n\nMedians over each variant's runs of the counters the engine "
                         "logs at the end of a run (totals over the run): auto mode's bytes a pass as chosen and "
                         "as its governor left them, the forward's GPU time unpaged (pass 2) and paged (median of "
                         "the paged passes), a pass's cycle on the GPU (its start to the next's) unpaged (measured) and as the governor "
                         "last judged it paged (and with the whole choice paged, where it cut; since: the median "
                         "after it settled, what the median step measures); stalls "
                         "(the job's thread waited for a reload to be issued); the GPU's waits for reloads "
                         "still copying at the marker that asked for them; reloads the schedule asked for; the "
                         "job's threads' time inside actpage a pass (where the host runs far ahead, waits there "
                         "replace the job's own and cost no GPU time); the peaks of device "
                         "memory in use auto mode's end-of-run line says (sampled in the job, as this comparison "
                         "samples it) beside this comparison's own.\n\n")
            handle.write(engine + "\n")
            for row in rows:
                if row.get("engine") and row["engine"].get("auto"):
                    handle.write("\n- %s: `%s`\n" % (row["variant"], row["engine"]["auto"]))
    return table


def main(argv=None):
    args = parse_args(argv)
    actpage = find_actpage(args.actpage)
    policy = os.path.abspath(args.policy) if args.policy else None
    records = []
    for rep, variant in schedule(args.variants, args.reps):
        records.append(run_once(variant, rep, args.command, actpage, policy, args.out, args.timeout,
                                trace_dir=args.trace_dir, thread_stats=args.thread_stats,
                                cpu_probe=args.cpu_probe, ranks=args.ranks))
    rows = summarize(args.variants, records, args.baseline, args.within)
    settings = {"command": args.command, "policy": policy, "actpage": actpage, "reps": args.reps, "ranks": args.ranks,
                "variants": [v.to_json() for v in args.variants], "baseline": args.baseline,
                "within": args.within, "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED}}
    table = write_outputs(args.out, settings, rows, records, args.within)
    print(table)
    if args.within is not None:
        print()
        for line in within_lines(rows, args.within):
            print(line)
    print("\nwritten: %s, %s" % (os.path.join(args.out, "results.json"), os.path.join(args.out, "results.md")))
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
