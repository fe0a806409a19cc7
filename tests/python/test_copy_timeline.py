"""scripts/copy_timeline.py: the copy engines' account of one profiled step, from a Chrome trace."""

import gzip
import io
import json
import os
import sys
import tempfile
import unittest

import helpers

sys.path.insert(0, os.path.join(helpers.SOURCE_DIR, "scripts"))
import copy_timeline  # noqa: E402

MIB = 1 << 20


def x(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 1, "args": args}


def step_trace():
    """A forward launched in [0, 100) us of CPU time whose kernels run 10-1010 us on the GPU, a
    backward launched in [200, 300) running 1100-2100; 8 MiB D2H copies of ours (no job launch)
    every 100 us from 100 us, each 80 us long, with a 370 us hole and the last one running past the
    forward's end; one small job copy; H2D copies in backward."""
    events = [x("user_annotation", "step.forward", 0, 100), x("user_annotation", "step.backward", 200, 100)]
    correlation = 0
    for cpu, gpu in ((10, 10), (90, 900), (210, 1100), (290, 2000)):
        correlation += 1
        events.append(x("cuda_runtime", "cudaLaunchKernel", cpu, 5, correlation=correlation))
        events.append(x("kernel", "gemm", gpu, 10 if gpu in (10, 1100) else 100, correlation=correlation))
    # GPU computes 10-1010 in forward: one long kernel of ours without a launch inside the ranges.
    events.append(x("kernel", "long", 20, 880, correlation=999))
    starts = [100, 200, 300, 400, 850, 950]  # the hole: 480-850
    for t in starts:
        events.append(x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", t, 80, bytes=8 * MIB, stream=30))
    events.append(x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 500, 2, bytes=4, stream=7))
    for t in (1200, 1300):
        events.append(x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", t, 100, bytes=4 * MIB, stream=31))
    return events


class CopyTimelineTest(unittest.TestCase):
    def setUp(self):
        self.report = copy_timeline.analyse(step_trace(), MIB)

    def test_windows_come_from_the_launches_inside_each_range(self):
        w = self.report["windows_ms"]
        self.assertEqual(w["step.forward"], [0.0, 0.99])  # 10..1000 us, relative to the step's 10 us start
        self.assertEqual(w["step.backward"], [1.09, 2.09])

    def test_forward_copies_busy_time_rate_and_gaps(self):
        d = self.report["d2h"]["step.forward"]
        self.assertEqual(d["copies"], 6)
        self.assertAlmostEqual(d["busy_ms"], (5 * 80 + 50) / 1000.0)  # the last copy is cut at 1000 us
        self.assertAlmostEqual(d["first_copy_ms"], 0.09)
        self.assertAlmostEqual(d["last_copy_end_ms"], 0.99)
        # Bytes are pro-rated to the window: the last copy ran 50 of its 80 us inside it.
        self.assertEqual(d["bytes"], int(5 * 8 * MIB + 8 * MIB * 50 / 80))
        self.assertAlmostEqual(d["rate_busy_gbs"], 8 * MIB / 80e3, places=6)
        self.assertAlmostEqual(d["rate_from_first_gbs"], d["bytes"] / 900e3, places=6)
        # Gaps: 20 us x3 (180 -> 200, 280 -> 300, 380 -> 400), 370 us (480 -> 850), 20 us (930 -> 950).
        self.assertEqual(d["gaps"]["10-50us"]["count"], 4)
        self.assertEqual(d["gaps"]["200-1000us"]["count"], 1)
        self.assertEqual(d["gaps"][">=1000us"]["count"], 0)
        self.assertAlmostEqual(d["gap_ms"], (4 * 20 + 370) / 1000.0)
        self.assertAlmostEqual(d["longest_gaps"][0]["ms"], 0.37)
        self.assertAlmostEqual(d["longest_gaps"][0]["at_ms"], 0.47)
        self.assertAlmostEqual(d["longest_gaps"][0]["compute_ms"], 0.37)  # the long kernel ran through it

    def test_small_copies_are_left_out_and_streams_named(self):
        self.assertEqual(self.report["streams"]["d2h"], ["30"])
        self.assertEqual(self.report["h2d"]["step.forward"]["copies"], 0)
        h = self.report["h2d"]["step.backward"]
        self.assertEqual((h["copies"], h["bytes"]), (2, 8 * MIB))

    def test_reads_a_compressed_trace_and_prints(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "step.json.gz")
            with gzip.open(path, "wt") as f:
                json.dump({"traceEvents": step_trace() + [{"ph": "M", "name": "process_name"}]}, f)
            report = copy_timeline.analyse(copy_timeline.load_events(path), MIB)
            self.assertEqual(report["d2h"]["step.forward"]["copies"], 6)
            text = io.StringIO()
            copy_timeline.print_report(report, text)
            self.assertIn("device to host copies (streams 30)", text.getvalue())
            self.assertIn("gap of 0.370 ms", text.getvalue())


if __name__ == "__main__":
    unittest.main()
