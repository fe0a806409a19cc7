"""Micro-batch identity of backward markers (pipeline parallelism): each outermost forward call gets
an id, and each marker announces the id of the forward call it belongs to just before it is pushed.
Debian's CPU torch; the library's two functions are replaced by recorders."""

import unittest

import helpers  # noqa: F401  (puts python/ on sys.path)
from helpers import RangeRecorder

import torch
from torch import nn

import actpage_hooks
from actpage_hooks import _log, _mode


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x):
        return x + self.mlp(x)


class Stage(nn.Module):
    def __init__(self, width=8, layers=2):
        super().__init__()
        self.layers = nn.ModuleList(Block(width) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class PassRecorder:
    """Stands in for actpage_begin_forward_pass / actpage_set_backward_pass, and logs each id given
    to a marker next to the marker pushed right after it."""

    def __init__(self, ranges):
        self.ranges = ranges
        self.next_id = 100
        self.begun = []
        self.pending = 0
        self.marked = []  # (marker name, forward id)

    def begin(self):
        self.next_id += 1
        self.begun.append(self.next_id)
        return self.next_id

    def set_backward(self, forward_id):
        self.pending = forward_id

    def push(self, name):
        if name.endswith(".backward"):
            self.marked.append((name, self.pending))
            self.pending = 0
        self.ranges.push(name)


class MicroBatchTest(unittest.TestCase):
    def setUp(self):
        actpage_hooks.uninstall()
        _log.reset()
        torch.manual_seed(0)
        self.ranges = RangeRecorder()
        self.passes = PassRecorder(self.ranges)
        actpage_hooks.install(mode=_mode.ON, push=self.passes.push, pop=self.ranges.pop, scope=_mode.ALL,
                              pass_functions=(self.passes.begin, self.passes.set_backward))

    def tearDown(self):
        actpage_hooks.uninstall()

    def test_each_outermost_forward_call_gets_a_new_id(self):
        stage = Stage()
        for _ in range(3):
            stage(torch.randn(2, 8))
        self.assertEqual(self.passes.begun, [101, 102, 103])  # inner modules begin nothing

    def test_markers_carry_their_own_micro_batchs_id_in_a_1f1b_order(self):
        stage = Stage()
        outputs = [stage(torch.randn(2, 8, requires_grad=True)).sum() for _ in range(3)]
        first, second, third = self.passes.begun
        self.passes.marked = []
        outputs[0].backward()  # the oldest micro-batch first, as 1F1B does
        ids = {forward_id for _, forward_id in self.passes.marked}
        self.assertEqual(ids, {first})
        self.assertIn(("layers.1.mlp.backward", first), self.passes.marked)
        outputs.append(stage(torch.randn(2, 8, requires_grad=True)).sum())  # F4 between B1 and B2
        fourth = self.passes.begun[-1]
        for loss, expected in ((outputs[1], second), (outputs[2], third), (outputs[3], fourth)):
            self.passes.marked = []
            loss.backward()
            self.assertTrue(self.passes.marked)
            self.assertEqual({forward_id for _, forward_id in self.passes.marked}, {expected})

    def test_without_markers_no_forward_pass_is_announced(self):
        # python_hooks_backward none (observe mode's default): the ids would serve no marker.
        actpage_hooks.uninstall()
        ranges = RangeRecorder()
        passes = PassRecorder(ranges)
        actpage_hooks.install(mode=_mode.ON, push=passes.push, pop=ranges.pop, scope=_mode.ALL,
                              pass_functions=(passes.begin, passes.set_backward), backward=_mode.NONE)
        Stage()(torch.randn(2, 8, requires_grad=True)).sum().backward()
        self.assertEqual(passes.begun, [])
        self.assertIn("layers.0.mlp", ranges.forward_names())
        self.assertEqual(ranges.backward_names(), [])

    def test_without_the_library_markers_are_pushed_unchanged(self):
        actpage_hooks.uninstall()
        ranges = RangeRecorder()
        actpage_hooks.install(mode=_mode.ON, push=ranges.push, pop=ranges.pop, scope=_mode.ALL,
                              pass_functions=(None, None))
        Stage()(torch.randn(2, 8, requires_grad=True)).sum().backward()
        self.assertIn("layers.0.mlp.backward", ranges.backward_names())


if __name__ == "__main__":
    unittest.main()
