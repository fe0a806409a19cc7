#!/usr/bin/env python3
"""Reads what scripts/bench.sh measured and says how each way of saving activation memory compares.

    bench_report.py [DIR] [--png FILE] [--json FILE] [--markdown FILE] [--png-link NAME]

DIR (default out/bench) holds one folder per job with examples/compare_runs.py's results.json and
bench.sh's meta.json. For each job it prints one table against the baseline (the variant `none`, the
job as is on the same allocator backend): median step time and its ratio, the device-memory-in-use
peak (total - free from cudaMemGetInfo, sampled) and how much of it each variant saved, torch's peak,
whether the losses equal the baseline's bit for bit, and, for actpage variants, the issue's targets
with the amount by which a missed target is missed. --png draws memory saved (GiB) against slowdown
(x baseline), one labelled point per variant and job; --markdown writes the section that
docs/benchmarks.md takes. Needs only the standard library (the PNG writer and its font are here), so
it runs on the GPU machine and on the CPU machine alike.

Exit status 1 when a run failed or a job has no baseline; missed targets are results, not failures.
"""

import argparse
import json
import math
import os
import struct
import sys
import zlib

GIB_IN_MIB = 1024.0
BASELINE = "none"

# What each variant of bench.sh is, in the order the tables list them.
VARIANTS = {
    "none": "no offload (same allocator backend)",
    "actpage-observe": "actpage, observe only",
    "actpage-near-free": "actpage, near-free policy",
    "actpage-all": "actpage, all MLP / expert activations",
    "save_on_cpu": "torch save_on_cpu(pin_memory=True)",
    "checkpointing": "gradient checkpointing",
    "stream_offload": "streamed offload in the job (hooks, side stream)",
}
JOB_TITLES = {"llama": "Llama, 16 layers", "qwen": "Qwen3-MoE, 8 layers"}

# The targets (H100). jobs: None means every job. A target is a bound on a measured value.
TARGETS = [
    {"variant": "actpage-observe", "jobs": None, "measure": "ratio", "max": 1.01},
    {"variant": "actpage-near-free", "jobs": ("llama",), "measure": "saved_gib", "min": 2.5},
    {"variant": "actpage-near-free", "jobs": ("llama",), "measure": "ratio", "max": 1.03},
    {"variant": "actpage-all", "jobs": ("llama",), "measure": "saved_gib", "min": 5.5},
    {"variant": "actpage-all", "jobs": ("llama",), "measure": "ratio", "max": 1.5},
    {"variant": "actpage-near-free", "jobs": None, "measure": "saved_share", "min": 0.99},
    {"variant": "actpage-all", "jobs": None, "measure": "saved_share", "min": 0.99},
]
# Steal time: CPU time the host (a KVM guest's hypervisor) took from the CPUs the job was pinned to,
# over a run (examples/thread_stats.py through compare_runs.py --thread-stats). On the H100 machine an
# offloading forward pass ran +2.3 ms (median of 13 runs) with at most 0.1 s of steal in the run and
# +8.0 ms (up to +17.9) with 0.3 s or more (docs/performance.md, session 19): a time verdict read in a
# run with that much steal is the host's as much as the variant's, and the reader must see it.
STEAL_NOTICE_S = 0.3
# measure: (label in the verdict, short label in the table, format)
MEASURES = {
    "ratio": ("step time", "time", lambda v: "%.3fx" % v),
    "saved_gib": ("device-used peak saved", "saved", lambda v: "%.2f GiB" % v),
    "saved_share": ("peak fell by / bytes off the device at the peak", "peak fell by/off",
                    lambda v: "%.1f%%" % (100 * v)),
}


