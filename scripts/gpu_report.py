#!/usr/bin/env python3
"""Reads the results of scripts/gpu-test.sh's stages and says whether each criterion holds.

  gpu_report.py pair PLAIN_LOG ACTPAGE_LOG [--trace T --actpage BIN] [--json OUT]
      Losses bit for bit, median step time and ratio, device-used and torch peaks side by side; with a
      trace, the bytes actpage had off the device at its peak and how much of them the peak fell by.
  gpu_report.py attribution LOG --trace T --actpage BIN [--json OUT]
      The trace's live-bytes peak (by module) against torch's peak allocated bytes.
  gpu_report.py safety PLAIN_LOG POISON_LOG HOST_MAPPED_LOG [--json OUT]
      An unsafe policy: poison must change the losses, host_mapped must keep them.

Exit status 1 when a criterion fails. Each log holds an example job's ACTPAGE_RESULT line.
"""
import argparse
import json
import subprocess
import sys

MIB = 1 << 20


def result_of(log_path):
    """The last ACTPAGE_RESULT of a log, or None (the job did not finish)."""
    try:
        lines = [l for l in open(log_path, errors="replace") if l.startswith("ACTPAGE_RESULT ")]
    except OSError:
        return None
    return json.loads(lines[-1][len("ACTPAGE_RESULT "):]) if lines else None


def dump_json(actpage, trace):
    output = subprocess.run([actpage, "dump", "--json", trace], check=True, capture_output=True, text=True)
    return json.loads(output.stdout)


def ratio(a, b):
    return None if not a or b is None else round(b / a, 4)


def pair(args):
    plain, paged = result_of(args.plain), result_of(args.actpage_log)
    report = {"plain_log": args.plain, "actpage_log": args.actpage_log}
    if plain is None or paged is None:
        report["error"] = "a run did not finish: " + ("plain" if plain is None else "actpage")
        print(report["error"])
        return report, False
    same = plain["losses"] == paged["losses"]
    first_diff = next((i for i, (a, b) in enumerate(zip(plain["losses"], paged["losses"])) if a != b), None)
    report.update({
        "steps": len(plain["losses"]),
        "losses_bit_identical": same,
        "first_differing_step": first_diff,
        "plain_losses": plain["losses"],
        "actpage_losses": paged["losses"],
        "plain_median_step_ms": plain["median_step_ms"],
        "actpage_median_step_ms": paged["median_step_ms"],
        "step_time_ratio": ratio(plain["median_step_ms"], paged["median_step_ms"]),
        "plain_device_used_peak_mib": plain["device_used_peak_mib"],
        "actpage_device_used_peak_mib": paged["device_used_peak_mib"],
        "device_used_saved_mib": round(plain["device_used_peak_mib"] - paged["device_used_peak_mib"], 1),
        "plain_torch_peak_mib": plain["torch_peak_mib"],
        "actpage_torch_peak_mib": paged["torch_peak_mib"],
        "actpage_active": paged.get("actpage", {}).get("active"),
    })
    ok = same
    print("losses bit-identical over %d steps: %s%s" % (report["steps"], "yes" if same else "NO",
                                                        "" if same else " (first difference at step %d)" % first_diff))
    print("median step: plain %.1f ms, actpage %.1f ms (x%.3f)" % (
        plain["median_step_ms"], paged["median_step_ms"], report["step_time_ratio"] or 0))
    print("device used peak: plain %.0f MiB, actpage %.0f MiB (saved %.0f MiB)" % (
        plain["device_used_peak_mib"], paged["device_used_peak_mib"], report["device_used_saved_mib"]))
    print("torch peak allocated: plain %.0f MiB, actpage %.0f MiB" % (plain["torch_peak_mib"], paged["torch_peak_mib"]))
    if args.trace:
        d = dump_json(args.actpage, args.trace)
        memory, offload, reload, stalls = d["memory"], d["offload"], d["reload"], d["stalls"]
        off_at_peak = memory.get("offloaded_at_peak_bytes", 0) / MIB
        report.update({
            "trace_offloads": offload["count"], "trace_offloaded_mib": round(offload["bytes"] / MIB, 1),
            "trace_reloads": reload["count"], "trace_reloaded_mib": round(reload["bytes"] / MIB, 1),
            "trace_stalls": stalls["count"], "trace_stall_ms": round(stalls["total_ns"] / 1e6, 2),
            "trace_peak_used_mib": round(memory.get("peak_used_bytes", 0) / MIB, 1),
            "trace_offloaded_at_peak_mib": round(off_at_peak, 1),
            "trace_peak_offloaded_mib": round(memory.get("peak_offloaded_bytes", 0) / MIB, 1),
            "trace_lost_records": d["records"].get("lost", 0) if isinstance(d.get("records"), dict) else None,
        })
        share = report["device_used_saved_mib"] / off_at_peak if off_at_peak > 0 else None
        report["saved_share_of_offloaded_at_peak"] = None if share is None else round(share, 4)
        print("trace: %d offloads (%.0f MiB), %d reloads (%.0f MiB), %d stalls (%.1f ms)" % (
            offload["count"], offload["bytes"] / MIB, reload["count"], reload["bytes"] / MIB, stalls["count"],
            stalls["total_ns"] / 1e6))
        if off_at_peak > 0:
            print("off the device at actpage's peak: %.0f MiB; the peak fell by %.0f MiB = %.1f%% of it" % (
                off_at_peak, report["device_used_saved_mib"], 100 * share))
    return report, ok


