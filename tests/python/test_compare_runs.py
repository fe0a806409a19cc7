"""examples/compare_runs.py with fake jobs and a fake `actpage` (no GPU, no torch)."""

import contextlib
import io
import json
import os
import stat
import sys
import tempfile
import textwrap
import unittest

import helpers  # noqa: F401  (puts examples/ on sys.path)

import compare_runs

# Prints a result that depends on how it was run: the losses on the allocator setting (expandable
# differs from the rest at step 2), time and memory on whether actpage ran it.
FAKE_JOB = textwrap.dedent("""
    import json, os, sys
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    under_actpage = "ACTPAGE_POLICY" in os.environ
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write("%s|%s|%s\\n" % (conf, under_actpage, " ".join(sys.argv[1:])))
    if "--fail" in sys.argv:
        sys.exit(3)
    losses = [1.5, 1.25, 1.0]
    if conf == "expandable_segments:True":
        losses[2] = 1.0000001
    print("some job output")
    print("ACTPAGE_RESULT " + json.dumps({
        "losses": [x.hex() for x in losses], "median_step_ms": 110.0 if under_actpage else 100.0,
        "device_used_peak_mib": 800.0 if under_actpage else 1000.0, "torch_peak_mib": 500.0,
        "actpage": {"loaded": under_actpage, "active": under_actpage}}))
""")

# Stands in for `actpage run --policy P -- CMD...`.
FAKE_ACTPAGE = textwrap.dedent("""
    import os, sys
    args = sys.argv[1:]
    assert args[0] == "run" and args[1] == "--policy" and args[3] == "--", args
    os.environ["ACTPAGE_POLICY"] = args[2]
    os.execvp(args[4], args[4:])
""")


class CompareRunsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.tmp = self.dir.name
        self.job = os.path.join(self.tmp, "job.py")
        with open(self.job, "w") as handle:
            handle.write(FAKE_JOB)
        self.actpage = os.path.join(self.tmp, "actpage")
        with open(self.actpage, "w") as handle:
            handle.write("#!%s\n%s" % (sys.executable, FAKE_ACTPAGE))
        os.chmod(self.actpage, os.stat(self.actpage).st_mode | stat.S_IXUSR)
        self.policy = os.path.join(self.tmp, "policy.json")
        with open(self.policy, "w") as handle:
            handle.write('{"version": 1}\n')
        self.log = os.path.join(self.tmp, "calls.log")
        os.environ["FAKE_LOG"] = self.log
        self.out = os.path.join(self.tmp, "out")

    def tearDown(self):
        os.environ.pop("FAKE_LOG", None)
        self.dir.cleanup()

    def main(self, *extra):
        argv = ["--policy", self.policy, "--actpage", self.actpage, "--out", self.out] + list(extra)
        argv += ["--", sys.executable, self.job]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = compare_runs.main(argv)
        return code, stdout.getvalue()

    def summary(self):
        with open(os.path.join(self.out, "results.json")) as handle:
            data = json.load(handle)
        return data, {row["variant"]: row for row in data["summary"]}

    def test_default_variants_compared_with_the_right_references(self):
        code, printed = self.main("--reps", "2")
        self.assertEqual(code, 0)
        data, rows = self.summary()
        self.assertEqual(list(rows), ["plain-native", "plain-async", "plain-expandable",
                                      "actpage-native", "actpage-async", "actpage-expandable"])
        self.assertEqual(len(data["runs"]), 12)
        for alloc in ("native", "async", "expandable"):
            row = rows["actpage-" + alloc]
            self.assertEqual(row["reference"], "plain-" + alloc)
            self.assertTrue(row["losses_identical_to_reference"])
            self.assertEqual(row["ratio_to_reference"], 1.1)
            self.assertEqual(row["device_used_peak_mib"], 800.0)
            self.assertTrue(row["actpage_active"])
        self.assertIsNone(rows["plain-native"]["reference"])
        self.assertEqual(rows["plain-async"]["reference"], "plain-native")
        self.assertTrue(rows["plain-async"]["losses_identical_to_reference"])
        self.assertFalse(rows["plain-expandable"]["losses_identical_to_reference"])
        self.assertEqual(rows["plain-expandable"]["losses_first_difference_step"], 2)
        self.assertTrue(all(row["losses_stable_across_reps"] for row in rows.values()))
        self.assertEqual(rows["plain-async"]["median_step_ms"], 100.0)
        # the table, printed and in Markdown
        with open(os.path.join(self.out, "results.md")) as handle:
            markdown = handle.read()
        for text in (printed, markdown):
            self.assertIn("| actpage-async | yes | backend:cudaMallocAsync | 2/2 | yes | plain-async | yes | 110.0 | 1.100 | 800 | 500 |", text)
            self.assertIn("| plain-expandable | no | expandable_segments:True | 2/2 | no (step 2) |", text)
        self.assertTrue(os.path.isfile(os.path.join(self.out, "logs", "actpage-async.rep2.out")))

    def test_runs_are_interleaved_and_each_gets_its_environment(self):
        self.main("--reps", "2", "--allocators", "native,async")
        with open(self.log) as handle:
            calls = [line.strip().split("|")[:2] for line in handle]
        expected_rep1 = [["backend:native", "False"], ["backend:cudaMallocAsync", "False"],
                         ["backend:native", "True"], ["backend:cudaMallocAsync", "True"]]
        self.assertEqual(calls[:4], expected_rep1)
        self.assertEqual(calls[4:], expected_rep1[1:] + expected_rep1[:1])  # rep 2 starts one later

    def test_custom_variants_and_failures(self):
        code, printed = self.main("--reps", "1", "--variant", "base;plain;async",
                                  "--variant", "broken;actpage;async;--fail")
        self.assertEqual(code, 1)
        _, rows = self.summary()
        self.assertEqual(list(rows), ["base", "broken"])
        self.assertEqual(rows["broken"]["ok"], 0)
        self.assertIsNone(rows["broken"]["median_step_ms"])
        self.assertIn("| broken --fail | yes | backend:cudaMallocAsync | 0/1 | - |", printed)
        with open(self.log) as handle:
            self.assertIn("--fail", handle.read())

    def test_unset_allocator_removes_the_variable(self):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:native"
        try:
            self.main("--reps", "1", "--variant", "u;plain;unset")
        finally:
            del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
        with open(self.log) as handle:
            self.assertEqual(handle.read().split("|")[0], "None")

    def test_variant_specs_and_schedule(self):
        variant = compare_runs.parse_variant("x;actpage;max_split_size_mb:64;--method none --steps 3")
        self.assertEqual((variant.mode, variant.alloc), ("actpage", "max_split_size_mb:64"))
        self.assertEqual(variant.extra_args, ["--method", "none", "--steps", "3"])
        with self.assertRaises(Exception):
            compare_runs.parse_variant("x;sometimes;async")
        a, b, c = (compare_runs.Variant(n, "plain", "async") for n in "abc")
        order = [(rep, v.name) for rep, v in compare_runs.schedule([a, b, c], 3)]
        self.assertEqual(order, [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"),
                                 (2, "c"), (2, "a"), (2, "b")])

    def test_parse_results_takes_every_result_line(self):
        text = "x\nACTPAGE_RESULT {\"a\": 1}\n[rank0] ACTPAGE_RESULT {\"a\": 2}\nACTPAGE_RESULT {broken\n"
        self.assertEqual(compare_runs.parse_results(text), [{"a": 1}, {"a": 2}])


if __name__ == "__main__":
    unittest.main()
