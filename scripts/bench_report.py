#!/usr/bin/env python3
"""Reads what scripts/bench.sh measured on the zoo and shows, per job, what each way of keeping
activation memory down saves and costs.

    bench_report.py [DIR] [--manifest FILE] [--png FILE] [--json FILE] [--markdown FILE] [--png-link NAME]

DIR (default out/bench) holds one folder per job: examples/compare_runs.py's results.json and
bench.sh's meta.json (its manifest entry, the call's settings and link.json), or skipped.json when
the machine had too few GPUs for it. Per job, a Pareto table against the baseline `none` (the job as
is, same allocator backend): each variant's median step time and ratio, the device memory in use
saved (peak of total - free from cudaMemGetInfo, max over ranks), GiB saved per 1% of slowdown, the
saving as a share of the job's link bound (D2H rate x the baseline's forward GPU time: what the copy
engine can move while forward runs), whether the losses equal the baseline's (bit for bit for a
deterministic job, else within the job's loss_tolerance, relative), for an actpage variant that
pages (its engine's account: bytes a pass) its step against the link's floor for them, and `*` on
the Pareto front (no other variant with the baseline's losses saves at least as much at no more
step time, and strictly more or faster). --png draws one panel per job (scripts/bench_plot.py, matplotlib); --markdown writes
the tables for docs/benchmarks.md; --manifest orders the jobs and names those not run yet.

Exit status 1 when a run failed or a job has no baseline; skipped and not-yet-run jobs are not failures.
"""

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_manifest  # noqa: E402

GIB_IN_MIB = 1024.0
GIB = 1 << 30
BASELINE = "none"
# What each of bench.sh's variants is, in the order the tables list them; others follow in
# results.json's order.
VARIANTS = {
    "none": "the job as is",
    "actpage-observe": "actpage run, observe only",
    "actpage": "actpage run, no policy",
    "actpage-default": "actpage run, config/default-policy.json",
    "actpage-device-memory": "actpage run --device-memory (a share of the preflight's peak)",
    "checkpointing": "the job's gradient checkpointing",
    "actpage-default+checkpointing": "actpage default policy on top of checkpointing",
    "actpage+checkpointing": "actpage run, no policy, on top of checkpointing",
    "no-checkpointing": "the job's default checkpointing turned off",
    "save_on_cpu": "torch save_on_cpu(pin_memory=True)",
    "stream_offload": "streamed offload in the job",
}
# Steal: CPU time the host took from the job's CPUs in a run (compare_runs.py --thread-stats). On the
# H100 machine a forward pass ran +8 ms at 0.3 s or more of steal against +2 ms at 0.1 s
# (docs/findings.md, section 6): a time read from such a run is the host's as much as the variant's.
STEAL_NOTICE_S = 0.3
# Runs of one job whose CPU probes (the job's own per-step loop) differ by more than this share are
# noted: their step-time ratios compare the CPUs as much as the builds.
PROBE_NOTICE_SHARE = 0.25


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------
def _read_json(path):
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def load_jobs(directory, order=()):
    """{job: {"results", "meta", "skipped"}} for each folder of DIR with a results.json or a
    skipped.json; jobs named in `order` (the manifest's) first, in that order, the rest by name."""
    jobs = {}
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        folder = os.path.join(directory, name)
        results = _read_json(os.path.join(folder, "results.json"))
        skipped = _read_json(os.path.join(folder, "skipped.json"))
        if results is None and skipped is None:
            continue
        jobs[name] = {"results": results, "meta": _read_json(os.path.join(folder, "meta.json")) or {},
                      "skipped": None if results is not None else skipped}
    ranked = [job for job in order if job in jobs] + sorted(job for job in jobs if job not in order)
    return {job: jobs[job] for job in ranked}


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------
def loss_rule(meta, baseline_result):
    """How losses are compared for a job: bit for bit when it ran deterministic, else within a
    relative tolerance. The baseline's result line says first (the job knows at run time what
    keeps it from repeating its bits, e.g. an inductor without a deterministic mode), its manifest
    entry where the line does not; a job neither deterministic nor given a tolerance is compared bit
    for bit, and says so."""
    manifest = meta.get("manifest") or {}
    result = baseline_result or {}
    deterministic = result.get("deterministic", manifest.get("deterministic"))
    tolerance = result.get("loss_tolerance") or manifest.get("loss_tolerance") or 0.0
    reason = result.get("nondeterministic_reason")
    if deterministic or not tolerance:
        return {"mode": "bits", "tolerance": None, "deterministic": bool(deterministic), "reason": reason}
    return {"mode": "tolerance", "tolerance": float(tolerance), "deterministic": False, "reason": reason}


