"""scripts/peak_holders.py: what held device memory at each iteration's peak, from `actpage dump --perfetto`."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import helpers

sys.path.insert(0, os.path.join(helpers.SOURCE_DIR, "scripts"))
import peak_holders  # noqa: E402

GIB = 1 << 30


def counter(name, ts, args):
    return {"name": name, "ph": "C", "ts": ts, "pid": 1, "args": args}


def held(ts, in_use, unused, activations, cache):
    return counter(peak_holders.HELD, ts, {"job's pool, in use": in_use * GIB, "job's pool, unused": unused * GIB,
                                           "actpage's activations": activations * GIB,
                                           "actpage's range cache": cache * GIB})


def trace():
    """Three iterations starting at 0, 100 and 200 ms (the third has no known end). Iteration 1 peaks
    at 30 ms with 10 GiB used: pool 6 + 2 unused, 1 GiB of ours, no cache, 1 GiB of context; its
    other sample (10 ms) is lower. Iteration 2 peaks at 150 ms, 12 GiB. Live bytes peak at 9 GiB at
    20 ms with 3 GiB off the device then (resident 6), and at 7 GiB at 40 ms with nothing off
    (resident 7, the iteration's resident peak)."""
    ms = 1000.0
    events = [{"name": f"iteration {i}", "cat": "iteration", "ph": "i", "ts": t * ms, "pid": 1, "tid": 1,
               "args": {"index": i}} for i, t in ((1, 0), (2, 100), (3, 200))]
    for t, used in ((10, 8), (30, 10), (150, 12), (250, 20)):
        events.append(counter("device memory", t * ms, {"bytes": used * GIB}))
    events.append(held(10 * ms, 5, 1, 1, 0))
    events.append(held(30 * ms, 6, 2, 1, 0))
    events.append(held(150 * ms, 7, 2, 0.5, 1.5))
    events.append(held(250 * ms, 1, 1, 1, 1))
    for t, live in ((20, 9), (40, 7), (120, 5)):
        events.append(counter("live bytes", t * ms, {"bytes": live * GIB}))
    events.append(counter("off the device", 15 * ms, {"bytes": 3 * GIB}))
    events.append(counter("off the device", 35 * ms, {"bytes": 0}))
    return {"traceEvents": events}


class PeakHoldersTest(unittest.TestCase):
    def setUp(self):
        self.trace = peak_holders.Trace(trace()["traceEvents"])

    def test_each_iteration_with_an_end_gets_its_highest_sample_split_by_its_holders(self):
        rows = peak_holders.peaks(self.trace)
        self.assertEqual([r["iteration"] for r in rows], [1, 2])
        first, second = rows
        self.assertAlmostEqual(first["peak_gib"], 10)
        self.assertAlmostEqual(first["at_ms"], 30)
        self.assertAlmostEqual(first["job's pool, in use"], 6)
        self.assertAlmostEqual(first["job's pool, unused"], 2)
        self.assertAlmostEqual(first["rest"], 1)  # 10 - (6 + 2 + 1 + 0)
        self.assertAlmostEqual(second["peak_gib"], 12)
        self.assertAlmostEqual(second["at_ms"], 50)
        self.assertAlmostEqual(second["actpage's range cache"], 1.5)
        self.assertAlmostEqual(second["rest"], 1)  # 12 - (7 + 2 + 0.5 + 1.5)

    def test_the_resident_peak_takes_what_was_off_the_device_away_from_the_live_bytes(self):
        first = peak_holders.peaks(self.trace)[0]
        self.assertAlmostEqual(first["resident_peak_gib"], 7)  # 7 at 40 ms beats 9 - 3 at 20 ms
        self.assertAlmostEqual(first["resident_at_ms"], 40)

    def test_the_timeline_lists_one_iterations_samples(self):
        rows = peak_holders.timeline(self.trace, 1, step_ms=1)
        self.assertEqual([r["at_ms"] for r in rows], [10, 30])
        self.assertAlmostEqual(rows[0]["used_gib"], 8)
        self.assertAlmostEqual(rows[0]["rest"], 1)  # 8 - (5 + 1 + 1 + 0)

    def test_the_command_line_prints_json(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            with open(path, "w") as f:
                json.dump(trace(), f)
            out = subprocess.run([sys.executable, os.path.join(helpers.SOURCE_DIR, "scripts", "peak_holders.py"), path,
                                  "--json"], check=True, capture_output=True, text=True).stdout
        rows = json.loads(out)
        self.assertEqual(len(rows), 2)
        self.assertAlmostEqual(rows[1]["peak_gib"], 12)


if __name__ == "__main__":
    unittest.main()
