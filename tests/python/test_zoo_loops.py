"""The zoo's jobs with loops of their own, on the CPU with --tiny: the nanoGPT-style script with
gradient accumulation and an eval pass (gpt_accum.py), the torch.compile'd job (compiled.py, eager
here: torch 1.13 has no torch.compile) and everything of the Trainer job (hf_trainer.py) but the
Trainer itself (test_zoo_trainer_run.py runs that where transformers is installed)."""

import math
import unittest

import torch

import test_zoo as zoo  # the helpers (a module import: its tests are not collected twice)

import compiled  # noqa: E402  (examples/zoo is on sys.path through test_zoo)
import gpt_accum  # noqa: E402
import gpt_model  # noqa: E402
import hf_trainer  # noqa: E402
import zoo_common  # noqa: E402


class GptAccumTest(unittest.TestCase):
    def test_result_counts_optimizer_steps_and_micro_batches(self):
        result = zoo.run_main(gpt_accum, "--steps", "4", "--accum", "3", "--eval-every", "2", "--deterministic")
        zoo.check_result(self, result, "gpt_accum", steps=4)
        self.assertEqual(result["microbatches"], 3)
        self.assertEqual([len(step) for step in result["microbatch_losses"]], [3] * 4)
        for loss, micro in zip(result["loss_values"], result["microbatch_losses"]):
            values = [float.fromhex(h) for h in micro]
            self.assertEqual(loss, sum(values) / 3)  # an optimizer step's loss: its micro-batches' mean
            self.assertEqual(len(set(values)), 3)  # three different batches
        self.assertEqual(result["eval_steps"], [1, 3])
        self.assertEqual(len(result["eval_losses"]), 2)
        self.assertEqual([float.fromhex(h) for h in result["eval_losses"]], result["eval_loss_values"])
        self.assertTrue(all(n is not None and math.isfinite(n) for n in result["grad_norms"]))
        self.assertEqual(len(result["lrs"]), 4)
        self.assertTrue(result["deterministic"])
        again = zoo.run_main(gpt_accum, "--steps", "4", "--accum", "3", "--eval-every", "2", "--deterministic")
        self.assertEqual((again["losses"], again["eval_losses"]), (result["losses"], result["eval_losses"]))

    def test_accumulated_gradients_are_those_of_the_mean_loss(self):
        torch.manual_seed(0)
        args = gpt_accum.parse_args(["--tiny", "--device", "cpu", "--dtype", "fp32"])
        model, _ = gpt_model.build_gpt(args, torch.device("cpu"))
        batches = [gpt_accum.token_batch(args.vocab, 2, args.seq, seed, torch.device("cpu")) for seed in (1, 2)]
        for inputs, targets in batches:
            (model(inputs, targets)[1] / 2).backward()
        accumulated = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        joined = [torch.cat(parts) for parts in zip(*batches)]
        model(*joined)[1].backward()
        for a, b in zip(accumulated, [p.grad for p in model.parameters()]):
            self.assertTrue(torch.allclose(a, b, rtol=1e-4, atol=1e-6))

    def test_the_eval_pass_runs_under_no_grad_in_eval_mode_and_changes_nothing(self):
        args = gpt_accum.parse_args(["--tiny", "--device", "cpu", "--dtype", "fp32"])
        device = torch.device("cpu")
        model, _ = gpt_model.build_gpt(args, device)
        seen = []
        model.register_forward_hook(lambda m, i, o: seen.append((torch.is_grad_enabled(), m.training)))
        before = {k: v.clone() for k, v in model.state_dict().items()}
        batches = [gpt_accum.token_batch(args.vocab, args.batch, args.seq, 7, device)]
        loss = gpt_accum.estimate_loss(model, batches, device, "fp32")
        self.assertTrue(math.isfinite(loss))
        self.assertEqual(seen, [(False, False)])
        self.assertTrue(model.training)  # back in train mode
        self.assertTrue(all(p.grad is None for p in model.parameters()))
        for key, value in model.state_dict().items():
            self.assertTrue(torch.equal(value, before[key]), key)
        # Evaluating every step changes none of the training losses.
        often = zoo.run_main(gpt_accum, "--eval-every", "1")
        never = zoo.run_main(gpt_accum, "--eval-every", "0")
        self.assertEqual(often["losses"], never["losses"])
        self.assertEqual((len(often["eval_losses"]), never["eval_losses"]), (3, []))

    def test_every_method_gives_the_losses_of_none(self):
        reference = zoo.run_main(gpt_accum)
        for method in ("checkpointing", "save_on_cpu", "stream_offload"):
            with self.subTest(method=method):
                result = zoo.run_main(gpt_accum, "--method", method, "--offload-min-bytes", "1KiB")
                self.assertEqual(result["losses"], reference["losses"])
                self.assertEqual(result["eval_losses"], reference["eval_losses"])
        self.assertGreater(result["stream_offload"]["offloaded_tensors"], 0)
        self.assertEqual(result["stream_offload"]["modules"], ["MLP"])

    def test_schedule_clipping_and_flags_of_common_train_it_does_not_have(self):
        args = gpt_accum.parse_args(["--steps", "10", "--lr-warmup", "2"])
        lrs = [gpt_accum.learning_rate(step, args) for step in range(10)]
        self.assertEqual(lrs[:2], [args.lr / 2, args.lr])
        self.assertTrue(all(a >= b for a, b in zip(lrs[1:], lrs[2:])))
        self.assertGreater(min(lrs), args.lr / 10)
        self.assertEqual(args.lr, gpt_accum.NANOGPT_LR)
        unclipped = zoo.run_main(gpt_accum, "--grad-clip", "0")
        self.assertEqual(unclipped["grad_norms"], [None] * 3)
        for argv in (["--profile-step", "1"], ["--alternate-actpage"], ["--dtype", "fp16"], ["--accum", "0"],
                     ["--method", "cuda_graph"]):
            failed, _ = zoo.parse_fails(gpt_accum.parse_args, argv)
            self.assertTrue(failed, argv)

    def test_defaults_are_the_gpu_sizes(self):
        args = gpt_accum.parse_args([])
        self.assertEqual((args.n_layer, args.n_embd, args.n_head, args.seq, args.batch, args.accum, args.eval_every),
                         (24, 1024, 16, 1024, 8, 4, 4))