def attribution(args):
    run = result_of(args.log)
    d = dump_json(args.actpage, args.trace)
    report = {"log": args.log}
    if run is None:
        print("the job did not finish")
        return report, False
    peak = d["peak"]
    torch_peak = run["torch_peak_mib"] * MIB
    modules = peak["modules"]
    report.update({
        "trace_peak_live_bytes": peak["live_bytes"],
        "torch_peak_allocated_bytes": int(torch_peak),
        "relative_difference": round(abs(peak["live_bytes"] - torch_peak) / torch_peak, 5) if torch_peak else None,
        "modules_at_peak": modules[:25],
        "allocations": d["allocations"]["count"],
        "tagged_bytes": d["allocations"]["tagged"]["bytes"],
        "untagged_bytes": d["allocations"]["untagged"]["bytes"],
    })
    kinds = {kind: any(kind in m["module"] for m in d["modules"]) for kind in ("mlp", "self_attn", "layernorm")}
    report["names_mlp_attention_norm"] = kinds
    ok = report["relative_difference"] is not None and report["relative_difference"] <= 0.01 and all(kinds.values())
    print("trace live-bytes peak %.1f MiB vs torch peak allocated %.1f MiB: %.3f%% apart" % (
        peak["live_bytes"] / MIB, torch_peak / MIB, 100 * (report["relative_difference"] or 0)))
    print("modules named: %s" % ", ".join("%s=%s" % kv for kv in kinds.items()))
    for m in modules[:12]:
        print("  %-48s %10.1f MiB" % (m["module"], m["bytes"] / MIB))
    return report, ok


def safety(args):
    plain, poison, mapped = result_of(args.plain), result_of(args.poison), result_of(args.host_mapped)
    report = {"plain_finished": plain is not None, "poison_finished": poison is not None,
              "host_mapped_finished": mapped is not None}
    if plain is None or mapped is None:
        print("plain or host_mapped run did not finish")
        return report, False
    caught = poison is None or poison["losses"] != plain["losses"]
    survived = mapped["losses"] == plain["losses"]
    report.update({"poison_changed_losses": caught, "host_mapped_losses_identical": survived,
                   "plain_losses": plain["losses"], "poison_losses": poison["losses"] if poison else None,
                   "poison_loss_values": poison.get("loss_values") if poison else None,
                   "host_mapped_losses": mapped["losses"],
                   "host_mapped_median_step_ms": mapped["median_step_ms"],
                   "plain_median_step_ms": plain["median_step_ms"]})
    print("poison: unsafe policy %s (losses %s)" % ("CAUGHT" if caught else "NOT caught",
                                                  poison.get("loss_values") if poison else "run failed"))
    print("host_mapped: losses %s the plain run's" % ("identical to" if survived else "DIFFERENT from"))
    return report, caught and survived


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pair")
    p.add_argument("plain")
    p.add_argument("actpage_log")
    p.add_argument("--trace")
    p.add_argument("--actpage", default="actpage")
    p.add_argument("--json")
    a = sub.add_parser("attribution")
    a.add_argument("log")
    a.add_argument("--trace", required=True)
    a.add_argument("--actpage", default="actpage")
    a.add_argument("--json")
    s = sub.add_parser("safety")
    s.add_argument("plain")
    s.add_argument("poison")
    s.add_argument("host_mapped")
    s.add_argument("--json")
    args = parser.parse_args()
    report, ok = {"pair": pair, "attribution": attribution, "safety": safety}[args.what](args)
    report["ok"] = ok
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
