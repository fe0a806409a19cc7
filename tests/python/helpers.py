"""Shared by the python tests: where things are, and a recorder of pushed/popped ranges."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("ACTPAGE_SOURCE_DIR") or os.path.normpath(os.path.join(HERE, os.pardir, os.pardir))
PYTHON_DIR = os.environ.get("ACTPAGE_TEST_PYTHON_DIR") or os.path.join(SOURCE_DIR, "python")
EXAMPLES_DIR = os.path.join(SOURCE_DIR, "examples")
PYTHON = os.environ.get("ACTPAGE_TEST_PYTHON") or sys.executable

for path in (PYTHON_DIR, EXAMPLES_DIR):
    if path not in sys.path:
        sys.path.insert(0, path)


class RangeRecorder:
    """Stands in for torch.cuda.nvtx.range_push/range_pop; checks the nesting as it goes."""

    def __init__(self):
        self.events = []
        self.depth = 0
        self.max_depth = 0
        self.underflows = 0

    def push(self, name):
        self.events.append(("push", name))
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)

    def pop(self):
        self.events.append(("pop", None))
        if self.depth == 0:
            self.underflows += 1
        else:
            self.depth -= 1

    def pushed(self):
        return [name for kind, name in self.events if kind == "push"]

    def forward_names(self):
        return [n for n in self.pushed() if not n.endswith(".backward")]

    def backward_names(self):
        return [n for n in self.pushed() if n.endswith(".backward")]

    def clear(self):
        self.events = []


def clean_environment(extra=None, drop_prefixes=("ACTPAGE_", "PYTHON", "LD_PRELOAD", "NVTX_", "PYTORCH_")):
    """os.environ without anything that would change how a child Python behaves, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop_prefixes)}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env
