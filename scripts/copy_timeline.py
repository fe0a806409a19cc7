#!/usr/bin/env python3
"""What the copy engines did during one profiled training step.

Reads the Chrome trace that `examples/train_*.py --profile-step N --profile-out FILE` keeps (torch.profiler,
whose CUPTI activity records see every copy of the process, libactpage's own on its streams included) and
prints, for device-to-host and host-to-device copies of at least --min-bytes:

- the forward's and the backward's GPU windows (from the first to the last GPU activity launched inside the
  `step.forward` / `step.backward` ranges the example's training loop opens while profiling);
- per window: bytes copied, the time any such copy ran (the union of their intervals), the rate while they
  ran (bytes over that time) and over the window from the first copy's start, and how long the GPU computed;
- the idle gaps between consecutive copies by length, and the longest ones with where they fell.

This is the copy engine's own account: the trace's "rate in the job" (bytes begun over the time an offload
was in flight) also counts the time a queued copy waits for the job's kernels to produce its data.

Usage: copy_timeline.py TRACE.json[.gz] [--min-bytes N] [--json]
"""
import argparse
import gzip
import json
import sys

GAP_BINS_US = (10, 50, 200, 1000)


def load_events(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        loaded = json.load(f)
    events = loaded.get("traceEvents", []) if isinstance(loaded, dict) else loaded
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]


