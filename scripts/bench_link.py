#!/usr/bin/env python3
"""This machine's pinned device-to-host copy rate, for the bench's link bound (scripts/bench.sh).

    bench_link.py --out link.json [--calibration calibration.json] [--torch]

The link bound of a job is what the copy engine can move to host memory while the forward pass runs:
D2H rate x the forward's GPU time. The rate comes from `actpage calibrate --quick`'s file when one
is given and readable (its largest copy, 64 MiB: past the size where the link reaches its peak,
FACTS.md), else, with --torch, from timing pinned copies of 64 MiB with torch and CUDA events. The
record says which: {"d2h_bytes_per_s", "copy_bytes", "source", "device", "measured_at", "errors"};
d2h_bytes_per_s is null when neither worked, and the report then shows no link bound.
"""

import argparse
import datetime
import json
import sys

MIB = 1 << 20
TORCH_COPY_BYTES = 64 * MIB
TORCH_COPIES = 20


def from_calibration(path):
    """(bytes per second, copy bytes, device) at the largest copy size of a calibrate file."""
    with open(path) as handle:
        document = json.load(handle)
    if not document.get("measured"):
        raise ValueError("%s holds built-in defaults, not a measurement" % path)
    points = sorted((int(size), float(rate)) for size, rate in document["d2h_bytes_per_s"])
    if not points:
        raise ValueError("%s: no d2h_bytes_per_s points" % path)
    size, rate = points[-1]
    return rate, size, document.get("device")


def from_torch(copy_bytes=TORCH_COPY_BYTES, copies=TORCH_COPIES):
    """(bytes per second, copy bytes, device): `copies` back-to-back D2H copies of copy_bytes into
    pinned memory on a side stream, timed by CUDA events, after two untimed ones."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    source = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")
    target = torch.empty(copy_bytes, dtype=torch.uint8, pin_memory=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            target.copy_(source, non_blocking=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(copies):
            target.copy_(source, non_blocking=True)
        end.record(stream)
    end.synchronize()
    seconds = start.elapsed_time(end) / 1000.0
    return copy_bytes * copies / seconds, copy_bytes, torch.cuda.get_device_name(0)


def measure(calibration=None, use_torch=False, now=None):
    record = {"d2h_bytes_per_s": None, "copy_bytes": None, "source": None, "device": None, "errors": [],
              "measured_at": (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    attempts = []
    if calibration:
        attempts.append(("actpage calibrate --quick", lambda: from_calibration(calibration)))
    if use_torch:
        attempts.append(("torch, scripts/bench_link.py", from_torch))
    for source, attempt in attempts:
        try:
            rate, size, device = attempt()
        except Exception as error:  # noqa: BLE001  (any failure: say it and try the next way)
            record["errors"].append("%s: %s" % (source, error))
            continue
        record.update(d2h_bytes_per_s=rate, copy_bytes=size, source=source, device=device)
        break
    if not attempts:
        record["errors"].append("nothing to measure with (neither --calibration nor --torch)")
    return record


def describe(record):
    if record.get("d2h_bytes_per_s") is None:
        return "D2H rate not measured (%s)" % ("; ".join(record.get("errors") or []) or "no record")
    return "D2H %.1f GB/s (%s, %d MiB copies)" % (record["d2h_bytes_per_s"] / 1e9, record["source"],
                                                  (record.get("copy_bytes") or 0) // MIB)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the record to write (JSON)")
    parser.add_argument("--calibration", default=None, help="`actpage calibrate`'s file, used first")
    parser.add_argument("--torch", action="store_true", help="time pinned copies with torch when there is no calibration")
    args = parser.parse_args(argv)
    record = measure(args.calibration, args.torch)
    with open(args.out, "w") as handle:
        json.dump(record, handle, indent=2, sort_keys=True)
        handle.write("\n")
    print("bench: %s" % describe(record))
    return 0 if record["d2h_bytes_per_s"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
