"""The module hooks on real nn.Modules (Debian's CPU torch), ranges recorded instead of pushed."""

import contextlib
import copy
import dataclasses
import io
import sys
import unittest

import helpers  # noqa: F401  (puts python/ on sys.path)
from helpers import RangeRecorder

import torch
from torch import nn

import actpage_hooks
from actpage_hooks import _hooks, _log, _mode


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Tiny(nn.Module):
    def __init__(self, width=8, layers=2):
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def completion_order(events):
    """Names in the order their forward ranges were popped."""
    stack, done = [], []
    for kind, name in events:
        if kind == "push":
            stack.append(name)
        else:
            done.append(stack.pop())
    return done


class HookTestCase(unittest.TestCase):
    use_node_prehook = None
    scope = _mode.ALL  # most tests look at every module; BlocksScopeTest covers the default

    def setUp(self):
        actpage_hooks.uninstall()
        _log.reset()
        torch.manual_seed(0)
        self.rec = RangeRecorder()
        self.hooks = actpage_hooks.install(mode=_mode.ON, push=self.rec.push, pop=self.rec.pop,
                                           use_node_prehook=self.use_node_prehook, scope=self.scope)

    def tearDown(self):
        actpage_hooks.uninstall()

    def input(self, rows=5):
        return torch.randn(rows, 4)


class NamesTest(HookTestCase):
    def test_nested_names_are_module_paths_and_root_is_class_name(self):
        model = Tiny()
        model(self.input())
        self.assertEqual(actpage_hooks.module_name(model), "Tiny")
        self.assertEqual(actpage_hooks.module_name(model.layers[1].mlp), "layers.1.mlp")
        self.assertEqual(actpage_hooks.module_name(model.layers[0].mlp.fc2), "layers.0.mlp.fc2")
        self.assertEqual(self.rec.forward_names(), [
            "Tiny", "embed",
            "layers.0", "layers.0.norm", "layers.0.mlp", "layers.0.mlp.fc1", "layers.0.mlp.act", "layers.0.mlp.fc2",
            "layers.1", "layers.1.norm", "layers.1.mlp", "layers.1.mlp.fc1", "layers.1.mlp.act", "layers.1.mlp.fc2",
            "head"])

    def test_module_shared_under_two_paths_keeps_the_first(self):
        class Shared(nn.Module):
            def __init__(self):
                super().__init__()
                self.first = nn.Linear(4, 4)
                self.second = self.first

            def forward(self, x):
                return self.second(self.first(x))

        model = Shared()
        model(self.input())
        self.assertEqual(self.rec.forward_names(), ["Shared", "first", "first"])

    def test_submodule_run_alone_first_gets_its_path_once_the_whole_model_runs(self):
        model = Tiny()
        model.layers[0](torch.randn(2, 8))
        self.assertEqual(self.rec.forward_names()[0], "Block")
        self.rec.clear()
        model(self.input())
        self.assertIn("layers.0.mlp.fc1", self.rec.forward_names())
        self.assertEqual(actpage_hooks.module_name(model.layers[0]), "layers.0")

    def test_names_do_not_keep_modules_alive(self):
        import gc
        import weakref

        model = Tiny()
        model(self.input())
        ref = weakref.ref(model)
        del model
        gc.collect()
        self.assertIsNone(ref())


class PauseTest(HookTestCase):
    def test_paused_hooks_push_nothing_and_the_library_is_told(self):
        model = Tiny()
        told = []
        x = self.input()
        model(x).sum().backward()
        recorded = list(self.rec.events)
        self.assertIn(("push", "layers.0.mlp"), recorded)
        self.rec.clear()
        self.assertTrue(actpage_hooks.set_paused(True, set_recording=told.append))
        paused_loss = model(x).sum()
        paused_loss.backward()
        self.assertEqual(self.rec.events, [])  # no range, no backward marker
        self.assertEqual(told, [0])
        self.assertTrue(actpage_hooks.set_paused(False, set_recording=told.append))
        model(x).sum().backward()
        self.assertEqual(self.rec.events, recorded)  # the same ranges as before the pause
        self.assertEqual(told, [0, 1])

    def test_pausing_changes_no_result(self):
        torch.manual_seed(1)
        model = Tiny()
        x = self.input()
        plain = model(x)
        actpage_hooks.set_paused(True, set_recording=lambda on: None)
        paused = model(x)
        actpage_hooks.set_paused(False, set_recording=lambda on: None)
        self.assertTrue(torch.equal(plain, paused))

    def test_without_hooks_or_library_there_is_nothing_to_pause(self):
        actpage_hooks.uninstall()
        self.assertFalse(actpage_hooks.set_paused(True))  # no libactpage.so in this process
        actpage_hooks.set_paused(False)