class CompiledTest(unittest.TestCase):
    def test_eagerly_it_is_gpt_accums_loop_without_accumulation(self):
        result = zoo.run_main(compiled, "--no-compile", "--deterministic")
        zoo.check_result(self, result, "compiled")
        self.assertFalse(result["compiled"])
        self.assertEqual(result["compile_step_ms"], result["step_ms"][0])
        self.assertEqual(result["microbatches"], 1)
        same_job = zoo.run_main(gpt_accum, "--accum", "1", "--eval-every", "0", "--deterministic")
        self.assertEqual(result["losses"], same_job["losses"])
        checkpointed = zoo.run_main(compiled, "--no-compile", "--method", "checkpointing")
        self.assertEqual(checkpointed["losses"], result["losses"])
        for method in ("save_on_cpu", "stream_offload"):
            failed, _ = zoo.parse_fails(compiled.parse_args, ["--method", method])
            self.assertTrue(failed, method)

    def test_asking_for_compile_on_a_torch_without_it_fails_clearly(self):
        if hasattr(torch, "compile"):
            self.skipTest("this torch has torch.compile")
        with self.assertRaises(SystemExit) as raised:
            zoo.run_main(compiled)
        self.assertIn("torch.compile needs torch >= 2.0", str(raised.exception))
        self.assertIn("--no-compile", str(raised.exception))
        self.assertIsNone(compiled.inductor_deterministic(torch))

    def test_compiled_runs_say_whether_inductor_is_deterministic(self):
        args = compiled.parse_args(["--deterministic"])
        on = zoo_common.determinism_fields(args, None)
        off = zoo_common.determinism_fields(args, compiled.NO_INDUCTOR_DETERMINISM)
        self.assertEqual((on["deterministic"], off["deterministic"]), (True, False))
        self.assertIn("inductor", off["nondeterministic_reason"])
        self.assertEqual((args.n_layer, args.seq, args.batch), (4, 2048, 8))


