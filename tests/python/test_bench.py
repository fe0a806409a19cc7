"""The side-by-side benchmark on the CPU, with fabricated jobs and a fake `actpage` (no GPU, no torch):
compare_runs.py's per-variant options and trace summaries, scripts/bench_report.py's numbers, target
verdicts, markdown and PNG, and scripts/bench.sh from end to end."""

import contextlib
import io
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import unittest
import zlib

import helpers

import compare_runs

sys.path.insert(0, os.path.join(helpers.SOURCE_DIR, "scripts"))
import bench_report  # noqa: E402

MIB = 1 << 20

# What each variant of each job "measures": step ms, device-used peak MiB, torch peak MiB, and for
# actpage variants the bytes the fake trace says were off the device at the peak (MiB).
FIGURES = {
    "llama": {
        "none": (170.0, 22000.0, 20000.0, None),
        "observe.json": (171.0, 22010.0, 20000.0, 0.0),          # x1.006: met
        "llama-near-free.json": (174.0, 19300.0, 17600.0, 2700.0),  # x1.024, 2.64 GiB: met
        "llama-mlp-capped.json": (270.0, 17000.0, 15200.0, 5040.0),  # x1.588 (missed by 0.088), 4.88 GiB (missed by 0.62), 99.2% of 5040
        "llama-near-free-7.json": (185.0, 20000.0, 17900.0, 2400.0),  # seven MLPs with the catch-up
        "save_on_cpu": (1000.0, 15000.0, 10000.0, None),
        "checkpointing": (210.0, 14000.0, 9600.0, None),
        "stream_offload": (340.0, 24000.0, 15300.0, None),
    },
    "qwen": {
        "none": (70.0, 12000.0, 10000.0, None),
        "observe.json": (71.4, 12000.0, 10000.0, 0.0),            # x1.02: missed by 0.01
        "qwen3-moe-near-free.json": (72.0, 11000.0, 9000.0, 1000.0),
        "qwen3-moe-near-free-6.json": (75.0, 10800.0, 8900.0, 1200.0),
        "qwen3-moe-experts.json": (90.0, 10800.0, 8800.0, 1300.0),  # 1200 of 1300: 92.3%, missed
        "save_on_cpu": (445.0, 8700.0, 5800.0, None),
        "checkpointing": (92.0, 8600.0, 6000.0, None),
        "stream_offload": (130.0, 11800.0, 7600.0, None),
    },
}

# Stands in for python3 running examples/train_*.py: prints a result from FIGURES, chosen by the
# script, --method and the policy the fake actpage passed on. Losses: the same for every variant but
# stream_offload, which differs from step 3.
FAKE_JOB = textwrap.dedent("""
    import json, os, sys
    figures = json.loads(os.environ["FAKE_FIGURES"])
    job = "llama" if "train_llama.py" in sys.argv[1] else "qwen"
    args = sys.argv[2:]
    def last(flag, default):
        values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
        return values[-1] if values else default
    method = last("--method", "none")
    steps = int(last("--steps", "10"))
    policy = os.environ.get("ACTPAGE_POLICY")
    key = os.path.basename(policy) if policy else method
    ms, used, torch_peak, _ = figures[job][key]
    losses = [10.5 - 0.125 * i for i in range(steps)]
    if method == "stream_offload" and steps > 3:
        losses[3] += 2 ** -20
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps({"job": job, "key": key, "alloc": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                              "steps": steps, "args": args,
                              "catch_up": os.environ.get("ACTPAGE_VMM_TRIM_JOB_POOL_CATCH_UP"),
                              "drain_at_backward_start": os.environ.get("ACTPAGE_OFFLOAD_DRAIN_AT_BACKWARD_START"),
                              "cpus": sorted(os.sched_getaffinity(0))}) + "\\n")
    print("ACTPAGE_RESULT " + json.dumps({
        "losses": [x.hex() for x in losses], "median_step_ms": ms, "median_fwd_ms": ms / 3,
        "device_used_peak_mib": used, "torch_peak_mib": torch_peak, "device": "Fake GPU", "torch": "0.0",
        "actpage": {"loaded": policy is not None, "active": policy is not None}}))
""")