def compare_losses(runs_losses, reference, rule):
    """Every run's losses (float.hex strings) against the reference run's, over the steps both ran:
    {"equal", "first_difference_step", "max_rel_diff"}; equal is None without both sides."""
    if reference is None or not runs_losses:
        return {"equal": None, "first_difference_step": None, "max_rel_diff": None}
    first, worst = None, 0.0
    tolerance = rule["tolerance"] if rule["mode"] == "tolerance" else None
    for losses in runs_losses:
        for step, (mine, theirs) in enumerate(zip(losses, reference)):
            if mine == theirs:
                continue
            a, b = float.fromhex(mine), float.fromhex(theirs)
            diff = abs(a - b) / max(abs(b), 1e-30) if a == a and b == b else float("inf")  # NaN: differs
            worst = max(worst, diff)
            if tolerance is None or diff > tolerance:
                first = step if first is None else min(first, step)
    return {"equal": first is None, "first_difference_step": first, "max_rel_diff": worst}


def _ok_runs(runs, variant):
    return [r for r in runs if r.get("variant") == variant and r.get("ok") and r.get("result")]


def _losses_of(runs, variant):
    return [r["result"].get("losses") or [] for r in _ok_runs(runs, variant)]


# ---------------------------------------------------------------------------------------------
# Host noise (compare_runs --thread-stats, --cpu-probe)
# ---------------------------------------------------------------------------------------------
def run_steal_s(run):
    cpus = (run.get("threads") or {}).get("cpus") or {}
    return sum(cpu.get("steal_ms", 0.0) for cpu in cpus.values()) / 1000.0 if cpus else None


def variant_steal_s(runs, variant):
    steals = [s for s in (run_steal_s(r) for r in _ok_runs(runs, variant)) if s is not None]
    return max(steals) if steals else None


def _run_cpu_rates(run):
    probe = run.get("cpu_probe") or {}
    before, after = probe.get("before") or {}, probe.get("after") or {}
    return {cpu: sum(x[cpu] for x in (before, after) if cpu in x) / sum(1 for x in (before, after) if cpu in x)
            for cpu in set(before) | set(after)}