class BalanceTest(HookTestCase):
    def test_every_push_is_popped_with_the_right_nesting(self):
        model = Tiny()
        model(self.input()).sum().backward()
        self.assertEqual(self.rec.depth, 0)
        self.assertEqual(self.rec.underflows, 0)
        self.assertEqual(self.rec.max_depth, 4)  # Tiny > layers.0 > mlp > fc1

    def test_inner_forward_that_raises_is_popped_by_its_parent(self):
        class Failing(nn.Module):
            def forward(self, x):
                raise ValueError("boom")

        class Parent(nn.Module):
            def __init__(self):
                super().__init__()
                self.bad = Failing()
                self.good = nn.Linear(4, 4)

            def forward(self, x):
                try:
                    self.bad(x)
                except ValueError:
                    pass
                return self.good(x)

        Parent()(self.input())
        self.assertEqual(self.rec.depth, 0)
        self.assertEqual(self.rec.underflows, 0)

    def test_ranges_still_pushed_without_grad_but_no_backward_markers(self):
        model = Tiny()
        with torch.no_grad():
            model(self.input())
        self.assertEqual(len(self.rec.forward_names()), 15)
        self.assertEqual(self.rec.depth, 0)


class BackwardMarkerTest(HookTestCase):
    def test_markers_fire_in_reverse_order_of_forward_completion(self):
        model = Tiny()
        loss = model(self.input()).sum()
        done = completion_order(self.rec.events)
        self.rec.clear()
        loss.backward()
        self.assertEqual(self.rec.backward_names(), [name + ".backward" for name in reversed(done)])
        self.assertEqual(self.rec.forward_names(), [])
        self.assertEqual(self.rec.depth, 0)  # each marker is pushed and popped at once

    def test_each_forward_call_marks_once_even_with_several_outputs(self):
        class Two(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)
                self.b = nn.Linear(4, 4)

            def forward(self, x):
                a, b = self.a(x), self.b(x)
                return {"a": a, "pair": (a, b)}

        out = Two()(self.input())
        self.rec.clear()
        (out["a"].sum() + out["pair"][1].sum()).backward()
        self.assertEqual(sorted(self.rec.backward_names()), ["Two.backward", "a.backward", "b.backward"])

    def test_outputs_found_in_containers_and_dataclasses(self):
        @dataclasses.dataclass
        class Output:
            loss: torch.Tensor
            logits: torch.Tensor
            extra: object = None

        x = torch.randn(3, requires_grad=True)
        y, z = x * 2, x + 1
        found = _hooks.find_grad_tensors([{"k": (y,)}, Output(loss=z, logits=y), torch.ones(2), None, "s"])
        self.assertEqual([id(t) for t in found], [id(y), id(z), id(y)])
        self.assertEqual(_hooks.find_grad_tensors(x.detach()), [])

    def test_module_called_twice_marks_each_call(self):
        class Twice(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)

            def forward(self, x):
                return self.lin(torch.tanh(self.lin(x)))

        loss = Twice()(self.input()).sum()
        self.rec.clear()
        loss.backward()
        self.assertEqual(self.rec.backward_names(), ["Twice.backward", "lin.backward", "lin.backward"])


