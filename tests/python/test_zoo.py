"""The zoo of training jobs (examples/zoo/) on the CPU: what the jobs share (zoo_common.py and the two
generic additions to common.py), the manifest jobs.json against the scripts, every script run alone
as a user would run it (with --tiny), and the two-rank job on gloo.

The other zoo test files import this one for its helpers (as a module, so that its test classes are
not collected twice): test_zoo_models.py (the Llama, MoE and ResNet jobs), test_zoo_loops.py (the
jobs with their own loops), test_zoo_trainer_run.py (the Trainer itself; needs transformers).
"""

import argparse
import contextlib
import importlib
import io
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import unittest

import helpers  # noqa: F401  (puts examples/ on sys.path)

ZOO_DIR = os.path.join(helpers.EXAMPLES_DIR, "zoo")
if ZOO_DIR not in sys.path:
    sys.path.insert(0, ZOO_DIR)

import torch  # noqa: E402

import common  # noqa: E402
import zoo_common  # noqa: E402

MANIFEST = os.path.join(ZOO_DIR, "jobs.json")
# A tiny CPU run: fp32 so that every method can be compared bit for bit.
CPU = ["--tiny", "--device", "cpu", "--dtype", "fp32", "--steps", "3", "--warmup", "1", "--seed", "5"]
REQUIRED_FIELDS = {"job", "method", "losses", "step_ms", "median_step_ms", "fwd_ms", "median_fwd_ms", "bwd_ms",
                   "device_used_peak_mib", "torch_peak_mib", "deterministic", "loss_tolerance",
                   "nondeterministic_reason", "config"}


def zoo_module(name):
    return importlib.import_module(name)


def result_lines(text):
    return [line for line in text.splitlines() if line.startswith(common.RESULT_PREFIX)]


def run_main(module, *extra, base=CPU):
    """module.main(base + extra) in this process; the one ACTPAGE_RESULT line it printed, parsed."""
    out = io.StringIO()
    module.main(list(base) + list(extra), out=out)
    lines = result_lines(out.getvalue())
    if len(lines) != 1:
        raise AssertionError("expected one result line, got %d:\n%s" % (len(lines), out.getvalue()))
    return json.loads(lines[0][len(common.RESULT_PREFIX):])


def check_result(test, result, job, method="none", steps=3):
    """The fields every zoo result carries, with CPU values."""
    test.assertLessEqual(REQUIRED_FIELDS, set(result), REQUIRED_FIELDS - set(result))
    test.assertEqual((result["job"], result["method"]), (job, method))
    test.assertEqual(len(result["losses"]), steps)
    values = [float.fromhex(h) for h in result["losses"]]
    test.assertTrue(all(math.isfinite(v) for v in values), values)
    for key in ("step_ms", "fwd_ms", "bwd_ms"):
        test.assertEqual(len(result[key]), steps, key)
        test.assertTrue(all(v is not None and v > 0 for v in result[key]), (key, result[key]))
    test.assertIsNotNone(result["median_step_ms"])
    test.assertIsNotNone(result["median_fwd_ms"])
    test.assertIsNone(result["device_used_peak_mib"])  # no CUDA here
    test.assertIsNone(result["torch_peak_mib"])
    test.assertIsInstance(result["config"], dict)
    if result["deterministic"]:
        test.assertEqual((result["loss_tolerance"], result["nondeterministic_reason"]), (0.0, None))
    else:
        test.assertGreater(result["loss_tolerance"], 0)
        test.assertTrue(result["nondeterministic_reason"])


