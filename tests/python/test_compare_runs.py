"""examples/compare_runs.py with fake jobs and a fake `actpage` (no GPU, no torch)."""

import contextlib
import io
import itertools
import json
import os
import shutil
import stat
import sys
import tempfile
import textwrap
import unittest

import helpers  # noqa: F401  (puts examples/ on sys.path)

import compare_runs

# Prints a result that depends on how it was run: the losses on the allocator setting (expandable
# differs from the rest at step 2), time and memory on whether actpage ran it. With FAKE_COUNTER the
# job counts its runs in that file and knows its rep (runs before it // FAKE_PER_REP, + 1: compare_runs
# runs every variant once per rep); FAKE_STEPS ({"plain": [...], "actpage": [...]}, one per rep) then
# gives its step time and FAKE_FAIL_REPS ("plain:2,actpage:4") the reps in which it fails.
FAKE_JOB = textwrap.dedent("""
    import json, os, sys
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    under_actpage = "FAKE_UNDER_ACTPAGE" in os.environ
    mode = "actpage" if under_actpage else "plain"
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write("%s|%s|%s|%s\\n" % (conf, under_actpage, " ".join(sys.argv[1:]), os.environ.get("ACTPAGE_POLICY")))
    if "--fail" in sys.argv:
        sys.exit(3)
    import time
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    step_ms = 110.0 if under_actpage else 100.0
    if "FAKE_COUNTER" in os.environ:
        path = os.environ["FAKE_COUNTER"]
        count = int(open(path).read()) if os.path.exists(path) else 0
        with open(path, "w") as counter:
            counter.write(str(count + 1))
        rep = count // int(os.environ["FAKE_PER_REP"]) + 1
        if "%s:%d" % (mode, rep) in os.environ.get("FAKE_FAIL_REPS", "").split(","):
            sys.exit(3)
        step_ms = json.loads(os.environ["FAKE_STEPS"])[mode][rep - 1]
    if under_actpage and os.environ.get("ACTPAGE_LOG_LEVEL") == "info":
        # What the engine logs at the end of a run at level info (compare_runs asks for it).
        sys.stderr.write('[actpage] info: engine: {"stalls": 2, "stall_ns": 3000000, "reload_gpu_waits": 1, '
                         '"reload_gpu_wait_ns": 5000000, "auto_bytes_chosen": 1073741824, '
                         '"auto_forward_gpu_ns": 50000000, "auto_forward_gpu_paged_ns": 55000000, "not_kept": 7, '
                         '"auto_peak_watched_bytes": 828375040, "auto_peak_paged_bytes": 723517440, '
                         '"iterations": 10, "job_thread_ns": 40000000, "job_thread_allocate_ns": 30000000, '
                         '"job_thread_pass_start_ns": 20000000, "job_thread_pool_mark_ns": 5000000, "auto_bytes_paged": 536870912, '
                         '"auto_sheds": 1, "auto_cycle_base_ns": 100000000, "auto_cycle_judged_ns": 110000000, '
                         '"auto_cycle_whole_ns": 120000000, "auto_cycle_settled_ns": 115000000}\\n')
        sys.stderr.write("[actpage] warning: auto (near-free): paged model.layers.0 (1 GiB a pass)\\n")
    losses = [1.5, 1.25, 1.0]
    if conf == "expandable_segments:True":
        losses[2] = 1.0000001
    print("some job output")
    print("ACTPAGE_RESULT " + json.dumps({
        "losses": [x.hex() for x in losses], "median_step_ms": step_ms,
        "device_used_peak_mib": 800.0 if under_actpage else 1000.0,
        "device_used_steady_peak_mib": 700.0 if under_actpage else 1000.0, "torch_peak_mib": 500.0,
        "actpage": {"loaded": under_actpage, "active": under_actpage}}))
""")