class NoBackwardMarkersTest(unittest.TestCase):
    """python_hooks_backward none (what auto gives observe mode): the forward ranges as before and no
    marker in backward, in either scope; the results are unchanged."""

    def run_tiny(self, scope, backward):
        actpage_hooks.uninstall()
        torch.manual_seed(0)
        rec = RangeRecorder()
        hooks = _hooks.ModuleHooks(_mode.ON, push=rec.push, pop=rec.pop, scope=scope, backward=backward).install()
        try:
            model = Tiny()
            x = torch.randn(5, 4)
            out = model(x)
            out.sum().backward()
            return rec, out.detach(), model.layers[0].mlp.fc1.weight.grad.clone()
        finally:
            hooks.remove()

    def test_none_pushes_the_forward_ranges_and_no_marker(self):
        for scope in (_mode.BLOCKS, _mode.ALL):
            marked, marked_out, marked_grad = self.run_tiny(scope, _mode.LAYERS)
            unmarked, out, grad = self.run_tiny(scope, _mode.NONE)
            self.assertTrue(marked.backward_names(), scope)  # the same model marks with layers
            self.assertEqual(unmarked.backward_names(), [], scope)
            self.assertEqual(unmarked.forward_names(), marked.forward_names(), scope)
            self.assertEqual(unmarked.depth, 0, scope)
            self.assertTrue(torch.equal(out, marked_out), scope)
            self.assertTrue(torch.equal(grad, marked_grad), scope)


class BackwardMarkerTensorHookTest(BackwardMarkerTest):
    """The fallback for torch without grad_fn pre-hooks: hooks on the output tensors."""

    use_node_prehook = False


class ResultsUnchangedTest(unittest.TestCase):
    def tearDown(self):
        actpage_hooks.uninstall()

    def run_model(self, model, x):
        out = model(x)
        loss = (out * out).mean()
        loss.backward()
        return loss.detach().clone(), [p.grad.clone() for p in model.parameters()]

    def check_identical(self, make_model, use_node_prehook=None):
        torch.manual_seed(1)
        reference = make_model()
        hooked = copy.deepcopy(reference)
        x = torch.randn(6, 4)
        actpage_hooks.uninstall()
        loss_a, grads_a = self.run_model(reference, x)
        rec = RangeRecorder()
        actpage_hooks.install(mode=_mode.ON, push=rec.push, pop=rec.pop, use_node_prehook=use_node_prehook)
        loss_b, grads_b = self.run_model(hooked, x)
        self.assertGreater(len(rec.backward_names()), 0)
        self.assertTrue(torch.equal(loss_a, loss_b))
        for a, b in zip(grads_a, grads_b):
            self.assertTrue(torch.equal(a, b))

    def test_bit_identical_with_and_without_hooks(self):
        self.check_identical(Tiny)
        self.check_identical(Tiny, use_node_prehook=False)

    def test_inplace_ops_after_hooked_modules_still_work(self):
        class InPlace(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)
                self.relu = nn.ReLU(inplace=True)
                self.out = nn.Linear(4, 4)

            def forward(self, x):
                y = self.lin(x)
                y.mul_(2)          # in place on a hooked module's output
                y = self.relu(y)   # an in-place module right after a hooked one
                z = self.out(y)
                z += 1             # in place on the output of the last module
                return z

        self.check_identical(InPlace)
        self.check_identical(InPlace, use_node_prehook=False)


class FailureTest(unittest.TestCase):
    def tearDown(self):
        actpage_hooks.uninstall()

    def test_a_failing_push_never_breaks_the_job_and_warns_once(self):
        def bad_push(name):
            raise RuntimeError("no NVTX here")

        _log.reset()
        actpage_hooks.install(mode=_mode.ON, push=bad_push, pop=lambda: None)
        model = Tiny()
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            model(torch.randn(2, 4)).sum().backward()
            model(torch.randn(2, 4)).sum().backward()
        self.assertEqual(stderr.getvalue().count("[actpage]"), 1, stderr.getvalue())
        self.assertIn("no NVTX here", stderr.getvalue())
        self.assertFalse(actpage_hooks.installed().active)

    def test_a_failing_marker_is_ignored(self):
        rec = RangeRecorder()
        calls = {"n": 0}

        def push(name):
            if name.endswith(".backward"):
                calls["n"] += 1
                raise RuntimeError("marker")
            rec.push(name)

        _log.reset()
        actpage_hooks.install(mode=_mode.ON, push=push, pop=rec.pop)
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            Tiny()(torch.randn(2, 4)).sum().backward()
        self.assertGreater(calls["n"], 0)
        self.assertEqual(stderr.getvalue().count("[actpage]"), 1)

    def test_without_cuda_and_unforced_the_hooks_turn_themselves_off(self):
        actpage_hooks.install(mode=_mode.ON)
        Tiny()(torch.randn(2, 4)).sum().backward()  # torch.cuda.nvtx would raise on this CPU torch
        hooks = actpage_hooks.installed()
        if torch.cuda.is_available():
            self.skipTest("CUDA present")
        self.assertFalse(hooks.active)
        self.assertIn("CUDA", hooks.disabled_reason)


