"""The zoo benchmark on the CPU, with fabricated results, fake jobs, a fake launcher and a fake
`actpage` (no GPU; nothing depends on this machine's speed): scripts/bench_report.py's Pareto
table, link-bound shares, loss checks, failed and skipped jobs, markdown and PNG; the manifest
reader and the link's rate; and scripts/bench.sh from end to end."""

import contextlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import unittest

import helpers

import compare_runs

sys.path.insert(0, os.path.join(helpers.SOURCE_DIR, "scripts"))
import bench_link  # noqa: E402
import bench_manifest  # noqa: E402
import bench_report  # noqa: E402

GIB = 1 << 30
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
D2H = 50e9  # the fabricated link: 50 GB/s
LOSSES = [10.5 - 0.125 * i for i in range(6)]

# Fabricated jobs: variant -> (median step ms, device used peak MiB, losses (None: the baseline's),
# runs that failed). The baseline's forward takes 30 ms, so the link bound is 50e9 * 0.030 B = 1.397 GiB.
ALPHA = {  # deterministic: bit for bit
    "none": (100.0, 20000.0, None, 0),
    "actpage-observe": (100.5, 20010.0, None, 0),
    "actpage": (100.2, 20000.0, None, 0),
    "actpage-default": (110.0, 18976.0, None, 0),             # 1 GiB at x1.10: 0.1 GiB per 1%, 72% of the bound
    "checkpointing": (125.0, 14000.0, None, 0),
    "actpage-default+checkpointing": (130.0, 13500.0, None, 0),
    "save_on_cpu": (600.0, 15000.0, None, 0),                 # slower and saves less than checkpointing
    "stream_offload": (150.0, 21000.0, [x + (2 ** -20 if i == 3 else 0) for i, x in enumerate(LOSSES)], 0),
}
BETA = {  # not deterministic, loss_tolerance 1e-3 (relative); its own checkpointing on by default
    "none": (200.0, 30000.0, None, 0),
    "actpage-observe": (201.0, 30000.0, [x * (1 + 1e-5) for x in LOSSES], 0),
    "actpage": (200.0, 30000.0, None, 1),                     # its one run failed
    "actpage-default": (198.0, 29000.0, [x * (1 + 4e-4) for x in LOSSES], 0),  # faster and saves: free
    "no-checkpointing": (160.0, 34096.0, None, 0),
    "stream_offload": (260.0, 28000.0, [x * (1 + (2e-2 if i >= 2 else 0)) for i, x in enumerate(LOSSES)], 0),
}


def fabricate(directory, job, table, deterministic=True, tolerance=0.0, link=D2H, reps=1, fwd_ms=30.0,
              manifest_extra=None, microbatches=None, steady=None, probe=None, paged=None):
    """results.json made by compare_runs' own summarize() from fabricated runs, and bench.sh's meta.json."""
    variants, records = [], []
    for name, (ms, used, losses, failures) in table.items():
        mode = "actpage" if name.startswith("actpage") else "plain"
        extra = ["--method", "checkpointing"] if name.endswith("checkpointing") and name != "no-checkpointing" else []
        variants.append(compare_runs.Variant(name, mode, "async", extra,
                                             policy="none" if mode == "actpage" else None))
        for rep in range(reps):
            ok = rep >= failures
            result = {"losses": [x.hex() for x in (losses or LOSSES)], "median_step_ms": ms,
                      "median_fwd_ms": fwd_ms if name == "none" else fwd_ms * 1.1, "device_used_peak_mib": used,
                      "torch_peak_mib": used - 2000, "deterministic": deterministic, "loss_tolerance": tolerance,
                      "device": "Fake GPU", "actpage": {"loaded": mode == "actpage", "active": mode == "actpage"}}
            if microbatches is not None:
                result["microbatches"] = microbatches
            if steady is not None and name in steady:
                result["device_used_steady_peak_mib"] = steady[name]
            if probe is not None and name in probe:
                result["cpu_probe_us"], result["warmup"] = probe[name], 2
            record = {"variant": name, "rep": rep + 1, "rc": 0 if ok else 1, "ok": ok,
                      "result": result if ok else None, "argv": []}
            if paged is not None and name in paged:  # actpage's own account (compare_runs.engine_account)
                record["engine"] = {"counters": {"auto_bytes_paged": paged[name]}, "auto": None}
            records.append(record)
    rows = compare_runs.summarize(variants, records, "none")
    folder = os.path.join(directory, job)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "results.json"), "w") as handle:
        json.dump({"settings": {"command": ["taskset", "-c", "3", "python3", "examples/zoo/%s.py" % job, "--steps", "6"]},
                   "summary": rows, "runs": records}, handle)
    manifest = dict({"name": job, "script": "examples/zoo/%s.py" % job, "deterministic": deterministic,
                     "loss_tolerance": tolerance, "stands_for": "a %s job" % job}, **(manifest_extra or {}))
    link_record = {"d2h_bytes_per_s": link, "source": "actpage calibrate --quick", "copy_bytes": 64 << 20,
                   "errors": []} if link else {"d2h_bytes_per_s": None, "source": None,
                                               "errors": ["actpage calibrate --quick: no GPU"]}
    with open(os.path.join(folder, "meta.json"), "w") as handle:
        json.dump({"job": job, "manifest": manifest, "started": "2026-11-28T10:00:00Z", "finished": "2026-11-28T10:03:00Z",
                   "device": "Fake GPU, 80 GiB", "commit": "abc1234", "reps": reps, "peer_reps": 1, "steps": 6,
                   "warmup": 2, "cpus": "3", "link": link_record}, handle)


def write_manifest(path, jobs):
    with open(path, "w") as handle:
        json.dump({"jobs": jobs}, handle)


def run_script(name, args, env, timeout):
    """Runs scripts/<name> with `args` under bash in `env`: (exit status, stdout and stderr together)."""
    done = subprocess.run(["bash", os.path.join(helpers.SOURCE_DIR, "scripts", name)] + list(args), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=timeout)
    return done.returncode, done.stdout


def read(path, mode="r"):
    with open(path, mode) as handle:
        return handle.read()


def png_size(path):
    data = read(path, "rb")
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


class BenchReportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.tmp = self.dir.name
        self.out = os.path.join(self.tmp, "bench")

    def tearDown(self):
        self.dir.cleanup()

    def report(self, manifest=None):
        return bench_report.build_report(self.out, manifest)

    def rows(self, report, job):
        return {row["variant"]: row for row in report["jobs"][job]["rows"]}

    def test_pareto_front_ratios_and_link_share(self):
        fabricate(self.out, "alpha", ALPHA)
        report = self.report()
        rows = self.rows(report, "alpha")
        self.assertEqual(list(rows), list(ALPHA))  # the table's order: bench.sh's variants
        front = sorted(name for name, row in rows.items() if row["front"])
        self.assertEqual(front, ["actpage-default", "actpage-default+checkpointing", "checkpointing", "none"])
        default = rows["actpage-default"]
        self.assertAlmostEqual(default["ratio"], 1.1)
        self.assertAlmostEqual(default["saved_gib"], 1.0)
        self.assertAlmostEqual(default["gib_per_pct"], 0.1)
        bound = D2H * 0.030 / GIB
        self.assertAlmostEqual(report["jobs"]["alpha"]["link"]["bound_gib"], bound)
        self.assertAlmostEqual(default["link_share"], 1.0 / bound)
        self.assertAlmostEqual(rows["actpage-observe"]["saved_gib"], -10 / 1024.0)
        self.assertIsNone(rows["actpage-observe"]["gib_per_pct"])  # it saved nothing
        self.assertEqual(report["problems"], [])
        text = bench_report.format_text(report)
        self.assertIn("| * | `actpage-default` | actpage run, config/default-policy.json | 1/1 | 110.0 | - | x1.100 | "
                      "18976 | 1.00 | 0.10 | 72% | yes |", text)
        self.assertIn("| | `save_on_cpu` |", text.replace("|  |", "| |"))  # off the front
        self.assertIn("link bound 1.40 GiB = D2H 50.0 GB/s (actpage calibrate --quick) x forward 30.0 ms", text)
        for expected in ("date: 2026-11-28", "device: Fake GPU, 80 GiB", "commit: abc1234",
                         "D2H rate: 50.0 GB/s (actpage calibrate --quick)"):
            self.assertIn(expected, text)

    def test_the_saving_after_warm_up_is_a_column_of_its_own_when_the_results_have_it(self):
        # Auto mode watches the first steps: its whole run's peak is the job's, the later one lower.
        fabricate(self.out, "alpha", ALPHA, steady={"none": 20000.0, "actpage": 18464.0})
        report = self.report()
        rows = self.rows(report, "alpha")
        self.assertAlmostEqual(rows["actpage"]["saved_gib"], 0.0)
        self.assertAlmostEqual(rows["actpage"]["saved_steady_gib"], 1.5)
        self.assertIsNone(rows["checkpointing"]["saved_steady_gib"])  # no figure for it
        text = bench_report.format_text(report)
        self.assertIn("saved after warm-up GiB", text)
        self.assertIn("| 20000 | 0.00 |", text)
        self.assertIn("| 1.50 |", text)
        fabricate(self.out, "alpha", ALPHA)
        self.assertNotIn("saved after warm-up GiB", bench_report.format_text(self.report()))

    def test_a_variant_that_pages_is_held_to_the_links_floor(self):
        # The bound is 1.5e9 B (50 GB/s x 30 ms). actpage-default pages 2.5e9 B a pass: 1e9 beyond it,
        # out and back at 50 GB/s, 40 ms: a floor of 140 ms, which its 110 ms beats (x0.79). actpage
        # pages 1e9 B, within the bound: its floor is the job's own step. With 4 forward passes a step
        # the beyond is paid 4 times.
        fabricate(self.out, "alpha", ALPHA, paged={"actpage-default": 2.5e9, "actpage": 1e9})
        rows = self.rows(self.report(), "alpha")
        self.assertAlmostEqual(rows["actpage-default"]["floor_ratio"], 110.0 / 140.0)
        self.assertAlmostEqual(rows["actpage-default"]["paged_gib"], 2.5e9 / GIB)
        self.assertAlmostEqual(rows["actpage"]["floor_ratio"], 100.2 / 100.0)
        self.assertIsNone(rows["checkpointing"]["floor_ratio"])
        text = bench_report.format_text(self.report())
        self.assertIn("x link floor", text)
        self.assertIn("| 2.33 | x0.79 |", text)
        fabricate(self.out, "alpha", ALPHA, paged={"actpage-default": 2.5e9}, microbatches=4, fwd_ms=120.0)
        rows = self.rows(self.report(), "alpha")
        self.assertAlmostEqual(rows["actpage-default"]["floor_ratio"], 110.0 / (100.0 + 4 * 40.0))
        fabricate(self.out, "alpha", ALPHA)
        self.assertNotIn("x link floor", bench_report.format_text(self.report()))

    def test_losses_bit_for_bit_for_a_deterministic_job(self):
        fabricate(self.out, "alpha", ALPHA)
        report = self.report()
        rows = self.rows(report, "alpha")
        self.assertEqual(report["jobs"]["alpha"]["loss_rule"]["mode"], "bits")
        self.assertTrue(rows["actpage-default"]["losses"]["equal"])
        stream = rows["stream_offload"]
        self.assertEqual((stream["losses"]["equal"], stream["losses"]["first_difference_step"]), (False, 3))
        self.assertFalse(stream["front"])  # different losses: never on the front
        self.assertIn("**no** (step 3)", bench_report.format_text(report))
        self.assertIn("losses: bit for bit against the baseline's", bench_report.format_text(report))
        # actpage on top of checkpointing is also held to checkpointing's own losses
        self.assertEqual(rows["actpage-default+checkpointing"]["losses"]["twin"], "checkpointing")
        self.assertTrue(rows["actpage-default+checkpointing"]["losses"]["twin_equal"])

    def test_losses_within_the_tolerance_when_not_deterministic(self):
        fabricate(self.out, "beta", BETA, deterministic=False, tolerance=1e-3)
        report = self.report()
        rows = self.rows(report, "beta")
        self.assertEqual(report["jobs"]["beta"]["loss_rule"], {"mode": "tolerance", "tolerance": 1e-3,
                                                                "deterministic": False, "reason": None})
        self.assertTrue(rows["actpage-default"]["losses"]["equal"])
        self.assertAlmostEqual(rows["actpage-default"]["losses"]["max_rel_diff"], 4e-4, places=6)
        self.assertEqual(rows["stream_offload"]["losses"]["first_difference_step"], 2)
        text = bench_report.format_text(report)
        self.assertIn("losses: within 0.001 relative of the baseline's (not deterministic)", text)
        self.assertIn("yes (4.0e-04)", text)
        # The same figures from a deterministic job: the 4e-4 is a difference.
        fabricate(self.out, "beta", BETA, deterministic=True, tolerance=1e-3)
        self.assertFalse(self.rows(self.report(), "beta")["actpage-default"]["losses"]["equal"])

    def test_the_result_line_says_whether_the_run_was_deterministic(self):
        # The manifest expects bits, but the job found at run time that it cannot repeat them (a
        # compiled job whose inductor has no deterministic mode): its result line wins, with its reason.
        fabricate(self.out, "beta", BETA, deterministic=False, tolerance=2e-3,
                  manifest_extra={"deterministic": True, "loss_tolerance": 0.0})
        path = os.path.join(self.out, "beta", "results.json")
        results = json.loads(read(path))
        for run in results["runs"]:
            if run["result"]:
                run["result"]["nondeterministic_reason"] = "no inductor determinism"
        with open(path, "w") as handle:
            json.dump(results, handle)
        report = self.report()
        self.assertEqual(report["jobs"]["beta"]["loss_rule"]["tolerance"], 2e-3)
        self.assertTrue(self.rows(report, "beta")["actpage-default"]["losses"]["equal"])
        self.assertIn("(not deterministic: no inductor determinism)", bench_report.format_text(report))

    def test_free_saving_and_the_jobs_default_checkpointing(self):
        fabricate(self.out, "beta", BETA, deterministic=False, tolerance=1e-3)
        rows = self.rows(self.report(), "beta")
        self.assertTrue(rows["actpage-default"]["free"])  # faster than the baseline and saved 1000 MiB
        self.assertTrue(rows["actpage-default"]["front"])
        self.assertFalse(rows["none"]["front"])
        self.assertAlmostEqual(rows["no-checkpointing"]["saved_gib"], -4.0)
        self.assertTrue(rows["no-checkpointing"]["front"])  # the fastest
        self.assertIn("| free |", bench_report.format_table(self.report()["jobs"]["beta"]))

    def test_a_failed_run_is_shown_as_failed(self):
        fabricate(self.out, "beta", BETA, deterministic=False, tolerance=1e-3)
        report = self.report()
        self.assertEqual(report["problems"], ["beta: actpage: 1 of 1 runs failed (logs: beta/logs/actpage.repN.err)"])
        self.assertIn("| `actpage` | actpage run, no policy | 0/1 FAILED | - |", bench_report.format_text(report))
        self.assertFalse(self.rows(report, "beta")["actpage"]["front"])
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(bench_report.main([self.out]), 1)
        # No baseline at all: said so.
        fabricate(self.out, "beta", dict(BETA, none=(200.0, 30000.0, None, 1)), deterministic=False, tolerance=1e-3)
        self.assertIn("beta: no baseline (variant `none`) result", self.report()["problems"])

    def test_the_link_bound_of_gradient_accumulation_is_one_forward_pass(self):
        # Four micro-batches a step, 120 ms of forward GPU time in all: each pass's activations are
        # freed by its own backward, so what the copies can hide is one pass's 30 ms.
        fabricate(self.out, "accum", ALPHA, fwd_ms=120.0, microbatches=4)
        link = self.report()["jobs"]["accum"]["link"]
        self.assertEqual(link["forward_passes"], 4)
        self.assertAlmostEqual(link["fwd_ms"], 30.0)
        self.assertAlmostEqual(link["bound_gib"], D2H * 0.030 / GIB)
        self.assertIn("x forward 30.0 ms (one of 4 forward passes a step, baseline)", bench_report.describe_link(link))

    def test_skipped_and_not_run_jobs(self):
        fabricate(self.out, "alpha", ALPHA)
        os.makedirs(os.path.join(self.out, "duo"))
        with open(os.path.join(self.out, "duo", "skipped.json"), "w") as handle:
            json.dump({"job": "duo", "reason": "needs 2 GPUs, this machine has 1"}, handle)
        manifest = os.path.join(self.tmp, "jobs.json")
        write_manifest(manifest, [{"name": n, "script": n + ".py"} for n in ("later", "duo", "alpha")])
        report = self.report(manifest)
        self.assertEqual(list(report["jobs"]), ["alpha"])
        self.assertEqual(report["skipped"], {"duo": "needs 2 GPUs, this machine has 1"})
        self.assertEqual(report["not_run"], ["later"])
        self.assertEqual(report["problems"], [])  # neither is a failure
        text = bench_report.format_text(report)
        self.assertIn("== duo: skipped (needs 2 GPUs, this machine has 1)", text)
        self.assertIn("not run yet: later", text)
        self.assertIn("Skipped: needs 2 GPUs, this machine has 1.", bench_report.format_markdown(report))

    def test_commits_are_shown_short(self):
        self.assertEqual(bench_report._short_commit("d9bd76502ae99a9a76dd2562ce125e133c5f924e +uncommitted changes "),
                         "d9bd76502ae9 +uncommitted changes")
        self.assertEqual(bench_report._short_commit("abc1234"), "abc1234")
        self.assertIsNone(bench_report._short_commit(None))

    def test_no_link_bound_without_a_rate(self):
        fabricate(self.out, "alpha", ALPHA, link=None)
        data = self.report()["jobs"]["alpha"]
        self.assertIsNone(data["link"]["bound_gib"])
        self.assertIsNone(self.rows(self.report(), "alpha")["actpage-default"]["link_share"])
        self.assertIn("no link bound: D2H rate not measured (actpage calibrate --quick: no GPU)", data["notes"])

    def test_noise_and_host_steal_notes(self):
        fabricate(self.out, "alpha", ALPHA, reps=1)
        self.assertIn("one repetition of each variant", self.report()["jobs"]["alpha"]["notes"][0])
        fabricate(self.out, "alpha", ALPHA, reps=2)
        path = os.path.join(self.out, "alpha", "results.json")
        results = json.loads(read(path))
        base = [r for r in results["summary"] if r["variant"] == "none"][0]
        base.update(step_ms_min=95.0, step_ms_max=104.5)
        for run in results["runs"]:
            if run["variant"] == "actpage-default":
                run["threads"] = {"cpus": {"3": {"steal_ms": 400.0}}}
        with open(path, "w") as handle:
            json.dump(results, handle)
        data = self.report()["jobs"]["alpha"]
        self.assertIn("the baseline's repetitions differ by 10.0%", data["notes"][0])
        self.assertTrue(any("stole up to 0.4 s of the job's CPUs in a run of actpage-default" in n for n in data["notes"]))
        self.assertIn("host steal s", bench_report.format_table(data))

    def test_the_jobs_own_cpu_probe_is_a_column_and_probes_that_differ_are_noted(self):
        # After the two warm-up steps: the median of each run's steps.
        fabricate(self.out, "alpha", ALPHA, probe={"none": [900.0, 500.0, 120.0, 125.0, 118.0],
                                                    "actpage-default": [900.0, 500.0, 230.0, 221.0, 240.0]})
        data = self.report()["jobs"]["alpha"]
        rows = {row["variant"]: row for row in data["rows"]}
        self.assertEqual(rows["none"]["job_probe_us"], 120.0)
        self.assertEqual(rows["actpage-default"]["job_probe_us"], 230.0)
        self.assertIsNone(rows["checkpointing"]["job_probe_us"])
        self.assertIn("job's CPU probe us", bench_report.format_table(data))
        self.assertTrue(any("CPU probe read 230 us a step in actpage-default against 120 in none" in note
                            for note in data["notes"]), data["notes"])
        # Within a quarter of each other: no note; without probes: no column.
        fabricate(self.out, "alpha", ALPHA, probe={"none": [120.0, 121.0, 122.0],
                                                    "actpage-default": [140.0, 141.0, 142.0]})
        data = self.report()["jobs"]["alpha"]
        self.assertFalse(any("CPU probe" in note for note in data["notes"]), data["notes"])
        fabricate(self.out, "alpha", ALPHA)
        self.assertNotIn("job's CPU probe us", bench_report.format_table(self.report()["jobs"]["alpha"]))

    def test_markdown_has_a_table_per_job_with_date_device_and_commit(self):
        fabricate(self.out, "alpha", ALPHA)
        fabricate(self.out, "beta", BETA, deterministic=False, tolerance=1e-3)
        markdown = bench_report.format_markdown(self.report(), "images/bench-zoo.png")
        for expected in ("### alpha", "### beta", "Stands for: a beta job.",
                         "2026-11-28, Fake GPU, 80 GiB, commit `abc1234`; `examples/zoo/alpha.py --steps 6`",
                         "Link bound 1.40 GiB", "![device memory saved against step time, one panel per job]"
                         "(images/bench-zoo.png)", "| front | variant |"):
            self.assertIn(expected, markdown)
        self.assertEqual(markdown.count("| front | variant |"), 2)

    def test_main_writes_every_output_and_the_png(self):
        fabricate(self.out, "alpha", ALPHA)
        fabricate(self.out, "beta", BETA, deterministic=False, tolerance=1e-3)
        png, js, md = (os.path.join(self.tmp, name) for name in ("b.png", "r.json", "r.md"))
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = bench_report.main([self.out, "--png", png, "--json", js, "--markdown", md])
        self.assertEqual(code, 1, stdout.getvalue())  # beta's failed run
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.assertIn("no PNG: matplotlib is not installed", stdout.getvalue())
            return
        width, height = png_size(png)
        self.assertGreater(width, 800)  # two panels side by side
        self.assertGreater(height, 300)
        self.assertEqual(json.loads(read(js))["jobs"]["alpha"]["rows"][3]["variant"], "actpage-default")
        self.assertIn("(images/bench-zoo.png)", read(md))


class ManifestAndLinkTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "jobs.json")

    def tearDown(self):
        self.dir.cleanup()

    def test_defaults_and_shell_assignments(self):
        write_manifest(self.path, [{"name": "a", "script": "a b.py", "args": ["--x", "it's"], "gpus": 2,
                                    "launcher": ["torchrun", "--nproc-per-node", "2"], "checkpointing": "method",
                                    "methods": ["none", "checkpointing"], "deterministic": True}])
        job = bench_manifest.load(self.path)[0]
        self.assertEqual((job["loss_tolerance"], job["stream_offload_modules"]), (0.0, None))
        script = bench_manifest.shell_assignments(job) + '\nprintf "%s|" "$job_script" "${job_args[@]}" ' \
            '"${#job_launcher[@]}" "$job_gpus" "$job_checkpointing" "$job_deterministic" "$job_loss_tolerance"'
        done = subprocess.run(["bash", "-c", script], stdout=subprocess.PIPE, universal_newlines=True)
        self.assertEqual(done.stdout, "a b.py|--x|it's|3|2|method|true|0.0|")

    def test_a_bad_manifest_names_the_job_and_the_key(self):
        for jobs, message in (([{"name": "a", "script": "a.py", "checkpointing": "yes"}], "job 1 (a): 'checkpointing'"),
                              ([{"name": "a", "script": "a.py", "gpus": 0}], "'gpus' must be a whole number"),
                              ([{"name": "a", "script": "a.py"}, {"name": "a", "script": "b.py"}], "unique: a"),
                              ([{"script": "a.py"}], "job 1: 'name'")):
            write_manifest(self.path, jobs)
            with self.assertRaises(bench_manifest.ManifestError) as caught:
                bench_manifest.load(self.path)
            self.assertIn(message, str(caught.exception))
        write_manifest(self.path, [{"name": "a", "script": "a.py"}])
        with self.assertRaises(bench_manifest.ManifestError):
            bench_manifest.find(bench_manifest.load(self.path), "b")

    def test_the_rate_from_a_calibration_and_why_not(self):
        calibration = os.path.join(self.dir.name, "calibration.json")
        with open(calibration, "w") as handle:
            json.dump({"version": 1, "measured": True, "device": "CUDA device 0",
                       "d2h_bytes_per_s": [[67108864, 55.1e9], [2097152, 52.8e9]]}, handle)
        record = bench_link.measure(calibration)
        self.assertEqual((record["d2h_bytes_per_s"], record["copy_bytes"]), (55.1e9, 64 << 20))
        self.assertEqual(record["source"], "actpage calibrate --quick")
        self.assertIn("D2H 55.1 GB/s (actpage calibrate --quick, 64 MiB copies)", bench_link.describe(record))
        with open(calibration, "w") as handle:
            json.dump({"version": 1, "measured": False, "d2h_bytes_per_s": [[1, 1.0]]}, handle)
        record = bench_link.measure(calibration)
        self.assertIsNone(record["d2h_bytes_per_s"])
        self.assertIn("built-in defaults", record["errors"][0])


