"""actpage_hooks._saved: the saved-tensor hooks come off in forwards the library cannot serve in.

At each outermost module call ModuleHooks calls SavedTensorHooks.forward_begins(), which asks the
library (actpage_saved_tensor_hooks_wanted) and pops ours, or pushes them back, where torch tells
that nothing of the job's is above them (torch 2.x: _top_saved_tensors_default_hooks). Debian's
torch 1.13 lacks that function: TrackedTorch below stands in for a torch that has it, pushing and
popping torch's real stack and keeping a mirror of what went through it (the tests push the job's
own hooks through it too). Real CPU autograd shows which hooks packed what."""

import ctypes
import threading
import unittest
from unittest import mock

import helpers  # noqa: F401  (puts the package on sys.path)

import torch

import actpage_hooks
from actpage_hooks import _mode, _saved


class TrackedAutograd:
    """torch._C._autograd with _top_saved_tensors_default_hooks, over the real stack."""

    def __init__(self):
        self.stack = []

    def _push_saved_tensors_default_hooks(self, pack, unpack):
        torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)
        self.stack.append((pack, unpack))

    def _pop_saved_tensors_default_hooks(self):
        torch._C._autograd._pop_saved_tensors_default_hooks()
        self.stack.pop()

    def _top_saved_tensors_default_hooks(self, ignore_is_tracing):
        assert ignore_is_tracing is True
        return self.stack[-1] if self.stack else None

    def __getattr__(self, name):
        return getattr(torch._C._autograd, name)


class TrackedTorch:
    """torch, but its _C._autograd is a TrackedAutograd."""

    def __init__(self):
        self.autograd = TrackedAutograd()
        outer = self

        class C:
            _autograd = outer.autograd

            def __getattr__(self, name):
                return getattr(torch._C, name)

        self._C = C()

    def __getattr__(self, name):
        return getattr(torch, name)


class ScopedSink:
    """A library whose forwards want the hooks or not (`wanted_now`); counts packs of CPU tensors
    through a spy on the hooks' pack (the sink hears only CUDA tensors)."""

    def __init__(self, wanted_now=True):
        self.wanted_now = wanted_now
        self.asked = 0

    def installed(self):
        return 1

    def wanted(self):
        self.asked += 1
        return 1 if self.wanted_now else 0

    def saved(self, address):
        return 1

    def unpacking(self, address):
        return 0

    def wait(self, address, stream):
        pass


def packs_by_ours(hooks):
    """How many of exp's saved tensors our hooks packed in one forward and backward on the CPU."""
    before = hooks.packs
    x = torch.randn(3, requires_grad=True)
    torch.exp(x).sum().backward()
    return hooks.packs - before


class CountingHooks(_saved.SavedTensorHooks):
    """The Python hooks, counting the packs torch gives them (CPU tensors included)."""

    packs = 0

    def pack(self, tensor):
        type(self).packs += 1
        return super().pack(tensor)


class ScopeTest(unittest.TestCase):
    def setUp(self):
        CountingHooks.packs = 0
        self.torch = TrackedTorch()
        self.sink = ScopedSink()
        self.hooks = CountingHooks(self.sink, self.torch, fast=False).install()

    def tearDown(self):
        self.hooks.remove()
        while self.torch.autograd.stack:  # whatever a failed test left (the job's, or ours)
            self.torch.autograd._pop_saved_tensors_default_hooks()

    def test_they_come_off_in_a_forward_the_library_cannot_serve_in_and_back_on_when_it_can(self):
        self.assertTrue(self.hooks.scoped)
        self.assertEqual(packs_by_ours(self.hooks), 1)
        self.sink.wanted_now = False
        self.hooks.forward_begins()
        self.assertFalse(self.hooks.pushed)
        self.assertEqual(self.torch.autograd.stack, [])
        self.assertEqual(packs_by_ours(self.hooks), 0, "off: torch calls no pack of ours")
        self.hooks.forward_begins()  # still unwanted: nothing changes
        self.assertEqual(self.torch.autograd.stack, [])
        self.sink.wanted_now = True
        self.hooks.forward_begins()
        self.assertTrue(self.hooks.pushed)
        self.assertEqual(len(self.torch.autograd.stack), 1)
        self.assertEqual(packs_by_ours(self.hooks), 1)
        self.assertEqual(self.sink.asked, 3)

    def test_a_jobs_hooks_above_ours_are_never_popped_and_ours_never_pushed_over_them(self):
        def own_pack(tensor):
            return tensor.detach()

        autograd = self.torch.autograd
        autograd._push_saved_tensors_default_hooks(own_pack, lambda t: t)  # e.g. `with save_on_cpu():`
        self.sink.wanted_now = False
        self.hooks.forward_begins()
        self.assertTrue(self.hooks.pushed, "the job's hooks are on top: ours stay under them")
        self.assertEqual([pair[0] for pair in autograd.stack][1:], [own_pack])
        autograd._pop_saved_tensors_default_hooks()
        self.hooks.forward_begins()
        self.assertFalse(self.hooks.pushed)
        autograd._push_saved_tensors_default_hooks(own_pack, lambda t: t)
        self.sink.wanted_now = True
        self.hooks.forward_begins()
        self.assertFalse(self.hooks.pushed, "never over the job's")
        self.assertEqual(packs_by_ours(self.hooks), 0)
        autograd._pop_saved_tensors_default_hooks()
        self.hooks.forward_begins()
        self.assertTrue(self.hooks.pushed)
        self.assertEqual(packs_by_ours(self.hooks), 1)

    def test_only_the_thread_that_installed_them_takes_them_off(self):
        self.sink.wanted_now = False
        worker = threading.Thread(target=self.hooks.forward_begins)
        worker.start()
        worker.join()
        self.assertTrue(self.hooks.pushed)
        self.assertEqual(self.sink.asked, 0)

    def test_a_failing_library_call_is_reported_once_and_ends_the_toggling(self):
        def broken():
            raise OSError("gone")

        self.sink.wanted = broken
        with mock.patch.object(_saved._log, "warn_once") as warn:
            self.hooks.forward_begins()
            self.hooks.forward_begins()
        self.assertEqual(warn.call_count, 1)
        self.assertIn("gone", warn.call_args[0][1])
        self.assertFalse(self.hooks.scoped)
        self.assertTrue(self.hooks.pushed, "they stay as they were")

    def test_after_remove_no_forward_puts_them_back(self):
        self.hooks.remove()
        self.hooks.forward_begins()
        self.assertFalse(self.hooks.pushed)
        self.assertEqual(self.torch.autograd.stack, [])