class HfTrainerPiecesTest(unittest.TestCase):
    """Everything of hf_trainer.py but transformers.Trainer."""

    def test_the_dataset_is_the_same_in_any_order_and_any_process(self):
        dataset = hf_trainer.random_token_dataset(vocab=50, seq=12, length=6, seed=3)
        self.assertEqual(len(dataset), 6)
        first = [dataset[i]["input_ids"] for i in range(6)]
        again = [dataset[i]["input_ids"] for i in reversed(range(6))][::-1]
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(first, again)))
        self.assertTrue(torch.equal(dataset[2]["labels"], dataset[2]["input_ids"]))
        self.assertFalse(torch.equal(first[0], first[1]))
        with self.assertRaises(IndexError):
            dataset[6]
        loader = torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=2)
        batches = list(loader)
        self.assertTrue(torch.equal(batches[1]["input_ids"][0], first[3]))

    def test_training_arguments(self):
        args = hf_trainer.parse_args(["--method", "checkpointing", "--deterministic"])
        kwargs = hf_trainer.training_arguments(args, "/tmp/out", torch.device("cuda"))
        self.assertEqual((kwargs["max_steps"], kwargs["per_device_train_batch_size"], kwargs["dataloader_num_workers"]),
                         (12, 4, 2))
        self.assertEqual((kwargs["bf16"], kwargs["fp16"], kwargs["use_cpu"]), (True, False, False))
        self.assertEqual((kwargs["logging_steps"], kwargs["report_to"], kwargs["save_strategy"]), (1, "none", "no"))
        self.assertTrue(kwargs["gradient_checkpointing"])
        self.assertEqual(kwargs["gradient_checkpointing_kwargs"], {"use_reentrant": False})
        self.assertNotIn("full_determinism", kwargs)  # it would set CUDA_LAUNCH_BLOCKING=1
        plain = hf_trainer.training_arguments(hf_trainer.parse_args(["--dtype", "fp32"]), "/tmp/out",
                                              torch.device("cpu"))
        self.assertEqual((plain["bf16"], plain["gradient_checkpointing"], plain["use_cpu"]), (False, False, True))
        self.assertNotIn("gradient_checkpointing_kwargs", plain)

    def test_the_recorder_measures_steps_in_the_trainers_order_of_events(self):
        args = hf_trainer.parse_args(zoo.CPU)
        device = torch.device("cpu")
        model, _ = zoo_common.build_llama(args, device, torch.float32)
        recorder = hf_trainer.StepRecorder(model, device, args)
        ids = torch.randint(0, args.vocab, (2, args.seq))
        model(input_ids=ids, labels=ids)  # a forward outside any step is not counted
        recorder.on_train_begin()
        for step in range(2):
            recorder.on_step_begin()
            losses = []
            for _ in range(2):  # two micro-batches
                loss = model(input_ids=ids, labels=ids)["loss"]
                (loss / 2).backward()
                losses.append(float(loss))
            recorder.on_pre_optimizer_step()
            model.zero_grad()
            recorder.on_step_end()
            self.assertEqual(recorder.losses[-1], sum(losses) / 2)
        recorder.on_train_end()
        result = recorder.result({"model": "tiny"}, {"loop": "test"})
        zoo.check_result(self, dict(result, deterministic=False, loss_tolerance=1, nondeterministic_reason="test"),
                         "hf_trainer", steps=2)
        self.assertEqual((result["microbatches"], result["forwards_per_step"]), (2, [2, 2]))

    def test_the_plain_loop_runs_the_job_and_every_method_gives_the_same_losses(self):
        reference = zoo.run_main(hf_trainer, "--loop", "plain", "--deterministic")
        zoo.check_result(self, reference, "hf_trainer")
        self.assertIn("plain", reference["loop"])
        self.assertEqual(reference["forwards_per_step"], [1, 1, 1])
        self.assertEqual((reference["config"]["weights"], reference["config"]["autocast"]), ("fp32", None))
        workers = zoo.run_main(hf_trainer, "--loop", "plain", "--deterministic", "--workers", "2")
        self.assertEqual(workers["losses"], reference["losses"])
        for method in ("checkpointing", "save_on_cpu", "stream_offload"):
            with self.subTest(method=method):
                result = zoo.run_main(hf_trainer, "--loop", "plain", "--method", method, "--offload-min-bytes", "1KiB")
                self.assertEqual(result["losses"], reference["losses"])
        self.assertGreater(result["stream_offload"]["offloaded_tensors"], 0)

    def test_without_transformers_the_trainer_loop_says_what_to_do(self):
        try:
            import transformers  # noqa: F401
            self.skipTest("transformers is installed: test_zoo_trainer_run.py runs the Trainer")
        except ImportError:
            pass
        with self.assertRaises(SystemExit) as raised:
            zoo.run_main(hf_trainer)
        self.assertIn("--loop plain", str(raised.exception))


if __name__ == "__main__":
    unittest.main()