def parse_fails(parse, argv):
    """Whether parse(argv) exits with an argument error; what it wrote to stderr."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        try:
            parse(argv)
        except SystemExit as exit:
            return exit.code not in (0, None), errors.getvalue()
    return False, errors.getvalue()


def load_manifest():
    with open(MANIFEST) as stream:
        return json.load(stream)


class CommonAdditionsTest(unittest.TestCase):
    """The two generic additions the zoo made to examples/common.py."""

    def test_a_job_names_the_methods_it_supports(self):
        parser = argparse.ArgumentParser()
        common.add_common_arguments(parser, methods=("none", "save_on_cpu"))
        self.assertEqual(parser.parse_args(["--method", "save_on_cpu"]).method, "save_on_cpu")
        failed, message = parse_fails(parser.parse_args, ["--method", "checkpointing"])
        self.assertTrue(failed)
        self.assertIn("invalid choice: 'checkpointing'", message)
        everything = argparse.ArgumentParser()
        common.add_common_arguments(everything)  # the default is every method, as before
        self.assertEqual(everything.parse_args(["--method", "cuda_graph"]).method, "cuda_graph")
        with self.assertRaises(ValueError):
            common.add_common_arguments(argparse.ArgumentParser(), methods=("checkpointing",))
        with self.assertRaises(ValueError):
            common.add_common_arguments(argparse.ArgumentParser(), methods=("none", "magic"))

    def test_a_jobs_result_fields_are_added_to_the_loops_result(self):
        parser = argparse.ArgumentParser()
        common.add_common_arguments(parser)
        args = parser.parse_args(["--steps", "2", "--warmup", "0", "--device", "cpu", "--seq", "4", "--batch", "2"])
        model = torch.nn.Linear(3, 1)

        def make_batch(step):
            return {"x": torch.full((2, 3), float(step + 1))}

        job = common.Job("linear", model, make_batch, lambda m, batch: m(batch["x"]).pow(2).mean(), {"width": 3},
                         result_fields={"loss_tolerance": 0.5, "deterministic": "as the job says"})
        out = io.StringIO()
        result = common.train(job, args, out=out)
        self.assertEqual(result["loss_tolerance"], 0.5)
        self.assertEqual(result["deterministic"], "as the job says")  # replaces the loop's own key
        self.assertEqual(json.loads(result_lines(out.getvalue())[0][len(common.RESULT_PREFIX):])["loss_tolerance"], 0.5)
        self.assertEqual(common.Job("j", model, make_batch, None).result_fields, {})


class ZooCommonTest(unittest.TestCase):
    def parser(self):
        parser = argparse.ArgumentParser()
        parser.add_argument("--width", type=int, default=1024)
        zoo_common.add_zoo_arguments(parser, ("none", "checkpointing"), "MLP", default_seq=4096, default_batch=2)
        return parser

    def test_defaults_tiny_preset_and_explicit_flags(self):
        args = zoo_common.parse_zoo_args(self.parser(), [], dict(width=8, seq=16))
        self.assertEqual((args.steps, args.width, args.seq, args.batch, args.tiny), (12, 1024, 4096, 2, False))
        tiny = zoo_common.parse_zoo_args(self.parser(), ["--tiny"], dict(width=8, seq=16))
        self.assertEqual((tiny.width, tiny.seq, tiny.batch, tiny.tiny), (8, 16, 2, True))
        explicit = zoo_common.parse_zoo_args(self.parser(), ["--tiny", "--seq", "5"], dict(width=8, seq=16))
        self.assertEqual((explicit.width, explicit.seq), (8, 5))

    def test_loop_only_flags_and_unsupported_dtypes_are_errors(self):
        for argv, expected in ((["--profile-step", "2"], "--profile-step"),
                               (["--alternate-actpage"], "--alternate-actpage"),
                               (["--dtype", "fp16"], "--dtype fp16")):
            failed, message = parse_fails(lambda a: zoo_common.parse_zoo_args(self.parser(), a, {}, own_loop=True,
                                                                              dtypes=("bf16", "fp32")), argv)
            self.assertTrue(failed, argv)
            self.assertIn(expected, message)
        # Jobs on common.train keep those flags.
        self.assertEqual(zoo_common.parse_zoo_args(self.parser(), ["--profile-step", "2"], {}).profile_step, [2])

    def test_a_warm_up_that_leaves_no_step_to_measure_is_an_error(self):
        # 30 steps asked as 12 with --warmup 16 would take the median over all 12, the first included.
        failed, message = parse_fails(lambda a: zoo_common.parse_zoo_args(self.parser(), a, {}),
                                      ["--steps", "12", "--warmup", "16"])
        self.assertTrue(failed)
        self.assertIn("--warmup 16 is not below --steps 12", message)
        self.assertTrue(parse_fails(lambda a: zoo_common.parse_zoo_args(self.parser(), a, {}),
                                    ["--steps", "3", "--warmup", "3"])[0])
        self.assertEqual(zoo_common.parse_zoo_args(self.parser(), ["--steps", "4", "--warmup", "3"], {}).warmup, 3)

    def test_determinism_fields(self):
        on = argparse.Namespace(deterministic=True)
        off = argparse.Namespace(deterministic=False)
        self.assertEqual(zoo_common.determinism_fields(on), {"deterministic": True, "deterministic_mode": True,
                                                             "loss_tolerance": 0.0, "nondeterministic_reason": None})
        blocked = zoo_common.determinism_fields(on, "an op without a deterministic backward", tolerance=0.01)
        self.assertEqual((blocked["deterministic"], blocked["deterministic_mode"], blocked["loss_tolerance"]),
                         (False, True, 0.01))
        self.assertEqual(blocked["nondeterministic_reason"], "an op without a deterministic backward")
        plain = zoo_common.determinism_fields(off)
        self.assertFalse(plain["deterministic"])
        self.assertEqual(plain["loss_tolerance"], zoo_common.NONDETERMINISTIC_LOSS_TOLERANCE)
        self.assertIn("--deterministic", plain["nondeterministic_reason"])

    def test_phase_timer_sums_repeats(self):
        timer = zoo_common.PhaseTimer(cuda=False)
        self.assertTrue(math.isnan(timer.total_ms("forward")))
        for _ in range(3):
            timer.start("forward")
            timer.stop("forward")
        self.assertEqual(timer.count("forward"), 3)
        self.assertGreaterEqual(timer.total_ms("forward"), 0.0)

    def test_forward_context_hooks_wrap_every_forward_and_only_forwards(self):
        packs = []

        def factory():
            return torch.autograd.graph.saved_tensors_hooks(lambda t: packs.append(t.shape) or t, lambda t: t)

        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
        hooks = zoo_common.ForwardContextHooks(model, factory)
        x = torch.randn(2, 4)
        loss = model(x).sum()
        inside = len(packs)
        torch.tanh(x.requires_grad_()).sum()  # outside the model: no hook active
        self.assertGreater(inside, 0)
        self.assertEqual(len(packs), inside)
        loss.backward()
        model(x)
        self.assertGreater(len(packs), inside)
        hooks.remove()
        before = len(packs)
        model(x)
        self.assertEqual(len(packs), before)


class ManifestTest(unittest.TestCase):
    """jobs.json, which the benchmark reads, against the scripts it names."""

    def setUp(self):
        self.manifest = load_manifest()
        self.jobs = self.manifest["jobs"]

    def test_every_job_of_the_issue_is_listed_once(self):
        names = [job["name"] for job in self.jobs]
        self.assertEqual(len(names), len(set(names)))
        self.assertEqual(set(names), {"gpu_bound_llama", "gpt_accum", "hf_trainer", "qwen3_moe", "deepseek_moe",
                                      "resnet", "long_context", "compiled", "fsdp2"})
        listed = {os.path.basename(job["script"]) for job in self.jobs}
        scripts = {name for name in os.listdir(ZOO_DIR) if name.endswith(".py")}
        helpers_only = {"zoo_common.py", "zoo_layers.py", "tiny_models.py", "moe_model.py", "gpt_model.py"}
        self.assertEqual(scripts - helpers_only, listed)

    def test_each_entry_is_complete_and_consistent(self):
        for job in self.jobs:
            with self.subTest(job=job["name"]):
                self.assertTrue(os.path.isfile(os.path.join(helpers.SOURCE_DIR, job["script"])))
                self.assertEqual(os.path.basename(job["script"]), job["name"] + ".py")
                self.assertIn(job["gpus"], (1, 2))
                if job["gpus"] == 2:
                    # --standalone: each run its own rendezvous (a fixed port clashes between runs).
                    self.assertEqual(job["launcher"], ["torchrun", "--standalone", "--nproc-per-node", str(job["gpus"])])
                else:
                    self.assertIsNone(job["launcher"])
                self.assertIn("none", job["methods"])
                self.assertLessEqual(set(job["methods"]), {"none", "checkpointing", "save_on_cpu", "stream_offload"})
                self.assertIn(job["checkpointing"], ("method", "default-on", None))
                self.assertEqual(job["checkpointing"] == "method", "checkpointing" in job["methods"])
                self.assertEqual(job["stream_offload_modules"] is not None, "stream_offload" in job["methods"])
                self.assertIsInstance(job["deterministic"], bool)
                if job["deterministic"]:
                    self.assertIn("--deterministic", job["args"])
                    self.assertEqual(job["loss_tolerance"], 0)
                else:
                    self.assertGreater(job["loss_tolerance"], 0)
                self.assertTrue(job["stands_for"].strip())

    def test_the_scripts_accept_the_listed_args_and_methods_and_reject_the_others(self):
        for job in self.jobs:
            module = zoo_module(job["name"])
            with self.subTest(job=job["name"]):
                defaults = module.parse_args(job["args"])
                self.assertFalse(defaults.tiny)
                self.assertEqual(defaults.method, "none")
                self.assertEqual(defaults.steps, zoo_common.DEFAULT_STEPS)
                if job["stream_offload_modules"] is not None:
                    self.assertEqual(defaults.offload_modules, job["stream_offload_modules"])
                if job["checkpointing"] == "default-on":
                    self.assertFalse(defaults.no_checkpointing)
                for method in job["methods"]:
                    self.assertEqual(module.parse_args(job["args"] + ["--method", method]).method, method)
                for method in set(common.METHODS) - set(job["methods"]):
                    failed, message = parse_fails(module.parse_args, job["args"] + ["--method", method])
                    self.assertTrue(failed, method)
                    self.assertIn("invalid choice", message)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class StandaloneRunTest(unittest.TestCase):
    """Each script run alone, as `python3 examples/zoo/X.py`, with --tiny on the CPU."""

    def test_every_single_process_script_prints_one_result_line(self):
        extra = {"hf_trainer": ["--loop", "plain"], "compiled": ["--no-compile"]}
        jobs = [job for job in load_manifest()["jobs"] if job["gpus"] == 1]
        with tempfile.TemporaryDirectory() as directory:
            running = {}
            for job in jobs:  # started together: the machine's speed decides nothing but the wall time
                command = [helpers.PYTHON, os.path.join(helpers.SOURCE_DIR, job["script"]), "--tiny", "--device", "cpu",
                           "--dtype", "fp32", "--steps", "2", "--warmup", "1"] + extra.get(job["name"], [])
                running[job["name"]] = subprocess.Popen(command, cwd=directory, env=helpers.clean_environment(),
                                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name, process in running.items():
                out, err = process.communicate(timeout=600)
                with self.subTest(job=name):
                    self.assertEqual(process.returncode, 0, err[-3000:])
                    lines = result_lines(out)
                    self.assertEqual(len(lines), 1, out[-3000:])
                    result = json.loads(lines[0][len(common.RESULT_PREFIX):])
                    self.assertEqual((result["job"], result["steps"]), (name, 2))


def run_two_ranks(directory, extra):
    """fsdp2.py's two ranks with torchrun's variables; [(returncode, stdout, stderr)] by rank."""
    port = str(free_port())
    script = os.path.join(ZOO_DIR, "fsdp2.py")
    ranks = []
    for rank in range(2):
        env = helpers.clean_environment({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        ranks.append(subprocess.Popen([helpers.PYTHON, script] + CPU + extra, cwd=directory, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return [(p.returncode, out, err) for p in ranks for out, err in [p.communicate(timeout=300)]]


class TwoRankJobTest(unittest.TestCase):
    """fsdp2.py's two processes on gloo. torch 1.13 (this machine) has no fully_shard, so they run the
    same job replicated (--parallel ddp); sharding itself is checked on the GPUs."""

    def test_rank_0_prints_one_result_with_every_rank_and_runs_repeat(self):
        with tempfile.TemporaryDirectory() as directory:
            runs = [run_two_ranks(directory, ["--parallel", "ddp", "--deterministic",
                                              "--result-json", "run%d.json" % i]) for i in range(2)]
            for ranks in runs:
                for code, out, err in ranks:
                    self.assertEqual(code, 0, err[-3000:])
                self.assertEqual(result_lines(ranks[1][1]), [])  # rank 1 prints no result
                self.assertEqual(len(result_lines(ranks[0][1])), 1)
            results = [json.loads(result_lines(r[0][1])[0][len(common.RESULT_PREFIX):]) for r in runs]
            with open(os.path.join(directory, "run0.json")) as stream:
                self.assertEqual(json.load(stream)["ranks"], results[0]["ranks"])  # rank 0's merged result
        first, second = results
        check_result(self, first, "fsdp2")
        self.assertEqual([r["rank"] for r in first["ranks"]], [0, 1])
        self.assertEqual(first["world_size"], 2)
        self.assertEqual(first["config"]["parallel"], "ddp")
        self.assertEqual(first["ranks"][0]["losses"], first["losses"])  # the job's losses are rank 0's
        self.assertNotEqual(first["ranks"][0]["losses"], first["ranks"][1]["losses"])  # each rank its own data
        self.assertEqual([r["losses"] for r in first["ranks"]], [r["losses"] for r in second["ranks"]])
        self.assertTrue(all(r["median_step_ms"] > 0 for r in first["ranks"]))
        self.assertIsNone(first["device_used_peak_mib"])

    def test_fsdp2_on_a_torch_without_fully_shard_stops_clearly(self):
        import train_distributed

        try:
            train_distributed.fully_shard_function()
            self.skipTest("this torch has fully_shard")
        except SystemExit:
            pass
        env = helpers.clean_environment({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(free_port())})
        done = subprocess.run([helpers.PYTHON, os.path.join(ZOO_DIR, "fsdp2.py")] + CPU, env=env, capture_output=True,
                              text=True, timeout=300)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("--parallel fsdp2 needs torch >= 2.4", done.stderr)
        self.assertEqual(result_lines(done.stdout), [])

    def test_merging_takes_the_largest_peak_of_the_ranks(self):
        import fsdp2

        summaries = [{"rank": 1, "device_used_peak_mib": 900.0, "torch_peak_mib": None, "median_step_ms": 12.0,
                      "median_fwd_ms": 4.0, "losses": []},
                     {"rank": 0, "device_used_peak_mib": 1000.0, "torch_peak_mib": None, "median_step_ms": 10.0,
                      "median_fwd_ms": 3.0, "losses": []}]
        merged = fsdp2.merge_ranks({"median_step_ms": 10.0, "device_used_peak_mib": 1000.0}, summaries)
        self.assertEqual([r["rank"] for r in merged["ranks"]], [0, 1])
        self.assertEqual((merged["device_used_peak_mib"], merged["torch_peak_mib"]), (1000.0, None))
        self.assertEqual((merged["median_step_ms"], merged["median_step_ms_slowest_rank"]), (10.0, 12.0))


if __name__ == "__main__":
    unittest.main()