class ModeTest(unittest.TestCase):
    def tearDown(self):
        actpage_hooks.uninstall()
        for name in ("transformer_engine", "megatron.core"):
            sys.modules.pop(name, None)

    def test_resolution_from_library_and_environment(self):
        self.assertEqual(_mode.resolve(lambda: None, {}), _mode.OFF)
        self.assertEqual(_mode.resolve(lambda: None, {"ACTPAGE_PYTHON_HOOKS": "on"}), _mode.ON)
        self.assertEqual(_mode.resolve(lambda: None, {"ACTPAGE_PYTHON_HOOKS": "auto"}), _mode.OFF)
        self.assertEqual(_mode.resolve(lambda: _mode.OFF, {"ACTPAGE_PYTHON_HOOKS": "on"}), _mode.OFF)
        self.assertEqual(_mode.resolve(lambda: _mode.ON, {}), _mode.ON)
        self.assertEqual(_mode.resolve(lambda: _mode.AUTO, {}), _mode.AUTO)

    def test_library_not_loaded_in_this_process(self):
        self.assertIsNone(_mode.library_mode())

    def test_off_installs_nothing(self):
        self.assertIsNone(actpage_hooks.install(mode=_mode.OFF))
        self.assertIsNone(actpage_hooks.installed())

    def test_on_pushes_even_when_the_job_has_its_own_ranges(self):
        sys.modules["transformer_engine"] = type(sys)("transformer_engine")
        rec = RangeRecorder()
        actpage_hooks.install(mode=_mode.ON, push=rec.push, pop=rec.pop)
        Tiny()(torch.randn(2, 4))
        self.assertGreater(len(rec.pushed()), 0)

    def test_auto_pushes_for_a_plain_job(self):
        rec = RangeRecorder()
        actpage_hooks.install(mode=_mode.AUTO, push=rec.push, pop=rec.pop)
        Tiny()(torch.randn(2, 4))
        self.assertGreater(len(rec.pushed()), 0)

    def test_auto_stays_off_when_megatron_or_transformer_engine_is_imported(self):
        for name in ("transformer_engine", "megatron.core"):
            with self.subTest(module=name):
                actpage_hooks.uninstall()
                sys.modules[name] = type(sys)(name)
                rec = RangeRecorder()
                actpage_hooks.install(mode=_mode.AUTO, push=rec.push, pop=rec.pop)
                Tiny()(torch.randn(2, 4)).sum().backward()
                self.assertEqual(rec.pushed(), [])
                self.assertFalse(actpage_hooks.installed().active)
                sys.modules.pop(name)



