#!/usr/bin/env python3
"""Compares what `actpage plan` predicted with what the planned policy measured on the GPU.

usage: plan_compare.py NAME --observe-log LOG --plan-json PLAN --planned-log LOG [--json OUT]
                       [--tolerance 0.10]

Inputs: the observe-only run's log (its ACTPAGE_RESULT line: device memory in use, median step),
`actpage plan --json`'s report, and the run with the planned policy's log.

The plan predicts a peak of memory held by allocations (the job's allocator plus actpage) and a
slowdown of the traced iteration. The device also holds the CUDA context and the allocator's
cached, unused blocks; that overhead is taken from the observe-only run (its device memory in use
minus the trace's peak of allocations) and assumed unchanged. So:
    predicted device use = observe device use - traced allocation peak + predicted allocation peak
    predicted step       = observe median step x (1 + predicted slowdown)
Each is compared with the planned run's measurement: |measured - predicted| / measured, within the
tolerance or not. Exit 0 when both are within it, 1 when either is not, 2 on unreadable input.
"""
import argparse
import json
import sys

RESULT_PREFIX = "ACTPAGE_RESULT "
MIB = 1 << 20


def last_result(path):
    """The last ACTPAGE_RESULT object in a job's log."""
    found = None
    with open(path, errors="replace") as f:
        for line in f:
            at = line.find(RESULT_PREFIX)
            if at >= 0:
                found = json.loads(line[at + len(RESULT_PREFIX):])
    if found is None:
        raise ValueError(f"{path}: no {RESULT_PREFIX.strip()} line (did the job fail?)")
    return found


def compare(name, observe, plan, planned, tolerance=0.10):
    """The comparison as a dict; `observe` and `planned` are ACTPAGE_RESULT objects, `plan` the report."""
    chosen = plan["chosen"]
    overhead_mib = observe["device_used_peak_mib"] - plan["baseline_peak_bytes"] / MIB
    predicted_mib = overhead_mib + chosen["predicted_peak_bytes"] / MIB
    predicted_ms = observe["median_step_ms"] * (1.0 + chosen["predicted_slowdown"])
    measured_mib = planned["device_used_peak_mib"]
    measured_ms = planned["median_step_ms"]

    def error(measured, predicted):
        return abs(measured - predicted) / measured if measured else float("inf")

    peak_error = error(measured_mib, predicted_mib)
    step_error = error(measured_ms, predicted_ms)
    return {
        "job": name,
        "policy": chosen["modules"],
        "keep_last": chosen["keep_last"],
        "prefetch_bytes": chosen["prefetch_bytes"],
        "goal": plan["goal"],
        "goal_met": plan["goal_met"],
        "calibration": plan["calibration"],
        "observe_device_used_mib": round(observe["device_used_peak_mib"], 1),
        "observe_step_ms": round(observe["median_step_ms"], 2),
        "overhead_mib": round(overhead_mib, 1),
        "predicted_device_used_mib": round(predicted_mib, 1),
        "measured_device_used_mib": round(measured_mib, 1),
        "peak_error": round(peak_error, 4),
        "predicted_step_ms": round(predicted_ms, 2),
        "measured_step_ms": round(measured_ms, 2),
        "step_error": round(step_error, 4),
        "predicted_slowdown": round(chosen["predicted_slowdown"], 4),
        "measured_slowdown": round(measured_ms / observe["median_step_ms"] - 1.0, 4),
        "losses_identical": bool(observe.get("losses")) and observe.get("losses") == planned.get("losses"),
        "tolerance": tolerance,
        "within": peak_error <= tolerance and step_error <= tolerance,
    }


def describe(c):
    verdict = "WITHIN" if c["within"] else "OUTSIDE"
    return (f"{c['job']}: planned {', '.join(c['policy'])} (keep_last {c['keep_last']})\n"
            f"  device memory in use: predicted {c['predicted_device_used_mib']:.0f} MiB, measured "
            f"{c['measured_device_used_mib']:.0f} MiB (error {100 * c['peak_error']:.1f}%); observe-only "
            f"{c['observe_device_used_mib']:.0f} MiB\n"
            f"  median step: predicted {c['predicted_step_ms']:.1f} ms, measured {c['measured_step_ms']:.1f} ms "
            f"(error {100 * c['step_error']:.1f}%); observe-only {c['observe_step_ms']:.1f} ms\n"
            f"  {verdict} {100 * c['tolerance']:.0f}%; losses identical to observe-only: {c['losses_identical']}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name")
    parser.add_argument("--observe-log", required=True)
    parser.add_argument("--plan-json", required=True)
    parser.add_argument("--planned-log", required=True)
    parser.add_argument("--json")
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args(argv)
    try:
        observe = last_result(args.observe_log)
        planned = last_result(args.planned_log)
        with open(args.plan_json) as f:
            plan = json.load(f)
        result = compare(args.name, observe, plan, planned, args.tolerance)
    except (OSError, ValueError, KeyError) as e:
        print(f"plan_compare: {e}", file=sys.stderr)
        return 2
    print(describe(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["within"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