def variant_cpu_speed(runs, variant):
    """The slowest CPU of any run of the variant as a share of the call's usual rate (the median of
    the probed runs' median rates), or None when not probed."""
    medians = sorted(sorted(rates.values())[len(rates) // 2] for rates in map(_run_cpu_rates, runs) if rates)
    usual = medians[len(medians) // 2] if medians else None
    lows = [min(rates.values()) for rates in map(_run_cpu_rates, _ok_runs(runs, variant)) if rates]
    return min(lows) / usual if lows and usual else None


def variant_job_probe_us(runs, variant):
    """The median over the variant's runs of the job's own CPU probe after warm-up (examples/common.py's
    cpu_probe_us: a fixed Python loop before each step's timer), or None where the job has none. The
    same job's probe read ~120 or ~220 us from run to run on the H200 machines, and paging's cost on a
    job whose host is barely ahead followed it (resnet's paged passes +3.6-7.3% at ~125 us, +12-22% at
    184-239 us, 2026-11-30): ratios across runs at different probes compare the CPUs too."""
    medians = []
    for run in _ok_runs(runs, variant):
        probe = run["result"].get("cpu_probe_us") or []
        warmup = run["result"].get("warmup") or 0
        steady = probe[warmup:] if len(probe) > warmup else probe
        if steady:
            medians.append(sorted(steady)[len(steady) // 2])
    return sorted(medians)[len(medians) // 2] if medians else None


# ---------------------------------------------------------------------------------------------
# One job
# ---------------------------------------------------------------------------------------------
def link_bound(meta, baseline_row):
    """{"d2h_bytes_per_s", "source", "fwd_ms", "forward_passes", "bound_gib", "why"}: the link bound of
    a job, or why there is none. The forward time is one forward pass's: with gradient accumulation a
    step runs several (`forward_passes`), and each one's activations are freed by its own backward,
    so the copies that lower the peak must hide behind one pass, not behind the step's sum."""
    link = meta.get("link") or {}
    rate = link.get("d2h_bytes_per_s")
    step_fwd = (baseline_row or {}).get("median_fwd_ms")
    passes = int((baseline_row or {}).get("forward_passes") or 1)
    fwd = None if step_fwd is None else step_fwd / max(passes, 1)
    bound = {"d2h_bytes_per_s": rate, "source": link.get("source"), "fwd_ms": fwd, "forward_passes": passes,
             "bound_gib": None, "why": None}
    if rate is None:
        bound["why"] = "D2H rate not measured (%s)" % ("; ".join(link.get("errors") or []) or "no link.json")
    elif fwd is None:
        bound["why"] = "no forward GPU time from the baseline (median_fwd_ms)"
    else:
        bound["bound_gib"] = rate * fwd / 1000.0 / GIB
    return bound


def link_floor_ms(bound, base_ms, paged_bytes):
    """The step time the link allows a variant that pages `paged_bytes` a forward pass (actpage's own
    account, auto_bytes_paged): the baseline's step plus, for each forward pass of a step, the copies
    out and back of what it pages beyond the link bound, at the measured D2H rate (the floor issue 37's
    device-memory goal is held to). None without paged bytes, a baseline step or a link bound."""
    if not paged_bytes or base_ms is None or bound["bound_gib"] is None or not bound["d2h_bytes_per_s"]:
        return None
    beyond = max(0.0, paged_bytes - bound["bound_gib"] * GIB)
    return base_ms + bound["forward_passes"] * 2 * beyond / bound["d2h_bytes_per_s"] * 1000.0


def _spread(row):
    low, high = row.get("step_ms_min"), row.get("step_ms_max")
    return high / low - 1 if low and high and (row.get("ok") or 0) >= 2 else None


def pareto_front(rows):
    """Marks row["front"]: among rows with a step time, a saving and losses not found different, those
    no other such row dominates (at most its step time and at least its saving, one of them strictly)."""
    candidates = [r for r in rows if r["median_step_ms"] is not None and r["saved_mib"] is not None
                  and r["losses"]["equal"] is not False]
    for row in rows:
        row["front"] = any(row is c for c in candidates) and not any(
            other is not row and other["median_step_ms"] <= row["median_step_ms"] and other["saved_mib"] >= row["saved_mib"]
            and (other["median_step_ms"] < row["median_step_ms"] or other["saved_mib"] > row["saved_mib"])
            for other in candidates)


def job_report(job, data):
    results, meta = data["results"], data["meta"]
    summary = {row["variant"]: row for row in results.get("summary", [])}
    runs = results.get("runs", [])
    base = summary.get(BASELINE) or {}
    base_runs = _ok_runs(runs, BASELINE)
    rule = loss_rule(meta, base_runs[0]["result"] if base_runs else None)
    reference = base_runs[0]["result"].get("losses") if base_runs else None
    bound = link_bound(meta, base)
    base_ms, base_used = base.get("median_step_ms"), base.get("device_used_peak_mib")
    base_steady = base.get("device_used_steady_peak_mib")
    names = [n for n in VARIANTS if n in summary] + [n for n in summary if n not in VARIANTS]
    rows, problems, notes = [], [], []
    for name in names:
        row = summary[name]
        ms, used = row.get("median_step_ms"), row.get("device_used_peak_mib")
        ratio = ms / base_ms if ms is not None and base_ms else None
        saved = base_used - used if used is not None and base_used is not None else None
        saved_gib = None if saved is None else saved / GIB_IN_MIB
        # After the warm-up steps: what a method that watches the first steps (auto mode) gives back.
        steady = row.get("device_used_steady_peak_mib")
        saved_steady_gib = (base_steady - steady) / GIB_IN_MIB if steady is not None and base_steady is not None \
            else None
        losses = compare_losses(_losses_of(runs, name), reference, rule) if name != BASELINE else \
            {"equal": None, "first_difference_step": None, "max_rel_diff": None}
        paged = ((row.get("engine") or {}).get("counters") or {}).get("auto_bytes_paged")
        floor_ms = link_floor_ms(bound, base_ms, paged)
        twin = row.get("reference")
        if name != BASELINE and twin not in (None, BASELINE) and twin in summary:
            # an actpage variant on top of a peer (checkpointing): actpage must not change *its* losses
            twin_losses = _losses_of(runs, twin)
            losses["twin"] = twin
            losses["twin_equal"] = compare_losses(_losses_of(runs, name), twin_losses[0] if twin_losses else None,
                                                  rule)["equal"]
        rows.append({
            "variant": name, "what": VARIANTS.get(name, name), "mode": row.get("mode"),
            "ok": row.get("ok") or 0, "runs": row.get("runs") or 0,
            "median_step_ms": ms, "step_ms_min": row.get("step_ms_min"), "step_ms_max": row.get("step_ms_max"),
            "spread": _spread(row), "ratio": ratio,
            "device_used_peak_mib": used, "saved_mib": saved, "saved_gib": saved_gib,
            "device_used_steady_peak_mib": steady, "saved_steady_gib": saved_steady_gib,
            "gib_per_pct": saved_gib / ((ratio - 1) * 100) if saved_gib and saved_gib > 0 and ratio and ratio > 1 else None,
            "free": bool(saved_gib and saved_gib > 0 and ratio is not None and ratio <= 1),
            "link_share": saved_gib / bound["bound_gib"] if saved_gib is not None and bound["bound_gib"] else None,
            "torch_peak_mib": row.get("torch_peak_mib"), "offloaded_at_peak_mib": row.get("offloaded_at_peak_mib"),
            "median_fwd_ms": row.get("median_fwd_ms"), "losses": losses,
            "steal_s_max": variant_steal_s(runs, name), "cpu_speed_min": variant_cpu_speed(runs, name),
            "job_probe_us": variant_job_probe_us(runs, name),
            "paged_gib": paged / GIB if paged else None,
            "floor_ratio": ms / floor_ms if ms is not None and floor_ms else None,
        })
        if rows[-1]["ok"] < rows[-1]["runs"]:
            problems.append("%s: %s: %d of %d runs failed (logs: %s/logs/%s.repN.err)" % (
                job, name, rows[-1]["runs"] - rows[-1]["ok"], rows[-1]["runs"], job, name))
        loaded = [((r["result"].get("actpage") or {}).get("loaded")) for r in _ok_runs(runs, name)]
        if row.get("mode") == "actpage" and False in loaded:
            problems.append("%s: %s: actpage was not loaded in the job (its result line says so)" % (job, name))
    if base_ms is None:
        problems.append("%s: no baseline (variant `%s`) result" % (job, BASELINE))
    pareto_front(rows)
    base_spread = _spread(base) if base else None
    if base_spread is not None:
        notes.append("the baseline's repetitions differ by %.1f%%: step-time ratios closer to 1 than that are "
                     "not resolved" % (100 * base_spread))
    elif base:
        notes.append("one repetition of each variant: the run-to-run spread is not measured (a few % on a "
                     "launch-bound job, FACTS.md)")
    own = compare_losses(_losses_of(runs, BASELINE)[1:], reference, rule)
    if own["equal"] is False:
        notes.append("the baseline's own repetitions differ from step %d: the comparison of losses cannot be "
                     "read bit for bit" % own["first_difference_step"])
    for row in rows:
        if row["steal_s_max"] is not None and row["steal_s_max"] >= STEAL_NOTICE_S:
            notes.append("the host stole up to %.1f s of the job's CPUs in a run of %s: its time is the host's as "
                         "much as the variant's" % (row["steal_s_max"], row["variant"]))
    probes = [(row["job_probe_us"], row["variant"]) for row in rows if row.get("job_probe_us")]
    if probes and max(probes)[0] > min(probes)[0] * (1 + PROBE_NOTICE_SHARE):
        notes.append("the job's CPU probe read %.0f us a step in %s against %.0f in %s: the runs' CPUs differed, and "
                     "a host barely ahead of its GPU pays for actpage's work in step time as the CPU is slower" % (
                         max(probes)[0], max(probes)[1], min(probes)[0], min(probes)[1]))
    if bound["bound_gib"] is None:
        notes.append("no link bound: %s" % bound["why"])
    return {"job": job, "rows": rows, "problems": problems, "notes": notes, "loss_rule": rule, "link": bound,
            "meta": meta, "command": _command_text(results), "ranks": (results.get("settings") or {}).get("ranks"),
            "device": meta.get("device") or _result_field(runs, "device"), "commit": _short_commit(meta.get("commit")),
            "date": (meta.get("finished") or meta.get("started") or "")[:10] or None,
            "stands_for": (meta.get("manifest") or {}).get("stands_for")}


def _short_commit(commit):
    """A leading commit hash as git shows it short (12 digits), what follows it (a bundle's
    "+uncommitted changes") kept."""
    words = (commit or "").split()
    if words and len(words[0]) == 40 and all(c in "0123456789abcdef" for c in words[0]):
        words[0] = words[0][:12]
    return " ".join(words) or None


def _result_field(runs, key):
    for run in runs:
        if run.get("result") and run["result"].get(key):
            return run["result"][key]
    return None


def _command_text(results):
    """The job's command as bench.sh ran it, without the pinning and the interpreter."""
    command = list((results.get("settings") or {}).get("command") or [])
    if len(command) > 3 and os.path.basename(command[0]) == "taskset" and command[1] == "-c":
        command = command[3:]
    if command and os.path.basename(command[0]).startswith("python"):
        command = command[1:]
    return " ".join(command)


def build_report(directory, manifest=None):
    order, manifest_error = [], None
    if manifest:
        try:
            order = [job["name"] for job in bench_manifest.load(manifest)]
        except bench_manifest.ManifestError as error:
            manifest_error = str(error)
    jobs = load_jobs(directory, order)
    report = {"generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "jobs": {}, "skipped": {}, "not_run": [job for job in order if job not in jobs], "problems": []}
    if manifest_error:
        report["problems"].append("manifest: %s" % manifest_error)
    for job, data in jobs.items():
        if data["skipped"] is not None:
            report["skipped"][job] = data["skipped"].get("reason") or "skipped"
            if data["skipped"].get("failed"):  # a job that could not run is a problem, not a skip
                report["problems"].append("%s: %s" % (job, report["skipped"][job]))
            continue
        report["jobs"][job] = job_report(job, data)
        report["problems"] += report["jobs"][job]["problems"]
    if not jobs:
        report["problems"].append("no results under %s (expected JOB/results.json)" % directory)
    return report


# ---------------------------------------------------------------------------------------------
# Text and markdown
# ---------------------------------------------------------------------------------------------
def _cell(value, fmt):
    return "-" if value is None else fmt % value


def losses_cell(row, rule):
    losses = row["losses"]
    if row["variant"] == BASELINE:
        return "(baseline)"
    if losses["equal"] is None:
        text = "-"
    elif losses["equal"]:
        text = "yes" if rule["mode"] == "bits" or not losses["max_rel_diff"] else "yes (%.1e)" % losses["max_rel_diff"]
    else:
        text = "**no** (step %d)" % losses["first_difference_step"]
    if "twin" in losses and losses["equal"] is not True:
        text += "; = %s: %s" % (losses["twin"], {True: "yes", False: "**no**", None: "-"}[losses["twin_equal"]])
    return text


def _saved_per_pct_cell(row):
    if row["free"]:
        return "free"
    return _cell(row["gib_per_pct"], "%.2f")


def format_table(job_data):
    rows, rule = job_data["rows"], job_data["loss_rule"]
    traced = any(row["offloaded_at_peak_mib"] is not None for row in rows)
    watched = any(row["steal_s_max"] is not None for row in rows)
    probed = any(row["cpu_speed_min"] is not None for row in rows)
    job_probed = any(row.get("job_probe_us") is not None for row in rows)
    steady = any(row.get("saved_steady_gib") is not None for row in rows)
    floored = any(row.get("floor_ratio") is not None for row in rows)
    header = ["front", "variant", "what", "ok/runs", "median step ms", "reps ms", "x none", "device used peak MiB",
              "saved GiB", "GiB per 1% slower", "of link bound", "losses = none", "torch peak MiB"]
    header += ["saved after warm-up GiB"] * steady
    header += ["paged a pass GiB", "x link floor"] * floored
    header += ["off at actpage's peak MiB"] * traced + ["host steal s"] * watched + ["slowest CPU"] * probed
    header += ["job's CPU probe us"] * job_probed
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for row in rows:
        failed = row["ok"] == 0
        cells = [
            "*" if row["front"] else "", "`%s`" % row["variant"], row["what"],
            "%d/%d%s" % (row["ok"], row["runs"], " FAILED" if failed else ""),
            _cell(row["median_step_ms"], "%.1f"),
            "%.1f-%.1f" % (row["step_ms_min"], row["step_ms_max"]) if row["spread"] is not None else "-",
            _cell(row["ratio"], "x%.3f"), _cell(row["device_used_peak_mib"], "%.0f"), _cell(row["saved_gib"], "%.2f"),
            _saved_per_pct_cell(row), _cell(None if row["link_share"] is None else 100 * row["link_share"], "%.0f%%"),
            losses_cell(row, rule), _cell(row["torch_peak_mib"], "%.0f"),
        ]
        cells += [_cell(row.get("saved_steady_gib"), "%.2f")] * steady
        if floored:
            cells += [_cell(row.get("paged_gib"), "%.2f"), _cell(row.get("floor_ratio"), "x%.2f")]
        cells += [_cell(row["offloaded_at_peak_mib"], "%.0f")] * traced
        cells += [_cell(row["steal_s_max"], "%.2f")] * watched + [_cell(row["cpu_speed_min"], "%.2f")] * probed
        cells += [_cell(row.get("job_probe_us"), "%.0f")] * job_probed
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe_link(link):
    if link["bound_gib"] is None:
        return "link bound: none (%s)" % link["why"]
    passes = link.get("forward_passes") or 1
    which = "one of %d forward passes a step" % passes if passes > 1 else "GPU time"
    return "link bound %.2f GiB = D2H %.1f GB/s (%s) x forward %.1f ms (%s, baseline)" % (
        link["bound_gib"], link["d2h_bytes_per_s"] / 1e9, link["source"], link["fwd_ms"], which)


def describe_losses(rule):
    if rule["mode"] == "tolerance":
        return "losses: within %g relative of the baseline's (not deterministic%s)" % (
            rule["tolerance"], ": " + rule["reason"] if rule.get("reason") else "")
    if rule["deterministic"]:
        return "losses: bit for bit against the baseline's (float.hex; the job runs deterministic)"
    return "losses: bit for bit (the job is not deterministic and gives no loss_tolerance: expect differences)"


def describe_run(job_data):
    meta = job_data["meta"]
    parts = ["`%s`" % job_data["command"]]
    if job_data["ranks"]:
        parts.append("%d ranks, device memory the max over ranks, the link bound per GPU" % job_data["ranks"])
    if meta.get("reps") is not None:
        parts.append("%s rep%s (save_on_cpu, stream_offload: %s), %s steps after %s warm-up, median" % (
            meta["reps"], "" if meta["reps"] == 1 else "s", meta.get("peer_reps"), meta.get("steps"), meta.get("warmup")))
    if meta.get("cpus"):
        parts.append("pinned to CPU cores %s" % meta["cpus"])
    return "; ".join(parts)


def _distinct(report, key):
    return sorted({str(data[key]) for data in report["jobs"].values() if data[key]})


def header_lines(report):
    rates = sorted({"%.1f GB/s (%s)" % (data["link"]["d2h_bytes_per_s"] / 1e9, data["link"]["source"])
                    for data in report["jobs"].values() if data["link"]["d2h_bytes_per_s"]})
    return ["date: %s" % (", ".join(_distinct(report, "date")) or "unknown"),
            "device: %s" % (", ".join(_distinct(report, "device")) or "unknown"),
            "commit: %s" % (", ".join(_distinct(report, "commit")) or "unknown"),
            "D2H rate: %s" % (", ".join(rates) or "not measured")]


def format_text(report):
    parts = ["zoo benchmark (scripts/bench.sh), report of %s" % report["generated"]]
    parts += ["  " + line for line in header_lines(report)]
    parts.append("")
    for job, data in report["jobs"].items():
        parts.append("== %s%s" % (job, ": " + data["stands_for"] if data["stands_for"] else ""))
        parts.append("   %s" % describe_run(data))
        parts.append("   %s, %s, commit %s" % (data["date"] or "date unknown", data["device"] or "device unknown",
                                                data["commit"] or "unknown"))
        parts.append("   %s" % describe_link(data["link"]))
        parts.append("   %s" % describe_losses(data["loss_rule"]))
        parts.append(format_table(data))
        parts += ["   note: %s" % note for note in data["notes"]]
        parts.append("")
    for job, reason in report["skipped"].items():
        parts.append("== %s: skipped (%s)" % (job, reason))
    if report["not_run"]:
        parts.append("not run yet: %s" % ", ".join(report["not_run"]))
    parts += ["problem: %s" % problem for problem in report["problems"]]
    return "\n".join(parts)


LEGEND = ("`*`: on the Pareto front (no variant with the baseline's losses saves at least as much at no more "
          "step time). Saved: the peak of device memory in use (cudaMemGetInfo total - free, sampled every 2 ms "
          "in the job) below `none`'s. GiB per 1% slower: saved GiB over the slowdown in percent (free: no "
          "slowdown measured). Of link bound: saved over the job's link bound (D2H rate x the baseline's "
          "forward GPU time), what offloading during forward can hide; checkpointing is not bound by it.")


def format_markdown(report, png_link=None):
    lines = ["Measured with `scripts/bench.sh`; " + "; ".join(header_lines(report)) + ".", "", LEGEND, ""]
    for job, data in report["jobs"].items():
        lines.append("### %s" % job)
        lines.append("")
        if data["stands_for"]:
            lines.append("Stands for: %s." % data["stands_for"])
            lines.append("")
        lines.append("%s, %s, commit `%s`; %s." % (data["date"] or "date unknown", data["device"] or "device unknown",
                                                  data["commit"] or "unknown", describe_run(data)))
        link = describe_link(data["link"])
        lines.append("%s; %s." % (link[0].upper() + link[1:], describe_losses(data["loss_rule"])))
        lines.append("")
        lines.append(format_table(data))
        lines.append("")
        lines += ["- %s" % note for note in data["notes"]]
        if data["notes"]:
            lines.append("")
    for job, reason in report["skipped"].items():
        lines += ["### %s" % job, "", "Skipped: %s." % reason, ""]
    if report["not_run"]:
        lines += ["Not run yet: %s." % ", ".join(report["not_run"]), ""]
    lines += ["- Problem: %s" % problem for problem in report["problems"]]
    if png_link:
        lines += ["", "![device memory saved against step time, one panel per job](%s)" % png_link, ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", default="out/bench", help="bench.sh's output (default out/bench)")
    parser.add_argument("--manifest", default=None, help="the zoo's manifest: job order, jobs not run yet")
    parser.add_argument("--png", default=None, help="one panel per job, memory saved against step time")
    parser.add_argument("--json", default=None, help="write the report as JSON")
    parser.add_argument("--markdown", default=None, help="write the tables for docs/benchmarks.md")
    parser.add_argument("--png-link", default="images/bench-zoo.png",
                        help="the image the markdown shows (default images/bench-zoo.png, beside docs/benchmarks.md)")
    args = parser.parse_args(argv)
    report = build_report(args.directory, args.manifest)
    print(format_text(report))
    drawn = False
    if args.png and report["jobs"]:
        import bench_plot
        drawn, message = bench_plot.draw(report, args.png)
        print(message)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2, sort_keys=True)
            handle.write("\n")
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(format_markdown(report, args.png_link if drawn else None))
        print("written: %s" % args.markdown)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
