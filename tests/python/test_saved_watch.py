"""actpage_hooks._saved's UnreferencedWatch: when a checkpointed layer's input is held by autograd's
saved copies alone (docs/engine.md, "Unreferenced").

UnreferencedWatchTest drives the watch with stand-ins for the storage use count and weak references
(Debian's torch 1.13 has neither); RealTorchWatchTest runs it on a torch that has them (the GPU
machine's), skipped here. The hooks and the recording sink are test_saved.py's."""
import gc
import threading
import unittest

import helpers  # noqa: F401  (puts the package on sys.path)

import torch

from actpage_hooks import _saved
from test_saved import RecordingSink, WeakStorages, make_hooks


class FakeSaved:
    """A saved tensor as the watch sees it: of the calibrated kind unless told otherwise; `handle`
    names its storage in the stand-in use counts."""

    def __init__(self, handle, requires_grad=True, is_leaf=False, base=None):
        self.handle = handle
        self.requires_grad = requires_grad
        self.is_leaf = is_leaf
        self._base = base


class Packed:
    """Our packed copy (the detached tensor autograd keeps): the test deletes it to free the graph."""


class UnreferencedWatchTest(unittest.TestCase):
    """The watch over stand-in use counts (counts[handle], by default what a storage the job still
    holds counts) with E = 1: an entry is told when its storage counts exactly 1 (our packed copy)
    + 1 (E)."""

    E = 1

    def setUp(self):
        self.counts = {}
        self.told = []
        self.weak = WeakStorages()
        self.watch = self.make_watch()

    def make_watch(self, limit=_saved.UnreferencedWatch.LIMIT):
        watch = _saved.UnreferencedWatch.create(self.told.append, torch, pack=None,
                                                use_count=lambda handle: self.counts.get(handle, 1 + self.E + 1),
                                                weak_storage=self.weak.of,
                                                calibrate=lambda pack, use_count, weak_storage: (self.E, self.E),
                                                limit=limit)
        self.assertIsNotNone(watch)
        self.assertEqual(watch.extra, self.E)
        return watch

    def save(self, handle, address=None, watch=None, **kind):
        """A pack answered 2 for a tensor whose storage is `handle` (address: 1000 + handle): the watch
        is called; returns our packed copy (the caller keeps it alive, as the graph would)."""
        packed = Packed()
        watch = self.watch if watch is None else watch
        watch(FakeSaved(handle, **kind), packed, 1000 + handle if address is None else address)
        return packed

    def test_it_tells_once_only_our_saved_copy_and_E_hold_the_storage(self):
        self.counts[1] = 1 + self.E + 1  # the job still holds the tensor
        first = self.save(1)
        self.counts[2] = 3
        second = self.save(2)  # checks entry 1: the job holds it
        self.assertEqual(self.told, [])
        self.counts[1] = 1 + self.E  # the job dropped it
        third = self.save(3)
        self.assertEqual(self.told, [1001])
        self.save(4)  # told once: the entry is gone
        self.assertEqual(self.told, [1001])
        self.assertEqual(self.watch.watched, 3)
        del first, second, third

    def test_never_while_the_job_holds_one_more_nor_below_the_count(self):
        packed = [self.save(1)]
        for handle, count in enumerate((1 + self.E + 1, 1 + self.E + 5, self.E, 1), start=2):
            self.counts[1] = count
            packed.append(self.save(handle))
            self.assertEqual(self.told, [], count)  # equality only: a lower count is not "free enough"
        self.assertEqual(self.watch.watched, 5)
        del packed

    def test_an_entry_whose_saved_copy_died_is_dropped_untold(self):
        packed = self.save(1)
        del packed  # its graph freed it
        gc.collect()
        self.counts[1] = 1 + self.E  # whatever the count says
        self.save(2)
        self.assertEqual(self.told, [])
        self.assertEqual(self.watch.watched, 1)

    def test_an_entry_whose_storage_is_gone_is_dropped_untold(self):
        packed = self.save(1)
        self.counts[1] = 0
        self.save(2)
        self.assertEqual((self.told, self.watch.watched), ([], 1))
        del packed

    def test_another_threads_entries_are_left_to_that_thread(self):
        packed, saved, go, done = [], threading.Event(), threading.Event(), threading.Event()

        def other_thread():  # alive throughout: its thread id is not this one's
            packed.append(self.save(1))
            saved.set()
            go.wait()
            packed.append(self.save(3))  # its own entry is checked here, on its thread
            done.set()

        thread = threading.Thread(target=other_thread, daemon=True)
        self.addCleanup(go.set)  # a failing assertion must not leave it waiting
        thread.start()
        self.assertTrue(saved.wait(10))
        self.counts[1] = 1 + self.E
        mine = self.save(2)
        self.assertEqual(self.told, [])  # entry 1 is the other thread's
        self.assertEqual(self.watch.watched, 2)
        go.set()
        self.assertTrue(done.wait(10))
        thread.join()
        self.assertEqual(self.told, [1001])
        del mine

    def test_it_keeps_at_most_its_limit_dropping_the_oldest(self):
        watch = self.make_watch(limit=3)
        packed = [self.save(handle, watch=watch) for handle in range(1, 6)]
        self.assertEqual(watch.watched, 3)
        for handle in range(1, 6):
            self.counts[handle] = 1 + self.E
        packed.append(self.save(9, watch=watch))
        self.assertEqual(self.told, [1003, 1004, 1005])  # 1 and 2 were dropped: never told
        del packed

    def test_only_the_calibrated_kind_is_watched(self):
        packed = [self.save(1, is_leaf=True), self.save(2, requires_grad=False), self.save(3, base=object())]
        self.assertEqual(self.watch.watched, 0)
        packed.append(self.save(4))
        self.assertEqual(self.watch.watched, 1)
        del packed

    def test_it_is_not_created_when_the_savers_disagree_or_E_is_unexpected(self):
        def create(measured):
            def calibrate(pack, use_count, weak_storage):
                if isinstance(measured, Exception):
                    raise measured
                return measured

            return _saved.UnreferencedWatch.create(self.told.append, torch, pack=None, use_count=lambda handle: 0,
                                                   weak_storage=self.weak.of, calibrate=calibrate)

        for measured in ((1, 0), (0, 1), (1, None), (None, None), (3, 3), (-1, -1), RuntimeError("no grad")):
            self.assertIsNone(create(measured), measured)
        for extra in (0, 1, 2):
            self.assertEqual(create((extra, extra)).extra, extra)

    def test_it_is_not_created_on_a_torch_without_the_storage_use_count(self):
        if hasattr(torch._C, "_storage_Use_Count"):
            self.skipTest("this torch has it")
        self.assertIsNone(_saved.UnreferencedWatch.create(self.told.append, torch, pack=lambda tensor: None))

    def test_a_sink_with_unreferenced_gets_a_watch_only_where_torch_can_count(self):
        sink = RecordingSink()
        sink.unreferenced = self.told.append
        hooks = _saved.SavedTensorHooks(sink, torch, fast=False, current_stream=lambda index: 0)
        if hasattr(torch._C, "_storage_Use_Count"):
            self.assertIsInstance(hooks.held, _saved.UnreferencedWatch)
        else:
            self.assertIsNone(hooks.held)  # torch 1.13: exactly as before
        self.assertIsNone(_saved.SavedTensorHooks(RecordingSink(), torch, fast=False).held)


