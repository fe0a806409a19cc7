"""scripts/plan_compare.py: the predicted-vs-measured arithmetic of the GPU `plan` stage."""

import json
import os
import sys
import tempfile
import unittest

import helpers

sys.path.insert(0, os.path.join(helpers.SOURCE_DIR, "scripts"))
import plan_compare  # noqa: E402

MIB = 1 << 20

PLAN = {
    "goal": "peak at most 18 GiB", "goal_met": True, "calibration": {"measured": True},
    "baseline_peak_bytes": 20000 * MIB,
    "chosen": {"modules": ["model.layers.[0-11].mlp"], "keep_last": 2, "prefetch_bytes": 1 << 30,
               "predicted_peak_bytes": 17000 * MIB, "predicted_slowdown": 0.10},
}
OBSERVE = {"device_used_peak_mib": 22000.0, "median_step_ms": 100.0, "losses": ["0x1.0p+0"]}


class PlanCompareTest(unittest.TestCase):
    def test_overhead_of_the_observe_run_is_carried_over(self):
        planned = {"device_used_peak_mib": 19500.0, "median_step_ms": 112.0, "losses": ["0x1.0p+0"]}
        c = plan_compare.compare("llama", OBSERVE, PLAN, planned)
        # 22000 - 20000 = 2000 MiB of context and cache; 2000 + 17000 predicted.
        self.assertEqual(c["overhead_mib"], 2000.0)
        self.assertEqual(c["predicted_device_used_mib"], 19000.0)
        self.assertAlmostEqual(c["peak_error"], 500 / 19500, places=4)
        self.assertAlmostEqual(c["predicted_step_ms"], 110.0)
        self.assertAlmostEqual(c["step_error"], 2 / 112, places=4)
        self.assertAlmostEqual(c["measured_slowdown"], 0.12)
        self.assertTrue(c["within"])
        self.assertTrue(c["losses_identical"])

    def test_outside_the_tolerance_fails(self):
        planned = {"device_used_peak_mib": 19000.0, "median_step_ms": 140.0, "losses": ["0x1.1p+0"]}
        c = plan_compare.compare("llama", OBSERVE, PLAN, planned)
        self.assertEqual(c["peak_error"], 0.0)
        self.assertGreater(c["step_error"], 0.10)
        self.assertFalse(c["within"])
        self.assertFalse(c["losses_identical"])
        self.assertIn("OUTSIDE 10%", plan_compare.describe(c))

    def test_the_predicted_gain_per_iteration_is_added_to_the_observed_step(self):
        plan = json.loads(json.dumps(PLAN))
        plan["chosen"]["predicted_added_iteration_ns"] = 12_000_000  # 12 ms; the 10% slowdown is not used
        planned = {"device_used_peak_mib": 19000.0, "median_step_ms": 113.0}
        c = plan_compare.compare("qwen", OBSERVE, plan, planned)
        self.assertAlmostEqual(c["predicted_step_ms"], 112.0)
        self.assertAlmostEqual(c["predicted_added_ms"], 12.0)
        self.assertAlmostEqual(c["measured_added_ms"], 13.0)
        self.assertTrue(c["within"])

    def test_a_run_whose_steps_spread_more_than_the_tolerance_is_an_unstable_baseline(self):
        # Warm-up 1, then the middle half of 80 80 80 100 120 120 (sorted: 80 80 80 100 120 120) runs
        # from 80 to 120 ms: 50%. One slow last step alone would not count.
        observe = dict(OBSERVE, warmup=1, step_ms=[700.0, 80.0, 120.0, 80.0, 100.0, 120.0, 80.0])
        steady = {"device_used_peak_mib": 19000.0, "median_step_ms": 110.0, "warmup": 1,
                  "step_ms": [700.0, 110.0, 111.0, 109.0, 110.0, 110.5, 300.0]}
        c = plan_compare.compare("qwen", observe, PLAN, steady)
        self.assertAlmostEqual(c["step_spread"]["observe"], 0.5)
        self.assertLess(c["step_spread"]["planned"], 0.02)
        self.assertEqual(c["unstable_baseline"], ["observe"])
        self.assertIn("UNSTABLE BASELINE: the middle half of the observe run's steps", plan_compare.describe(c))
        self.assertEqual(plan_compare.compare("llama", OBSERVE, PLAN, steady)["unstable_baseline"], [])

    def test_a_replay_report_stands_for_the_plan(self):
        replay = {"policy": "p.json", "modules": ["model.layers.*.mlp"], "keep_last": 2, "prefetch_bytes": 1 << 30,
                  "baseline_peak_bytes": 20000 * MIB, "timed_peak_bytes": 17000 * MIB,
                  "calibration": {"measured": True},
                  "time": {"slowdown": 0.5, "added_iteration_ns": 10_000_000}}
        planned = {"device_used_peak_mib": 19000.0, "median_step_ms": 110.0}
        c = plan_compare.compare("llama", OBSERVE, plan_compare.plan_from_replay(replay), planned)
        self.assertEqual(c["predicted_device_used_mib"], 19000.0)
        self.assertAlmostEqual(c["predicted_step_ms"], 110.0)
        self.assertEqual(c["policy"], ["model.layers.*.mlp"])

    def test_command_reads_logs_and_writes_json(self):
        with tempfile.TemporaryDirectory() as d:
            def write(name, text):
                path = os.path.join(d, name)
                with open(path, "w") as f:
                    f.write(text)
                return path
            observe = write("observe.log", "noise\nACTPAGE_RESULT " + json.dumps(OBSERVE) + "\n")
            planned = write("planned.log", "ACTPAGE_RESULT " + json.dumps(
                {"device_used_peak_mib": 19100.0, "median_step_ms": 111.0}) + "\n")
            plan = write("plan.json", json.dumps(PLAN))
            out = os.path.join(d, "cmp.json")
            code = plan_compare.main(["llama", "--observe-log", observe, "--plan-json", plan,
                                      "--planned-log", planned, "--json", out])
            self.assertEqual(code, 0)
            with open(out) as f:
                self.assertTrue(json.load(f)["within"])
            failed = write("failed.log", "Traceback: CUDA out of memory\n")
            self.assertEqual(plan_compare.main(["llama", "--observe-log", observe, "--plan-json", plan,
                                                "--planned-log", failed]), 2)


if __name__ == "__main__":
    unittest.main()
