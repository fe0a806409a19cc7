"""actpage_hooks._fingerprint: the backward roots `actpage validate` compares, on Debian's CPU torch."""

import os
import subprocess
import tempfile
import textwrap
import unittest

from helpers import PYTHON, PYTHON_DIR, clean_environment

import torch

from actpage_hooks import _fingerprint


def read_lines(path):
    with open(path) as handle:
        return [line.split() for line in handle]


class FingerprintTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.addCleanup(_fingerprint.uninstall)
        self.addCleanup(torch.use_deterministic_algorithms, torch.are_deterministic_algorithms_enabled())
        self.backward, self.grad = torch.autograd.backward, torch.autograd.grad

    def test_nothing_is_installed_unless_the_process_is_being_validated(self):
        self.assertIsNone(_fingerprint.install(torch, environ={}))
        self.assertIs(torch.autograd.backward, self.backward)

    def test_every_backward_call_writes_its_roots_values(self):
        recorder = _fingerprint.install(torch, environ={_fingerprint.ENV_OUT: self.dir.name})
        self.assertIs(_fingerprint.install(torch, environ={_fingerprint.ENV_OUT: self.dir.name}), recorder)
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 3)
        x = torch.randn(4, 8)
        losses = []
        loss = model(x).square().mean()
        losses.append(loss.item())
        loss.backward()  # Tensor.backward goes through torch.autograd.backward
        first, second = model(x).sum(), model(x).square().sum()
        torch.autograd.backward([first, second])
        out = model(x)  # a non-scalar root with its gradient
        torch.autograd.backward(out, torch.ones_like(out))
        grads = torch.autograd.grad(model(x).mean(), model.weight)
        self.assertEqual(grads[0].shape, model.weight.shape)  # the call still does its work
        lines = read_lines(os.path.join(self.dir.name, "rank0.fingerprint"))
        self.assertEqual([line[:2] for line in lines], [["0", "0"], ["1", "0"], ["1", "1"], ["2", "0"], ["3", "0"]])
        self.assertEqual(lines[0][2], float(losses[0]).hex())
        self.assertEqual(lines[1][2], float(first.item()).hex())
        self.assertEqual(lines[2][2], float(second.item()).hex())
        self.assertEqual(lines[3][2], "%s/%d" % (float(out.detach().sum().item()).hex(), out.numel()))
        self.assertIsNotNone(model.weight.grad)
        _fingerprint.uninstall()
        self.assertIs(torch.autograd.backward, self.backward)
        self.assertIs(torch.autograd.grad, self.grad)

    def test_each_rank_writes_its_own_file(self):
        folder = self.dir.name
        self.assertEqual(_fingerprint.fingerprint_path(folder, {"RANK": "3"}), os.path.join(folder, "rank3.fingerprint"))
        self.assertEqual(_fingerprint.fingerprint_path(folder, {}), os.path.join(folder, "rank0.fingerprint"))

    def test_a_root_that_cannot_be_read_is_written_as_an_error(self):
        class Unreadable:
            def detach(self):
                raise RuntimeError("gone")

        self.assertEqual(_fingerprint.root_value(Unreadable()), "error:RuntimeError")

    def test_deterministic_mode_when_asked(self):
        torch.use_deterministic_algorithms(False)
        _fingerprint.install(torch, environ={_fingerprint.ENV_OUT: self.dir.name, _fingerprint.ENV_DETERMINISTIC: "1"})
        self.assertTrue(torch.are_deterministic_algorithms_enabled())

    def test_a_job_started_with_the_package_on_its_path_records_itself(self):
        # As `actpage run` starts a job: sitecustomize installs the import hook, torch's import runs it.
        code = textwrap.dedent("""
            import torch
            w = torch.ones(3, requires_grad=True)
            for step in range(2):
                (w * (step + 2)).sum().backward()
        """)
        env = clean_environment({"PYTHONPATH": PYTHON_DIR, _fingerprint.ENV_OUT: self.dir.name, "RANK": "1",
                                 "ACTPAGE_PYTHON_HOOKS": "off"})
        done = subprocess.run([PYTHON, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=240)
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = read_lines(os.path.join(self.dir.name, "rank1.fingerprint"))
        self.assertEqual(lines, [["0", "0", (6.0).hex()], ["1", "0", (9.0).hex()]])


class ValidateCommandTest(unittest.TestCase):
    """`actpage validate` on a real torch job (CPU): the package records, the CLI compares."""

    JOB = textwrap.dedent("""
        import os, torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            loss = model(torch.randn(8, 16)).square().mean()
            if os.environ.get("ACTPAGE_STRAY_ACCESS") == "poison" and os.environ.get("BREAK"):
                loss = loss * 2  # stands in for a read of poisoned pages
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """)

    def setUp(self):
        self.cli = os.environ.get("ACTPAGE_TEST_CLI")
        if not self.cli or not os.path.isfile(self.cli):
            self.skipTest("no actpage CLI built (ACTPAGE_TEST_CLI)")
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.job = os.path.join(self.dir.name, "job.py")
        with open(self.job, "w") as handle:
            handle.write(self.JOB)

    def validate(self, **extra):
        env = clean_environment(extra)
        done = subprocess.run([self.cli, "validate", "--work-dir", os.path.join(self.dir.name, "work"), "--",
                               PYTHON, self.job], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=240)
        return done.returncode, done.stdout

    def test_the_same_job_computes_the_same_losses(self):
        code, printed = self.validate()
        self.assertEqual(code, 0, printed)
        self.assertIn("same values: 3 backward roots bit for bit", printed)

    def test_a_job_whose_losses_change_under_poison_is_caught(self):
        code, printed = self.validate(BREAK="1")
        self.assertEqual(code, 1, printed)
        self.assertIn("DIFFERENT values", printed)
        self.assertIn("rank0.fingerprint, line 1", printed)


if __name__ == "__main__":
    unittest.main()