class OptionResolutionTest(unittest.TestCase):
    def test_scope_and_backward_come_from_the_library_else_the_environment(self):
        self.assertEqual(_mode.resolve_scope(library=lambda: _mode.ALL, environ={}), _mode.ALL)
        self.assertEqual(_mode.resolve_scope(library=lambda: None, environ={"ACTPAGE_PYTHON_HOOKS_SCOPE": "all"}),
                         _mode.ALL)
        self.assertEqual(_mode.resolve_scope(library=lambda: None, environ={}), _mode.BLOCKS)
        self.assertEqual(_mode.resolve_backward(library=lambda: _mode.HOOKED, environ={}), _mode.HOOKED)
        self.assertEqual(_mode.resolve_backward(library=lambda: _mode.LAYERS,
                                                environ={"ACTPAGE_PYTHON_HOOKS_BACKWARD": "hooked"}), _mode.LAYERS)
        self.assertEqual(_mode.resolve_backward(library=lambda: None,
                                                environ={"ACTPAGE_PYTHON_HOOKS_BACKWARD": " Hooked "}), _mode.HOOKED)
        self.assertEqual(_mode.resolve_backward(library=lambda: None, environ={}), _mode.LAYERS)
        self.assertEqual(_mode.resolve_backward(library=lambda: _mode.NONE, environ={}), _mode.NONE)
        self.assertEqual(_mode.resolve_backward(library=lambda: None,
                                                environ={"ACTPAGE_PYTHON_HOOKS_BACKWARD": "none"}), _mode.NONE)
        # auto needs the library's mode: without the library it falls back to layers.
        self.assertEqual(_mode.resolve_backward(library=lambda: None,
                                                environ={"ACTPAGE_PYTHON_HOOKS_BACKWARD": "auto"}), _mode.LAYERS)
        self.assertEqual(_mode.resolve_call(library=lambda: None, environ={}), _mode.WRAP)
        self.assertEqual(_mode.resolve_call(library=lambda: None, environ={"ACTPAGE_PYTHON_HOOKS_CALL": "hooks"}),
                         _mode.HOOKS)
        self.assertEqual(_mode.resolve_call(library=lambda: _mode.WRAP,
                                            environ={"ACTPAGE_PYTHON_HOOKS_CALL": "hooks"}), _mode.WRAP)
        # Without libactpage.so in this process the library has no answer.
        self.assertIsNone(_mode.library_backward())


