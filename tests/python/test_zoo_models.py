"""The zoo's jobs on common.train's loop, on the CPU with --tiny: the Hugging Face Llama jobs
(gpu_bound_llama.py, long_context.py: pure-torch stand-ins here), the two MoE router families
(qwen3_moe.py, deepseek_moe.py and moe_model.py's dispatch) and torchvision's ResNet (resnet.py).
Every method must give the loss bits of --method none (fp32 on the CPU: bit-identical)."""

import unittest

import torch
import torch.nn.functional as F

import test_zoo as zoo  # the helpers (a module import: its tests are not collected twice)

import gpu_bound_llama  # noqa: E402  (examples/zoo is on sys.path through test_zoo)
import long_context  # noqa: E402
import qwen3_moe  # noqa: E402
import deepseek_moe  # noqa: E402
import moe_model  # noqa: E402
import tiny_models  # noqa: E402
import zoo_common  # noqa: E402

OFFLOAD_EVERYTHING = ["--offload-min-bytes", "1KiB"]  # tiny tensors: offload them all


class MethodsGiveTheSameLossesMixin:
    module = None
    job = None
    extra = []
    methods = ("checkpointing", "save_on_cpu", "stream_offload")

    def test_result_is_complete_and_two_runs_repeat_bit_for_bit(self):
        first = zoo.run_main(self.module, "--deterministic", *self.extra)
        second = zoo.run_main(self.module, "--deterministic", *self.extra)
        zoo.check_result(self, first, self.job)
        self.assertTrue(first["deterministic"])
        self.assertEqual(first["losses"], second["losses"])
        other_seed = zoo.run_main(self.module, "--deterministic", "--seed", "6", *self.extra)
        self.assertNotEqual(first["losses"], other_seed["losses"])
        plain = zoo.run_main(self.module, *self.extra)
        self.assertFalse(plain["deterministic"])
        self.assertEqual(plain["loss_tolerance"], zoo_common.NONDETERMINISTIC_LOSS_TOLERANCE)

    def test_every_method_gives_the_losses_of_none(self):
        reference = zoo.run_main(self.module, *self.extra)
        for method in self.methods:
            with self.subTest(method=method):
                result = zoo.run_main(self.module, "--method", method, *(OFFLOAD_EVERYTHING + self.extra))
                self.assertEqual(result["method"], method)
                self.assertEqual(result["losses"], reference["losses"])
                if method == "stream_offload":
                    stats = result["stream_offload"]
                    self.assertGreater(stats["offloaded_tensors"], 0, stats)
                    self.assertGreaterEqual(stats["reloaded_tensors"], stats["offloaded_tensors"])


class GpuBoundLlamaTest(MethodsGiveTheSameLossesMixin, unittest.TestCase):
    module = gpu_bound_llama
    job = "gpu_bound_llama"

    def test_defaults_are_the_gpu_sizes_and_tiny_is_a_stand_in(self):
        args = gpu_bound_llama.parse_args([])
        self.assertEqual((args.hidden, args.ffn, args.layers, args.heads, args.seq, args.batch),
                         (4096, 11008, 8, 32, 4096, 2))
        result = zoo.run_main(gpu_bound_llama)
        self.assertIn("stand-in", result["config"]["model"])
        model, _ = zoo_common.build_llama(gpu_bound_llama.parse_args(["--tiny"]), torch.device("cpu"), torch.float32)
        offload_matches = [type(m).__name__ for m in model.modules() if "MLP" in type(m).__name__]
        self.assertEqual(offload_matches, ["TinyLlamaMLP"] * 2)