def union(intervals):
    """Merged [start, end) intervals, sorted."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1][1] = end
        else:
            merged.append([start, end])
    return merged


def clipped_length(merged, lo, hi):
    return sum(max(0.0, min(end, hi) - max(start, lo)) for start, end in merged)


def copy_direction(event):
    name = event.get("name", "")
    if "DtoH" in name:
        return "d2h"
    if "HtoD" in name:
        return "h2d"
    return None


def phase_windows(events):
    """GPU windows of the ranges the training loop names: {name: (start_us, end_us)}."""
    # torch >= 2 files record_function ranges under "user_annotation"; older versions name no category.
    ranges = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("cat", "user_annotation") == "user_annotation" and e.get("name", "").startswith("step.")}
    launches = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})]
    gpu = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in e.get("args", {}):
            gpu.setdefault(e["args"]["correlation"], []).append(e)
    windows = {}
    for name, (lo, hi) in ranges.items():
        spans = []
        for launch in launches:
            if lo <= launch["ts"] <= hi:
                for g in gpu.get(launch["args"]["correlation"], ()):
                    spans.append((g["ts"], g["ts"] + g["dur"]))
        if spans:
            windows[name] = (min(s for s, _ in spans), max(e for _, e in spans))
    return windows


def describe(copies, kernels_merged, lo, hi):
    """Copies (dicts with ts, dur, bytes) inside [lo, hi): what they moved and the gaps between them."""
    inside = [c for c in copies if c["ts"] < hi and c["ts"] + c["dur"] > lo]
    merged = union((c["ts"], c["ts"] + c["dur"]) for c in inside)
    busy = clipped_length(merged, lo, hi)
    out = {"copies": len(inside), "bytes": 0, "busy_ms": busy / 1000.0,
           "compute_ms": clipped_length(kernels_merged, lo, hi) / 1000.0, "window_ms": (hi - lo) / 1000.0}
    if not inside:
        return out
    moved = 0.0
    for c in inside:
        overlap = max(0.0, min(c["ts"] + c["dur"], hi) - max(c["ts"], lo))
        moved += c["bytes"] * (overlap / c["dur"] if c["dur"] > 0 else 1.0)
    out["bytes"] = int(moved)
    first = max(lo, merged[0][0])
    last = min(hi, merged[-1][1])
    out["first_copy_ms"] = (first - lo) / 1000.0
    out["last_copy_end_ms"] = (last - lo) / 1000.0
    out["rate_busy_gbs"] = moved / (busy * 1e3) if busy > 0 else 0.0
    out["rate_from_first_gbs"] = moved / ((last - first) * 1e3) if last > first else 0.0
    gaps = [(merged[i][1], merged[i + 1][0]) for i in range(len(merged) - 1)
            if merged[i + 1][0] > lo and merged[i][1] < hi]
    bins = [0] * (len(GAP_BINS_US) + 1)
    bin_us = [0.0] * (len(GAP_BINS_US) + 1)
    for start, end in gaps:
        length = end - start
        index = next((i for i, limit in enumerate(GAP_BINS_US) if length < limit), len(GAP_BINS_US))
        bins[index] += 1
        bin_us[index] += length
    labels = ["<%dus" % GAP_BINS_US[0]] + ["%d-%dus" % (a, b) for a, b in zip(GAP_BINS_US, GAP_BINS_US[1:])] + \
        [">=%dus" % GAP_BINS_US[-1]]
    out["gaps"] = {label: {"count": n, "ms": t / 1000.0} for label, n, t in zip(labels, bins, bin_us)}
    out["gap_ms"] = sum(end - start for start, end in gaps) / 1000.0
    longest = sorted(gaps, key=lambda g: g[0] - g[1])[:5]
    out["longest_gaps"] = [{"at_ms": (start - lo) / 1000.0, "ms": (end - start) / 1000.0,
                            "compute_ms": clipped_length(kernels_merged, start, end) / 1000.0}
                           for start, end in longest]
    rates = sorted(c["bytes"] / c["dur"] / 1e3 for c in inside if c["dur"] > 0)
    if rates:
        out["per_copy_gbs_p10_p50_p90"] = [rates[int(q * (len(rates) - 1))] for q in (0.1, 0.5, 0.9)]
    return out


def analyse(events, min_bytes):
    kernels = union((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel")
    copies = {"d2h": [], "h2d": []}
    for e in events:
        if e.get("cat") != "gpu_memcpy":
            continue
        direction = copy_direction(e)
        size = int(e.get("args", {}).get("bytes", 0))
        if direction and size >= min_bytes:
            copies[direction].append({"ts": float(e["ts"]), "dur": float(e["dur"]), "bytes": size,
                                      "stream": e.get("args", {}).get("stream", e.get("tid"))})
    windows = phase_windows(events)
    everything = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if everything:
        windows.setdefault("step", (min(e["ts"] for e in everything), max(e["ts"] + e["dur"] for e in everything)))
    report = {"windows_ms": {}, "d2h": {}, "h2d": {}}
    base = windows.get("step", (0.0, 0.0))[0]
    for name, (lo, hi) in sorted(windows.items(), key=lambda kv: kv[1]):
        report["windows_ms"][name] = [(lo - base) / 1000.0, (hi - base) / 1000.0]
        for direction in ("d2h", "h2d"):
            report[direction][name] = describe(copies[direction], kernels, lo, hi)
    report["streams"] = {d: sorted({str(c["stream"]) for c in copies[d]}) for d in copies}
    return report


def print_report(report, out=sys.stdout):
    for name, (lo, hi) in report["windows_ms"].items():
        print("%-14s GPU window %8.2f - %8.2f ms (%.2f ms)" % (name, lo, hi, hi - lo), file=out)
    for direction, label in (("d2h", "device to host"), ("h2d", "host to device")):
        print("\n%s copies (streams %s)" % (label, ", ".join(report["streams"][direction]) or "-"), file=out)
        for name, d in report[direction].items():
            if not d["copies"]:
                print("  %-14s none; GPU computed %.2f of %.2f ms" % (name, d["compute_ms"], d["window_ms"]), file=out)
                continue
            print("  %-14s %d copies, %.1f MiB; copying %.2f ms of %.2f (first at %.2f ms, last ends %.2f ms); "
                  "%.1f GB/s while copying, %.1f GB/s from the first start to the last end; GPU computed %.2f ms"
                  % (name, d["copies"], d["bytes"] / 2**20, d["busy_ms"], d["window_ms"], d["first_copy_ms"],
                     d["last_copy_end_ms"], d["rate_busy_gbs"], d["rate_from_first_gbs"], d["compute_ms"]), file=out)
            if "per_copy_gbs_p10_p50_p90" in d:
                print("  %-14s per copy GB/s p10 %.1f p50 %.1f p90 %.1f" % ("", *d["per_copy_gbs_p10_p50_p90"]), file=out)
            print("  %-14s gaps %.2f ms: %s" % ("", d["gap_ms"], ", ".join(
                "%s %d (%.2f ms)" % (k, v["count"], v["ms"]) for k, v in d["gaps"].items())), file=out)
            for g in d["longest_gaps"]:
                print("  %-14s   gap of %.3f ms at %.2f ms (GPU computing %.3f ms of it)"
                      % ("", g["ms"], g["at_ms"], g["compute_ms"]), file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="Chrome trace kept by --profile-out (.json or .json.gz)")
    parser.add_argument("--min-bytes", type=int, default=1 << 20,
                        help="ignore copies smaller than this (the job's own small reads; default 1 MiB)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = analyse(load_events(args.trace), args.min_bytes)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