# Stands in for the actpage CLI: `run --policy P [--trace T] -- CMD...` (writes a trace that is JSON,
# the bytes off the device at the peak taken from FIGURES) and `dump --json T`.
FAKE_ACTPAGE = textwrap.dedent("""
    import json, os, sys
    args = sys.argv[1:]
    if args[0] == "dump":
        assert args[1] == "--json", args
        print(open(args[2]).read())
        sys.exit(0)
    assert args[0] == "run" and args[1] == "--policy", args
    policy = args[2]
    rest = args[3:]
    trace = None
    if rest[0] == "--trace":
        trace, rest = rest[1], rest[2:]
    assert rest[0] == "--", args
    if trace:
        figures = json.loads(os.environ["FAKE_FIGURES"])
        job = "llama" if "train_llama.py" in " ".join(rest) else "qwen"
        off = figures[job][os.path.basename(policy)][3]
        with open(trace, "w") as handle:
            json.dump({"memory": {"offloaded_at_peak_bytes": int(off * %d), "peak_offloaded_bytes": int(off * %d),
                                  "peak_used_bytes": 0},
                       "offload": {"count": 10, "bytes": 100}, "reload": {"count": 9, "bytes": 90},
                       "stalls": {"count": 1, "total_ns": 2500000}}, handle)
    os.environ["ACTPAGE_POLICY"] = policy
    os.execvp(rest[1], rest[1:])
""" % (MIB, MIB))


def write_executable(path, text):
    with open(path, "w") as handle:
        handle.write("#!%s\n%s" % (sys.executable, text))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def read_png(data):
    """(width, height, rows of RGB bytes) of an 8-bit RGB PNG with filter 0 rows, checking its CRCs."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature"
    pos, chunks = 8, []
    while pos < len(data):
        length, = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        crc, = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, "bad CRC in %r" % kind
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, colour_type = struct.unpack(">IIBB", chunks[0][1][:10])
    assert (depth, colour_type) == (8, 2)
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = 1 + 3 * width
    assert len(raw) == stride * height
    rows = [raw[y * stride + 1:(y + 1) * stride] for y in range(height)]
    assert all(raw[y * stride] == 0 for y in range(height))
    return width, height, rows


def read(path, mode="r"):
    with open(path, mode) as handle:
        return handle.read()


def colours_in(rows):
    found = set()
    for row in rows:
        for x in range(0, len(row), 3):
            found.add(bytes(row[x:x + 3]))
    return found


class FakeBench:
    """A temporary folder with the fake job and actpage, and their environment."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory()
        self.tmp = self.dir.name
        self.job = os.path.join(self.tmp, "fake_job.py")
        write_executable(self.job, FAKE_JOB)
        self.actpage = os.path.join(self.tmp, "actpage")
        write_executable(self.actpage, FAKE_ACTPAGE)
        self.log = os.path.join(self.tmp, "calls.log")
        self.env = {"FAKE_FIGURES": json.dumps(FIGURES), "FAKE_LOG": self.log}

    def calls(self):
        with open(self.log) as handle:
            return [json.loads(line) for line in handle]

    def close(self):
        self.dir.cleanup()