# ---------------------------------------------------------------------------------------------
# Reading and computing
# ---------------------------------------------------------------------------------------------
def load_jobs(directory):
    """{job: {"results": compare_runs' results.json, "meta": bench.sh's meta.json or {}}} for each
    folder of DIR that holds a results.json, in a stable order (llama, qwen, then by name)."""
    jobs = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name, "results.json")
        if not os.path.isfile(path):
            continue
        with open(path) as handle:
            results = json.load(handle)
        meta_path = os.path.join(directory, name, "meta.json")
        meta = {}
        if os.path.isfile(meta_path):
            with open(meta_path) as handle:
                meta = json.load(handle)
        jobs[name] = {"results": results, "meta": meta}
    order = sorted(jobs, key=lambda job: (list(JOB_TITLES).index(job) if job in JOB_TITLES else len(JOB_TITLES), job))
    return {job: jobs[job] for job in order}


def _first_losses(runs, variant):
    for run in runs:
        if run["variant"] == variant and run.get("ok") and run.get("result"):
            return run["result"].get("losses")
    return None


def losses_against(runs, variant, reference):
    """(equal, first differing step): every successful run of `variant` against the baseline's
    first run, bit for bit (float.hex strings) over the steps both ran; (None, None) if either is
    missing."""
    if reference is None:
        return None, None
    mine = [r["result"].get("losses") for r in runs if r["variant"] == variant and r.get("ok") and r.get("result")]
    if not mine:
        return None, None
    first = None
    for losses in mine:
        for step, (a, b) in enumerate(zip(losses, reference)):
            if a != b:
                first = step if first is None else min(first, step)
                break
    return first is None, first


def run_steal_s(run):
    """Seconds of steal summed over the CPUs the run's job could use, or None when its threads were
    not watched."""
    cpus = (run.get("threads") or {}).get("cpus") or {}
    if not cpus:
        return None
    return sum(cpu.get("steal_ms", 0.0) for cpu in cpus.values()) / 1000.0


def run_cpu_rates(run):
    """The CPU probe's rates of a run's CPUs (compare_runs.py --cpu-probe), each the mean of before
    and after, or {} when it was not probed."""
    probe = run.get("cpu_probe") or {}
    before, after = probe.get("before") or {}, probe.get("after") or {}
    rates = {}
    for cpu in set(before) | set(after):
        values = [x[cpu] for x in (before, after) if cpu in x]
        rates[cpu] = sum(values) / len(values)
    return rates


