#!/usr/bin/env python3
"""Compares what `actpage plan` predicted with what the planned policy measured on the GPU.

usage: plan_compare.py NAME --observe-log LOG (--plan-json PLAN | --replay-json REPLAY)
                       --planned-log LOG [--json OUT] [--tolerance 0.10]

Inputs: the observe-only run's log (its ACTPAGE_RESULT line: device memory in use, median step),
`actpage plan --json`'s report (or `actpage replay --json` of the observe trace with the policy that
ran: to price an earlier run again with another actpage), and the run with the planned policy's log.

The plan predicts a peak of memory held by allocations (the job's allocator plus actpage) and what
the policy adds to an iteration. The device also holds the CUDA context and the allocator's
cached, unused blocks; that overhead is taken from the observe-only run (its device memory in use
minus the trace's peak of allocations) and assumed unchanged. So:
    predicted device use = observe device use - traced allocation peak + predicted allocation peak
    predicted step       = observe median step + predicted time added per iteration
(plans written before predicted_added_iteration_ns existed: observe median step x (1 + slowdown)).
Each is compared with the planned run's measurement: |measured - predicted| / measured, within the
tolerance or not. Exit 0 when both are within it, 1 when either is not, 2 on unreadable input.

The step comparison assumes the host ran both jobs at the same speed. Each run's steps after its
warm-up are checked for that: when they spread by more than the tolerance,
the report says the baseline is unstable, because a step-time error of that size then says nothing
about the prediction (the H100 Qwen3-MoE job of 2026-11-23 ran its observe-only steps at 78-119 ms).
The spread is that of the middle half of the steps (third over first quartile).
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


def plan_from_replay(replay):
    """The fields of a plan report that compare() reads, from `actpage replay --json`."""
    time = replay["time"]
    return {
        "goal": "(replay of " + str(replay.get("policy", "")) + ")",
        "goal_met": True,
        "calibration": replay.get("calibration", {}),
        "baseline_peak_bytes": replay["baseline_peak_bytes"],
        "chosen": {
            "modules": replay.get("modules") or [replay.get("policy", "")],
            "keep_last": replay.get("keep_last"),
            "prefetch_bytes": replay.get("prefetch_bytes"),
            "predicted_peak_bytes": replay["timed_peak_bytes"],
            "predicted_slowdown": time["slowdown"],
            "predicted_added_iteration_ns": time["added_iteration_ns"],
        },
    }


def step_spread(result):
    """How far the steps after warm-up spread: third quartile / first quartile - 1 (the middle half,
    so that one slow step, such as the last one writing the trace, does not count); None without a
    step list."""
    steps = [s for s in result.get("step_ms") or [] if s is not None]
    warmup = result.get("warmup", 0)
    measured = sorted(steps[warmup:] if len(steps) > warmup else steps)
    if len(measured) < 2 or measured[len(measured) // 4] <= 0:
        return None
    return measured[(3 * len(measured) - 1) // 4] / measured[len(measured) // 4] - 1.0


def compare(name, observe, plan, planned, tolerance=0.10):
    """The comparison as a dict; `observe` and `planned` are ACTPAGE_RESULT objects, `plan` the report."""
    chosen = plan["chosen"]
    overhead_mib = observe["device_used_peak_mib"] - plan["baseline_peak_bytes"] / MIB
    predicted_mib = overhead_mib + chosen["predicted_peak_bytes"] / MIB
    if "predicted_added_iteration_ns" in chosen:
        predicted_added_ms = chosen["predicted_added_iteration_ns"] / 1e6
    else:
        predicted_added_ms = observe["median_step_ms"] * chosen["predicted_slowdown"]
    predicted_ms = observe["median_step_ms"] + predicted_added_ms
    measured_mib = planned["device_used_peak_mib"]
    measured_ms = planned["median_step_ms"]

    def error(measured, predicted):
        return abs(measured - predicted) / measured if measured else float("inf")

    peak_error = error(measured_mib, predicted_mib)
    step_error = error(measured_ms, predicted_ms)
    spreads = {"observe": step_spread(observe), "planned": step_spread(planned)}
    unstable = [run for run, spread in spreads.items() if spread is not None and spread > tolerance]
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
        "predicted_added_ms": round(predicted_added_ms, 2),
        "measured_added_ms": round(measured_ms - observe["median_step_ms"], 2),
        "predicted_slowdown": round(chosen["predicted_slowdown"], 4),
        "measured_slowdown": round(measured_ms / observe["median_step_ms"] - 1.0, 4),
        "step_spread": {run: None if spread is None else round(spread, 4) for run, spread in spreads.items()},
        "unstable_baseline": unstable,
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
            f"(error {100 * c['step_error']:.1f}%); observe-only {c['observe_step_ms']:.1f} ms; added "
            f"{c['predicted_added_ms']:.1f} ms predicted, {c['measured_added_ms']:.1f} ms measured\n"
            + "".join(f"  UNSTABLE BASELINE: the middle half of the {run} run's steps spread by "
                      f"{100 * c['step_spread'][run]:.0f}% (more than the tolerance): the step comparison "
                      f"measures the host as much as the prediction\n" for run in c["unstable_baseline"])
            + f"  {verdict} {100 * c['tolerance']:.0f}%; losses identical to observe-only: {c['losses_identical']}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name")
    parser.add_argument("--observe-log", required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan-json")
    source.add_argument("--replay-json")
    parser.add_argument("--planned-log", required=True)
    parser.add_argument("--json")
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args(argv)
    try:
        observe = last_result(args.observe_log)
        planned = last_result(args.planned_log)
        with open(args.plan_json or args.replay_json) as f:
            plan = json.load(f)
        if args.replay_json:
            plan = plan_from_replay(plan)
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