def run_compare(bench, argv):
    saved = {k: os.environ.get(k) for k in bench.env}
    os.environ.update(bench.env)
    try:
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = compare_runs.main(argv)
        return code, stdout.getvalue()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class CompareRunsVariantOptionsTest(unittest.TestCase):
    def setUp(self):
        self.bench = FakeBench()

    def tearDown(self):
        self.bench.close()

    def test_variant_options_are_parsed_and_the_rest_stays_extra_args(self):
        v = compare_runs.parse_variant("near;actpage;async;policy=config/x.json;reps=1;env=A=b=c;--steps 3;--x")
        self.assertEqual((v.policy, v.reps, v.env), ("config/x.json", 1, {"A": "b=c"}))
        self.assertEqual(v.extra_args, ["--steps", "3;--x"])  # parts joined again with ';' as before
        plain = compare_runs.parse_variant("p;plain;async;--offload-min-bytes=1MiB")
        self.assertEqual((plain.policy, plain.reps, plain.env), (None, None, {}))
        self.assertEqual(plain.extra_args, ["--offload-min-bytes=1MiB"])
        for bad in ("x;plain;async;reps=two", "x;plain;async;reps=0", "x;plain;async;env=NOVALUE"):
            with self.assertRaises(Exception, msg=bad):
                compare_runs.parse_variant(bad)

    def test_schedule_leaves_out_a_variant_after_its_own_reps(self):
        a, b = compare_runs.Variant("a", "plain", "async"), compare_runs.Variant("b", "plain", "async", reps=1)
        order = [(rep, v.name) for rep, v in compare_runs.schedule([a, b], 3)]
        self.assertEqual(order, [(0, "a"), (0, "b"), (1, "a"), (2, "a")])

    def test_per_variant_policy_env_trace_and_fewer_steps(self):
        out = os.path.join(self.bench.tmp, "out")
        code, printed = run_compare(self.bench, [
            "--actpage", self.bench.actpage, "--out", out, "--reps", "2", "--trace-dir", os.path.join(out, "traces"),
            "--variant", "none;plain;async",
            "--variant", "near;actpage;async;policy=%s" % os.path.join(helpers.SOURCE_DIR, "config", "llama-near-free.json"),
            "--variant", "slow;plain;async;reps=1;env=EXTRA=1;--method save_on_cpu --steps 4",
            "--", sys.executable, self.bench.job, "examples/train_llama.py", "--steps", "8"])
        self.assertEqual(code, 0, printed)
        calls = self.bench.calls()
        self.assertEqual([c["key"] for c in calls], ["none", "llama-near-free.json", "save_on_cpu",
                                                     "llama-near-free.json", "none"])
        self.assertTrue(all(c["alloc"] == "backend:cudaMallocAsync" for c in calls))
        with open(os.path.join(out, "results.json")) as handle:
            data = json.load(handle)
        rows = {row["variant"]: row for row in data["summary"]}
        self.assertEqual(rows["near"]["offloaded_at_peak_mib"], 2700.0)
        self.assertEqual(rows["near"]["reference"], "none")
        self.assertTrue(rows["near"]["losses_identical_to_reference"])
        self.assertEqual((rows["slow"]["runs"], rows["slow"]["ok"]), (1, 1))
        # 4 steps against the baseline's 8: equal over the steps both ran
        self.assertTrue(rows["slow"]["losses_identical_to_reference"])
        self.assertIsNone(rows["none"]["offloaded_at_peak_mib"])
        near_runs = [r for r in data["runs"] if r["variant"] == "near"]
        self.assertEqual(near_runs[0]["trace_summary"]["stall_ms"], 2.5)
        self.assertTrue(near_runs[1]["trace"].endswith("near.rep2.trace"))
        self.assertIn("--trace", near_runs[0]["argv"])

    def test_actpage_variant_needs_a_policy_from_somewhere(self):
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            compare_runs.parse_args(["--variant", "a;actpage;async", "--", "job"])
        args = compare_runs.parse_args(["--variant", "a;actpage;async;policy=p.json", "--", "job"])
        self.assertEqual(args.variants[0].policy, "p.json")


