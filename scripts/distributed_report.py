#!/usr/bin/env python3
"""The distributed stage's verdict (scripts/gpu-test.sh distributed): per parallelism and rank, the run
without actpage next to the run under it.

  distributed_report.py DIR [--parallel ddp fsdp2] [--world 2] [--json OUT]

DIR holds the per-rank results examples/train_distributed.py wrote (--result-json), named
dist-PARALLEL-plain-rankR.json and dist-PARALLEL-actpage-rankR.json. Prints one table (losses equal
bit for bit, median step time, device-used peak from cudaMemGetInfo, torch's peak) and exits 1 when
a result is missing, the two runs' losses differ on a rank, or actpage was not active in its run.
"""
import argparse
import json
import os
import sys


def load(directory, parallel, variant, rank):
    path = os.path.join(directory, "dist-%s-%s-rank%d.json" % (parallel, variant, rank))
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def ratio(a, b):
    return None if not a or b is None else round(b / a, 4)


def difference(a, b):
    return None if a is None or b is None else round(a - b, 1)


def compare(plain, paged):
    """One row: what the two results of a rank say side by side."""
    same = plain["losses"] == paged["losses"]
    first = next((i for i, (a, b) in enumerate(zip(plain["losses"], paged["losses"])) if a != b), None)
    if first is None and len(plain["losses"]) != len(paged["losses"]):
        same, first = False, min(len(plain["losses"]), len(paged["losses"]))
    return {
        "steps": len(plain["losses"]),
        "losses_bit_identical": same,
        "first_differing_step": first,
        "plain_median_step_ms": plain.get("median_step_ms"),
        "actpage_median_step_ms": paged.get("median_step_ms"),
        "step_time_ratio": ratio(plain.get("median_step_ms"), paged.get("median_step_ms")),
        "plain_device_used_peak_mib": plain.get("device_used_peak_mib"),
        "actpage_device_used_peak_mib": paged.get("device_used_peak_mib"),
        "device_used_saved_mib": difference(plain.get("device_used_peak_mib"), paged.get("device_used_peak_mib")),
        "plain_torch_peak_mib": plain.get("torch_peak_mib"),
        "actpage_torch_peak_mib": paged.get("torch_peak_mib"),
        "actpage_active": bool((paged.get("actpage") or {}).get("active")),
    }


def text(value, digits=1):
    if value is None:
        return "-"
    if isinstance(value, float):
        return "%.*f" % (digits, value)
    return str(value)


def report(directory, parallels, world):
    rows, problems = [], []
    for parallel in parallels:
        for rank in range(world):
            plain, paged = load(directory, parallel, "plain", rank), load(directory, parallel, "actpage", rank)
            if plain is None or paged is None:
                missing = [v for v, r in (("plain", plain), ("actpage", paged)) if r is None]
                problems.append("%s rank %d: no result from the %s run" % (parallel, rank, " and ".join(missing)))
                rows.append({"parallel": parallel, "rank": rank, "missing": missing})
                continue
            row = dict(parallel=parallel, rank=rank, **compare(plain, paged))
            if not row["losses_bit_identical"]:
                problems.append("%s rank %d: losses differ from step %s" % (parallel, rank, row["first_differing_step"]))
            if not row["actpage_active"]:
                problems.append("%s rank %d: actpage was not active in its run" % (parallel, rank))
            rows.append(row)
    return rows, problems


def print_table(rows, out):
    header = ("parallel", "rank", "losses equal", "step ms plain", "actpage", "x", "used peak MiB plain", "actpage",
              "saved", "torch peak MiB plain", "actpage")
    lines = [header]
    for row in rows:
        if "missing" in row:
            lines.append((row["parallel"], str(row["rank"]), "missing: " + ",".join(row["missing"])) + ("",) * 8)
            continue
        equal = "yes (%d steps)" % row["steps"] if row["losses_bit_identical"] else "NO (step %s)" % row["first_differing_step"]
        lines.append((row["parallel"], str(row["rank"]), equal, text(row["plain_median_step_ms"]),
                      text(row["actpage_median_step_ms"]), text(row["step_time_ratio"], 3),
                      text(row["plain_device_used_peak_mib"], 0), text(row["actpage_device_used_peak_mib"], 0),
                      text(row["device_used_saved_mib"], 0), text(row["plain_torch_peak_mib"], 0),
                      text(row["actpage_torch_peak_mib"], 0)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory")
    parser.add_argument("--parallel", nargs="+", default=["ddp", "fsdp2"])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows, problems = report(args.directory, args.parallel, args.world)
    print_table(rows, sys.stdout)
    for problem in problems:
        print("FAILED: " + problem)
    if not problems:
        print("ok: every rank's losses are bit-identical with and without actpage")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"rows": rows, "problems": problems}, handle, indent=2)
            handle.write("\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
