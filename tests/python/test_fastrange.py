"""The C forward (actpage_hooks._fastrange): hooked modules entered without a Python frame.

Needs the built package (ACTPAGE_TEST_PYTHON_DIR = <build>/python, set by CTest); skipped where the
extension is not built. The end-to-end test also needs libactpage.so, the fake CUDA libraries of
tests/integration/preload and the CLI (ACTPAGE_TEST_LIBRARY, ACTPAGE_TEST_FAKE_CUDA_PATH,
ACTPAGE_TEST_CLI).
"""

import copy
import inspect
import io
import json
import os
import subprocess
import tempfile
import textwrap
import unittest
from unittest import mock

import helpers  # noqa: F401  (puts python/ on sys.path)
from helpers import PYTHON, PYTHON_DIR, RangeRecorder, clean_environment

import torch
from torch import nn

import actpage_hooks
from actpage_hooks import _hooks, _mode

try:
    from actpage_hooks import _fastrange
except ImportError:
    _fastrange = None

NEEDS_EXTENSION = unittest.skipIf(_fastrange is None, "actpage_hooks._fastrange is not built in %s" % PYTHON_DIR)


class Leaf(nn.Module):
    def __init__(self, fail=False):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.fail = fail

    def forward(self, x, scale=1.0):
        """A leaf's forward."""
        if self.fail:
            raise ValueError("boom")
        return self.linear(x) * scale


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Leaf()
        self.mlp = Leaf()

    def forward(self, x):
        return self.mlp(self.attn(x), scale=0.5)