def fabricate(directory, figures=FIGURES, reps=2, fail=None, steal=None, probe=None):
    """compare_runs-style results.json and bench.sh-style meta.json for each job, made by hand.
    steal: {(job, variant): [steal ms of CPU 2, of CPU 3] for each of its runs}, as compare_runs.py
    --thread-stats records it; runs not named have no thread watch. probe: {(job, variant): [the CPU
    probe's {cpu: rate} before (and after) for each of its runs]}, as --cpu-probe records it."""
    policies = {"llama": ("llama-near-free.json", "llama-mlp-capped.json"),
                "qwen": ("qwen3-moe-near-free.json", "qwen3-moe-experts.json")}
    for job, table in figures.items():
        near, all_ = policies[job]
        keys = {"none": "none", "actpage-observe": "observe.json", "actpage-near-free": near, "actpage-all": all_,
                "save_on_cpu": "save_on_cpu", "checkpointing": "checkpointing", "stream_offload": "stream_offload"}
        summary, runs = [], []
        for variant, key in keys.items():
            ms, used, torch_peak, off = table[key]
            losses = [(10.5 - 0.125 * i) for i in range(6)]
            if variant == "stream_offload":
                losses[3] += 2 ** -20
            n = 1 if variant in ("save_on_cpu", "checkpointing", "stream_offload") else reps
            ok = n - (1 if fail == (job, variant) else 0)
            for rep in range(n):
                good = rep < ok
                run = {"variant": variant, "rep": rep + 1, "ok": good, "rc": 0 if good else 1,
                       "result": {"losses": [x.hex() for x in losses], "median_step_ms": ms,
                                  "device": "Fake GPU", "torch": "9.9"} if good else None}
                if steal and (job, variant) in steal:
                    run["threads"] = {"cpus": {str(cpu): {"steal_ms": ms_stolen, "busy_ms": 1000.0}
                                               for cpu, ms_stolen in zip((2, 3), steal[(job, variant)][rep])}}
                if probe and (job, variant) in probe:
                    rates = probe[(job, variant)][rep]
                    run["cpu_probe"] = {"before": rates, "after": rates}
                runs.append(run)
            summary.append({"variant": variant, "runs": n, "ok": ok, "median_step_ms": ms if ok else None,
                            "device_used_peak_mib": used if ok else None, "torch_peak_mib": torch_peak if ok else None,
                            "offloaded_at_peak_mib": off, "median_fwd_ms": ms / 3})
        os.makedirs(os.path.join(directory, job), exist_ok=True)
        with open(os.path.join(directory, job, "results.json"), "w") as handle:
            json.dump({"settings": {"command": ["python3", "examples/train_%s.py" % job, "--steps", "6"]},
                       "summary": summary, "runs": runs}, handle)
        with open(os.path.join(directory, job, "meta.json"), "w") as handle:
            json.dump({"job": job, "started": "2026-11-23T10:00:00Z", "finished": "2026-11-23T10:04:00Z",
                       "device": "Fake GPU, 80 GiB", "commit": "abc123", "reps": reps, "peer_reps": 1, "steps": 6,
                       "warmup": 2},
                      handle)


class BenchReportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.tmp = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def report(self, **kwargs):
        fabricate(self.tmp, **kwargs)
        return bench_report.build_report(self.tmp)

    def test_rows_against_the_baseline(self):
        report = self.report()
        self.assertEqual(list(report["jobs"]), ["llama", "qwen"])
        rows = {r["variant"]: r for r in report["jobs"]["llama"]["rows"]}
        self.assertEqual(list(rows), list(bench_report.VARIANTS))
        self.assertAlmostEqual(rows["actpage-near-free"]["ratio"], 174.0 / 170.0)
        self.assertAlmostEqual(rows["actpage-near-free"]["saved_gib"], 2700.0 / 1024)
        self.assertAlmostEqual(rows["actpage-near-free"]["saved_share"], 1.0)
        self.assertAlmostEqual(rows["stream_offload"]["saved_gib"], -2000.0 / 1024)
        self.assertTrue(rows["save_on_cpu"]["losses_equal"])
        self.assertEqual((rows["stream_offload"]["losses_equal"], rows["stream_offload"]["losses_first_difference_step"]),
                         (False, 3))
        self.assertIsNone(rows["none"]["losses_equal"])
        self.assertEqual(report["problems"], [])

    def test_target_verdicts_say_by_how_much(self):
        report = self.report()
        llama = {(c["variant"], c["measure"]): c for c in report["jobs"]["llama"]["checks"]}
        self.assertTrue(llama[("actpage-observe", "ratio")]["met"])
        self.assertTrue(llama[("actpage-near-free", "saved_gib")]["met"])
        self.assertTrue(llama[("actpage-near-free", "ratio")]["met"])
        all_ratio = llama[("actpage-all", "ratio")]
        self.assertFalse(all_ratio["met"])
        self.assertAlmostEqual(all_ratio["missed_by"], 270.0 / 170.0 - 1.5)
        self.assertIn("MISSED by 0.088x", all_ratio["verdict"])
        self.assertIn("MISSED by 0.62 GiB", llama[("actpage-all", "saved_gib")]["verdict"])
        self.assertIn("target at least 5.50 GiB", llama[("actpage-all", "saved_gib")]["verdict"])
        self.assertTrue(llama[("actpage-all", "saved_share")]["met"])  # 5000 of 5040 MiB: 99.2%
        qwen = {(c["variant"], c["measure"]): c for c in report["jobs"]["qwen"]["checks"]}
        # The Llama-only targets are not checked on Qwen; observe and the peak share are.
        self.assertNotIn(("actpage-near-free", "saved_gib"), qwen)
        self.assertIn("MISSED by 0.010x", qwen[("actpage-observe", "ratio")]["verdict"])
        share = qwen[("actpage-all", "saved_share")]
        self.assertFalse(share["met"])
        self.assertAlmostEqual(share["value"], 1200.0 / 1300.0)
        self.assertIn("MISSED by 6.7 points", share["verdict"])

    def test_nothing_off_the_device_at_the_peak_is_said_so(self):
        rows = [{"variant": "actpage-all", "ratio": 1.2, "saved_gib": 6.0, "saved_share": None,
                 "offloaded_at_peak_mib": 0.0}]
        checks = {c["measure"]: c for c in bench_report.check_targets("llama", rows)}
        self.assertIsNone(checks["saved_share"]["met"])
        self.assertIn("nothing was off the device", checks["saved_share"]["verdict"])
        self.assertTrue(checks["saved_gib"]["met"] and checks["ratio"]["met"])

    def test_a_time_miss_inside_the_repetitions_spread_says_so(self):
        # Baseline reps 89 and 105 ms (18% apart): a 1.059x observe run misses 1.010x by less than that.
        base = {"variant": "none", "ok": 2, "runs": 2, "median_step_ms": 97.3, "step_ms_min": 89.1,
                "step_ms_max": 105.5, "device_used_peak_mib": 11333}
        observe = {"variant": "actpage-observe", "ok": 2, "runs": 2, "median_step_ms": 103.1, "step_ms_min": 95.6,
                   "step_ms_max": 110.6, "device_used_peak_mib": 11301}
        rows = bench_report.job_rows({"summary": [base, observe], "runs": []})
        self.assertAlmostEqual(rows[0]["spread"], 105.5 / 89.1 - 1)
        self.assertAlmostEqual(rows[1]["baseline_spread"], 105.5 / 89.1 - 1)
        check = [c for c in bench_report.check_targets("qwen", rows) if c["measure"] == "ratio"][0]
        self.assertFalse(check["met"])  # still a miss, not a pass
        self.assertIn("within run-to-run noise: repetitions differ by up to 18.4%", check["verdict"])
        self.assertIn("| 89.1-105.5 |", bench_report.format_table("qwen", rows, []))
        # A miss larger than the spread gets no such note; one repetition has no spread.
        base.update(step_ms_min=97.0, step_ms_max=97.6)
        observe.update(step_ms_min=103.0, step_ms_max=103.2)
        check = [c for c in bench_report.check_targets("qwen", bench_report.job_rows({"summary": [base, observe]}))
                 if c["measure"] == "ratio"][0]
        self.assertNotIn("noise", check["verdict"])
        self.assertNotIn("within_noise", check)
        base["ok"] = 1
        self.assertIsNone(bench_report.job_rows({"summary": [base]})[0]["spread"])

    def test_host_steal_is_shown_and_a_time_miss_in_a_stolen_run_says_so(self):
        # Qwen's observe run misses 1.010x; its second run lost 0.25 + 0.20 s to the host, the
        # baseline's 0.05 s. Llama's near-free row meets its time: no note, whatever the steal.
        steal = {("qwen", "actpage-observe"): [[10.0, 0.0], [250.0, 200.0]], ("qwen", "none"): [[50.0, 0.0], [0.0, 0.0]],
                 ("llama", "actpage-near-free"): [[900.0, 0.0], [0.0, 0.0]], ("llama", "none"): [[0.0, 0.0], [0.0, 0.0]]}
        report = self.report(steal=steal)
        qwen = {r["variant"]: r for r in report["jobs"]["qwen"]["rows"]}
        self.assertAlmostEqual(qwen["actpage-observe"]["steal_s_max"], 0.45)
        self.assertAlmostEqual(qwen["actpage-observe"]["baseline_steal_s_max"], 0.05)
        self.assertIsNone(qwen["actpage-all"]["steal_s_max"])  # not watched
        check = [c for c in report["jobs"]["qwen"]["checks"] if c["measure"] == "ratio"][0]
        self.assertFalse(check["met"])  # still a miss
        self.assertAlmostEqual(check["host_steal_s"], 0.45)
        self.assertIn("the host stole up to 0.5 s of the job's CPUs in a run (variant 0.5 s, baseline 0.1 s)",
                      check["verdict"])
        llama = [c for c in report["jobs"]["llama"]["checks"] if c["measure"] == "ratio"]
        self.assertTrue(all("host" not in c["verdict"] for c in llama))
        text = bench_report.format_text(report)
        self.assertIn("| `actpage-observe` | actpage, observe only | 2/2 | 71.4 | - | 1.020 | 0.45 | - | 12000 |", text)
        self.assertIn("- host steal s:", bench_report.format_markdown(report))
        # Below the notice, a miss says nothing of the host; no watch at all, no markdown line.
        steal[("qwen", "actpage-observe")] = [[10.0, 0.0], [100.0, 100.0]]
        check = [c for c in self.report(steal=steal)["jobs"]["qwen"]["checks"] if c["measure"] == "ratio"][0]
        self.assertNotIn("host", check["verdict"])
        self.assertNotIn("- host steal s:", bench_report.format_markdown(self.report()))

    def test_the_slowest_cpu_against_the_calls_usual_rate(self):
        # Llama: the baseline's and observe's runs found both CPUs at 10 rounds/ms; one near-free run
        # found CPU 3 at 6.
        usual = {"2": 10.0, "3": 10.0}
        probe = {("llama", "none"): [usual, usual], ("llama", "actpage-observe"): [usual, usual],
                 ("llama", "actpage-near-free"): [usual, {"2": 10.0, "3": 6.0}]}
        rows = {r["variant"]: r for r in self.report(probe=probe)["jobs"]["llama"]["rows"]}
        self.assertAlmostEqual(rows["none"]["cpu_speed_min"], 1.0)
        self.assertAlmostEqual(rows["actpage-near-free"]["cpu_speed_min"], 0.6)
        self.assertIsNone(rows["actpage-all"]["cpu_speed_min"])  # not probed
        report = bench_report.build_report(self.tmp)
        self.assertIn("| 1.024 | - | 0.60 | 19300 |", bench_report.format_text(report))
        self.assertIn("- slowest CPU:", bench_report.format_markdown(report))
        self.assertNotIn("- slowest CPU:", bench_report.format_markdown(self.report()))

    def test_failed_runs_and_missing_measurements_are_reported(self):
        report = self.report(fail=("llama", "actpage-near-free"))
        self.assertEqual(report["problems"], ["llama: actpage-near-free: 1 of 2 runs failed"])
        fabricate(self.tmp, fail=("qwen", "none"), reps=1)
        report = bench_report.build_report(self.tmp)
        self.assertIn("qwen: no baseline (variant `none`) result", report["problems"])
        qwen = {(c["variant"], c["measure"]): c for c in report["jobs"]["qwen"]["checks"]}
        self.assertIsNone(qwen[("actpage-observe", "ratio")]["met"])
        self.assertIn("not measured", qwen[("actpage-observe", "ratio")]["verdict"])

    def test_table_and_markdown(self):
        report = self.report()
        text = bench_report.format_text(report)
        self.assertIn("| `actpage-near-free` | actpage, near-free policy | 2/2 | 174.0 | - | 1.024 | - | - | 19300 | 2.64 | 17600 | 2700 "
                      "| yes | saved 2.64 GiB >= 2.50 GiB: met; time 1.024x <= 1.030x: met; peak fell by/off 100.0% >= 99.0%: met |",
                      text)
        self.assertIn("time 1.588x <= 1.500x: **missed by 0.088x**", text)
        self.assertIn("| `stream_offload` |", text)
        self.assertIn("no (step 3)", text)
        markdown = bench_report.format_markdown(report, "benchmarks.png")
        for expected in ("### Run of 2026-11-23", "- Device: Fake GPU, 80 GiB", "`abc123`", "#### Llama, 16 layers",
                         "#### Qwen3-MoE, 8 layers", "Targets missed or not measured:",
                         "![device memory saved against slowdown](benchmarks.png)"):
            self.assertIn(expected, markdown)
        self.assertIn("- Llama, 16 layers, `actpage-all`: step time 1.588x: MISSED by 0.088x", markdown)

    def test_png_is_valid_and_shows_each_job(self):
        report = self.report()
        data = bench_report.draw_plot(report, width=640, height=400).png()
        width, height, rows = read_png(data)
        self.assertEqual((width, height), (640, 400))
        colours = colours_in(rows)
        self.assertGreater(len(colours), 3, "blank image")
        for colour in bench_report.SERIES_COLOURS[:2]:
            self.assertIn(bytes(colour), colours)
        # one job only: its colour present, the other's absent
        one = {"jobs": {"qwen": report["jobs"]["qwen"]}, "problems": []}
        colours = colours_in(read_png(bench_report.draw_plot(one).png())[2])
        self.assertIn(bytes(bench_report.SERIES_COLOURS[0]), colours)
        self.assertNotIn(bytes(bench_report.SERIES_COLOURS[1]), colours)

    def test_main_writes_every_output(self):
        fabricate(self.tmp)
        png, js, md = (os.path.join(self.tmp, name) for name in ("b.png", "r.json", "r.md"))
        with contextlib.redirect_stdout(io.StringIO()):
            code = bench_report.main([self.tmp, "--png", png, "--json", js, "--markdown", md])
        self.assertEqual(code, 0)
        read_png(read(png, "rb"))
        self.assertIn("actpage-all", json.loads(read(js))["jobs"]["llama"]["rows"][3]["variant"])
        self.assertIn("#### Llama", read(md))