class UnscopedTest(unittest.TestCase):
    def test_a_torch_without_top_keeps_them_pushed(self):
        sink = ScopedSink(wanted_now=False)
        hooks = _saved.SavedTensorHooks(sink, torch, fast=False).install()  # Debian's 1.13: no _top
        try:
            self.assertFalse(hooks.scoped)
            hooks.forward_begins()
            self.assertTrue(hooks.pushed)
            self.assertEqual(sink.asked, 0)
        finally:
            hooks.remove()

    def test_a_library_without_wanted_keeps_them_pushed(self):
        tracked = TrackedTorch()
        sink = ScopedSink(wanted_now=False)
        sink.wanted = None
        hooks = _saved.SavedTensorHooks(sink, tracked, fast=False).install()
        try:
            self.assertFalse(hooks.scoped)
            hooks.forward_begins()
            self.assertTrue(hooks.pushed)
        finally:
            hooks.remove()

    def test_the_librarys_wanted_is_found_where_exported(self):
        wanted = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
        noop_int = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_ulonglong)(lambda address: 0)
        wait = ctypes.CFUNCTYPE(None, ctypes.c_ulonglong, ctypes.c_ulonglong)(lambda address, stream: None)
        symbols = {"actpage_saved_tensor_hooks_installed": ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 1),
                   "actpage_tensor_saved": noop_int, "actpage_tensor_unpacking": noop_int,
                   "actpage_tensor_wait": wait, "actpage_saved_tensor_hooks_wanted": wanted}
        with mock.patch.object(_mode, "_process_symbol", lambda name, restype, argtypes: symbols.get(name)):
            found = _saved.LibrarySink.find()
        self.assertIs(found.wanted, wanted)
        del symbols["actpage_saved_tensor_hooks_wanted"]
        with mock.patch.object(_mode, "_process_symbol", lambda name, restype, argtypes: symbols.get(name)):
            self.assertIsNone(_saved.LibrarySink.find().wanted)


class ModuleHooksTest(unittest.TestCase):
    def tearDown(self):
        _saved.uninstall()
        actpage_hooks.uninstall()

    def test_each_outermost_forward_asks_once_and_the_hooks_follow_the_answer(self):
        recorder = helpers.RangeRecorder()
        passes = iter(range(1, 100))
        hooks = actpage_hooks.install(mode=_mode.ON, push=recorder.push, pop=recorder.pop,
                                      pass_functions=(lambda: next(passes), lambda forward_pass: None))
        tracked = TrackedTorch()
        sink = ScopedSink()
        saved = actpage_hooks.install_saved_tensor_hooks(tracked, sink)
        self.assertTrue(saved.scoped)
        self.assertEqual(hooks.on_forward_begin, saved.forward_begins)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 4)))
        model(torch.randn(2, 4)).sum().backward()
        self.assertEqual(sink.asked, 1, "one outermost call, one question")
        sink.wanted_now = False
        model(torch.randn(2, 4)).sum().backward()
        self.assertEqual(sink.asked, 2)
        self.assertFalse(saved.pushed)
        self.assertEqual(tracked.autograd.stack, [])
        sink.wanted_now = True
        model(torch.randn(2, 4))
        self.assertTrue(saved.pushed)


if __name__ == "__main__":
    unittest.main()
