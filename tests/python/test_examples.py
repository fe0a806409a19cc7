"""examples/common.py on the CPU with a tiny pure-torch language model (no transformers here)."""

import argparse
import contextlib
import gzip
import io
import json
import os
import tempfile
import threading
import unittest

import helpers  # noqa: F401  (puts examples/ on sys.path)

import torch
from torch import nn
import torch.nn.functional as F
import torch.utils.checkpoint

import common
import stream_offload


class TinyMLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))


class TinyLayer(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = TinyMLP(width)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class TinyLM(nn.Module):
    """Embedding, a few MLP layers, a head; HF-like enough for the loop (checkpointing included)."""

    def __init__(self, vocab=50, width=16, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(TinyLayer(width) for _ in range(layers))
        self.head = nn.Linear(width, vocab)
        self.checkpointing = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.checkpointing = True
        self.checkpoint_kwargs = dict(gradient_checkpointing_kwargs or {})

    def forward(self, input_ids, labels):
        x = self.embed(input_ids)
        for layer in self.layers:
            if self.checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(layer, x, **self.checkpoint_kwargs)
            else:
                x = layer(x)
        logits = self.head(x)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))


def make_args(*extra):
    parser = argparse.ArgumentParser()
    common.add_common_arguments(parser, default_offload_modules="TinyMLP")
    return parser.parse_args(["--steps", "4", "--warmup", "1", "--seq", "12", "--batch", "3", "--dtype", "fp32",
                              "--device", "cpu", "--seed", "7"] + list(extra))


def run_job(*extra):
    args = make_args(*extra)
    common.prepare_process(args)
    model = TinyLM()
    job = common.Job("tiny", model, common.random_token_batches(50, args.batch, args.seq, args.seed, "cpu"),
                     lambda m, batch: m(batch["input_ids"], batch["labels"]), {"width": 16})
    out = io.StringIO()
    result = common.train(job, args, out=out)
    return result, out.getvalue()


