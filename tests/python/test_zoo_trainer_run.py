"""hf_trainer.py with transformers.Trainer itself, on the CPU with --tiny (a pure-torch Llama stand-in,
fp32, no dataloader workers). Needs transformers, which the CPU machine lacks: there every test skips,
and run as a script (CTest's python.zoo_trainer_run) the file exits 77, CTest's "Skipped", so that the
skip shows in the suite (tests/may_skip.txt allows it). test_zoo_loops.py covers the rest of the job."""

import sys
import unittest

import test_zoo as zoo  # the helpers (a module import: its tests are not collected twice)

import hf_trainer  # noqa: E402  (examples/zoo is on sys.path through test_zoo)

try:
    import transformers  # noqa: F401
    HAVE_TRANSFORMERS = True
except ImportError:
    HAVE_TRANSFORMERS = False

SKIPPED_EXIT_CODE = 77


@unittest.skipUnless(HAVE_TRANSFORMERS, "transformers is not importable (the CPU machine has none)")
class TrainerRunTest(unittest.TestCase):
    def test_the_trainer_trains_and_the_callback_sees_every_step(self):
        first = zoo.run_main(hf_trainer, "--deterministic")
        zoo.check_result(self, first, "hf_trainer")
        self.assertEqual(first["loop"], "transformers.Trainer")
        self.assertEqual(first["forwards_per_step"], [1, 1, 1])
        self.assertEqual(first["training_arguments"]["max_steps"], 3)
        second = zoo.run_main(hf_trainer, "--deterministic")
        self.assertEqual(first["losses"], second["losses"])

    def test_every_method_gives_the_losses_of_none(self):
        reference = zoo.run_main(hf_trainer, "--deterministic")
        for method in ("checkpointing", "save_on_cpu", "stream_offload"):
            with self.subTest(method=method):
                result = zoo.run_main(hf_trainer, "--deterministic", "--method", method, "--offload-min-bytes", "1KiB")
                self.assertEqual(result["losses"], reference["losses"])


if __name__ == "__main__":
    if not HAVE_TRANSFORMERS:
        print("skipped: transformers is not importable")
        sys.exit(SKIPPED_EXIT_CODE)
    unittest.main()