@unittest.skipUnless(_saved._storage_watch_functions(torch) is not None,
                     "this torch has no storage use count (torch._C._storage_Use_Count)")
class RealTorchWatchTest(unittest.TestCase):
    """The watch on a torch that can count a storage's users, with real autograd on CPU tensors: a
    pack wrapper plays the library answering 2 for every saved tensor."""

    def watched_pack(self, path):
        hooks = make_hooks(path, RecordingSink())
        told = []
        watch = _saved.UnreferencedWatch.create(told.append, torch, hooks.pack)
        self.assertIsNotNone(watch, "the calibration refused")

        def pack(tensor):
            packed = hooks.pack(tensor)
            watch(tensor, packed[0], tensor.untyped_storage().data_ptr())
            return packed

        return pack, hooks.unpack, watch, told

    def check_paths(self, body):
        for path in ("python",) + (("c",) if _saved._fastsaved is not None else ()):
            with self.subTest(path=path):
                body(path)

    def test_a_saved_input_is_told_only_once_the_job_dropped_it(self):
        def body(path):
            pack, unpack, watch, told = self.watched_pack(path)
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                x = torch.randn(16, requires_grad=True) * 1.0
                address = x.untyped_storage().data_ptr()
                y = x.sin()
                z = (x * 2).sin()  # a pack while the job still holds x: not told
                self.assertNotIn(address, told)
                del x
                w = z.cos()  # the next pack: x is held by sin's saved copy only
                self.assertIn(address, told)
            (y.sum() + w.sum()).backward()

        self.check_paths(body)

    def test_checkpointed_layer_inputs_are_told_after_the_next_layer(self):
        import torch.utils.checkpoint as checkpoint

        def body(path):
            pack, unpack, watch, told = self.watched_pack(path)
            weight = torch.randn(8, 8, requires_grad=True)
            inputs = []
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                h = torch.randn(4, 8, requires_grad=True) * 1.0
                for _ in range(4):
                    inputs.append(h.untyped_storage().data_ptr())
                    h = checkpoint.checkpoint(lambda t: torch.tanh(t @ weight), h, use_reentrant=False)
            self.assertEqual([a for a in inputs[:3] if a in told], inputs[:3])
            self.assertNotIn(inputs[3], told)  # the last layer's: no pack came after the job dropped it
            h.sum().backward()

        self.check_paths(body)


if __name__ == "__main__":
    unittest.main()