class TrainingLoopTest(unittest.TestCase):
    def test_result_line_is_the_last_line_and_complete(self):
        result, text = run_job()
        last = text.strip().splitlines()[-1]
        self.assertTrue(last.startswith(common.RESULT_PREFIX))
        parsed = json.loads(last[len(common.RESULT_PREFIX):])
        self.assertEqual(parsed, json.loads(json.dumps(result)))
        self.assertEqual(parsed["steps"], 4)
        self.assertEqual(len(parsed["losses"]), 4)
        self.assertEqual([float.fromhex(h) for h in parsed["losses"]], parsed["loss_values"])
        self.assertEqual(len(parsed["step_ms"]), 4)
        self.assertEqual(parsed["median_step_ms"], round(sorted(parsed["step_ms"][1:])[1], 3))
        self.assertTrue(all(f is not None and f > 0 for f in parsed["fwd_ms"]))
        # The thread's CPU speed at each step's start: one reading a step, each a positive time.
        self.assertEqual(len(parsed["cpu_probe_us"]), 4)
        self.assertTrue(all(us > 0 for us in parsed["cpu_probe_us"]), parsed["cpu_probe_us"])
        self.assertIsNone(parsed["device_used_peak_mib"])
        self.assertIsNone(parsed["torch_peak_mib"])
        self.assertEqual(parsed["actpage"], {"loaded": False, "active": False})
        self.assertEqual(parsed["config"], {"width": 16})
        self.assertEqual(common.parse_result_lines("noise\n" + text + "more noise\n"), [parsed])

    def test_alternating_actpage_pairs_the_measured_steps_and_changes_no_loss(self):
        plain, _ = run_job("--steps", "9")
        alternated, _ = run_job("--steps", "9", "--alternate-actpage")
        self.assertEqual(alternated["losses"], plain["losses"])
        # Warm-up step 0 recorded; then the pairs (1, 2), (3, 4), ... ordered ABBA.
        self.assertEqual(alternated["actpage_recorded"], [True, True, False, False, True, True, False, False, True])
        summary = alternated["alternate"]
        self.assertEqual(summary["pairs"], 4)
        steps = alternated["step_ms"]
        ratios = [steps[1] / steps[2], steps[4] / steps[3], steps[5] / steps[6], steps[8] / steps[7]]
        # The result's step times are rounded to the microsecond, the summary's ratios were not.
        expected = (sorted(ratios)[1] + sorted(ratios)[2]) / 2
        self.assertAlmostEqual(summary["paired_ratio_median"] / expected, 1.0, delta=0.01)
        self.assertNotIn("alternate", plain)

    def test_alternate_summary_of_known_steps(self):
        recorded = [common.alternate_recorded(step, 2) for step in range(12)]
        self.assertEqual(recorded, [True, False, True, False, False, True, True, False, False, True, True, False])
        steps = [50.0, 50.0] + [110.0 if r else 100.0 for r in recorded[2:]]
        summary = common.alternate_summary(steps, recorded, 2)
        self.assertEqual(summary["pairs"], 5)
        self.assertEqual(summary["paired_ratio_median"], 1.1)
        self.assertEqual(summary["recorded_median_ms"], 110.0)
        self.assertEqual(summary["paused_median_ms"], 100.0)
        self.assertEqual(summary["paired_ratio_ci95"], [1.1, 1.1])

    def test_profiling_a_step_adds_a_summary_and_changes_no_loss(self):
        plain, _ = run_job()
        with tempfile.TemporaryDirectory() as tmp:
            kept = os.path.join(tmp, "step.json.gz")
            profiled, _ = run_job("--profile-step", "2", "--profile-out", kept)
            # The kept trace names the forward and the backward for scripts/copy_timeline.py.
            with gzip.open(kept, "rt") as f:
                loaded = json.load(f)
        events = loaded.get("traceEvents", []) if isinstance(loaded, dict) else loaded
        phases = {e["name"] for e in events if e.get("cat", "user_annotation") == "user_annotation"}
        self.assertTrue({"step.forward", "step.backward"} <= phases, phases)
        self.assertIsNone(plain["profile"])
        self.assertEqual(profiled["losses"], plain["losses"])
        summary = profiled["profile"]
        # On the CPU there is no kernel to count, but every figure is there and consistent.
        self.assertEqual(summary["kernels"], 0)
        self.assertEqual(summary["gpu_busy_ms"], 0.0)
        self.assertEqual(set(summary), {"kernels", "kernel_ms", "gpu_busy_ms", "kernel_span_ms", "copies_ms",
                                        "top_kernels_ms", "host_calls", "host_phases_ms"})
        # The host ran both phases of the profiled step.
        self.assertEqual(set(summary["host_phases_ms"]), {"step.forward", "step.backward"})
        self.assertTrue(all(ms > 0 for ms in summary["host_phases_ms"].values()), summary["host_phases_ms"])

    def test_several_steps_are_profiled_each_with_its_summary_and_trace(self):
        # A paged and an unpaged pass of auto mode's governor, side by side in one process.
        plain, _ = run_job()
        with tempfile.TemporaryDirectory() as tmp:
            kept = os.path.join(tmp, "step.json.gz")
            profiled, _ = run_job("--profile-step", "3,1", "--profile-out", kept)
            self.assertEqual(sorted(os.listdir(tmp)), ["step.step1.json.gz", "step.step3.json.gz"])
        self.assertEqual(profiled["losses"], plain["losses"])
        self.assertEqual(sorted(profiled["profiles"]), ["1", "3"])
        self.assertEqual(profiled["profile"], profiled["profiles"]["1"])
        self.assertEqual(plain["profiles"], {})
        # A step past the run's end profiles nothing; bad lists are errors.
        beyond, _ = run_job("--profile-step", "9")
        self.assertIsNone(beyond["profile"])
        for bad in ("a", "-1", ",", "2,x"):
            with self.assertRaises(SystemExit, msg=bad), contextlib.redirect_stderr(io.StringIO()):
                make_args("--profile-step", bad)
        self.assertEqual(common.profile_path("t.json", 4, True), "t.step4.json")
        self.assertEqual(common.profile_path("t.json", 4, False), "t.json")
        self.assertEqual(common.profile_path("t", 4, True), "t.step4")

    def test_the_model_learns_and_runs_repeat_bit_for_bit(self):
        first, _ = run_job("--deterministic")
        second, _ = run_job("--deterministic")
        self.assertEqual(first["losses"], second["losses"])
        self.assertLess(first["loss_values"][-1], first["loss_values"][0])

    def test_every_cpu_method_gives_the_same_losses(self):
        reference, _ = run_job()
        for method in ("checkpointing", "save_on_cpu", "stream_offload"):
            with self.subTest(method=method):
                result, _ = run_job("--method", method, "--offload-min-bytes", "1KiB")
                self.assertEqual(result["losses"], reference["losses"])
                self.assertEqual(result["method"], method)
        result, _ = run_job("--method", "stream_offload", "--offload-min-bytes", "1KiB")
        stats = result["stream_offload"]
        self.assertEqual(stats["modules"], ["TinyMLP"])
        self.assertGreater(stats["offloaded_tensors"], 0)
        self.assertEqual(stats["reloaded_tensors"], stats["offloaded_tensors"])

    def test_cuda_graph_needs_cuda(self):
        if torch.cuda.is_available():
            self.skipTest("CUDA present")
        with self.assertRaises(SystemExit):
            run_job("--method", "cuda_graph")

    def test_batches_are_deterministic_per_step(self):
        make = common.random_token_batches(50, 2, 8, 3, "cpu")
        self.assertTrue(torch.equal(make(1)["input_ids"], make(1)["input_ids"]))
        self.assertFalse(torch.equal(make(1)["input_ids"], make(2)["input_ids"]))

    def test_parse_size(self):
        self.assertEqual(common.parse_size("1MiB"), 1 << 20)
        self.assertEqual(common.parse_size("512KiB"), 512 << 10)
        self.assertEqual(common.parse_size("4096"), 4096)
        with self.assertRaises(argparse.ArgumentTypeError):
            common.parse_size("lots")