def call_cpu_rate(runs):
    """The median over the call's probed runs of each run's median CPU rate: what "as fast as usual"
    is in this call, or None."""
    medians = []
    for run in runs:
        rates = sorted(run_cpu_rates(run).values())
        if rates:
            medians.append(rates[len(rates) // 2])
    medians.sort()
    return medians[len(medians) // 2] if medians else None


def variant_cpu_speed(runs, variant, usual):
    """The slowest CPU of any successful run of `variant`, as a share of the call's usual rate: below
    1, a CPU ran slower than usual around that run (the host's other work on the core)."""
    if not usual:
        return None
    probed = (run_cpu_rates(r) for r in runs if r.get("variant") == variant and r.get("ok"))
    lows = [min(rates.values()) for rates in probed if rates]
    return min(lows) / usual if lows else None


def variant_steal_s(runs, variant):
    """The most steal any successful run of `variant` had, or None when none was watched."""
    steals = [run_steal_s(r) for r in runs if r.get("variant") == variant and r.get("ok")]
    steals = [s for s in steals if s is not None]
    return max(steals) if steals else None


def job_rows(results):
    """One row per variant of a job, with its ratios against the baseline."""
    summary = {row["variant"]: row for row in results.get("summary", [])}
    runs = results.get("runs", [])
    base = summary.get(BASELINE)
    base_ms = base.get("median_step_ms") if base else None
    base_used = base.get("device_used_peak_mib") if base else None
    base_losses = _first_losses(runs, BASELINE)
    base_steal = variant_steal_s(runs, BASELINE)
    usual_cpu = call_cpu_rate(runs)
    names = [n for n in VARIANTS if n in summary] + [n for n in summary if n not in VARIANTS]
    rows = []
    for name in names:
        row = summary[name]
        ms, used = row.get("median_step_ms"), row.get("device_used_peak_mib")
        ratio = ms / base_ms if ms is not None and base_ms else None
        saved_mib = base_used - used if used is not None and base_used is not None else None
        off_at_peak = row.get("offloaded_at_peak_mib")
        share = saved_mib / off_at_peak if saved_mib is not None and off_at_peak else None
        equal, first = (None, None) if name == BASELINE else losses_against(runs, name, base_losses)
        rows.append({
            "variant": name, "what": VARIANTS.get(name, name), "ok": row.get("ok"), "runs": row.get("runs"),
            "median_step_ms": ms, "ratio": ratio, "device_used_peak_mib": used,
            "saved_mib": saved_mib, "saved_gib": None if saved_mib is None else saved_mib / GIB_IN_MIB,
            "torch_peak_mib": row.get("torch_peak_mib"), "offloaded_at_peak_mib": off_at_peak,
            "saved_share": share, "losses_equal": equal, "losses_first_difference_step": first,
            "median_fwd_ms": row.get("median_fwd_ms"),
            "step_ms_min": row.get("step_ms_min"), "step_ms_max": row.get("step_ms_max"),
            "spread": _spread(row), "baseline_spread": _spread(base) if base else None,
            "steal_s_max": variant_steal_s(runs, name), "baseline_steal_s_max": base_steal,
            "cpu_speed_min": variant_cpu_speed(runs, name, usual_cpu),
        })
    return rows


def _spread(summary_row):
    """How far apart the repetitions' median step times are (max / min - 1), or None for one run.
    Each repetition is a fresh process; on a launch-bound job two runs of the same variant can differ
    by more than a target's margin, and a verdict inside that spread says nothing either way."""
    low, high = summary_row.get("step_ms_min"), summary_row.get("step_ms_max")
    if not low or not high or summary_row.get("ok", 0) < 2:
        return None
    return high / low - 1


def check_targets(job, rows):
    """Each target that applies to this job: what it asks, what was measured, met or missed and by
    how much. A target whose measurement is missing (a failed run, no trace) is 'not measured'."""
    by_name = {row["variant"]: row for row in rows}
    checks = []
    for target in TARGETS:
        if target["jobs"] is not None and job not in target["jobs"]:
            continue
        row = by_name.get(target["variant"])
        if row is None:
            continue
        label, short, fmt = MEASURES[target["measure"]]
        value = row.get(target["measure"])
        bound = target.get("max", target.get("min"))
        wanted = ("at most " if "max" in target else "at least ") + fmt(bound)
        check = {"job": job, "variant": target["variant"], "measure": target["measure"], "label": label,
                 "target": wanted, "bound": bound, "value": value, "met": None, "missed_by": None}
        sign = "<=" if "max" in target else ">="
        if value is None and target["measure"] == "saved_share" and row.get("offloaded_at_peak_mib") == 0:
            check["verdict"] = "%s: nothing was off the device at actpage's peak (target %s)" % (label, wanted)
            check["short"] = "%s: nothing off at the peak" % short
        elif value is None:
            check["verdict"] = "%s: not measured (target %s)" % (label, wanted)
            check["short"] = "%s: not measured" % short
        else:
            met = value <= bound if "max" in target else value >= bound
            check["met"] = met
            if met:
                check["verdict"] = "%s %s: met (target %s)" % (label, fmt(value), wanted)
                check["short"] = "%s %s %s %s: met" % (short, fmt(value), sign, fmt(bound))
            else:
                missed = value - bound if "max" in target else bound - value
                check["missed_by"] = missed
                amount = _amount(target["measure"], missed)
                check["verdict"] = "%s %s: MISSED by %s (target %s)" % (label, fmt(value), amount, wanted)
                check["short"] = "%s %s %s %s: **missed by %s**" % (short, fmt(value), sign, fmt(bound), amount)
                noise = [x for x in (row.get("spread"), row.get("baseline_spread")) if x is not None]
                if target["measure"] == "ratio" and noise and max(noise) > missed:
                    # Not a pass: the measurement cannot tell, and the reader must see that.
                    check["within_noise"] = max(noise)
                    _annotate(check, "within run-to-run noise: repetitions differ by up to %.1f%%" % (100 * max(noise)))
                steal = [x for x in (row.get("steal_s_max"), row.get("baseline_steal_s_max")) if x is not None]
                if target["measure"] == "ratio" and steal and max(steal) >= STEAL_NOTICE_S:
                    # Still a miss; but the host, not only the variant, took time in these runs.
                    check["host_steal_s"] = max(steal)
                    _annotate(check, "the host stole up to %.1f s of the job's CPUs in a run (variant %s, baseline %s)" % (
                        max(steal), _cell(row.get("steal_s_max"), "%.1f s"), _cell(row.get("baseline_steal_s_max"), "%.1f s")))
        checks.append(check)
    return checks


def _annotate(check, note):
    """Adds a note to a verdict, long and short: what the reader must know to read it."""
    check["verdict"] += "; " + note
    check["short"] += " (%s)" % note


def _amount(measure, amount):
    if measure == "ratio":
        return "%.3fx" % amount
    if measure == "saved_gib":
        return "%.2f GiB" % amount
    return "%.1f points" % (100 * amount)


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------
def _cell(value, fmt):
    return "-" if value is None else fmt % value


def _reps_cell(row):
    """The repetitions' median step times, lowest to highest, when there were several."""
    if row.get("spread") is None:
        return "-"
    return "%.1f-%.1f" % (row["step_ms_min"], row["step_ms_max"])


def _losses_cell(row):
    if row["variant"] == BASELINE:
        return "(baseline)"
    if row["losses_equal"] is None:
        return "-"
    return "yes" if row["losses_equal"] else "no (step %d)" % row["losses_first_difference_step"]


def format_table(job, rows, checks):
    header = ["variant", "what", "ok/runs", "median step ms", "reps ms", "x baseline", "host steal s", "slowest CPU",
              "device used peak MiB",
              "saved GiB", "torch peak MiB", "off the device at actpage's peak MiB", "losses = baseline", "targets"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for row in rows:
        verdicts = [c["short"] for c in checks if c["variant"] == row["variant"]]
        cells = [
            "`%s`" % row["variant"], row["what"], "%s/%s" % (row["ok"], row["runs"]),
            _cell(row["median_step_ms"], "%.1f"), _reps_cell(row), _cell(row["ratio"], "%.3f"),
            _cell(row.get("steal_s_max"), "%.2f"), _cell(row.get("cpu_speed_min"), "%.2f"),
            _cell(row["device_used_peak_mib"], "%.0f"), _cell(row["saved_gib"], "%.2f"),
            _cell(row["torch_peak_mib"], "%.0f"), _cell(row["offloaded_at_peak_mib"], "%.0f"), _losses_cell(row),
            "; ".join(verdicts) or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _job_title(job, meta, results):
    title = JOB_TITLES.get(job, job)
    command = list((results.get("settings") or {}).get("command") or [])
    pinned = ""
    if len(command) > 3 and os.path.basename(command[0]) == "taskset" and command[1] == "-c":
        # bench.sh pins the job (BENCH_CPUS): say so, and show the job's own command
        pinned, command = ", pinned to CPU cores %s" % command[2], command[3:]
    return "%s (`%s`%s)" % (title, " ".join(command[1:]), pinned) if command else title


def build_report(directory):
    jobs = load_jobs(directory)
    report = {"jobs": {}, "problems": []}
    for job, data in jobs.items():
        rows = job_rows(data["results"])
        if not any(r["variant"] == BASELINE and r["median_step_ms"] is not None for r in rows):
            report["problems"].append("%s: no baseline (variant `%s`) result" % (job, BASELINE))
        for row in rows:
            if row["ok"] != row["runs"]:
                report["problems"].append("%s: %s: %s of %s runs failed" % (
                    job, row["variant"], (row["runs"] or 0) - (row["ok"] or 0), row["runs"]))
        report["jobs"][job] = {"rows": rows, "checks": check_targets(job, rows), "meta": data["meta"],
                               "title": _job_title(job, data["meta"], data["results"]),
                               "device": _result_field(data["results"], "device"),
                               "torch": _result_field(data["results"], "torch")}
    if not jobs:
        report["problems"].append("no results under %s (expected JOB/results.json)" % directory)
    return report


def _result_field(results, key):
    for run in results.get("runs", []):
        if run.get("result") and run["result"].get(key):
            return run["result"][key]
    return None


def format_text(report):
    parts = []
    for job, data in report["jobs"].items():
        parts.append("== %s" % data["title"])
        parts.append(format_table(job, data["rows"], data["checks"]))
        for check in data["checks"]:
            parts.append("  %s %s" % (check["variant"], check["verdict"]))
        parts.append("")
    for problem in report["problems"]:
        parts.append("problem: %s" % problem)
    return "\n".join(parts)


def format_markdown(report, png_link=None):
    metas = [d["meta"] for d in report["jobs"].values()]
    dates = sorted({(m.get("finished") or m.get("started") or "")[:10] for m in metas} - {""})
    devices = sorted({m.get("device") or d["device"] or "" for m, d in zip(metas, report["jobs"].values())} - {""})
    commits = sorted({m.get("commit") or "" for m in metas} - {""})
    torches = sorted({d["torch"] or "" for d in report["jobs"].values()} - {""})
    lines = ["### Run of %s" % (", ".join(dates) or "(date unknown)"), ""]
    lines.append("- Device: %s" % (", ".join(devices) or "unknown"))
    lines.append("- Commit (bundle): %s" % (", ".join("`%s`" % c for c in commits) or "unknown"))
    if torches:
        lines.append("- torch: %s" % ", ".join(torches))
    for job, data in report["jobs"].items():
        meta = data["meta"]
        if meta:
            policies = ", ".join("`%s` %s" % (name, path) for name, path in sorted((meta.get("policies") or {}).items()))
            lines.append("- %s: %s repetitions (%s for save_on_cpu, checkpointing and stream_offload), "
                         "interleaved, %s steps, median after %s warm-up steps (save_on_cpu: fewer)%s" % (
                             JOB_TITLES.get(job, job), meta.get("reps"), meta.get("peer_reps", "?"),
                             meta.get("steps"), meta.get("warmup"), "; policies: " + policies if policies else ""))
    if any(row.get("steal_s_max") is not None for d in report["jobs"].values() for row in d["rows"]):
        lines.append("- host steal s: the most CPU time the host took from the job's CPUs in one run of the "
                     "variant (steal, /proc/stat); at %.1f s or more a time verdict says so" % STEAL_NOTICE_S)
    if any(row.get("cpu_speed_min") is not None for d in report["jobs"].values() for row in d["rows"]):
        lines.append("- slowest CPU: a fixed Python loop timed on each of the job's CPUs before and after each run "
                     "(compare_runs.py --cpu-probe); the slowest CPU in any run of the variant as a share of "
                     "the call's usual rate")
    lines.append("")
    for job, data in report["jobs"].items():
        lines.append("#### %s" % data["title"])
        lines.append("")
        lines.append(format_table(job, data["rows"], data["checks"]))
        lines.append("")
    missed = [c for d in report["jobs"].values() for c in d["checks"] if c["met"] is False]
    unmeasured = [c for d in report["jobs"].values() for c in d["checks"] if c["met"] is None]
    if missed or unmeasured:
        lines.append("Targets missed or not measured:")
        lines.append("")
        for check in missed + unmeasured:
            lines.append("- %s, `%s`: %s" % (JOB_TITLES.get(check["job"], check["job"]), check["variant"], check["verdict"]))
        lines.append("")
    else:
        lines.append("Every target was met.")
        lines.append("")
    for problem in report["problems"]:
        lines.append("- Problem: %s" % problem)
    if png_link:
        lines.append("![device memory saved against slowdown](%s)" % png_link)
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The PNG: a tiny raster canvas, a 3x5 bitmap font and a writer (zlib + struct)
# ---------------------------------------------------------------------------------------------
# Each glyph is 5 rows of 3 pixels ('#' set). Upper case is drawn as lower case.
FONT = {
    "0": "###/#.#/#.#/#.#/###", "1": ".#./##./.#./.#./###", "2": "###/..#/###/#../###",
    "3": "###/..#/.##/..#/###", "4": "#.#/#.#/###/..#/..#", "5": "###/#../###/..#/###",
    "6": "###/#../###/#.#/###", "7": "###/..#/..#/.#./.#.", "8": "###/#.#/###/#.#/###",
    "9": "###/#.#/###/..#/###", "a": ".#./#.#/###/#.#/#.#", "b": "##./#.#/##./#.#/##.",
    "c": ".##/#../#../#../.##", "d": "##./#.#/#.#/#.#/##.", "e": "###/#../##./#../###",
    "f": "###/#../##./#../#..", "g": ".##/#../#.#/#.#/.##", "h": "#.#/#.#/###/#.#/#.#",
    "i": "###/.#./.#./.#./###", "j": "..#/..#/..#/#.#/.#.", "k": "#.#/#.#/##./#.#/#.#",
    "l": "#../#../#../#../###", "m": "#.#/###/###/#.#/#.#", "n": "##./#.#/#.#/#.#/#.#",
    "o": ".#./#.#/#.#/#.#/.#.", "p": "##./#.#/##./#../#..", "q": ".#./#.#/#.#/##./.##",
    "r": "##./#.#/##./#.#/#.#", "s": ".##/#../.#./..#/##.", "t": "###/.#./.#./.#./.#.",
    "u": "#.#/#.#/#.#/#.#/###", "v": "#.#/#.#/#.#/#.#/.#.", "w": "#.#/#.#/###/###/#.#",
    "x": "#.#/#.#/.#./#.#/#.#", "y": "#.#/#.#/.#./.#./.#.", "z": "###/..#/.#./#../###",
    ".": ".../.../.../.../.#.", "-": ".../.../###/.../...", "_": ".../.../.../.../###",
    " ": ".../.../.../.../...", "(": "..#/.#./.#./.#./..#", ")": "#../.#./.#./.#./#..",
    "/": "..#/..#/.#./#../#..", ":": ".../.#./.../.#./...", "%": "#.#/..#/.#./#../#.#",
    "+": ".../.#./###/.#./...", "=": ".../###/.../###/...", "<": "..#/.#./#../.#./..#",
    ">": "#../.#./..#/.#./#..", ",": ".../.../.../.#./#..", "?": "###/..#/.#./.../.#.",
}
GLYPH_W, GLYPH_H = 3, 5
WHITE, BLACK, GREY, LIGHT = (255, 255, 255), (0, 0, 0), (150, 150, 150), (225, 225, 225)
SERIES_COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14)]


class Canvas:
    """RGB pixels, (0, 0) at the top left; drawing outside is clipped."""

    def __init__(self, width, height, background=WHITE):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x, y, colour):
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i:i + 3] = bytes(colour)

    def rect(self, x0, y0, x1, y1, colour):
        """Filled, both corners included."""
        for y in range(max(0, min(y0, y1)), min(self.height, max(y0, y1) + 1)):
            for x in range(max(0, min(x0, x1)), min(self.width, max(x0, x1) + 1)):
                self.set(x, y, colour)

    def hline(self, x0, x1, y, colour, dash=0):
        for x in range(min(x0, x1), max(x0, x1) + 1):
            if not dash or (x // dash) % 2 == 0:
                self.set(x, y, colour)

    def vline(self, x, y0, y1, colour, dash=0):
        for y in range(min(y0, y1), max(y0, y1) + 1):
            if not dash or (y // dash) % 2 == 0:
                self.set(x, y, colour)

    def text(self, x, y, string, colour, scale=2):
        """Draws `string` with its top left at (x, y); returns its width in pixels."""
        cursor = x
        for char in string:
            glyph = FONT.get(char.lower(), FONT["?"])
            for row, bits in enumerate(glyph.split("/")):
                for col, bit in enumerate(bits):
                    if bit == "#":
                        self.rect(cursor + col * scale, y + row * scale,
                                  cursor + (col + 1) * scale - 1, y + (row + 1) * scale - 1, colour)
            cursor += (GLYPH_W + 1) * scale
        return cursor - x

    @staticmethod
    def text_width(string, scale=2):
        return len(string) * (GLYPH_W + 1) * scale

    def png(self):
        raw = b"".join(b"\x00" + bytes(self.pixels[y * self.width * 3:(y + 1) * self.width * 3])
                       for y in range(self.height))
        return encode_png(self.width, self.height, raw)


def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(width, height, filtered_rows):
    """An 8-bit RGB PNG of rows that already carry their filter byte (0: none)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(filtered_rows, 9))
            + _chunk(b"IEND", b""))


def _nice_step(span, count):
    raw = span / max(1, count)
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for factor in (1, 2, 5, 10):
        if factor * power >= raw:
            return factor * power
    return 10 * power


def draw_plot(report, width=960, height=600):
    """Memory saved (GiB, y) against slowdown (x baseline, x, log scale): one point per variant and
    job, labelled with the variant, one colour per job; the Llama targets as dashed corners."""
    canvas = Canvas(width, height)
    left, right, top, bottom = 90, 30, 50, 80
    points = []
    for index, (job, data) in enumerate(report["jobs"].items()):
        colour = SERIES_COLOURS[index % len(SERIES_COLOURS)]
        for row in data["rows"]:
            if row["variant"] != BASELINE and row["ratio"] is not None and row["saved_gib"] is not None:
                points.append((job, colour, row["variant"], row["ratio"], row["saved_gib"]))
    xs = [p[3] for p in points] + [1.0, 1.5]
    ys = [p[4] for p in points] + [0.0]
    x_lo, x_hi = math.log(min(xs) * 0.97), math.log(max(xs) * 1.08)
    y_step = _nice_step(max(ys) - min(ys) or 1.0, 8)
    y_lo = math.floor(min(ys) / y_step) * y_step - (y_step if min(ys) < 0 else 0)
    y_hi = math.ceil(max(ys) / y_step + 0.5) * y_step
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(ratio):
        return left + int(round((math.log(ratio) - x_lo) / (x_hi - x_lo) * plot_w))

    def py(gib):
        return top + plot_h - int(round((gib - y_lo) / (y_hi - y_lo) * plot_h))

    canvas.text(left, 12, "device memory saved vs slowdown (baseline: no offload, same allocator)", BLACK)
    # grid and ticks: y
    tick = y_lo
    while tick <= y_hi + 1e-9:
        y = py(tick)
        canvas.hline(left, width - right, y, LIGHT)
        label = ("%g" % round(tick, 6))
        canvas.text(left - 8 - Canvas.text_width(label), y - 5, label, BLACK)
        tick += y_step
    # x: the usual slowdowns that fit, at least 40 pixels apart
    last = None
    for ratio in (0.9, 0.95, 1.0, 1.03, 1.1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20):
        if math.log(ratio) < x_lo or math.log(ratio) > x_hi:
            continue
        x = px(ratio)
        if last is not None and x - last < 40:
            continue
        last = x
        canvas.vline(x, top, top + plot_h, LIGHT)
        label = "%gx" % ratio
        canvas.text(x - Canvas.text_width(label) // 2, top + plot_h + 8, label, BLACK)
    # axes, the baseline (x 1, 0 GiB saved) and the Llama targets' corners
    canvas.hline(left, width - right, top + plot_h, BLACK)
    canvas.vline(left, top, top + plot_h, BLACK)
    if y_lo < 0 < y_hi:
        canvas.hline(left, width - right, py(0.0), GREY, dash=4)
    canvas.vline(px(1.0), top, top + plot_h, GREY, dash=4)
    targets = []
    if "llama" in report["jobs"]:
        for ratio, gib, name in ((1.03, 2.5, "llama near-free target"), (1.5, 5.5, "llama all-mlp target")):
            if y_lo < gib < y_hi and math.log(ratio) <= x_hi:
                canvas.hline(left, px(ratio), py(gib), GREY, dash=3)
                canvas.vline(px(ratio), top, py(gib), GREY, dash=3)
                targets.append((px(ratio), py(gib), name))
    canvas.text(left + plot_w // 2 - 150, height - 34, "slowdown (x baseline step time, log scale)", BLACK)
    canvas.text(8, top - 30 + 12, "saved gib", BLACK)
    # legend: one colour per job
    legend_x = width - right - 200
    taken = []
    for index, job in enumerate(report["jobs"]):
        colour = SERIES_COLOURS[index % len(SERIES_COLOURS)]
        y = top + 8 + index * 18
        canvas.rect(legend_x, y, legend_x + 9, y + 9, colour)
        canvas.text(legend_x + 16, y, JOB_TITLES.get(job, job), colour)
        taken.append((legend_x, y, legend_x + 16 + Canvas.text_width(JOB_TITLES.get(job, job)), y + 10))
    # points, then their labels and the targets' labels, each moved until it overlaps nothing drawn
    for job, colour, name, ratio, gib in points:
        x, y = px(ratio), py(gib)
        canvas.rect(x - 4, y - 4, x + 4, y + 4, colour)
        taken.append((x - 5, y - 5, x + 5, y + 5))

    def place(x, y, label, colour):
        w = Canvas.text_width(label)
        box = None
        for dy in (-5, 9, -19, 23, -33, 37, -47, 51, -61, 65):
            for candidate in ((x + 8, y + dy, x + 8 + w, y + dy + 10), (x - 8 - w, y + dy, x - 8, y + dy + 10)):
                if candidate[0] < left + 2 or candidate[2] > width - 2 or candidate[1] < top - 10:
                    continue
                if not any(candidate[0] < b[2] and b[0] < candidate[2] and candidate[1] < b[3] and b[1] < candidate[3]
                           for b in taken):
                    box = candidate
                    break
            if box is not None:
                break
        if box is None:  # crowded: the first place to the right, overlapping
            box = (x + 8, y - 5, x + 8 + w, y + 5)
        taken.append(box)
        canvas.text(box[0], box[1], label, colour)

    for job, colour, name, ratio, gib in points:
        place(px(ratio), py(gib), name.replace("actpage-", "ap-"), colour)
    for x, y, name in targets:
        place(x, y, name, GREY)
    return canvas


# ---------------------------------------------------------------------------------------------
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", default="out/bench", help="bench.sh's output (default out/bench)")
    parser.add_argument("--png", default=None, help="draw memory saved against slowdown into this PNG")
    parser.add_argument("--json", default=None, help="write the rows and target checks as JSON")
    parser.add_argument("--markdown", default=None, help="write the Results section for docs/benchmarks.md")
    parser.add_argument("--png-link", default="benchmarks.png",
                        help="the image the markdown shows (default benchmarks.png, beside docs/benchmarks.md)")
    args = parser.parse_args(argv)
    report = build_report(args.directory)
    print(format_text(report))
    if args.png and report["jobs"]:
        with open(args.png, "wb") as handle:
            handle.write(draw_plot(report).png())
        print("drawn: %s" % args.png)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2, sort_keys=True)
            handle.write("\n")
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(format_markdown(report, args.png_link if args.png else None))
        print("written: %s" % args.markdown)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