class BlocksScopeTest(unittest.TestCase):
    """The default scope: the model, modules with children, each layer's direct children and modules
    a policy rule names get hooks; other leaves keep torch's fast path. Run with each way of entering
    a hooked module (python_hooks_call): the ranges and markers must not depend on it."""

    call = _mode.HOOKS

    def install(self, rule_matches=None, backward=None):
        actpage_hooks.uninstall()
        _log.reset()
        torch.manual_seed(0)
        self.rec = RangeRecorder()
        self.hooks = _hooks.ModuleHooks(_mode.ON, push=self.rec.push, pop=self.rec.pop, scope=_mode.BLOCKS,
                                        rule_matches=rule_matches, backward=backward, call=self.call).install()

    def tearDown(self):
        self.hooks.remove()

    def test_a_failing_name_lookup_runs_the_module_without_its_range(self):
        # The wrapper's fast path does the pre-hook's work inline: a failure there (here the name
        # lookup of a module that lost its cached name) must still run the module, unchanged, and
        # leave every other range balanced.
        self.install()
        model = Tiny()
        x = torch.randn(5, 4)
        model(x)  # names and hooks the tree
        expected = model(x)
        self.rec = RangeRecorder()
        self.hooks.set_range_functions(self.rec.push, self.rec.pop)
        del model.layers[1].mlp.__dict__[_hooks._NAME_ATTR]

        def broken_name_of(module):
            raise RuntimeError("no name")

        self.hooks.name_of = broken_name_of
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            out = model(x)
        self.assertTrue(torch.equal(out, expected))
        self.assertEqual(self.rec.forward_names(), ["Tiny", "layers.0", "layers.0.norm", "layers.0.mlp", "layers.1",
                                                    "layers.1.norm"])
        self.assertEqual((self.rec.depth, self.rec.underflows), (0, 0))
        self.assertIn("no name", stderr.getvalue())

    def test_layers_and_their_children_are_named_leaves_below_are_not(self):
        self.install(backward=_mode.HOOKED)
        Tiny()(torch.randn(5, 4)).sum().backward()
        self.assertEqual(self.rec.forward_names(), [
            "Tiny", "layers.0", "layers.0.norm", "layers.0.mlp", "layers.1", "layers.1.norm", "layers.1.mlp"])
        self.assertEqual(self.rec.backward_names(), [
            "Tiny.backward", "layers.1.backward", "layers.1.mlp.backward", "layers.1.norm.backward",
            "layers.0.backward", "layers.0.mlp.backward", "layers.0.norm.backward"])

    def test_by_default_only_the_model_its_layers_and_rule_matches_mark_backward(self):
        self.install()
        Tiny()(torch.randn(5, 4)).sum().backward()
        # Forward ranges as with every marker; backward markers for the model and each layer.
        self.assertEqual(self.rec.forward_names(), [
            "Tiny", "layers.0", "layers.0.norm", "layers.0.mlp", "layers.1", "layers.1.norm", "layers.1.mlp"])
        self.assertEqual(self.rec.backward_names(), ["Tiny.backward", "layers.1.backward", "layers.0.backward"])
        # A module a policy rule selects marks its own backward (the engine reloads by it).
        self.install(rule_matches=lambda name: name.endswith(".mlp"))
        Tiny()(torch.randn(5, 4)).sum().backward()
        self.assertEqual(self.rec.backward_names(), [
            "Tiny.backward", "layers.1.backward", "layers.1.mlp.backward", "layers.0.backward",
            "layers.0.mlp.backward"])

    def test_a_module_a_policy_rule_names_is_hooked_even_as_a_leaf(self):
        self.install(rule_matches=lambda name: name.endswith(".fc1"))
        Tiny()(torch.randn(5, 4))
        names = self.rec.forward_names()
        self.assertIn("layers.0.mlp.fc1", names)
        self.assertIn("layers.1.mlp.fc1", names)
        self.assertNotIn("layers.0.mlp.fc2", names)

    def test_the_discovery_hook_goes_once_the_model_is_found(self):
        from torch.nn.modules import module as module_mod

        self.install()
        model = Tiny()
        before = len(module_mod._global_forward_pre_hooks)
        model(torch.randn(5, 4))
        self.assertEqual(len(module_mod._global_forward_pre_hooks), before - 1)
        # Later steps push the same ranges through the per-module hooks alone.
        first = self.rec.forward_names()
        self.rec.events.clear()
        model(torch.randn(5, 4))
        self.assertEqual(self.rec.forward_names(), first)

    def test_a_lone_leaf_called_first_does_not_end_the_search(self):
        self.install()
        model = Tiny()
        model.embed(torch.randn(5, 4))  # a leaf on its own: not the model
        model(torch.randn(5, 4))
        self.assertEqual(self.rec.forward_names()[0], "Tiny")

    def test_results_are_bit_identical(self):
        torch.manual_seed(0)
        model = Tiny()
        x = torch.randn(5, 4)
        plain = model(x)
        plain.sum().backward()
        plain_grad = model.embed.weight.grad.clone()
        model.zero_grad()
        self.install()
        hooked = model(x)
        hooked.sum().backward()
        self.assertTrue(torch.equal(plain, hooked))
        self.assertTrue(torch.equal(plain_grad, model.embed.weight.grad))

    def test_a_deep_copy_runs_its_own_parameters(self):
        self.install()
        model = Tiny()
        x = torch.randn(5, 4)
        model(x)
        twin = copy.deepcopy(model)
        self.rec.events.clear()
        with torch.no_grad():
            for parameter in twin.parameters():
                parameter.add_(1.0)
        self.assertFalse(torch.equal(model(x), twin(x)))
        self.assertEqual(self.rec.forward_names()[-7:], [
            "Tiny", "layers.0", "layers.0.norm", "layers.0.mlp", "layers.1", "layers.1.norm", "layers.1.mlp"])
        twin(x).sum().backward()
        self.assertIsNone(model.layers[0].mlp.fc1.weight.grad)
        self.assertIsNotNone(twin.layers[0].mlp.fc1.weight.grad)

    def test_a_pickled_model_loads_and_runs(self):
        self.install()
        model = Tiny()
        x = torch.randn(5, 4)
        expected = model(x)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        try:
            loaded = torch.load(buffer, weights_only=False)
        except TypeError:  # torch < 1.13 has no weights_only
            buffer.seek(0)
            loaded = torch.load(buffer)
        self.assertTrue(torch.equal(loaded(x), expected))

    def test_a_pause_takes_the_hooks_off_and_a_resume_puts_them_back(self):
        self.install()
        model = Tiny()
        x = torch.randn(5, 4)
        model(x).sum().backward()
        recorded = list(self.rec.events)
        self.hooks.set_paused(True)
        self.rec.events.clear()
        paused = model(x)
        paused.sum().backward()
        self.assertEqual(self.rec.events, [])
        for module in model.modules():  # the modules run as if never hooked
            self.assertNotIn("forward", module.__dict__)
            self.assertEqual(len(module._forward_pre_hooks), 0)
            self.assertEqual(len(module._forward_hooks), 0)
        self.hooks.set_paused(False)
        self.hooks.set_paused(False)  # twice: no second set of hooks
        resumed = model(x)
        resumed.sum().backward()
        self.assertEqual(self.rec.events, recorded)
        self.assertTrue(torch.equal(paused, resumed))

    def test_a_model_found_while_paused_is_hooked_on_resume(self):
        self.install()
        self.hooks.set_paused(True)
        model = Tiny()
        model(torch.randn(5, 4))
        self.assertEqual(self.rec.events, [])
        self.hooks.set_paused(False)
        model(torch.randn(5, 4))
        self.assertEqual(self.rec.forward_names(), [
            "Tiny", "layers.0", "layers.0.norm", "layers.0.mlp", "layers.1", "layers.1.norm", "layers.1.mlp"])

    def test_an_inner_forward_that_raises_leaves_the_ranges_balanced(self):
        class Failing(nn.Module):
            def forward(self, x):
                raise ValueError("boom")

        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.bad = Failing()
                self.good = nn.Linear(4, 4)

            def forward(self, x):
                try:
                    self.bad(x)
                except ValueError:
                    pass
                return self.good(x)

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([Layer(), Layer()])

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x

        self.install()
        model = Model()
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
        self.assertIn("layers.1.bad", self.rec.forward_names())
        self.assertEqual(self.rec.depth, 0)
        self.assertEqual(self.rec.underflows, 0)