class MemorySamplerTest(unittest.TestCase):
    def test_without_cuda_it_reports_nothing(self):
        if torch.cuda.is_available():
            self.skipTest("CUDA present")
        sampler = common.MemorySampler()
        self.assertFalse(sampler.available)
        sampler.start()
        self.assertIsNone(sampler.stop())
        self.assertEqual(sampler.samples, 0)

    def test_keeps_the_peak_of_what_the_query_reports(self):
        values = iter([100 << 20, 300 << 20] + [200 << 20] * 100000)
        lock = threading.Lock()

        def query():
            with lock:
                return next(values)

        sampler = common.MemorySampler(interval_ms=0.5, query=query).start()
        done = threading.Event()
        done.wait(0.05)
        peak = sampler.stop()
        self.assertEqual(peak, 300.0)
        self.assertEqual(sampler.first_bytes, 100 << 20)
        self.assertGreater(sampler.samples, 3)

    def test_the_steady_peak_counts_only_what_comes_after_the_warm_up_steps(self):
        # No sampling thread: each sample() takes the next value, as the thread would.
        values = iter([900 << 20, 700 << 20, 400 << 20, 600 << 20, 500 << 20])
        sampler = common.MemorySampler(query=lambda: next(values))
        sampler.steady_after = 2
        sampler.sample()        # 900: step 1, the warm-up's peak
        sampler.step_ended()
        sampler.sample()        # 700: step 2
        self.assertIsNone(sampler.steady_peak_mib())
        sampler.step_ended()    # the warm-up is over: takes 400
        sampler.sample()        # 600
        sampler.sample()        # 500
        self.assertEqual(sampler.peak_mib(), 900.0)
        self.assertEqual(sampler.steady_peak_mib(), 600.0)

    def test_without_warm_up_steps_set_there_is_no_steady_peak(self):
        sampler = common.MemorySampler(query=lambda: 100 << 20)
        sampler.sample()
        sampler.step_ended()
        sampler.sample()
        self.assertEqual(sampler.peak_mib(), 100.0)
        self.assertIsNone(sampler.steady_peak_mib())

    def test_finds_libraries_mapped_into_the_process(self):
        self.assertIn("libc.so", common.find_process_library("libc.so"))
        self.assertIsNone(common.find_process_library("libnothing-like-this.so"))
        if not torch.cuda.is_available():
            self.assertIsNone(common.CudaRuntime.find())


class StreamOffloadTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.model = TinyLM()
        self.offload = common.StreamOffload(self.model, "TinyMLP", min_bytes=1024, device="cpu")

    def test_selects_modules_by_class_name(self):
        self.assertEqual(len(self.offload.selected), 2)
        self.assertTrue(self.offload.matches("TinyMLP"))
        self.assertFalse(self.offload.matches("TinyLayer"))
        with self.assertRaises(ValueError):
            common.StreamOffload(self.model, "NoSuchBlock", device="cpu")

    def test_pack_and_unpack_inside_a_selected_module(self):
        offload = self.offload
        with offload:
            offload._depth = 1  # as if inside TinyMLP's forward
            big = torch.randn(32, 64)
            transposed = torch.randn(64, 32).t()
            small = torch.randn(4)
            weight_view = self.model.head.weight.t()
            packed = [offload.pack(t) for t in (big, transposed, small, weight_view)]
            offload._depth = 0
            outside = offload.pack(big)
        self.assertIsInstance(packed[0], stream_offload._Offloaded)
        self.assertIsInstance(packed[1], stream_offload._Offloaded)
        self.assertIs(packed[2], small)        # below min_bytes
        self.assertIs(packed[3], weight_view)  # a view of a parameter
        self.assertIs(outside, big)            # not inside a selected module
        restored = offload.unpack(packed[1])
        self.assertTrue(torch.equal(restored, transposed))
        self.assertEqual(restored.stride(), transposed.stride())
        self.assertTrue(torch.equal(offload.unpack(packed[0]), big))
        self.assertIs(offload.unpack(small), small)
        self.assertEqual(offload.offloaded_tensors, 2)

    def test_weights_swapped_in_during_the_forward_and_sharded_parameters_are_not_activations(self):
        # FSDP2: the model's parameters are DTensors whose own storage cannot be read, and the forward
        # runs on gathered nn.Parameters that model.parameters() did not list at __enter__.
        class Sharded:
            def to_local(self):
                return self

            def untyped_storage(self):
                raise RuntimeError("Attempted to access the data pointer on an invalid python storage.")

        real = list(self.model.parameters())
        self.model.parameters = lambda: iter([Sharded()] + real)
        offload = self.offload
        with offload:
            offload._depth = 1
            gathered = torch.nn.Parameter(torch.randn(64, 64))
            activation = torch.randn(64, 64)
            packed = [offload.pack(gathered), offload.pack(activation)]
        self.assertIs(packed[0], gathered)
        self.assertIsInstance(packed[1], stream_offload._Offloaded)

    def test_a_tensor_saved_twice_is_copied_once_unless_modified_between(self):
        offload = self.offload
        with offload:
            offload._depth = 1
            x = torch.randn(4, 8, 64)
            before = x.clone()
            view_a, view_b = x.view(-1, 64), x.view(-1, 64)  # what two Linear layers save
            first, second = offload.pack(view_a), offload.pack(view_b)
            x.add_(1)  # a new version: a new copy
            third = offload.pack(x)
        self.assertIs(first, second)
        self.assertIsNot(third, first)
        self.assertEqual((offload.offloaded_tensors, offload.shared_tensors), (2, 1))
        self.assertTrue(torch.equal(offload.unpack(third), x))
        self.assertTrue(torch.equal(offload.unpack(first), before.view(-1, 64)))
        with offload:  # a new forward: nothing is shared across forwards
            offload._depth = 1
            self.assertIsNot(offload.pack(view_a), first)

    def test_a_budget_offloads_the_first_saved_until_the_next_would_pass_it(self):
        offload = common.StreamOffload(self.model, "TinyMLP", min_bytes=1024, device="cpu", max_bytes=3 * 8192)
        tensors = [torch.randn(32, 64) for _ in range(4)]  # 8 KiB each
        for forward in range(2):  # the budget is a forward's: the second offloads as the first did
            with offload:
                offload._depth = 1
                packed = [offload.pack(t) for t in tensors]
            self.assertEqual([isinstance(p, stream_offload._Offloaded) for p in packed], [True, True, True, False],
                             "forward %d" % forward)
            self.assertIs(packed[3], tensors[3])
            for p, t in zip(packed, tensors):
                self.assertTrue(torch.equal(offload.unpack(p), t))
        self.assertEqual((offload.offloaded_tensors, offload.kept_tensors), (6, 2))

    def test_host_buffers_are_pooled(self):
        offload = self.offload
        offload._depth = 1
        with offload:
            offload._depth = 1
            packed = offload.pack(torch.randn(32, 64))
        del packed  # autograd let go of it: the buffer returns to the pool
        with offload:
            offload._depth = 1
            again = offload.pack(torch.randn(32, 64))
        self.assertEqual(offload.pool.allocations, 1)
        del again

    def test_gradients_match_without_offload(self):
        x = torch.randint(0, 50, (2, 10))
        reference = TinyLM()
        reference.load_state_dict(self.model.state_dict())
        reference(x, x).backward()
        with self.offload:
            loss = self.model(x, x)
        loss.backward()
        self.assertGreater(self.offload.offloaded_tensors, 0)
        for a, b in zip(reference.parameters(), self.model.parameters()):
            self.assertTrue(torch.equal(a.grad, b.grad))

    def test_dense_strides(self):
        self.assertEqual(stream_offload._dense_strides(torch.zeros(3, 4)), (4, 1))
        self.assertEqual(stream_offload._dense_strides(torch.zeros(4, 3).t()), (1, 3))
        self.assertEqual(stream_offload._dense_strides(torch.zeros(4, 6)[:, ::2]), (3, 1))


if __name__ == "__main__":
    unittest.main()
