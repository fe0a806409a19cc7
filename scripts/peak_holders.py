#!/usr/bin/env python3
"""What held device memory at each iteration's peak, from `actpage dump --perfetto` output.

For every iteration of the trace: the highest sample of device memory in use (cudaMemGetInfo), when it
came (ms from the iteration's start), and what held it according to the ENGINE_MEMORY record written with
that sample (the "held device memory" counter: the job's cudaMallocAsync pool in use and unused,
actpage's activations on the device, its range cache); the rest is the context and whatever neither
counts. Also the iteration's highest resident bytes (live allocations minus what actpage had off the
device), the figure the pool's reserve has to cover at least; the pool's reserve above it is the pool's
slack.

`--timeline N` prints iteration N sample by sample (one line every --step ms) instead.

Usage: peak_holders.py PERFETTO.json [--timeline N] [--step MS] [--json]
"""
import argparse
import bisect
import json
import sys

GIB = float(1 << 30)
HELD = "held device memory"


def load(path):
    with open(path) as f:
        loaded = json.load(f)
    return loaded.get("traceEvents", []) if isinstance(loaded, dict) else loaded


def series(events, name):
    return sorted((e["ts"], e["args"]) for e in events if e.get("ph") == "C" and e.get("name") == name)


class Trace:
    def __init__(self, events):
        self.iterations = sorted((e["ts"], e["args"]["index"]) for e in events if e.get("cat") == "iteration")
        self.device = [(t, a["bytes"]) for t, a in series(events, "device memory")]
        self.held = series(events, HELD)
        self.held_ts = [t for t, _ in self.held]
        self.live = [(t, a["bytes"]) for t, a in series(events, "live bytes")]
        self.off = [(t, a["bytes"]) for t, a in series(events, "off the device")]
        self.off_ts = [t for t, _ in self.off]

    def held_at(self, ts):
        """The ENGINE_MEMORY record written with the sample at ts (the first at or after it)."""
        i = bisect.bisect_left(self.held_ts, ts)
        return self.held[i][1] if i < len(self.held) else {}

    def off_at(self, ts):
        i = bisect.bisect_right(self.off_ts, ts) - 1
        return self.off[i][1] if i >= 0 else 0

    def windows(self):
        """(index, start, end) of every iteration that has a next one (the last has no known end)."""
        for (start, index), (end, _) in zip(self.iterations, self.iterations[1:]):
            yield index, start, end


def split(held, used):
    row = {k: v / GIB for k, v in held.items()}
    row["rest"] = (used - sum(held.values())) / GIB
    return row


def peaks(trace):
    rows = []
    for index, start, end in trace.windows():
        samples = [s for s in trace.device if start <= s[0] < end]
        if not samples:
            continue
        ts, used = max(samples, key=lambda s: s[1])
        resident = max((((b - trace.off_at(t)), t) for t, b in trace.live if start <= t < end), default=(0, start))
        held = trace.held_at(ts)
        row = {"iteration": index, "peak_gib": used / GIB, "at_ms": (ts - start) / 1e3,
               "resident_peak_gib": resident[0] / GIB, "resident_at_ms": (resident[1] - start) / 1e3}
        row.update(split(held, used))
        rows.append(row)
    return rows


def timeline(trace, index, step_ms):
    window = [(s, e) for i, s, e in trace.windows() if i == index]
    if not window:
        sys.exit(f"peak_holders: no iteration {index} with a known end in the trace")
    start, end = window[0]
    rows, last = [], None
    for ts, used in trace.device:
        if start <= ts < end and (last is None or (ts - last) / 1e3 >= step_ms):
            last = ts
            row = {"at_ms": (ts - start) / 1e3, "used_gib": used / GIB}
            row.update(split(trace.held_at(ts), used))
            rows.append(row)
    return rows


def print_rows(rows):
    if not rows:
        print("no samples")
        return
    keys = list(rows[0].keys())
    for row in rows:
        for k in row:
            if k not in keys:
                keys.append(k)
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(f"{row[k]:.2f}" if isinstance(row.get(k), float) else str(row.get(k, "-")) for k in keys))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("perfetto", help="the JSON `actpage dump --perfetto` wrote")
    parser.add_argument("--timeline", type=int, metavar="N", help="iteration N sample by sample")
    parser.add_argument("--step", type=float, default=4.0, metavar="MS", help="timeline: at most a line per MS (4)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    trace = Trace(load(args.perfetto))
    if not trace.device:
        sys.exit(f"peak_holders: {args.perfetto} has no device memory samples")
    rows = timeline(trace, args.timeline, args.step) if args.timeline is not None else peaks(trace)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
    else:
        print_rows(rows)


if __name__ == "__main__":
    main()
