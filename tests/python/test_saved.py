"""actpage_hooks._saved: the saved-tensor hooks, over a recording sink, on Debian's CPU torch.

The CPU has no CUDA tensors, so the hooks are driven with tensors that say they are (is_cuda is
what the hooks ask) through a stand-in torch module where needed, and for real with CPU tensors
where autograd's behaviour is the point (cycles, in-place checks, nesting).

The hook tests run once per path (HooksTest and DefaultHooksTest, then their subclasses):
  python   SavedTensorHooks' Python methods (the fallback where the extension is not built);
  c        the C hooks of actpage_hooks._fastsaved calling the sink's Python methods;
  native   the C hooks calling C function pointers, as with the library (ctypes callbacks over the
           recording sink stand in for libactpage.so's functions).
The C paths need the built package (ACTPAGE_TEST_PYTHON_DIR = <build>/python, set by CTest) and are
skipped where the extension is not built.

The unreferenced watch's tests are test_saved_watch.py's."""

import ctypes
import gc
import json
import os
import subprocess
import unittest
import weakref
from unittest import mock

import helpers  # noqa: F401  (puts the package on sys.path)
from helpers import PYTHON, PYTHON_DIR, SOURCE_DIR, clean_environment

import torch

import actpage_hooks
from actpage_hooks import _mode, _saved

NEEDS_EXTENSION = unittest.skipIf(_saved._fastsaved is None,
                                  "actpage_hooks._fastsaved is not built in %s" % PYTHON_DIR)


class RecordingSink:
    """Stands in for the library: records what it is told; `not_back` addresses need a wait,
    `foreign` ones are not the library's, `held` ones are answered 2 (the library's, released once
    unreferenced)."""

    def __init__(self, not_back=(), foreign=(), held=()):
        self.events = []
        self.not_back = set(not_back)
        self.foreign = set(foreign)
        self.held = set(held)

    def saved(self, address):
        self.events.append(("saved", address))
        return 0 if address in self.foreign else 2 if address in self.held else 1

    def unpacking(self, address):
        self.events.append(("unpacking", address))
        return address in self.not_back

    def wait(self, address, stream):
        self.events.append(("wait", address, stream))


class CudaLike:
    """A CPU tensor that the hooks take for a CUDA one (is_cuda, device.index)."""

    class _Device:
        index = 0

    def __init__(self, tensor):
        self.tensor = tensor
        self.is_cuda = True
        self.device = self._Device()
        self._version = 0

    def untyped_storage(self):
        return self.tensor.untyped_storage() if hasattr(self.tensor, "untyped_storage") else self.tensor.storage()

    def storage(self):
        return self.tensor.storage()

    def detach(self):
        return self


SAVED_PROTOTYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_ulonglong)
WAIT_PROTOTYPE = ctypes.CFUNCTYPE(None, ctypes.c_ulonglong, ctypes.c_ulonglong)


def native_functions(sink):
    """C functions (ctypes callbacks) that tell `sink`, typed as the library's."""
    return (SAVED_PROTOTYPE(lambda address: int(sink.saved(address))),
            SAVED_PROTOTYPE(lambda address: int(sink.unpacking(address))),
            WAIT_PROTOTYPE(sink.wait))


def native_sink(sink):
    """A LibrarySink whose addresses are C functions telling `sink` (it keeps them alive)."""
    functions = native_functions(sink)
    addresses = [ctypes.cast(function, ctypes.c_void_p).value for function in functions]
    return _saved.LibrarySink(*functions, addresses=addresses)


def make_hooks(path, sink, current_stream=lambda index: 1000 + index, held=None):
    """SavedTensorHooks over `sink` on one of the paths (the module doc); current_stream stands in
    for the current stream's raw handle; held is what packs answered 2 call."""
    if path == "native":
        sink = native_sink(sink)
    hooks = _saved.SavedTensorHooks(sink, torch, fast=False if path == "python" else _saved._fastsaved,
                                    current_stream=current_stream, held=held)
    assert hooks.fast == (path != "python"), path
    return hooks