class LongContextTest(MethodsGiveTheSameLossesMixin, unittest.TestCase):
    module = long_context
    job = "long_context"
    methods = ("save_on_cpu", "stream_offload")

    def test_checkpointing_is_the_default_and_can_be_turned_off(self):
        args = long_context.parse_args([])
        self.assertEqual((args.seq, args.batch, args.no_checkpointing, args.loss_chunk), (32768, 1, False, 4096))
        on = zoo.run_main(long_context)
        self.assertTrue(on["checkpointing"])
        self.assertIn("default", on["config"]["checkpointing"])
        off = zoo.run_main(long_context, "--no-checkpointing")
        self.assertFalse(off["checkpointing"])
        self.assertEqual(off["losses"], on["losses"])
        failed, message = zoo.parse_fails(long_context.parse_args, ["--method", "checkpointing"])
        self.assertTrue(failed)

    def test_the_chunked_loss_is_the_models_own_loss(self):
        torch.manual_seed(0)
        model = tiny_models.tiny_llama(vocab=40, hidden=16, ffn=32, layers=2, heads=2)
        ids = torch.randint(0, 40, (2, 23))
        batch = {"input_ids": ids, "labels": ids}
        whole = zoo_common.causal_lm_loss(model, batch)
        whole.backward()
        reference = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        chunked = long_context.chunked_causal_lm_loss(5)(model, batch)  # 22 positions: chunks of 5, 5, 5, 5, 2
        chunked.backward()
        self.assertTrue(torch.allclose(chunked, whole, rtol=1e-6, atol=0), (chunked, whole))
        for a, b in zip(reference, [p.grad for p in model.parameters()]):
            self.assertTrue(torch.allclose(a, b, rtol=1e-4, atol=1e-7))
        # The whole-logits path stays available, within rounding of the chunked one.
        unchunked = zoo.run_main(long_context, "--loss-chunk", "0")
        chunks = zoo.run_main(long_context)
        for a, b in zip(unchunked["loss_values"], chunks["loss_values"]):
            self.assertAlmostEqual(a / b, 1.0, delta=1e-6)


class Qwen3MoeTest(MethodsGiveTheSameLossesMixin, unittest.TestCase):
    module = qwen3_moe
    job = "qwen3_moe"

    def test_the_stand_in_routes_with_softmax_and_matches_the_offload_default(self):
        result = zoo.run_main(qwen3_moe)
        self.assertIn("softmax", result["config"]["router"])
        model, _ = qwen3_moe.build_model(qwen3_moe.parse_args(["--tiny"]), torch.device("cpu"), torch.float32)
        blocks = [m for m in model.modules() if "SparseMoeBlock" in type(m).__name__]
        self.assertEqual(len(blocks), 2)
        self.assertIsInstance(blocks[0].router, moe_model.SoftmaxTopKRouter)


class DeepSeekMoeTest(MethodsGiveTheSameLossesMixin, unittest.TestCase):
    module = deepseek_moe
    job = "deepseek_moe"

    def test_defaults(self):
        args = deepseek_moe.parse_args([])
        self.assertEqual((args.layers, args.hidden, args.experts, args.top_k, args.shared_experts, args.seq),
                         (8, 1024, 32, 6, 1, 4096))
        failed, _ = zoo.parse_fails(deepseek_moe.parse_args, ["--top-k", "40"])
        self.assertTrue(failed)


class MoeModelTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(3)
        self.experts = torch.nn.ModuleList(moe_model.SwiGLU(8, 12) for _ in range(5))
        self.tokens = torch.randn(11, 8)

    def test_dispatch_by_sort_and_index_equals_a_loop_over_tokens(self):
        chosen = torch.stack([torch.randperm(5)[:3] for _ in range(11)])
        gates = torch.rand(11, 3)
        got = moe_model.dispatch_and_combine(self.tokens, chosen, gates, self.experts)
        expected = torch.stack([sum(gates[t, j] * self.experts[int(chosen[t, j])](self.tokens[t:t + 1])[0]
                                    for j in range(3)) for t in range(11)])
        self.assertTrue(torch.allclose(got, expected, atol=1e-6), (got - expected).abs().max())

    def test_an_expert_nobody_chose_gets_no_gradient_and_the_others_do(self):
        chosen = torch.tensor([[0, 1]] * 6 + [[1, 2]] * 5)
        gates = torch.rand(11, 2, requires_grad=True)
        moe_model.dispatch_and_combine(self.tokens, chosen, gates, self.experts).sum().backward()
        self.assertIsNone(self.experts[4].up_proj.weight.grad)
        self.assertIsNotNone(self.experts[2].up_proj.weight.grad)
        self.assertIsNotNone(gates.grad)

    def test_sigmoid_router_selects_with_the_bias_and_gates_without_it(self):
        router = moe_model.SigmoidTopKRouter(8, 5, 2, scaling=2.5, balance_alpha=0.0)
        chosen, gates, aux = router(self.tokens, batch=1)
        scores = torch.sigmoid(F.linear(self.tokens, router.weight))
        self.assertTrue(torch.equal(chosen, torch.topk(scores, 2, dim=-1).indices))
        self.assertTrue(torch.allclose(gates.sum(-1), torch.full((11,), 2.5)))
        self.assertIsNone(aux)
        router.selection_bias[3] = 10.0  # steers every token to expert 3, gates still from the scores
        chosen, gates, _ = router(self.tokens, batch=1)
        self.assertTrue(bool((chosen == 3).any(-1).all()))
        picked = scores.gather(1, chosen)
        self.assertTrue(torch.allclose(gates, picked / picked.sum(-1, keepdim=True) * 2.5))

    def test_sequence_balance_loss_is_one_when_balanced_and_more_when_not(self):
        experts, top_k, seq = 4, 2, 8
        uniform = torch.full((seq, experts), 0.5)
        balanced = torch.tensor([[0, 1], [2, 3]] * 4)
        self.assertAlmostEqual(float(moe_model.sequence_balance_loss(uniform, balanced, 1, experts, top_k)), 1.0,
                               places=6)
        skewed_scores = torch.tensor([[0.9, 0.9, 0.1, 0.1]] * seq)
        skewed = torch.tensor([[0, 1]] * seq)
        self.assertGreater(float(moe_model.sequence_balance_loss(skewed_scores, skewed, 1, experts, top_k)), 1.5)

    def test_softmax_router_renormalises_the_chosen_gates(self):
        router = moe_model.SoftmaxTopKRouter(8, 5, 3)
        chosen, gates, aux = router(self.tokens, batch=1)
        self.assertTrue(torch.allclose(gates.sum(-1), torch.ones(11)))
        self.assertIsNone(aux)
        probabilities = torch.softmax(F.linear(self.tokens, router.weight), -1)
        self.assertTrue(torch.equal(chosen, torch.topk(probabilities, 3, dim=-1).indices))

    def test_the_deepseek_model_trains_its_router_and_shared_expert_deterministically(self):
        torch.use_deterministic_algorithms(True)
        grads = []
        for _ in range(2):
            torch.manual_seed(1)
            model = moe_model.deepseek_moe(vocab=30, hidden=16, layers=2, heads=2, experts=4, top_k=2, expert_ffn=8,
                                           shared_experts=1)
            ids = torch.randint(0, 30, (2, 9))
            model(ids, labels=ids).loss.backward()
            grads.append([p.grad for p in model.parameters()])
            block = model.model.layers[0].mlp
            self.assertIsInstance(block, moe_model.DeepSeekMoEBlock)
            self.assertIsNotNone(block.router.weight.grad)
            self.assertIsNotNone(block.shared_expert.down_proj.weight.grad)
        for a, b in zip(*grads):
            self.assertTrue((a is None and b is None) or torch.equal(a, b))


class ResNetTest(MethodsGiveTheSameLossesMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import resnet

        cls.module = resnet
        cls.job = "resnet"

    def test_torchvisions_bottleneck_with_in_place_ops_and_the_pooling_each_mode_uses(self):
        from torchvision.models.resnet import Bottleneck

        args = self.module.parse_args(["--tiny"])
        model, config = self.module.build_resnet(args, torch.device("cpu"))
        blocks = [m for m in model.modules() if isinstance(m, Bottleneck)]
        self.assertEqual(len(blocks), 4)
        self.assertTrue(all(block.relu.inplace for block in blocks))
        self.assertIsInstance(model.net.avgpool, torch.nn.AdaptiveAvgPool2d)
        self.assertEqual(config["global_pool"], "AdaptiveAvgPool2d(1)")
        deterministic, config = self.module.build_resnet(self.module.parse_args(["--tiny", "--deterministic"]),
                                                         torch.device("cpu"))
        self.assertIn("mean", config["global_pool"])
        x = torch.randn(2, 2048, 3, 3)
        self.assertTrue(torch.allclose(deterministic.net.avgpool(x), torch.nn.AdaptiveAvgPool2d(1)(x), atol=1e-6))
        defaults = self.module.parse_args([])
        self.assertEqual((defaults.blocks, defaults.image, defaults.batch, defaults.classes),
                         ([3, 4, 6, 3], 224, 256, 1000))

    def test_checkpointing_is_per_block_and_bad_arguments_are_errors(self):
        result = zoo.run_main(self.module, "--method", "checkpointing")
        self.assertIn("per Bottleneck block", result["config"]["checkpointing"])
        for argv in (["--dtype", "fp16"], ["--blocks", "3,4,6"], ["--blocks", "a,b,c,d"]):
            failed, _ = zoo.parse_fails(self.module.parse_args, argv)
            self.assertTrue(failed, argv)


if __name__ == "__main__":
    unittest.main()