# Stands in for `actpage run [--policy P] [--trace T] -- CMD...` and `actpage dump --json T`. Like
# the real one it passes the policy on as ACTPAGE_POLICY; a trace path's %r becomes each rank of
# FAKE_RANKS (one trace per rank, as the ranks of a torchrun job would write), the rank in the trace.
FAKE_ACTPAGE = textwrap.dedent("""
    import json, os, sys
    args = sys.argv[1:]
    if args[0] == "dump":
        print(open(args[2]).read())
        sys.exit(0)
    assert args[0] == "run", args
    args = args[1:]
    while args[0] != "--":
        if args[0] == "--policy":
            os.environ["ACTPAGE_POLICY"] = args[1]
        elif args[0] == "--trace":
            for rank in range(int(os.environ.get("FAKE_RANKS", "1"))):
                with open(args[1].replace("%r", str(rank)), "w") as trace:
                    json.dump({"offload": {"count": rank + 1, "bytes": 1}}, trace)
        else:
            raise SystemExit("fake actpage: unexpected %r" % args[0])
        args = args[2:]
    os.environ["FAKE_UNDER_ACTPAGE"] = "1"
    os.execvp(args[1], args[1:])
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
        for name in ("FAKE_LOG", "FAKE_COUNTER", "FAKE_PER_REP", "FAKE_STEPS", "FAKE_FAIL_REPS", "FAKE_SLEEP", "FAKE_RANKS",
                     "ACTPAGE_POLICY"):
            os.environ.pop(name, None)
        self.dir.cleanup()

    def paired_main(self, plain, actpage, *extra, fail=""):
        """compare_runs on plain-async and actpage-async, len(plain) reps, the fake job taking its step
        time per mode and rep from these lists."""
        os.environ.update({"FAKE_COUNTER": os.path.join(self.tmp, "counter"), "FAKE_PER_REP": "2",
                           "FAKE_STEPS": json.dumps({"plain": plain, "actpage": actpage}), "FAKE_FAIL_REPS": fail})
        return self.main("--reps", str(len(plain)), "--allocators", "async", *extra)

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
            self.assertIn("| actpage-async | yes | backend:cudaMallocAsync | 2/2 | yes | plain-async | yes | 110.0 | 1.100 | 800 | 700 | 500 |", text)
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

    def test_thread_stats_record_each_runs_threads(self):
        os.environ["FAKE_SLEEP"] = "0.3"
        code, _ = self.main("--reps", "1", "--allocators", "async", "--thread-stats", "0.02")
        self.assertEqual(code, 0)
        data, _ = self.summary()
        self.assertEqual(len(data["runs"]), 2)
        for run in data["runs"]:
            threads = run["threads"]["threads"]
            # The job's main thread (the fake actpage execs the job, so both modes have one).
            self.assertEqual(sum(1 for t in threads if t["main"]), 1, threads)
            self.assertGreater(run["threads"]["samples"], 3)
            name = "%s.rep1.threads.txt" % run["variant"]
            with open(os.path.join(self.out, "logs", name)) as handle:
                self.assertIn("cpu ms", handle.read())

    def test_cpu_probe_before_and_after_each_run(self):
        code, _ = self.main("--reps", "1", "--allocators", "async", "--cpu-probe", "0.01")
        self.assertEqual(code, 0)
        data, _ = self.summary()
        cpus = {str(cpu) for cpu in os.sched_getaffinity(0)}
        for run in data["runs"]:
            for when in ("before", "after"):
                self.assertEqual(set(run["cpu_probe"][when]), cpus)
                self.assertTrue(all(rate > 0 for rate in run["cpu_probe"][when].values()))
        self.main("--reps", "1", "--allocators", "async")
        self.assertTrue(all("cpu_probe" not in run for run in self.summary()[0]["runs"]))

    def test_no_thread_stats_without_the_flag(self):
        self.main("--reps", "1", "--allocators", "async")
        data, _ = self.summary()
        self.assertTrue(all("threads" not in run for run in data["runs"]))
        self.assertFalse([f for f in os.listdir(os.path.join(self.out, "logs")) if f.endswith(".threads.txt")])

    def test_unset_allocator_removes_the_variable(self):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:native"
        try:
            self.main("--reps", "1", "--variant", "u;plain;unset")
        finally:
            del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
        with open(self.log) as handle:
            self.assertEqual(handle.read().split("|")[0], "None")

    def test_an_actpage_variant_without_a_policy(self):
        # policy=none: `actpage run -- CMD`, what a new user types; a policy named in the caller's
        # environment must not reach it either (actpage run would take ACTPAGE_POLICY).
        os.environ["ACTPAGE_POLICY"] = "/somewhere/else.json"
        code, _ = self.main("--reps", "1", "--variant", "none;plain;async",
                            "--variant", "bare;actpage;async;policy=none", "--variant", "given;actpage;async")
        self.assertEqual(code, 0)
        data, rows = self.summary()
        argv = {run["variant"]: run["argv"] for run in data["runs"]}
        self.assertEqual(argv["bare"][1:3], ["run", "--"])
        self.assertEqual(argv["given"][1:4], ["run", "--policy", self.policy])
        with open(self.log) as handle:
            calls = [line.strip().split("|") for line in handle]
        self.assertEqual([(c[1], c[3]) for c in calls], [("False", "/somewhere/else.json"), ("True", "None"),
                                                         ("True", self.policy)])
        self.assertEqual(rows["bare"]["reference"], "none")
        self.assertTrue(rows["bare"]["losses_identical_to_reference"])
        self.assertEqual(data["settings"]["variants"][1]["policy"], "none")
        # No policy from anywhere is still an error: policy=none must be asked for.
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            compare_runs.parse_args(["--variant", "a;actpage;async", "--", "job"])

    def test_the_engines_own_account_comes_back_for_actpage_variants(self):
        # actpage variants run at log level info unless told otherwise; their engine line's counters
        # and auto mode's end-of-run line go into results.json and a table of results.md.
        code, _ = self.main("--reps", "1", "--variant", "none;plain;async", "--variant", "auto;actpage;async;policy=none",
                            "--variant", "quiet;actpage;async;policy=none;env=ACTPAGE_LOG_LEVEL=warn")
        self.assertEqual(code, 0)
        data, rows = self.summary()
        runs = {run["variant"]: run for run in data["runs"]}
        self.assertNotIn("engine", runs["none"])
        self.assertIsNone(runs["quiet"]["engine"])
        counters = runs["auto"]["engine"]["counters"]
        self.assertEqual(counters["stalls"], 2)
        self.assertEqual(counters["reload_gpu_wait_ns"], 5000000)
        self.assertNotIn("not_kept", counters)
        self.assertEqual(runs["auto"]["engine"]["auto"], "auto (near-free): paged model.layers.0 (1 GiB a pass)")
        self.assertEqual(rows["auto"]["engine"]["counters"]["auto_forward_gpu_paged_ns"], 55000000)
        self.assertIsNone(rows["quiet"]["engine"])
        with open(os.path.join(self.out, "results.md")) as handle:
            text = handle.read()
        self.assertIn("## actpage's own account", text)
        self.assertIn("| auto | 1.00 -> 0.50 | 50.0 -> 55.0 | 100.0 -> 110.0 (whole 120.0); since 115.0 | 2 (3.0) | 1 (5.0) | - (-) | - | 4.0 (3.0; 2.0 [0.5]) | 790 -> 690 (800, 700) |",
                      text)
        self.assertIn("- auto: `auto (near-free): paged model.layers.0 (1 GiB a pass)`", text)
        self.assertNotIn("| quiet |", text.split("## actpage's own account")[1])

    def test_engine_account_reads_the_last_engine_line(self):
        self.assertIsNone(compare_runs.engine_account("no engine here\n[actpage] info: engine: {broken\n"))
        text = ('[actpage] info: engine: {"stalls": 1}\n'
                '[actpage] info: engine: {"stalls": 4, "stall_ns": 9, "released_unreferenced": 3, "not_kept": 1}\n')
        self.assertEqual(compare_runs.engine_account(text),
                         {"counters": {"stalls": 4, "stall_ns": 9, "released_unreferenced": 3}, "auto": None})

    def test_a_variant_with_an_actpage_of_its_own(self):
        # actpage=PATH: two builds side by side in one comparison (before and after a change).
        other = os.path.join(self.tmp, "old-build", "actpage")
        os.makedirs(os.path.dirname(other))
        shutil.copy2(self.actpage, other)
        code, _ = self.main("--reps", "1", "--variant", "none;plain;async", "--variant", "new;actpage;async",
                            "--variant", "old;actpage;async;actpage=%s" % other)
        self.assertEqual(code, 0)
        data, rows = self.summary()
        argv = {run["variant"]: run["argv"] for run in data["runs"]}
        self.assertEqual(argv["old"][0], other)
        self.assertEqual(argv["new"][0], self.actpage)
        self.assertEqual(argv["old"][1:4], ["run", "--policy", self.policy])
        self.assertTrue(rows["old"]["losses_identical_to_reference"])
        self.assertEqual(data["settings"]["variants"][2]["actpage"], other)
        self.assertIsNone(data["settings"]["variants"][1]["actpage"])
        self.assertEqual(compare_runs.parse_variant("x;actpage;async;actpage=/b/actpage").actpage, "/b/actpage")
        with self.assertRaises(Exception):
            compare_runs.parse_variant("x;actpage;async;actpage=")

    def test_ranks_trace_each_rank_and_summarise_rank_0(self):
        os.environ["FAKE_RANKS"] = "2"
        traces = os.path.join(self.tmp, "traces")
        code, _ = self.main("--reps", "1", "--ranks", "2", "--trace-dir", traces,
                            "--variant", "none;plain;async", "--variant", "ap;actpage;async")
        self.assertEqual(code, 0)
        data, _ = self.summary()
        run = [r for r in data["runs"] if r["variant"] == "ap"][0]
        self.assertTrue(run["argv"][run["argv"].index("--trace") + 1].endswith("ap.rep1.rank%r.trace"))
        self.assertTrue(run["trace"].endswith("ap.rep1.rank0.trace"))
        self.assertEqual(run["trace_summary"]["offloads"], 1)
        self.assertEqual([s["offloads"] for s in run["trace_summaries"]], [1, 2])
        self.assertEqual(data["settings"]["ranks"], 2)
        # A rank that writes no trace this time: an earlier comparison's file must not stand in for it.
        os.environ["FAKE_RANKS"] = "1"
        self.main("--reps", "1", "--ranks", "2", "--trace-dir", traces, "--variant", "none;plain;async",
                  "--variant", "ap;actpage;async")
        run = [r for r in self.summary()[0]["runs"] if r["variant"] == "ap"][0]
        self.assertEqual(run["trace_summaries"][0]["offloads"], 1)
        self.assertIsNone(run["trace_summaries"][1])
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            compare_runs.parse_args(["--ranks", "0", "--", "job"])

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

    def test_paired_ratios_follow_the_rep(self):
        # Rep 3's actpage process ran slow (130.5 where its plain neighbour took 100): it moves the
        # unpaired medians' ratio by 13%, the median of the paired ratios not at all.
        code, printed = self.paired_main([100, 130, 100, 130], [100.5, 130.5, 130.5, 130.5], "--within", "0.01")
        self.assertEqual(code, 0)
        data, rows = self.summary()
        row = rows["actpage-async"]
        self.assertEqual(row["reference"], "plain-async")
        self.assertEqual(row["ratio_to_reference"], round(130.5 / 115, 4))  # unpaired: 1.1348
        self.assertEqual(row["paired_reps"], [1, 2, 3, 4])
        expected = [1.005, 130.5 / 130, 1.305, 130.5 / 130]
        for got, want in zip(row["paired_ratios"], expected):
            self.assertAlmostEqual(got, want, places=6)
        self.assertAlmostEqual(row["paired_ratio_median"], (130.5 / 130 + 1.005) / 2, places=6)  # 1.004423
        # 4 pairs: a resample's median is the smallest ratio when 3 or 4 of its 4 draws are that
        # pair, 13 of the 256 equally likely resamples (5.1% > 2.5%), and likewise the largest: the
        # 95% interval runs from the smallest ratio to the largest.
        self.assertEqual(row["paired_ratio_ci95"], [round(130.5 / 130, 6), 1.305])
        self.assertAlmostEqual(row["ratio_of_means"], (100.5 + 3 * 130.5) / 460, places=6)  # 1.069565
        self.assert_exact_bootstrap(row["ratio_of_means_ci95"], [(100.5, 100), (130.5, 130), (130.5, 100), (130.5, 130)],
                                    compare_runs.ratio_of_means)
        self.assertFalse(row["paired_within"])
        self.assertIsNone(rows["plain-async"]["paired_ratio_median"])
        self.assertEqual(rows["plain-async"]["paired_ratios"], [])
        line = ("within 1%: actpage-async vs plain-async: x1.004 [1.004, 1.305] over 4 pairs: "
                "no, the 95% interval is not inside [0.990, 1.010]")
        self.assertIn(line, printed.splitlines())
        with open(os.path.join(self.out, "results.md")) as handle:
            markdown = handle.read()
        self.assertIn("- " + line + "\n", markdown)
        low, high = row["ratio_of_means_ci95"]
        for text in (printed, markdown):
            self.assertIn("| 1.135 | 800 | 700 | 500 | x1.004 [1.004, 1.305] | x1.070 [%.3f, %.3f] |" % (low, high), text)
        self.assertEqual(data["settings"]["within"], 0.01)

    def test_within_when_every_pair_is(self):
        plain, actpage = [100, 140, 100, 140, 120], [100.4, 140.7, 99.9, 141.0, 120.6]
        code, printed = self.paired_main(plain, actpage, "--within", "0.01")
        self.assertEqual(code, 0)
        _, rows = self.summary()
        row = rows["actpage-async"]
        # ratios 1.004, 1.005, 0.999, 1.007143, 1.005: median 1.005. 5 pairs: a resample's median is
        # the smallest ratio when 3 or more of its 5 draws are that pair, 5.8% of resamples; likewise
        # the largest.
        self.assertAlmostEqual(row["paired_ratio_median"], 1.005, places=6)
        self.assertEqual(row["paired_ratio_ci95"], [0.999, round(141.0 / 140, 6)])
        self.assertTrue(row["paired_within"])
        self.assertIn("within 1%: actpage-async vs plain-async: x1.005 [0.999, 1.007] over 5 pairs: "
                      "yes, the 95% interval lies inside [0.990, 1.010]", printed.splitlines())
        # a tighter tolerance: the same interval is not inside [0.995, 1.005]
        self.assertIsNone(compare_runs.interval_within(None, 0.01))
        self.assertFalse(compare_runs.interval_within(row["paired_ratio_ci95"], 0.005))
        self.assertTrue(compare_runs.interval_within(row["paired_ratio_ci95"], 0.0075))

    def test_a_failed_run_drops_its_pair_only(self):
        # plain fails in rep 2, actpage in rep 4: the pairs are reps 1, 3 and 5. Pairing the
        # successful runs in order instead would divide 150 by 110 (actpage rep 2 by plain rep 3).
        code, printed = self.paired_main([100, 200, 110, 120, 130], [101, 150, 110.55, 999, 130.13], "--within", "0.01",
                                         fail="plain:2,actpage:4")
        self.assertEqual(code, 1)
        _, rows = self.summary()
        row = rows["actpage-async"]
        self.assertEqual((row["ok"], row["runs"], rows["plain-async"]["ok"]), (4, 5, 4))
        self.assertEqual(row["paired_reps"], [1, 3, 5])
        for got, want in zip(row["paired_ratios"], [1.01, 1.005, 1.001]):
            self.assertAlmostEqual(got, want, places=6)
        self.assertEqual(len(row["paired_ratios"]), 3)
        self.assertAlmostEqual(row["paired_ratio_median"], 1.005, places=6)
        # 3 pairs: the median of 3 draws is the smallest ratio in 7 of 27 resamples, likewise the largest
        self.assertEqual(row["paired_ratio_ci95"], [1.001, 1.01])
        self.assertAlmostEqual(row["ratio_of_means"], (101 + 110.55 + 130.13) / 340, places=6)
        self.assertIn("within 1%: actpage-async vs plain-async: x1.005 [1.001, 1.010] over 3 pairs: yes", printed)

    def test_too_few_pairs_for_an_interval(self):
        code, printed = self.paired_main([100, 120], [101, 119], "--within", "0.01")
        self.assertEqual(code, 0)
        _, rows = self.summary()
        row = rows["actpage-async"]
        self.assertAlmostEqual(row["paired_ratio_median"], (1.01 + 119 / 120) / 2, places=6)
        self.assertIsNone(row["paired_ratio_ci95"])
        self.assertIsNone(row["ratio_of_means_ci95"])
        self.assertIsNone(row["paired_within"])
        self.assertIn("| x1.001 | x1.000 |", printed)  # 220 / 220
        self.assertIn("within 1%: actpage-async vs plain-async: x1.001 over 2 pairs: not established "
                      "(an interval needs 3 pairs)", printed.splitlines())

    def test_no_within_line_without_the_flag(self):
        code, printed = self.paired_main([100, 120, 110], [101, 119, 110])
        self.assertEqual(code, 0)
        data, rows = self.summary()
        self.assertNotIn("within", printed)
        self.assertNotIn("paired_within", rows["actpage-async"])
        self.assertIsNone(data["settings"]["within"])
        with self.assertRaises(SystemExit):
            with contextlib.redirect_stderr(io.StringIO()):
                compare_runs.parse_args(["--within", "1.5", "--", "job"])

    def assert_exact_bootstrap(self, interval, pairs, statistic, level=0.95, slack=0.015):
        """interval (compare_runs' Monte Carlo bootstrap, 2000 resamples) against the exact bootstrap
        distribution of statistic over all len(pairs)**len(pairs) equally likely resamples: lo must
        be near its (1 - level) / 2 point, hi near its (1 + level) / 2 point, within `slack` in
        probability (the Monte Carlo error of a 2.5% point from 2000 resamples is about 0.35%)."""
        n = len(pairs)
        values = [statistic([pairs[i] for i in draw]) for draw in itertools.product(range(n), repeat=n)]
        eps = 1e-6  # compare_runs rounds its intervals to 6 decimals

        def below(x):
            return sum(v < x - eps for v in values) / len(values)

        def at_most(x):
            return sum(v <= x + eps for v in values) / len(values)

        tail = (1 - level) / 2
        low, high = interval
        self.assertLessEqual(below(low), tail + slack, (low, sorted(values)[:40]))
        self.assertGreaterEqual(at_most(low), tail - slack, low)
        self.assertLessEqual(1 - at_most(high), tail + slack, high)
        self.assertGreaterEqual(1 - below(high), tail - slack, high)

    def test_bootstrap_interval_against_the_exact_distribution(self):
        pairs = [(100.0, 100.0), (103.0, 101.0), (99.0, 100.0), (151.0, 150.0), (122.0, 118.0)]
        for statistic in (compare_runs.median_of_ratios, compare_runs.ratio_of_means):
            interval = compare_runs.bootstrap_interval(pairs, statistic)
            self.assert_exact_bootstrap(interval, pairs, statistic)
            self.assertEqual(interval, compare_runs.bootstrap_interval(pairs, statistic))  # fixed seed
            self.assertLess(interval[0], statistic(pairs))
            self.assertGreater(interval[1], statistic(pairs))
        # a 90% interval lies inside the 95% one
        wide = compare_runs.bootstrap_interval(pairs, compare_runs.ratio_of_means)
        narrow = compare_runs.bootstrap_interval(pairs, compare_runs.ratio_of_means, level=0.9)
        self.assert_exact_bootstrap(narrow, pairs, compare_runs.ratio_of_means, level=0.9)
        self.assertTrue(wide[0] <= narrow[0] <= narrow[1] <= wide[1])
        self.assertIsNone(compare_runs.bootstrap_interval(pairs[:2], compare_runs.ratio_of_means))

    def test_parse_results_takes_every_result_line(self):
        text = "x\nACTPAGE_RESULT {\"a\": 1}\n[rank0] ACTPAGE_RESULT {\"a\": 2}\nACTPAGE_RESULT {broken\n"
        self.assertEqual(compare_runs.parse_results(text), [{"a": 1}, {"a": 2}])


if __name__ == "__main__":
    unittest.main()