class BenchScriptTest(unittest.TestCase):
    """scripts/bench.sh with the fake job and actpage: every variant of both jobs runs, the report is
    written and packed."""

    def setUp(self):
        if not shutil.which("taskset"):
            self.skipTest("no taskset on this machine (util-linux)")
        # the last core this process may run on: every job must run there and nowhere else
        self.core = max(os.sched_getaffinity(0))

    def test_end_to_end(self):
        bench = FakeBench()
        self.addCleanup(bench.close)
        out = os.path.join(bench.tmp, "bench")
        packed = os.path.join(bench.tmp, "device-out")
        os.mkdir(packed)
        env = helpers.clean_environment(dict(bench.env, BENCH_OUT=out, OUT=packed, PYTHON=sys.executable,
                                             BENCH_JOB_PYTHON=bench.job, BENCH_ACTPAGE=bench.actpage,
                                             BENCH_STEPS="5", BENCH_WARMUP="1", BENCH_CPUS=str(self.core)))
        done = subprocess.run(["bash", os.path.join(helpers.SOURCE_DIR, "scripts", "bench.sh")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=240)
        self.assertEqual(done.returncode, 0, done.stdout[-3000:])
        calls = bench.calls()
        # 4 variants twice, the 3 actpage variants with the prefill and the 3 peers once, for both jobs
        self.assertEqual(len(calls), 2 * (4 * 2 + 3 + 3))
        # The catch-up variant: each job's shipped near-free settings with one more layer, once per job,
        # from the policy file alone (no environment settings left over from when it had them).
        catch_up = [(c["job"], c["key"]) for c in calls if c["key"].startswith(("llama-near-free-", "qwen3-moe-near-free-"))]
        self.assertEqual(sorted(catch_up), [("llama", "llama-near-free-7.json"), ("qwen", "qwen3-moe-near-free-6.json")])
        self.assertEqual([c for c in calls if c["catch_up"] is not None], [])
        self.assertTrue(all(c["alloc"] == "backend:cudaMallocAsync" for c in calls))
        self.assertEqual({tuple(c["cpus"]) for c in calls}, {(self.core,)})  # BENCH_CPUS pinned every run
        slow = [c for c in calls if c["key"] == "save_on_cpu"]
        self.assertEqual([c["steps"] for c in slow], [6, 6])
        keys = {(c["job"], c["key"]) for c in calls}
        for job, near, all_ in (("llama", "llama-near-free.json", "llama-mlp-capped.json"),
                                ("qwen", "qwen3-moe-near-free.json", "qwen3-moe-experts.json")):
            for key in ("none", "observe.json", near, all_, "save_on_cpu", "checkpointing", "stream_offload"):
                self.assertIn((job, key), keys)
        # Llama's every-MLP peer: the same capped policy, draining where backward begins; Qwen's: the
        # experts policy with the prefill and the cap from the environment.
        drained = [(c["job"], c["key"]) for c in calls if c["drain_at_backward_start"] is not None]
        self.assertEqual(drained, [("llama", "llama-mlp-capped.json")])
        self.assertEqual(len([c for c in calls if (c["job"], c["key"]) == ("llama", "llama-mlp-capped.json")]), 3)
        self.assertEqual(len([c for c in calls if (c["job"], c["key"]) == ("qwen", "qwen3-moe-experts.json")]), 3)
        # every run's threads were watched (BENCH_THREAD_STATS): the report has the host's steal
        results = json.loads(read(os.path.join(out, "llama", "results.json")))
        self.assertTrue(all("cpus" in run["threads"] for run in results["runs"]))
        self.assertIn("host steal s", read(os.path.join(out, "results.md")))
        self.assertTrue(all(run["cpu_probe"]["before"] == run["cpu_probe"]["after"] or run["cpu_probe"]["after"]
                            for run in results["runs"]))
        self.assertTrue(all(set(run["cpu_probe"]["before"]) == {str(self.core)} for run in results["runs"]))
        self.assertIn("- slowest CPU:", read(os.path.join(out, "results.md")))
        self.assertIn("MISSED by 0.088x", done.stdout)
        meta = json.loads(read(os.path.join(out, "llama", "meta.json")))
        self.assertEqual((meta["reps"], meta["peer_reps"], meta["steps"], meta["warmup"], meta["cpus"]),
                         (2, 1, 5, 1, str(self.core)))
        # the report shows the job's own command and where it was pinned
        self.assertIn("`examples/train_llama.py --layers 16", read(os.path.join(out, "results.md")))
        self.assertIn(", pinned to CPU cores %d)" % self.core, read(os.path.join(out, "results.md")))
        read_png(read(os.path.join(out, "bench.png"), "rb"))
        with tarfile.open(os.path.join(packed, "bench-results.tar.gz")) as tar:
            names = tar.getnames()
        for expected in ("./bench.png", "./results.md", "./report.json", "./llama/results.json", "./qwen/meta.json"):
            self.assertIn(expected, names)
        self.assertFalse(any(name.endswith(".trace") for name in names))


if __name__ == "__main__":
    unittest.main()