# ---------------------------------------------------------------------------------------------
# scripts/bench.sh from end to end
# ---------------------------------------------------------------------------------------------
# Stands in for the jobs' interpreter: `FAKE_JOB SCRIPT ARGS...` (bench.sh runs BENCH_JOB_PYTHON with
# the manifest's script). Logs how it was run, and prints a result whose step time and memory depend
# on the variant it recognises from its arguments and environment.
FAKE_JOB = textwrap.dedent("""
    import json, os, sys, time
    script, args = os.path.basename(sys.argv[1]), sys.argv[2:]
    def last(flag, default):
        values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
        return values[-1] if values else default
    method = last("--method", "none")
    if script in os.environ.get("FAKE_BROKEN_SCRIPTS", "").split(","):
        sys.exit("Traceback: %s cannot start" % script)
    policy = os.environ.get("ACTPAGE_POLICY")
    if os.environ.get("FAKE_UNDER_ACTPAGE"):
        key = "actpage-" + (os.path.basename(policy).split(".")[0] if policy else "bare")
        key += "+checkpointing" if method == "checkpointing" else ""
    else:
        key = "no-checkpointing" if "--no-checkpointing" in args else method
    steps = int(last("--steps", "10"))
    ms = {"none": 100.0, "checkpointing": 130.0, "save_on_cpu": 600.0, "stream_offload": 160.0,
          "no-checkpointing": 80.0}.get(key, 105.0)
    used = {"none": 20000.0, "checkpointing": 12000.0, "actpage-default-policy+checkpointing": 11000.0,
            "actpage-default-policy": 19000.0, "no-checkpointing": 26000.0}.get(key, 19500.0)
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps({"script": script, "key": key, "args": args, "time": time.time(),
                              "target": os.environ.get("ACTPAGE_AUTO_DEVICE_MEMORY"),
                              "alloc": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "policy": policy,
                              "trace": os.environ.get("ACTPAGE_TRACE_PATH"), "rank": os.environ.get("RANK"),
                              "cpus": sorted(os.sched_getaffinity(0)),
                              "build": os.environ.get("FAKE_ACTPAGE_BUILD")}) + "\\n")
    if os.environ.get("RANK", "0") == "0":
        print("ACTPAGE_RESULT " + json.dumps({
            "losses": [(10.5 - 0.125 * i).hex() for i in range(steps)], "median_step_ms": ms, "median_fwd_ms": 30.0,
            "device_used_peak_mib": used, "torch_peak_mib": used - 2000, "deterministic": "--deterministic" in args,
            "loss_tolerance": 0.0, "device": "Fake GPU", "actpage": {"loaded": bool(os.environ.get("FAKE_UNDER_ACTPAGE")),
                                                                   "active": False}}))
""")