class HooksTest(unittest.TestCase):
    path = "python"

    def hooks(self, sink):
        return make_hooks(self.path, sink)

    def test_a_saved_device_tensor_is_reported_by_its_storage_address(self):
        sink = RecordingSink()
        hooks = self.hooks(sink)
        base = torch.zeros(64)
        view = CudaLike(base[16:])  # a view: reported by its storage, the allocation
        packed, version, ours = hooks.pack(view)
        self.assertIs(packed, view)
        self.assertTrue(ours)
        self.assertEqual(sink.events, [("saved", base.storage().data_ptr())])
        self.assertEqual(hooks.saved_count, 1)

    def test_a_host_tensor_is_not_reported(self):
        sink = RecordingSink()
        hooks = self.hooks(sink)
        tensor = torch.ones(4)
        packed = hooks.pack(tensor)
        self.assertTrue(torch.equal(packed[0], tensor))
        self.assertEqual(hooks.unpack(packed).data_ptr(), tensor.data_ptr())
        self.assertEqual(sink.events, [])

    def test_unpacking_waits_only_for_what_is_not_back(self):
        back, away = torch.zeros(8), torch.zeros(8)
        sink = RecordingSink(not_back={away.storage().data_ptr()})
        hooks = self.hooks(sink)
        self.assertIs(hooks.unpack((CudaLike(back), 0, True)).tensor, back)
        self.assertIs(hooks.unpack((CudaLike(away), 0, True)).tensor, away)
        self.assertEqual(sink.events, [("unpacking", back.storage().data_ptr()),
                                       ("unpacking", away.storage().data_ptr()),
                                       ("wait", away.storage().data_ptr(), 1000)])
        self.assertEqual(hooks.waits, 1)

    def test_a_tensor_the_library_does_not_serve_costs_no_call_at_unpack(self):
        mine, theirs = torch.zeros(8), torch.zeros(8)
        sink = RecordingSink(not_back={theirs.storage().data_ptr()}, foreign={theirs.storage().data_ptr()})
        hooks = self.hooks(sink)
        packed_mine, packed_theirs = hooks.pack(CudaLike(mine)), hooks.pack(CudaLike(theirs))
        self.assertEqual((packed_mine[2], packed_theirs[2]), (True, False))
        hooks.unpack(packed_theirs)
        hooks.unpack(packed_mine)
        self.assertEqual(sink.events, [("saved", mine.storage().data_ptr()), ("saved", theirs.storage().data_ptr()),
                                       ("unpacking", mine.storage().data_ptr())])
        self.assertEqual(hooks.waits, 0)

    def test_a_failing_sink_never_reaches_the_job(self):
        class Broken(RecordingSink):
            def saved(self, address):
                raise OSError("library gone")

        if self.path == "native":
            self.skipTest("a C function cannot raise")
        warnings = []
        with mock.patch.object(_saved, "_warn", lambda key, error: warnings.append((key, error))):
            hooks = self.hooks(Broken())
            tensor = CudaLike(torch.zeros(2))
            self.assertEqual(hooks.pack(tensor), (tensor, 0, False))
        self.assertEqual([(key, repr(error)) for key, error in warnings],
                         [("saved-pack", repr(OSError("library gone")))])
        self.assertEqual(hooks.saved_count, 0)

    def test_a_failing_tensor_is_reported_and_goes_through(self):
        class NoStorage(CudaLike):
            def untyped_storage(self):
                raise ValueError("no storage")

            storage = untyped_storage

        sink = RecordingSink()
        warnings = []
        with mock.patch.object(_saved, "_warn", lambda key, error: warnings.append((key, str(error)))):
            hooks = self.hooks(sink)
            tensor = NoStorage(torch.zeros(2))
            self.assertEqual(hooks.pack(tensor), (tensor, 0, False))
            self.assertIs(hooks.unpack((tensor, 0, True)), tensor)
        self.assertEqual(warnings, [("saved-pack", "no storage"), ("saved-unpack", "no storage")])
        self.assertEqual(sink.events, [])

    def test_a_failing_stream_lookup_is_reported_after_the_unpacking_call(self):
        away = torch.zeros(8)
        sink = RecordingSink(not_back={away.storage().data_ptr()})

        def no_stream(index):
            raise RuntimeError("no device %d" % index)

        warnings = []
        with mock.patch.object(_saved, "_warn", lambda key, error: warnings.append((key, str(error)))):
            hooks = make_hooks(self.path, sink, current_stream=no_stream)
            tensor = CudaLike(away)
            self.assertIs(hooks.unpack((tensor, 0, True)), tensor)
        self.assertEqual(warnings, [("saved-unpack", "no device 0")])
        self.assertEqual(sink.events, [("unpacking", away.storage().data_ptr())])
        self.assertEqual(hooks.waits, 0)

    def test_an_interrupt_is_not_swallowed(self):
        class Interrupted(RecordingSink):
            def saved(self, address):
                raise KeyboardInterrupt

        if self.path == "native":
            self.skipTest("a C function cannot raise")
        with self.assertRaises(KeyboardInterrupt):
            self.hooks(Interrupted()).pack(CudaLike(torch.zeros(2)))

    def test_a_changed_tensor_raises_autograds_error_in_the_same_words(self):
        sink = RecordingSink()
        hooks = self.hooks(sink)
        tensor = CudaLike(torch.zeros(2, 3))
        tensor.type = lambda: "torch.cuda.FloatTensor"
        tensor.shape = torch.Size([2, 3])
        packed = hooks.pack(tensor)
        tensor._version = 2
        with self.assertRaises(RuntimeError) as caught:
            hooks.unpack(packed)
        self.assertEqual(str(caught.exception),
                         "one of the variables needed for gradient computation has been modified by an inplace "
                         "operation: [torch.cuda.FloatTensor [2, 3]] is at version 2; expected version 0 instead "
                         "(checked by actpage's saved-tensor hooks, as autograd checks it without hooks)")
        self.assertEqual(sink.events, [("saved", tensor.tensor.storage().data_ptr())])  # no unpacking call

    def held_hooks(self, sink, held):
        return make_hooks(self.path, sink, held=held)

    def test_an_answer_of_2_tells_held_the_tensor_its_saved_copy_and_address(self):
        tensor = CudaLike(torch.zeros(4))
        address = tensor.tensor.storage().data_ptr()
        calls = []
        hooks = self.held_hooks(RecordingSink(held={address}), lambda *arguments: calls.append(arguments))
        packed = hooks.pack(tensor)
        self.assertEqual(packed, (tensor, 0, True))  # ours, as for 1
        self.assertEqual(calls, [(tensor, packed[0], address)])
        self.assertEqual(hooks.saved_count, 1)

    def test_an_answer_of_1_or_0_does_not_call_held(self):
        mine, theirs = CudaLike(torch.zeros(4)), CudaLike(torch.zeros(4))
        calls = []
        hooks = self.held_hooks(RecordingSink(foreign={theirs.tensor.storage().data_ptr()}),
                                lambda *arguments: calls.append(arguments))
        self.assertEqual(hooks.pack(mine)[2], True)
        self.assertEqual(hooks.pack(theirs)[2], False)
        self.assertEqual(hooks.pack(torch.ones(2))[2], False)  # a host tensor: not even asked
        self.assertEqual(calls, [])

    def test_an_answer_of_true_is_1_not_2(self):
        # A Python sink answering True (an int, but 1) is not answering 2.
        class TrueSink(RecordingSink):
            def saved(self, address):
                super().saved(address)
                return True

        if self.path == "native":
            self.skipTest("a C function answers an int")
        calls = []
        hooks = self.held_hooks(TrueSink(), lambda *arguments: calls.append(arguments))
        self.assertEqual(hooks.pack(CudaLike(torch.zeros(4)))[2], True)
        self.assertEqual(calls, [])

    def test_a_failing_held_is_reported_and_the_pack_still_returns_its_tuple(self):
        def broken(tensor, detached, address):
            raise ValueError("watch broken")

        tensor = CudaLike(torch.zeros(4))
        warnings = []
        with mock.patch.object(_saved, "_warn", lambda key, error: warnings.append((key, str(error)))):
            hooks = self.held_hooks(RecordingSink(held={tensor.tensor.storage().data_ptr()}), broken)
            self.assertEqual(hooks.pack(tensor), (tensor, 0, True))
        self.assertEqual(warnings, [("saved-pack", "watch broken")])

    def test_an_interrupt_in_held_is_not_swallowed(self):
        def interrupted(tensor, detached, address):
            raise KeyboardInterrupt

        tensor = CudaLike(torch.zeros(4))
        hooks = self.held_hooks(RecordingSink(held={tensor.tensor.storage().data_ptr()}), interrupted)
        with self.assertRaises(KeyboardInterrupt):
            hooks.pack(tensor)

    def test_an_answer_of_2_is_asked_about_at_unpack(self):
        tensor = CudaLike(torch.zeros(4))
        address = tensor.tensor.storage().data_ptr()
        sink = RecordingSink(held={address}, not_back={address})
        hooks = self.held_hooks(sink, lambda *arguments: None)
        self.assertIs(hooks.unpack(hooks.pack(tensor)), tensor)
        self.assertEqual(sink.events, [("saved", address), ("unpacking", address), ("wait", address, 1000)])

    def test_the_calibration_measures_one_saved_copy_per_saver_through_this_pack(self):
        # The stand-in use count answers 2 for any storage: E = 2 - the live packed copies, which is
        # 1 only when each saver packed its input once, through this path's pack, and the graph kept
        # the packed copy alive while counting.
        hooks = self.hooks(RecordingSink())
        seen = []

        def pack(tensor):
            seen.append((tensor.requires_grad, tensor.is_leaf, tuple(tensor.shape)))
            return hooks.pack(tensor)

        weak = WeakStorages()
        self.assertEqual(_saved.calibrate_unreferenced(torch, pack, lambda handle: 2, weak.of), (1, 1))
        self.assertEqual(seen, [(True, False, (4,))] * 2)
        self.assertEqual(len(weak.made), 2)

    def test_the_hooks_are_freed_with_a_sink_that_holds_them(self):
        sink = RecordingSink()
        hooks = self.hooks(sink)
        sink.hooks = hooks  # a cycle through the C hooks' reference to the sink
        alive = weakref.ref(hooks)
        del hooks, sink
        gc.collect()
        self.assertIsNone(alive())