class BlocksScopeWrapTest(BlocksScopeTest):
    """python_hooks_call wrap: hooked modules are entered through a forward wrapper on the instance."""

    call = _mode.WRAP

    def test_wrapped_modules_have_no_torch_hooks_and_the_root_keeps_its_hooks(self):
        self.install()
        model = Tiny()
        model(torch.randn(5, 4))
        mlp = model.layers[0].mlp
        self.assertIn("forward", mlp.__dict__)
        self.assertEqual(len(mlp._forward_pre_hooks), 0)
        self.assertEqual(len(mlp._forward_hooks), 0)
        self.assertNotIn("forward", model.__dict__)  # the root: found during its own first call
        self.assertEqual(len(model._forward_pre_hooks), 1)
        self.assertNotIn("forward", model.layers[0].mlp.fc1.__dict__)  # an unhooked leaf

    def test_the_forward_keeps_its_signature_for_inspect(self):
        import inspect

        class Keywords(nn.Module):
            def forward(self, x, scale=2.0, *, shift=None):
                return x * scale

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([Keywords()])

            def forward(self, x):
                return self.layers[0](x, scale=3.0)

        self.install()
        model = Model()
        plain = inspect.signature(model.layers[0].forward)
        model(torch.randn(2, 4))
        self.assertIn("forward", model.layers[0].__dict__)
        self.assertEqual(inspect.signature(model.layers[0].forward), plain)
        self.assertEqual(str(plain), "(x, scale=2.0, *, shift=None)")

    def test_a_deep_copy_is_bound_to_itself(self):
        self.install()
        model = Tiny()
        model(torch.randn(5, 4))
        twin = copy.deepcopy(model)
        self.assertIs(twin.layers[0].mlp.forward.__self__, twin.layers[0].mlp)

    def test_removal_restores_the_class_forward(self):
        self.install()
        model = Tiny()
        model(torch.randn(5, 4))
        self.assertGreater(len(self.hooks.wrapped), 0)
        self.hooks.remove()
        for module in model.modules():
            self.assertNotIn("forward", module.__dict__)
        self.rec.events.clear()
        model(torch.randn(5, 4))
        self.assertEqual(self.rec.events, [])

    def test_a_forward_replaced_on_the_instance_keeps_it_and_gets_hooks(self):
        model = Tiny()
        mlp = model.layers[1].mlp
        calls = []
        original = mlp.forward

        def replaced(x):  # what accelerate's add_hook_to_module does
            calls.append(1)
            return original(x)

        mlp.forward = replaced
        self.install()
        model(torch.randn(5, 4))
        self.assertIs(mlp.forward, replaced)
        self.assertEqual(len(calls), 1)
        self.assertEqual(len(mlp._forward_pre_hooks), 1)
        self.assertIn("layers.1.mlp", self.rec.forward_names())


if __name__ == "__main__":
    unittest.main()