# Stands in for the actpage CLI: `calibrate --quick --out F`, `run [--policy P] [--trace T] -- CMD`
# (passes the policy on as ACTPAGE_POLICY, the trace as ACTPAGE_TRACE_PATH, as the real one does) and
# `dump --json T`. FAKE_CALIBRATE_FAILS makes calibrate fail.
FAKE_ACTPAGE = textwrap.dedent("""
    import json, os, sys
    args = sys.argv[1:]
    if args[0] == "calibrate":
        if os.environ.get("FAKE_CALIBRATE_FAILS"):
            sys.exit("actpage calibrate: no usable GPU 0")
        assert args[1:3] == ["--quick", "--out"], args
        with open(args[3], "w") as handle:
            json.dump({"version": 1, "measured": True, "device": "CUDA device 0",
                       "d2h_bytes_per_s": [[2097152, 40e9], [67108864, 50e9]]}, handle)
        sys.exit(0)
    if args[0] == "dump":
        print(json.dumps({"memory": {"offloaded_at_peak_bytes": 0}}))
        sys.exit(0)
    assert args[0] == "run", args
    args = args[1:]
    while args[0] != "--":
        os.environ["ACTPAGE_POLICY" if args[0] == "--policy" else "ACTPAGE_TRACE_PATH"] = args[1]
        args = args[2:]
    os.environ["FAKE_UNDER_ACTPAGE"] = "1"
    os.environ["FAKE_ACTPAGE_BUILD"] = sys.argv[0]  # which build ran the job (bench_ab.sh has two)
    os.execvp(args[1], args[1:])
""")

# Stands in for torchrun: `fake_torchrun --nproc-per-node N SCRIPT ARGS...` starts N ranks of the
# fake job with RANK set, like torchrun passes its environment on; rank 0 prints the result.
FAKE_LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys
    assert sys.argv[1] == "--nproc-per-node", sys.argv
    ranks = int(sys.argv[2])
    workers = [subprocess.Popen([os.environ["FAKE_JOB"]] + sys.argv[3:], env=dict(os.environ, RANK=str(rank)))
               for rank in range(ranks)]
    sys.exit(max(worker.wait() for worker in workers))
