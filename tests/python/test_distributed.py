"""examples/train_distributed.py on the CPU (gloo, the tiny model, two ranks started the way torchrun
starts them) and scripts/distributed_report.py on fabricated results."""

import io
import json
import os
import py_compile
import socket
import subprocess
import sys
import tempfile
import unittest

import helpers  # noqa: F401  (puts examples/ on sys.path)

import common
import train_distributed

SCRIPTS_DIR = os.path.join(helpers.SOURCE_DIR, "scripts")
if SCRIPTS_DIR not in sys.path:
    sys.path.insert(0, SCRIPTS_DIR)
import distributed_report  # noqa: E402

EXAMPLE = os.path.join(helpers.EXAMPLES_DIR, "train_distributed.py")
TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "fp32", "--hidden", "16", "--layers", "2",
        "--vocab", "50", "--seq", "8", "--batch", "2", "--steps", "4", "--warmup", "1", "--deterministic"]


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_two_ranks(directory, extra):
    """Both ranks with torchrun's variables; returns [(returncode, stdout, stderr)] by rank."""
    port = str(free_port())
    workers = []
    for rank in range(2):
        env = helpers.clean_environment({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        workers.append(subprocess.Popen([helpers.PYTHON, EXAMPLE] + TINY + extra, cwd=directory, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return [(w.returncode, out, err) for w in workers for out, err in [w.communicate(timeout=240)]]


def params_line(stdout):
    for line in stdout.splitlines():
        if line.startswith(train_distributed.PARAMS_PREFIX):
            return json.loads(line[len(train_distributed.PARAMS_PREFIX):])
    return None


class DdpOnTheCpuTest(unittest.TestCase):
    def test_two_ranks_train_in_step_and_repeat_bit_for_bit(self):
        with tempfile.TemporaryDirectory() as directory:
            first = run_two_ranks(directory, ["--parallel", "ddp", "--result-json", "first-rank%r.json"])
            second = run_two_ranks(directory, ["--parallel", "ddp", "--result-json", "second-rank%r.json"])
            for code, out, err in first + second:
                self.assertEqual(code, 0, err[-2000:])
            results = {(run, rank): json.load(open(os.path.join(directory, "%s-rank%d.json" % (run, rank))))
                       for run in ("first", "second") for rank in (0, 1)}
            for rank in (0, 1):
                self.assertEqual(results["first", rank]["config"]["rank"], rank)
                self.assertEqual(results["first", rank]["config"]["world_size"], 2)
                self.assertEqual(results["first", rank]["steps"], 4)
                # Deterministic: the same losses bit for bit in a second run.
                self.assertEqual(results["first", rank]["losses"], results["second", rank]["losses"])
            # Each rank trains on its own batches...
            self.assertNotEqual(results["first", 0]["losses"], results["first", 1]["losses"])
            # ...and DDP keeps the replicas identical.
            checksums = [params_line(out) for _, out, _ in first]
            self.assertEqual(checksums[0]["checksum"], checksums[1]["checksum"])
            self.assertEqual([c["rank"] for c in checksums], [0, 1])
            # The stdout result line is the same result.
            self.assertEqual(common.parse_result_lines(first[1][1])[-1]["losses"], results["first", 1]["losses"])

    def test_a_single_process_without_torchrun_is_rank_0_of_1(self):
        with tempfile.TemporaryDirectory() as directory:
            env = helpers.clean_environment({"MASTER_PORT": str(free_port())})
            for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
                env.pop(name, None)
            done = subprocess.run([helpers.PYTHON, EXAMPLE] + TINY + ["--parallel", "ddp"], cwd=directory, env=env,
                                  capture_output=True, text=True, timeout=240)
            self.assertEqual(done.returncode, 0, done.stderr[-2000:])
            result = common.parse_result_lines(done.stdout)[-1]
            self.assertEqual((result["config"]["rank"], result["config"]["world_size"]), (0, 1))


class ExampleHelpersTest(unittest.TestCase):
    def test_environment_and_result_paths(self):
        self.assertEqual(train_distributed.distributed_environment({}), (0, 1, 0))
        self.assertEqual(train_distributed.distributed_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}),
                         (3, 4, 1))
        self.assertEqual(train_distributed.result_path("out/r%r-100%%.json", 2), "out/r2-100%.json")
        self.assertIsNone(train_distributed.result_path(None, 2))

    def test_fsdp2_needs_a_torch_with_fully_shard(self):
        py_compile.compile(EXAMPLE, doraise=True, cfile=os.path.join(tempfile.gettempdir(), "train_distributed.pyc"))
        import torch

        try:
            from torch.distributed.fsdp import fully_shard  # noqa: F401
            has_fully_shard = True
        except Exception:
            has_fully_shard = False
        if has_fully_shard:
            self.assertTrue(callable(train_distributed.fully_shard_function()))
        else:
            with self.assertRaises(SystemExit) as raised:
                train_distributed.fully_shard_function()
            self.assertIn("torch >= 2.4", str(raised.exception))
        self.assertTrue(torch.__version__)


def fake_result(losses, step_ms, used, torch_peak, active):
    return {"losses": [float(v).hex() for v in losses], "median_step_ms": step_ms, "device_used_peak_mib": used,
            "torch_peak_mib": torch_peak, "actpage": {"loaded": active, "active": active}}


class DistributedReportTest(unittest.TestCase):
    def write(self, directory, parallel, variant, rank, result):
        with open(os.path.join(directory, "dist-%s-%s-rank%d.json" % (parallel, variant, rank)), "w") as handle:
            json.dump(result, handle)

    def test_equal_losses_pass_and_the_table_shows_both_runs(self):
        with tempfile.TemporaryDirectory() as directory:
            for parallel in ("ddp", "fsdp2"):
                for rank in (0, 1):
                    losses = [4.0 + rank, 3.5 + rank, 3.25]
                    self.write(directory, parallel, "plain", rank, fake_result(losses, 100.0, 20000.0, 15000.0, False))
                    self.write(directory, parallel, "actpage", rank, fake_result(losses, 110.0, 16000.0, 15000.0, True))
            out = io.StringIO()
            sys.stdout, saved = out, sys.stdout
            try:
                code = distributed_report.main([directory, "--json", os.path.join(directory, "r.json")])
            finally:
                sys.stdout = saved
            self.assertEqual(code, 0, out.getvalue())
            text = out.getvalue()
            self.assertEqual(text.count("yes (3 steps)"), 4, text)
            self.assertIn("4000", text)  # saved MiB
            self.assertIn("1.100", text)  # step-time ratio
            saved_json = json.load(open(os.path.join(directory, "r.json")))
            self.assertEqual(len(saved_json["rows"]), 4)
            self.assertEqual(saved_json["problems"], [])

    def test_a_differing_loss_a_missing_rank_and_an_inactive_run_fail(self):
        with tempfile.TemporaryDirectory() as directory:
            self.write(directory, "ddp", "plain", 0, fake_result([4.0, 3.0], 100.0, 1.0, 1.0, False))
            self.write(directory, "ddp", "actpage", 0, fake_result([4.0, 3.0000001], 100.0, 1.0, 1.0, True))
            self.write(directory, "ddp", "plain", 1, fake_result([4.0, 3.0], 100.0, 1.0, 1.0, False))
            self.write(directory, "ddp", "actpage", 1, fake_result([4.0, 3.0], 100.0, 1.0, 1.0, False))
            rows, problems = distributed_report.report(directory, ["ddp", "fsdp2"], 2)
            self.assertEqual(rows[0]["first_differing_step"], 1)
            self.assertFalse(rows[0]["losses_bit_identical"])
            self.assertTrue(rows[1]["losses_bit_identical"])
            self.assertEqual(len(problems), 4, problems)  # rank 0 losses, rank 1 inactive, fsdp2 x2 missing
            self.assertTrue(any("not active" in p for p in problems))
            self.assertEqual(sum("no result" in p for p in problems), 2)

    def test_a_shorter_run_is_not_equal(self):
        row = distributed_report.compare(fake_result([1.0, 2.0], 1.0, 1.0, 1.0, False),
                                         fake_result([1.0], 1.0, 1.0, 1.0, True))
        self.assertFalse(row["losses_bit_identical"])
        self.assertEqual(row["first_differing_step"], 1)


if __name__ == "__main__":
    unittest.main()