@NEEDS_EXTENSION
class FastHooksTest(HooksTest):
    path = "c"

    def test_held_must_be_callable(self):
        with self.assertRaises(TypeError):
            _saved._fastsaved.Hooks(lambda a: 1, lambda a: 0, lambda a, s: None, current_stream=lambda i: 0,
                                    warn=lambda k, e: None, held=3)


@NEEDS_EXTENSION
class NativeHooksTest(HooksTest):
    path = "native"


class DefaultHooksTest(unittest.TestCase):
    """Installed as torch's default hooks, with real autograd (CPU tensors: nothing is reported)."""

    path = "python"

    def setUp(self):
        self.sink = RecordingSink()
        self.hooks = make_hooks(self.path, self.sink).install()
        self.addCleanup(self.hooks.remove)

    def test_an_output_saved_by_its_own_node_is_freed_with_its_graph(self):
        # exp saves its result: returned as is from pack, it would hold itself alive through the graph.
        x = torch.randn(1000, requires_grad=True)
        y = torch.exp(x)
        z = y.sum()
        alive = weakref.ref(y)
        del y, z
        gc.collect()
        self.assertIsNone(alive())

    def test_gradients_are_those_of_a_run_without_hooks(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        x = torch.randn(4, 8)
        model(x).exp().sum().backward()
        with_hooks = [p.grad.clone() for p in model.parameters()]
        self.hooks.remove()
        model.zero_grad()
        model(x).exp().sum().backward()
        for a, b in zip(with_hooks, (p.grad for p in model.parameters())):
            self.assertTrue(torch.equal(a, b))

    def test_an_in_place_change_to_a_saved_tensor_is_still_caught(self):
        x = torch.randn(4, requires_grad=True)
        y = torch.exp(x)
        y.add_(1)  # exp's saved result changed: backward must refuse, as without the hooks
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            y.sum().backward()
        a = torch.randn(4, requires_grad=True) * 1
        y = a.sin()  # sin saves its input
        a.add_(1)
        with self.assertRaisesRegex(RuntimeError, "is at version 1; expected version 0"):
            y.sum().backward()

    def test_a_jobs_own_hooks_take_precedence_inside_their_region(self):
        seen = []

        def own_pack(tensor):
            seen.append(tensor.shape)
            return tensor.detach()

        x = torch.randn(3, requires_grad=True)
        packed_before = self.hooks.saved_count
        with torch.autograd.graph.saved_tensors_hooks(own_pack, lambda t: t):
            torch.exp(x).sum().backward()
        self.assertEqual(seen, [torch.Size([3])])
        self.assertEqual(self.hooks.saved_count, packed_before)

    def test_a_saved_tensor_goes_through_pack_and_unpack(self):
        # A CPU tensor: the sink hears nothing, but torch called the pushed hooks (a version check
        # that fails would raise; ours is False: no unpacking call).
        x = torch.randn(5, requires_grad=True)
        torch.exp(x).sum().backward()
        self.assertTrue(torch.allclose(x.grad, torch.exp(x)))
        self.assertEqual(self.sink.events, [])


@NEEDS_EXTENSION
class FastDefaultHooksTest(DefaultHooksTest):
    path = "c"


@NEEDS_EXTENSION
class NativeDefaultHooksTest(DefaultHooksTest):
    path = "native"


class WeakStorages:
    """Stands in for StorageWeakRef: weak references whose handle (cdata) is the tensor's `handle`
    (a FakeSaved), else its storage's address."""

    class Ref:
        def __init__(self, handle):
            self.cdata = handle

    def __init__(self):
        self.made = []

    def of(self, tensor):
        handle = getattr(tensor, "handle", None)
        if handle is None:
            handle = tensor.storage().data_ptr()
        self.made.append(handle)
        return self.Ref(handle)


class NotifiedSink(RecordingSink):
    """A library that is told the hooks are installed and answers whether it uses them."""

    def __init__(self, uses_them):
        super().__init__()
        self.uses_them = uses_them

    def installed(self):
        self.events.append(("installed",))
        return 1 if self.uses_them else 0


class InstallTest(unittest.TestCase):
    def tearDown(self):
        _saved.uninstall()
        actpage_hooks.uninstall()

    def test_the_c_hooks_are_installed_where_built(self):
        hooks = _saved.install(RecordingSink(), torch)
        self.assertEqual(hooks.fast, _saved._fastsaved is not None)

    @NEEDS_EXTENSION
    def test_the_librarys_functions_are_called_by_their_addresses(self):
        # LibrarySink.find() as under libactpage.so, the library's symbols played by ctypes callbacks.
        sink = NotifiedSink(uses_them=True)
        saved, unpacking, wait = native_functions(sink)
        symbols = {"actpage_saved_tensor_hooks_installed": ctypes.CFUNCTYPE(ctypes.c_int)(sink.installed),
                   "actpage_tensor_saved": saved, "actpage_tensor_unpacking": unpacking, "actpage_tensor_wait": wait}
        with mock.patch.object(_mode, "_process_symbol", lambda name, restype, argtypes: symbols.get(name)):
            hooks = _saved.install(torch_module=torch)
        self.assertTrue(hooks.fast)
        self.assertIsNone(hooks._sink.unreferenced)  # a library without it: no watch
        self.assertIsNone(hooks.held)
        self.assertEqual(hooks._sink.addresses,
                         tuple(ctypes.cast(f, ctypes.c_void_p).value for f in (saved, unpacking, wait)))
        tensor = CudaLike(torch.zeros(4))
        self.assertEqual(hooks.pack(tensor), (tensor, 0, True))
        self.assertEqual(sink.events, [("installed",), ("saved", tensor.tensor.storage().data_ptr())])

    def test_the_librarys_unreferenced_is_found_where_exported(self):
        sink = NotifiedSink(uses_them=True)
        told = []
        unreferenced = ctypes.CFUNCTYPE(None, ctypes.c_ulonglong)(told.append)
        symbols = dict(zip(("actpage_tensor_saved", "actpage_tensor_unpacking", "actpage_tensor_wait"),
                           native_functions(sink)))
        symbols["actpage_saved_tensor_hooks_installed"] = ctypes.CFUNCTYPE(ctypes.c_int)(sink.installed)
        symbols["actpage_tensor_unreferenced"] = unreferenced
        with mock.patch.object(_mode, "_process_symbol", lambda name, restype, argtypes: symbols.get(name)):
            found = _saved.LibrarySink.find()
        self.assertIs(found.unreferenced, unreferenced)
        found.unreferenced(77)
        self.assertEqual(told, [77])

    def test_nothing_is_installed_without_the_librarys_entry_points(self):
        self.assertIsNone(_saved.LibrarySink.find())  # no libactpage.so in this process
        self.assertIsNone(_saved.install(torch_module=torch))
        self.assertIsNone(_saved.installed())

    def test_install_over_a_sink_is_idempotent_and_removable(self):
        sink = RecordingSink()
        first = _saved.install(sink, torch)
        self.assertIs(_saved.install(RecordingSink(), torch), first)
        _saved.uninstall()
        self.assertIsNone(_saved.installed())

    def test_the_library_is_told_once_before_the_hooks_are_pushed(self):
        sink = NotifiedSink(uses_them=True)
        hooks = _saved.install(sink, torch)
        self.assertIsNotNone(hooks)
        self.assertIs(_saved.install(sink, torch), hooks)
        self.assertEqual(sink.events, [("installed",)])
        x = torch.randn(3, requires_grad=True)
        torch.exp(x).sum().backward()  # pushed: exp's result went through pack (a CPU tensor: not told)
        self.assertEqual(hooks.saved_count, 0)

    def test_a_library_that_does_not_use_them_gets_no_hooks(self):
        # Observe mode: the library has no engine, the hooks would only cost time.
        sink = NotifiedSink(uses_them=False)
        self.assertIsNone(_saved.install(sink, torch))
        self.assertIsNone(_saved.installed())
        self.assertEqual(sink.events, [("installed",)])

    def test_a_torch_without_default_saved_tensor_hooks_gets_none(self):
        class OldTorch:
            class _C:
                class _autograd:
                    pass

        sink = NotifiedSink(uses_them=True)
        self.assertIsNone(_saved.install(sink, OldTorch))
        self.assertEqual(sink.events, [])  # not even told

    def test_they_come_with_the_module_hooks_only(self):
        sink = NotifiedSink(uses_them=True)
        self.assertIsNone(actpage_hooks.install_saved_tensor_hooks(torch, sink))  # python_hooks off
        self.assertEqual(sink.events, [])
        recorder = helpers.RangeRecorder()
        actpage_hooks.install(mode=_mode.ON, push=recorder.push, pop=recorder.pop)
        self.assertIsNotNone(actpage_hooks.install_saved_tensor_hooks(torch, sink))
        self.assertIs(_saved.installed().__class__, _saved.SavedTensorHooks)

    def test_torch_imported_without_the_library_installs_no_saved_tensor_hooks(self):
        actpage_hooks.on_torch_imported(torch)  # no libactpage.so here: python_hooks resolve to off
        self.assertIsNone(_saved.installed())


LIBRARY_JOB = """
import json
import torch
from actpage_hooks import _saved


class CudaLike:
    is_cuda = True
    _version = 0

    class device:
        index = 0

    def __init__(self):
        self.tensor = torch.zeros(4)

    def untyped_storage(self):
        return self.tensor.storage()

    storage = untyped_storage

    def detach(self):
        return self


sink = _saved.LibrarySink.find()
hooks = _saved.SavedTensorHooks(sink, torch, current_stream=lambda index: 0)
tensor = CudaLike()
packed = hooks.pack(tensor)
back = hooks.unpack((tensor, 0, True))  # as if served: the unpacking call is made
print(json.dumps({"native": hooks._fast.native(), "addresses": len(set(sink.addresses)),
                  "ours": packed[2], "saved_count": hooks.saved_count, "waits": hooks.waits,
                  "back": back is tensor}))
"""


@NEEDS_EXTENSION
class RealLibraryTest(unittest.TestCase):
    def test_the_c_hooks_call_the_preloaded_librarys_functions(self):
        # libactpage.so preloaded without a device (inert): its functions answer 0 for an address it
        # did not serve; what matters is that the C hooks reach them through LibrarySink.find().
        library = os.environ.get("ACTPAGE_TEST_LIBRARY")
        if not (library and os.path.isfile(library)):
            self.skipTest("ACTPAGE_TEST_LIBRARY not set or not built")
        job = subprocess.run([PYTHON, "-c", LIBRARY_JOB], capture_output=True, text=True, timeout=240,
                             env=clean_environment({"LD_PRELOAD": library, "PYTHONPATH": PYTHON_DIR}))
        self.assertEqual(job.returncode, 0, job.stderr)
        state = json.loads(job.stdout.strip().splitlines()[-1])
        self.assertEqual(state, {"native": True, "addresses": 3, "ours": False, "saved_count": 1, "waits": 0,
                                 "back": True})


@NEEDS_EXTENSION
class BenchTest(unittest.TestCase):
    def test_the_benchmark_runs_on_the_cpu(self):
        # bench/python/saved_hooks_bench.py is run by hand on the GPU machine; here only that it runs
        # and prints its table (CPU tensors: the sink is skipped, the figures mean nothing).
        script = os.path.join(SOURCE_DIR, "bench", "python", "saved_hooks_bench.py")
        result = subprocess.run([PYTHON, script, "--device", "cpu", "--ops", "20", "--reps", "2", "--warmup", "0",
                                 "--python-dir", PYTHON_DIR], capture_output=True, text=True, timeout=120,
                                env=clean_environment())
        self.assertEqual(result.returncode, 0, result.stderr)
        for line in ("package: " + os.path.join(PYTHON_DIR, "actpage_hooks"), "\nnone ", "\npython ", "\nc ",
                     "C hooks against Python hooks"):
            self.assertIn(line, result.stdout)


if __name__ == "__main__":
    unittest.main()