""")


def write_executable(path, text):
    with open(path, "w") as handle:
        handle.write("#!%s\n%s" % (sys.executable, text))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class BenchScriptTest(unittest.TestCase):
    """scripts/bench.sh with a fake manifest of tiny fake jobs and a fake actpage."""

    def setUp(self):
        if not shutil.which("taskset"):
            self.skipTest("no taskset on this machine (util-linux)")
        self.core = max(os.sched_getaffinity(0))  # every job must run there and nowhere else
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        tmp = self.dir.name
        self.job, self.actpage, launcher = (os.path.join(tmp, n) for n in ("fake_job", "actpage", "fake_torchrun"))
        write_executable(self.job, FAKE_JOB)
        write_executable(self.actpage, FAKE_ACTPAGE)
        write_executable(launcher, FAKE_LAUNCHER)
        self.manifest = os.path.join(tmp, "jobs.json")
        write_manifest(self.manifest, [
            {"name": "tiny-llama", "script": "fake/tiny_llama.py", "launcher": None, "gpus": 1,
             "args": ["--layers", "2"], "methods": ["none", "checkpointing", "save_on_cpu", "stream_offload"],
             "checkpointing": "method", "stream_offload_modules": "MLP", "deterministic": True, "loss_tolerance": 0.0,
             "stands_for": "a GPU-bound transformer"},
            {"name": "tiny-long", "script": "fake/tiny_long.py", "launcher": None, "gpus": 1, "args": [],
             "methods": ["none"], "checkpointing": "default-on", "stream_offload_modules": None,
             "deterministic": False, "loss_tolerance": 1e-3, "stands_for": "long context"},
            {"name": "tiny-fsdp", "script": "fake/tiny_fsdp.py", "launcher": [launcher, "--nproc-per-node", "2"],
             "gpus": 2, "args": [], "methods": ["none"], "checkpointing": None, "deterministic": True}])
        self.out = os.path.join(tmp, "bench")
        self.packed = os.path.join(tmp, "device-out")
        os.mkdir(self.packed)
        self.log = os.path.join(tmp, "calls.log")
        self.env = helpers.clean_environment(dict(
            FAKE_LOG=self.log, FAKE_JOB=self.job, BENCH_MANIFEST=self.manifest, BENCH_OUT=self.out, OUT=self.packed,
            PYTHON=sys.executable, BENCH_JOB_PYTHON=self.job, BENCH_ACTPAGE=self.actpage, BENCH_STEPS="5",
            BENCH_WARMUP="1", BENCH_CPUS=str(self.core), BENCH_GPUS="1", BENCH_THREAD_STATS="0.05",
            BENCH_CPU_PROBE="0.005", BENCH_DEVICE_MEMORY="0"))

    def bench(self, *args, **env):
        return run_script("bench.sh", args, dict(self.env, **env), timeout=280)

    def calls(self):
        with open(self.log) as handle:
            return [json.loads(line) for line in handle]

    def test_every_variant_of_every_job_runs_interleaved_and_the_report_comes_out(self):
        code, printed = self.bench(BENCH_REPS="2")
        self.assertEqual(code, 0, printed[-3000:])
        calls = self.calls()
        llama = [c for c in calls if c["script"] == "tiny_llama.py"]
        main = ["none", "actpage-observe", "actpage-bare", "actpage-default-policy", "checkpointing",
                "actpage-default-policy+checkpointing", "actpage-bare+checkpointing"]
        peers = ["save_on_cpu", "stream_offload"]
        # rep 1: every variant in bench.sh's order; rep 2 rotated by one, the peers (BENCH_PEER_REPS 1) left out
        self.assertEqual([c["key"] for c in llama], main + peers + main[1:] + main[:1])
        long = [c["key"] for c in calls if c["script"] == "tiny_long.py"]
        long_variants = ["none", "actpage-observe", "actpage-bare", "actpage-default-policy", "no-checkpointing"]
        self.assertEqual(long, long_variants + long_variants[1:] + long_variants[:1])
        self.assertFalse([c for c in calls if c["script"] == "tiny_fsdp.py"])  # 2 GPUs, this "machine" has 1
        self.assertIn("=== tiny-fsdp: skipped: needs 2 GPUs, this machine has 1", printed)
        # Arguments and environment of each variant
        self.assertTrue(all(c["alloc"] == "backend:cudaMallocAsync" for c in calls))
        self.assertEqual({tuple(c["cpus"]) for c in calls}, {(self.core,)})
        by_key = {c["key"]: c for c in llama}
        for c in llama:
            self.assertEqual(c["args"][:2], ["--layers", "2"])
            self.assertIn("--deterministic", c["args"])
        self.assertTrue(all("--deterministic" not in c["args"] for c in calls if c["script"] == "tiny_long.py"))
        self.assertIsNone(by_key["actpage-bare"]["policy"])  # actpage with no policy at all
        self.assertTrue(by_key["actpage-default-policy"]["policy"].endswith("config/default-policy.json"))
        self.assertTrue(by_key["actpage-observe"]["policy"].endswith("config/observe.json"))
        # untraced (BENCH_TRACE 0): observe's own trace goes to the traces folder; nothing else traces
        self.assertTrue(by_key["actpage-observe"]["trace"].startswith(os.path.join(self.out, "traces", "tiny-llama")))
        self.assertEqual([c["key"] for c in calls if c["trace"] and c["key"] != "actpage-observe"], [])
        self.assertEqual(by_key["save_on_cpu"]["args"][-4:], ["--steps", "6", "--warmup", "2"])
        self.assertEqual(by_key["stream_offload"]["args"][-4:], ["--method", "stream_offload", "--offload-modules", "MLP"])
        self.assertEqual(by_key["checkpointing"]["args"][-2:], ["--method", "checkpointing"])
        self.assertIn("--steps", by_key["none"]["args"])
        # The link and the report
        link = json.loads(read(os.path.join(self.out, "link.json")))
        self.assertEqual((link["d2h_bytes_per_s"], link["source"]), (50e9, "actpage calibrate --quick"))
        meta = json.loads(read(os.path.join(self.out, "tiny-llama", "meta.json")))
        self.assertEqual((meta["reps"], meta["peer_reps"], meta["steps"], meta["cpus"], meta["link"]["d2h_bytes_per_s"]),
                         (2, 1, 5, str(self.core), 50e9))
        self.assertEqual(meta["manifest"]["stands_for"], "a GPU-bound transformer")
        report = json.loads(read(os.path.join(self.out, "report.json")))
        self.assertEqual(list(report["jobs"]), ["tiny-llama", "tiny-long"])
        self.assertEqual(report["skipped"], {"tiny-fsdp": "needs 2 GPUs, this machine has 1"})
        self.assertAlmostEqual(report["jobs"]["tiny-llama"]["link"]["bound_gib"], 50e9 * 0.030 / GIB)
        rows = {r["variant"]: r for r in report["jobs"]["tiny-llama"]["rows"]}
        self.assertTrue(rows["actpage-default+checkpointing"]["front"])
        self.assertEqual(report["jobs"]["tiny-long"]["loss_rule"]["mode"], "tolerance")
        self.assertLessEqual(len(report["jobs"]["tiny-llama"]["commit"].split()[0]), 12)  # shown short
        markdown = read(os.path.join(self.out, "results.md"))
        self.assertIn("### tiny-llama", markdown)
        self.assertIn("host steal s", markdown)
        self.assertIn("slowest CPU", markdown)
        self.assertIn("== tiny-fsdp: skipped", read(os.path.join(self.out, "report.txt")))
        with tarfile.open(os.path.join(self.packed, "bench-results.tar.gz")) as tar:
            names = tar.getnames()
        for expected in ("./report.json", "./results.md", "./link.json", "./tiny-llama/results.json",
                         "./tiny-long/meta.json", "./tiny-fsdp/skipped.json"):
            self.assertIn(expected, names)
        self.assertFalse(any(".trace" in name or "traces" in name for name in names))
        # --report rebuilds the report from what is there, running nothing
        os.remove(os.path.join(self.out, "report.json"))
        code, printed = self.bench("--report")
        self.assertEqual(code, 0, printed[-2000:])
        self.assertEqual(len(self.calls()), len(calls))
        self.assertTrue(os.path.isfile(os.path.join(self.out, "report.json")))

    def test_a_subset_through_its_launcher_and_calibrate_failing(self):
        code, printed = self.bench("tiny-fsdp", BENCH_GPUS="2", BENCH_TRACE="1", FAKE_CALIBRATE_FAILS="1")
        self.assertEqual(code, 0, printed[-3000:])
        calls = self.calls()
        self.assertEqual({c["script"] for c in calls}, {"tiny_fsdp.py"})
        self.assertEqual(sorted(c["rank"] for c in calls), ["0"] * 4 + ["1"] * 4)  # 4 variants, 2 ranks each
        self.assertEqual({tuple(c["cpus"]) for c in calls}, {(self.core,)})  # the launcher pinned, its ranks too
        results = json.loads(read(os.path.join(self.out, "tiny-fsdp", "results.json")))
        self.assertEqual(results["settings"]["ranks"], 2)
        default = [r for r in results["runs"] if r["variant"] == "actpage-default"][0]
        self.assertTrue(default["argv"][default["argv"].index("--trace") + 1].endswith("actpage-default.rep1.rank%r.trace"))
        # calibrate failed: the torch fallback ran (no CUDA here: no rate) and the report says so
        self.assertIn("actpage calibrate failed (actpage calibrate: no usable GPU 0)", printed)
        link = json.loads(read(os.path.join(self.out, "link.json")))
        self.assertIsNone(link["d2h_bytes_per_s"])
        self.assertEqual(len(link["errors"]), 1)
        self.assertIn("no link bound: D2H rate not measured", read(os.path.join(self.out, "report.txt")))
        self.assertIn("not run yet: tiny-llama, tiny-long", read(os.path.join(self.out, "report.txt")))

    def test_the_device_memory_goal_runs_at_a_share_of_the_preflights_peak(self):
        # By default a preflight of 3 plain steps runs first; the goal's target is 75% of its peak
        # (the fake job's plain peak: 20000 MiB), in the variant's environment, and nowhere else.
        env = dict(self.env)
        del env["BENCH_DEVICE_MEMORY"]
        code, printed = run_script("bench.sh", ("tiny-llama",), env, timeout=280)
        self.assertEqual(code, 0, printed[-3000:])
        calls = self.calls()
        self.assertEqual(calls[0]["args"][-4:], ["--steps", "3", "--warmup", "0"])  # the preflight
        targeted = [c for c in calls if c["target"]]
        self.assertEqual([(c["key"], c["target"]) for c in targeted], [("actpage-bare", "15000MiB")])
        results = json.loads(read(os.path.join(self.out, "tiny-llama", "results.json")))
        self.assertIn("actpage-device-memory", {r["variant"] for r in results["runs"]})
        code, printed = self.bench("--list", "tiny-llama", BENCH_DEVICE_MEMORY="60%")
        self.assertEqual(code, 0, printed)
        self.assertIn("ACTPAGE_AUTO_DEVICE_MEMORY=60%-of-the-preflight's-peak", printed)
        # Only some variants (none always); without the goal's variant, no preflight either
        before = len(self.calls())
        code, printed = run_script("bench.sh", ("tiny-llama",),
                                   dict(env, BENCH_VARIANTS="checkpointing,actpage+checkpointing"), timeout=280)
        self.assertEqual(code, 0, printed[-3000:])
        self.assertEqual([c["key"] for c in self.calls()[before:]], ["none", "checkpointing", "actpage-bare+checkpointing"])
        self.assertNotIn("preflight", printed)
        code, printed = self.bench("--list", BENCH_DEVICE_MEMORY="120%")
        self.assertEqual(code, 2, printed)
        self.assertIn("BENCH_DEVICE_MEMORY must be a share of the preflight's peak below 100%", printed)

    def test_the_callers_own_variants_run_beside_the_chosen_ones(self):
        # Another build side by side (BENCH_EXTRA_VARIANTS), kept whatever BENCH_VARIANTS chose.
        before = os.path.join(self.dir.name, "before", "bin", "actpage")
        os.makedirs(os.path.dirname(before))
        write_executable(before, FAKE_ACTPAGE)
        extra = "actpage-before;actpage;async;policy=none;actpage=%s\n\nactpage-lean;actpage;async;policy=none;env=ACTPAGE_MIN_BYTES=4MiB" % before
        code, printed = self.bench("tiny-llama", BENCH_VARIANTS="actpage", BENCH_EXTRA_VARIANTS=extra)
        self.assertEqual(code, 0, printed[-3000:])
        ran = [(c["key"], c["build"]) for c in self.calls()]
        self.assertEqual(ran, [("none", None), ("actpage-bare", self.actpage), ("actpage-bare", before),
                               ("actpage-bare", self.actpage)])
        results = json.loads(read(os.path.join(self.out, "tiny-llama", "results.json")))
        self.assertEqual([r["variant"] for r in results["runs"]], ["none", "actpage", "actpage-before", "actpage-lean"])
        rows = {r["variant"] for r in json.loads(read(os.path.join(self.out, "report.json")))["jobs"]["tiny-llama"]["rows"]}
        self.assertEqual(rows, {"none", "actpage", "actpage-before", "actpage-lean"})
        code, printed = self.bench("--list", "tiny-llama", BENCH_EXTRA_VARIANTS=extra)
        self.assertEqual(code, 0, printed)
        self.assertIn("tiny-llama: 1 GPU(s), 11 runs:", printed)
        self.assertIn("  actpage-lean;actpage;async;policy=none;env=ACTPAGE_MIN_BYTES=4MiB", printed)

    def test_a_job_failing_its_preflight_is_skipped_as_a_failure(self):
        code, printed = self.bench("tiny-llama", "tiny-long", BENCH_PREFLIGHT_STEPS="2",
                                   FAKE_BROKEN_SCRIPTS="tiny_long.py")
        self.assertEqual(code, 1, printed[-3000:])
        calls = self.calls()
        long = [c for c in calls if c["script"] == "tiny_long.py"]
        self.assertEqual(len(long), 0)  # it exits before logging: not one variant of it ran
        llama = [c for c in calls if c["script"] == "tiny_llama.py"]
        self.assertEqual(llama[0]["key"], "none")  # the preflight: plain, 2 steps, no warm-up
        self.assertEqual(llama[0]["args"][-4:], ["--steps", "2", "--warmup", "0"])
        self.assertEqual(len(llama), 1 + 9)  # then every variant once
        self.assertIn("bench: tiny-long: the preflight run failed", printed)
        report = json.loads(read(os.path.join(self.out, "report.json")))
        self.assertEqual(list(report["jobs"]), ["tiny-llama"])
        self.assertIn("tiny-long: the preflight run failed: Traceback: tiny_long.py cannot start", report["problems"])

    def test_list_unknown_jobs_and_a_missing_manifest(self):
        code, printed = self.bench("--list")
        self.assertEqual(code, 0, printed)
        self.assertIn("tiny-llama: 1 GPU(s), 9 runs:", printed)
        self.assertIn("tiny-fsdp: 2 GPU(s), 4 runs (skipped here: needs 2 GPUs, this machine has 1):", printed)
        self.assertIn("  actpage;actpage;async;policy=none", printed)
        self.assertIn("total: 18 runs, about 6 minutes at ~20 s a run", printed)
        self.assertFalse(os.path.exists(self.log))
        code, printed = self.bench("--list", "tiny-llama", BENCH_SKIP_VARIANTS="save_on_cpu,stream_offload")
        self.assertIn("tiny-llama: 1 GPU(s), 7 runs:", printed)
        self.assertNotIn("save_on_cpu", printed)
        code, printed = self.bench("--list", BENCH_SKIP_VARIANTS="none")
        self.assertEqual(code, 2)
        self.assertIn("cannot drop none", printed)
        code, printed = self.bench("nosuchjob")
        self.assertEqual(code, 2)
        self.assertIn("unknown job nosuchjob (jobs: tiny-llama tiny-long tiny-fsdp)", printed)
        code, printed = self.bench(BENCH_MANIFEST=os.path.join(self.dir.name, "none.json"))
        self.assertEqual(code, 2)
        self.assertIn("no manifest", printed)


class BenchBeforeAfterTest(unittest.TestCase):
    """scripts/bench_ab.sh: the examples in auto mode and under a fixed policy, run by two builds side
    by side, with fakes."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        tmp = self.dir.name
        self.job = os.path.join(tmp, "fake_job")
        self.after, self.before = (os.path.join(tmp, n, "bin", "actpage") for n in ("after", "before"))
        write_executable(self.job, FAKE_JOB)
        for build in (self.after, self.before):
            os.makedirs(os.path.dirname(build))
            write_executable(build, FAKE_ACTPAGE)
        with open(os.path.join(tmp, "before", "COMMIT"), "w") as handle:
            handle.write("be64f4d\n")
        self.out = os.path.join(tmp, "ab")
        self.packed = os.path.join(tmp, "device-out")
        os.mkdir(self.packed)
        self.log = os.path.join(tmp, "calls.log")
        self.env = helpers.clean_environment(dict(
            FAKE_LOG=self.log, BENCH_OUT=self.out, OUT=self.packed, PYTHON=sys.executable, BENCH_JOB_PYTHON=self.job,
            BENCH_ACTPAGE=self.after, BENCH_STEPS="5", BENCH_WARMUP="1"))

    def bench_ab(self, *args, **env):
        return run_script("bench_ab.sh", args, dict(self.env, **env), timeout=120)

    def test_auto_mode_and_the_fixed_policy_run_under_both_builds_interleaved(self):
        # A policy in the caller's environment must not reach the auto-mode runs.
        code, printed = self.bench_ab(self.before, "llama", ACTPAGE_POLICY="/elsewhere/tuned.json")
        self.assertEqual(code, 0, printed[-3000:])
        self.assertIn("before %s (be64f4d )" % self.before, printed)
        with open(self.log) as handle:
            calls = [json.loads(line) for line in handle]
        ran = [(c["key"], c["build"]) for c in calls]
        # The fake job names a run under actpage with no policy "actpage-bare".
        rep = [("none", None), ("actpage-bare", self.before), ("actpage-bare", self.after),
               ("actpage-llama-mlp", self.before), ("actpage-llama-mlp", self.after)]
        self.assertEqual(ran, rep + rep[1:] + rep[:1])  # BENCH_REPS 2: rep 2 rotated by one
        fixed = os.path.join(helpers.SOURCE_DIR, "tests", "policies", "llama-mlp.json")
        self.assertEqual({c["policy"] for c in calls if c["key"] == "actpage-llama-mlp"}, {fixed})
        self.assertTrue(os.path.exists(fixed))
        self.assertTrue(all(c["alloc"] == "backend:cudaMallocAsync" and "--deterministic" in c["args"] for c in calls))
        results = json.loads(read(os.path.join(self.out, "llama", "results.json")))
        rows = {row["variant"]: row for row in results["summary"]}
        self.assertEqual(set(rows), {"none", "before-auto", "after-auto", "before-llama-mlp", "after-llama-mlp"})
        self.assertTrue(rows["before-auto"]["losses_identical_to_reference"])
        self.assertTrue(rows["after-llama-mlp"]["losses_identical_to_reference"])
        self.assertTrue(os.path.exists(os.path.join(self.packed, "bench-ab.tar.gz")))

    def test_the_qwen_job_runs_auto_mode_and_the_experts_policy(self):
        code, printed = self.bench_ab(self.before, "qwen", BENCH_REPS="1")
        self.assertEqual(code, 0, printed[-3000:])
        with open(self.log) as handle:
            calls = [json.loads(line) for line in handle]
        self.assertEqual([(c["key"], c["build"]) for c in calls],
                         [("none", None), ("actpage-bare", self.before), ("actpage-bare", self.after),
                          ("actpage-qwen3-moe-experts", self.before), ("actpage-qwen3-moe-experts", self.after)])
        self.assertTrue(all(c["script"] == "train_qwen3_moe.py" for c in calls))

    def test_bad_arguments(self):
        code, printed = self.bench_ab()
        self.assertEqual(code, 2)
        self.assertIn("usage: scripts/bench_ab.sh BEFORE_ACTPAGE", printed)
        code, printed = self.bench_ab(os.path.join(self.dir.name, "nothing"))
        self.assertEqual(code, 2)
        self.assertIn("is not an executable actpage", printed)
        code, printed = self.bench_ab(self.before, "resnet")
        self.assertEqual(code, 2)
        self.assertIn("unknown job resnet (llama, qwen)", printed)


if __name__ == "__main__":
    unittest.main()
