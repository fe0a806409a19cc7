"""actpage_hooks._saved: the saved-tensor hooks, over a recording sink, on Debian's CPU torch.

The CPU has no CUDA tensors, so the hooks are driven with tensors that say they are (is_cuda is
what the hooks ask) through a stand-in torch module where needed, and for real with CPU tensors
where autograd's behaviour is the point (cycles, in-place checks, nesting)."""

import gc
import unittest
import weakref

import helpers  # noqa: F401  (puts the package on sys.path)

import torch

import actpage_hooks
from actpage_hooks import _mode, _saved


class RecordingSink:
    """Stands in for the library: records what it is told; `not_back` addresses need a wait,
    `foreign` ones are not the library's."""

    def __init__(self, not_back=(), foreign=()):
        self.events = []
        self.not_back = set(not_back)
        self.foreign = set(foreign)

    def saved(self, address):
        self.events.append(("saved", address))
        return 0 if address in self.foreign else 1

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


class HooksTest(unittest.TestCase):
    def hooks(self, sink):
        hooks = _saved.SavedTensorHooks(sink, torch)
        hooks._stream = lambda index: 1000 + index  # the current stream's raw handle
        return hooks

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

        hooks = self.hooks(Broken())
        tensor = CudaLike(torch.zeros(2))
        self.assertIs(hooks.pack(tensor)[0], tensor)


class DefaultHooksTest(unittest.TestCase):
    """Installed as torch's default hooks, with real autograd (CPU tensors: nothing is reported)."""

    def setUp(self):
        self.sink = RecordingSink()
        self.hooks = _saved.SavedTensorHooks(self.sink, torch).install()
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


if __name__ == "__main__":
    unittest.main()