class Model(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.head = Leaf()

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def fast_modules(model):
    return [m for m in model.modules() if isinstance(m.__dict__.get("forward"), _hooks._FastForward)]


@NEEDS_EXTENSION
class FastForwardTest(unittest.TestCase):
    def setUp(self):
        actpage_hooks.uninstall()
        torch.manual_seed(0)
        self.model = Model()
        self.x = torch.randn(3, 4)
        self.expected = self.model(self.x)

    def tearDown(self):
        actpage_hooks.uninstall()

    def install(self, **kwargs):
        kwargs.setdefault("backward", _mode.NONE)
        return actpage_hooks.install(mode="on", force=True, scope=_mode.BLOCKS, call=_mode.WRAP,
                                     pass_functions=(None, None), **kwargs)

    def counted_call(self, *args):
        before = _fastrange.counters()
        output = self.model(*args)
        after = _fastrange.counters()
        return output, after[0] - before[0], after[1] - before[1]

    def test_modules_that_mark_nothing_are_entered_in_c_with_the_same_results(self):
        hooks = self.install()
        self.model(self.x)  # the first call finds the model and decides
        self.assertTrue(_fastrange.enabled())
        wrapped = fast_modules(self.model)
        # Every wrapped module (the root keeps torch hooks): layers, their children, the head.
        self.assertEqual(len(wrapped), len(hooks.wrapped))
        self.assertEqual(len(wrapped), 2 + 2 * 2 + 1)
        output, fast, fallback = self.counted_call(self.x)
        self.assertTrue(torch.equal(output, self.expected))
        self.assertEqual((fast, fallback), (len(wrapped), 0))

    def test_marked_modules_keep_the_python_wrapper(self):
        recorder = RangeRecorder()
        hooks = self.install(backward=_mode.LAYERS, push=recorder.push, pop=recorder.pop)
        hooks.set_range_functions(None, None)  # NVTX's own functions: the C path may push
        self.model(self.x)
        for layer in self.model.layers:  # layers mark their backward
            self.assertNotIsInstance(layer.__dict__["forward"], _hooks._FastForward)
            self.assertIsInstance(layer.attn.__dict__["forward"], _hooks._FastForward)
        output, fast, fallback = self.counted_call(self.x)
        self.assertTrue(torch.equal(output, self.expected))
        self.assertEqual((fast, fallback), (2 * 2 + 1, 0))

    def test_custom_range_functions_go_through_the_python_wrapper_with_the_same_ranges(self):
        recorder = RangeRecorder()
        self.install(push=recorder.push, pop=recorder.pop)
        self.assertFalse(_fastrange.enabled())
        self.model(self.x)
        recorder.clear()
        output, fast, fallback = self.counted_call(self.x)
        self.assertTrue(torch.equal(output, self.expected))
        self.assertEqual((fast, fallback), (0, 7))
        self.assertEqual(recorder.pushed(), [
            "Model", "layers.0", "layers.0.attn", "layers.0.mlp", "layers.1", "layers.1.attn", "layers.1.mlp", "head"])
        self.assertEqual(recorder.depth, 0)
        # Back to NVTX's functions: the C path takes over.
        actpage_hooks.set_range_functions(None, None)
        self.assertTrue(_fastrange.enabled())
        _, fast, fallback = self.counted_call(self.x)
        self.assertEqual((fast, fallback), (7, 0))

    def test_a_raising_forward_propagates_and_the_next_call_still_works(self):
        self.install()
        self.model.layers[1].mlp.fail = True
        with self.assertRaisesRegex(ValueError, "boom"):
            self.model(self.x)
        self.model.layers[1].mlp.fail = False
        output, fast, _ = self.counted_call(self.x)
        self.assertTrue(torch.equal(output, self.expected))
        self.assertEqual(fast, 7)

    def test_the_c_forward_looks_like_the_bound_method_it_replaces(self):
        self.install()
        self.model(self.x)
        leaf = self.model.layers[0].attn
        forward = leaf.forward
        self.assertIsInstance(forward, _hooks._FastForward)
        self.assertIs(forward.__self__, leaf)
        self.assertIs(forward.__func__, Leaf.forward)
        self.assertEqual(forward.__name__, "forward")
        self.assertEqual(inspect.signature(forward), inspect.signature(Leaf.forward.__get__(leaf)))
        self.assertEqual(str(inspect.signature(forward)), "(x, scale=1.0)")
        self.assertEqual(inspect.unwrap(forward), Leaf.forward.__get__(leaf))
        self.assertIn("Leaf", repr(forward))

    def test_a_deep_copy_gets_its_own_c_forward_and_the_same_results(self):
        self.install()
        self.model(self.x)
        clone = copy.deepcopy(self.model)
        self.assertIs(clone.layers[0].attn.forward.__self__, clone.layers[0].attn)
        self.assertTrue(torch.equal(clone(self.x), self.expected))
        with torch.no_grad():
            for parameter in clone.parameters():
                parameter.add_(1.0)
        self.assertTrue(torch.equal(self.model(self.x), self.expected))  # the original is unchanged

    def test_a_saved_model_loads_without_actpage_forwards(self):
        self.install()
        self.model(self.x)
        buffer = io.BytesIO()
        torch.save(self.model, buffer)
        actpage_hooks.uninstall()
        buffer.seek(0)
        loaded = torch.load(buffer)
        self.assertEqual(fast_modules(loaded), [])
        self.assertTrue(torch.equal(loaded(self.x), self.expected))

    def test_pausing_and_removing_take_the_c_forward_off(self):
        hooks = self.install()
        self.model(self.x)
        actpage_hooks.set_paused(True, set_recording=lambda _: 0)
        self.assertEqual(fast_modules(self.model), [])
        self.assertFalse(_fastrange.enabled())
        actpage_hooks.set_paused(False, set_recording=lambda _: 0)
        self.assertEqual(len(fast_modules(self.model)), len(hooks.wrapped))
        self.assertTrue(_fastrange.enabled())
        actpage_hooks.uninstall()
        self.assertEqual(fast_modules(self.model), [])
        self.assertFalse(_fastrange.enabled())
        self.assertNotIn("forward", self.model.layers[0].__dict__)

    def test_set_fast_switches_between_c_and_python(self):
        hooks = self.install()
        self.model(self.x)
        self.assertFalse(hooks.set_fast(False))
        self.assertEqual(fast_modules(self.model), [])
        self.assertEqual(len(hooks.wrapped), 7)
        output, fast, fallback = self.counted_call(self.x)
        self.assertTrue(torch.equal(output, self.expected))
        self.assertEqual((fast, fallback), (0, 0))
        self.assertTrue(hooks.set_fast(True))
        self.assertEqual(len(fast_modules(self.model)), 7)

    def test_a_dataparallel_replica_runs_its_own_forward(self):
        # nn.DataParallel copies each module's __dict__ into its replicas: the forward must be the
        # replica's, with either wrapper, and removal puts torch's method back.
        seen = []

        class Probe(nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = nn.Linear(4, 4)

            def forward(self, x):
                seen.append(self)
                return self.linear(x)

        class Holder(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([Probe(), Probe()])

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x

        hooks = self.install()
        model = Holder()
        model(self.x)
        for fast in (True, False):
            hooks.set_fast(fast)
            original = model.layers[0]
            self.assertIn(original, hooks.wrapped)
            replica = original._replicate_for_data_parallel()
            self.assertIs(replica.forward.__self__, replica)
            seen.clear()
            replica(self.x)
            self.assertEqual(seen, [replica], "fast %s" % fast)
        patched = nn.Module._replicate_for_data_parallel
        self.assertTrue(getattr(patched, "_actpage_replicate", False))
        actpage_hooks.uninstall()
        self.assertIs(nn.Module._replicate_for_data_parallel, patched.__wrapped__)

    def test_no_stand_in_for_torch_compile_means_the_python_wrapper_for_good(self):
        hooks = self.install()
        self.model(self.x)
        with mock.patch.object(_hooks, "_register_compile_stand_in", return_value="TypeError('no')"), \
                mock.patch("sys.stderr", new_callable=io.StringIO) as stderr:
            hooks._on_dynamo_imported(None)
        self.assertIn("Python wrapper", stderr.getvalue())
        self.assertEqual(fast_modules(self.model), [])
        self.assertFalse(_fastrange.enabled())
        self.assertFalse(hooks.set_fast(True))  # gone for good
        self.assertTrue(torch.equal(self.model(self.x), self.expected))

    def test_the_stand_in_calls_the_class_forward(self):
        leaf = Leaf()
        x = torch.randn(2, 4)
        self.assertTrue(torch.equal(_hooks._in_graph_forward(leaf, x, scale=2.0), leaf.forward(x, scale=2.0)))

    def test_which_torch_can_use_it(self):
        class Compiler:
            def substitute_in_graph(self):
                pass

        def torch_like(**attributes):
            return type("T", (), attributes)()

        self.assertEqual(_hooks.fast_forward_support(_fastrange, torch_like()), "yes")  # no torch.compile
        self.assertIsNone(_hooks.fast_forward_support(_fastrange, torch_like(compile=1, compiler=object())))
        self.assertEqual(_hooks.fast_forward_support(_fastrange, torch_like(compile=1, compiler=Compiler())),
                         "stand-in")
        self.assertIsNone(_hooks.fast_forward_support(False, torch_like()))

    def test_a_call_without_a_module_is_an_error_not_a_crash(self):
        self.install()
        self.model(self.x)
        self.assertTrue(_fastrange.enabled())
        with self.assertRaises(TypeError):  # handed to the Python wrapper, which needs the module
            _fastrange.forward()


E2E_JOB = textwrap.dedent("""
    import ctypes, json, sys
    ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)  # the fake runtime libactpage.so forwards to
    process = ctypes.CDLL(None)
    malloc = process.cudaMalloc
    malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    import torch
    from torch import nn
    import actpage_hooks
    from actpage_hooks import _hooks, _fastrange
    hooks = actpage_hooks.installed()  # by sitecustomize, at `import torch`
    hooks.force = True  # a CPU torch: push anyway

    def allocate(size):
        pointer = ctypes.c_void_p()
        assert malloc(ctypes.byref(pointer), size) == 0

    class Leaf(nn.Module):
        def __init__(self, size, fail=False):
            super().__init__()
            self.size, self.fail, self.linear = size, fail, nn.Linear(2, 2)
        def forward(self, x):
            allocate(self.size)
            if self.fail:
                raise ValueError("boom")
            return self.linear(x)

    class Layer(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.attn, self.mlp = Leaf((1 << 20) + i), Leaf((3 << 20) + i)
        def forward(self, x):
            return self.mlp(self.attn(x))

    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer(i) for i in range(2))
            self.bad = Leaf(5 << 20, fail=True)
        def forward(self, x, fail=False):
            for layer in self.layers:
                x = layer(x)
            if fail:
                self.bad(x)
            return x

    root, x = Root(), torch.zeros(1, 2)
    root(x)
    try:
        root(x, fail=True)
    except ValueError:
        pass
    root(x)
    allocate(7 << 20)  # outside every module
    print(json.dumps({"counters": _fastrange.counters(), "fast": len([m for m in root.modules()
          if isinstance(m.__dict__.get("forward"), _hooks._FastForward)])}))
""")


@NEEDS_EXTENSION
class EndToEndTest(unittest.TestCase):
    """Under the real libactpage.so (NVTX injection, fake driver): allocations made inside C-wrapped
    modules are tagged with the module's name, and a forward that raises pops its range."""

    def test_allocations_are_tagged_by_the_c_forwards_ranges(self):
        library = os.environ.get("ACTPAGE_TEST_LIBRARY")
        fake_path = os.environ.get("ACTPAGE_TEST_FAKE_CUDA_PATH")
        cli = os.environ.get("ACTPAGE_TEST_CLI")
        if not (library and os.path.isfile(library) and fake_path and cli and os.path.isfile(cli)):
            self.skipTest("ACTPAGE_TEST_LIBRARY, ACTPAGE_TEST_FAKE_CUDA_PATH or ACTPAGE_TEST_CLI not set")
        with tempfile.TemporaryDirectory() as scratch:
            trace = os.path.join(scratch, "job.trace")
            env = clean_environment({
                "LD_PRELOAD": library, "NVTX_INJECTION64_PATH": library, "LD_LIBRARY_PATH": fake_path,
                "PYTHONPATH": PYTHON_DIR, "ACTPAGE_TRACE_PATH": trace, "ACTPAGE_PYTHON_HOOKS": "on",
                "ACTPAGE_PYTHON_HOOKS_BACKWARD": "none"})  # no markers: every wrapped module in C
            job = subprocess.run([PYTHON, "-c", E2E_JOB], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True, timeout=240)
            self.assertEqual(job.returncode, 0, job.stderr)
            state = json.loads(job.stdout.strip().splitlines()[-1])
            dump = subprocess.run([cli, "dump", trace, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True, timeout=120)
            self.assertEqual(dump.returncode, 0, dump.stderr)
        summary = json.loads(dump.stdout)
        self.assertEqual(state["fast"], 2 + 2 * 2 + 1)  # layers, their children, bad
        fast_calls, fallback_calls = state["counters"]
        self.assertEqual(fast_calls, 3 * 6 + 1)  # three calls of six modules, one of bad
        self.assertEqual(fallback_calls, 0)  # the root's hooks decided before its children ran
        by_module = {entry["module"]: entry for entry in summary["modules"]}
        for layer in range(2):
            self.assertEqual(by_module["layers.%d.attn" % layer]["bytes"], 3 * ((1 << 20) + layer))
            self.assertEqual(by_module["layers.%d.mlp" % layer]["bytes"], 3 * ((3 << 20) + layer))
        self.assertEqual(by_module["bad"]["bytes"], 5 << 20)
        paths = {entry["module"] for entry in summary["module_paths"]}
        self.assertIn("Root/layers.1/layers.1.mlp", paths)
        self.assertFalse([p for p in paths if "bad/" in p], paths)  # bad's range was popped when it raised
        # The allocation outside every module: untagged, or (torch < 2.1, whose forward hooks have no
        # always_call, so the root's range stays open after a raise) the root's; never bad's.
        outside = summary["allocations"]["untagged"]["bytes"] + by_module.get("Root", {}).get("bytes", 0)
        self.assertEqual(outside, 7 << 20)


if __name__ == "__main__":
    unittest.main()
