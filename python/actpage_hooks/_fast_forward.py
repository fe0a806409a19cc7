"""The C forward's Python side: _FastForward (a hooked module's forward entered through
_fastrange.forward, dressed as the bound method it replaces), the stand-in torch.compile traces in its
place, and rebinding an instance forward of ours to a module's replica.

Apart from _hooks.py (ModuleHooks, which decides where each is used) so that each file can be read in
one sitting; _hooks.py re-exports these names, where tests and examples reach them.
"""

import copy
import functools
import inspect
import threading
import types

import torch

try:
    from . import _fastrange  # built from python/ext/fastrange.cpp where Python's headers were found
except ImportError:
    _fastrange = None


class _FastForward(functools.partial):
    """A hooked module's forward entered through _fastrange.forward: partial(_fastrange.forward,
    module), dressed as the bound method it replaces. The partial call is C all the way down."""

    __slots__ = ()
    __name__ = "forward"

    @property
    def __self__(self):
        return self.args[0]

    @property
    def __func__(self):
        return type(self.args[0]).forward

    @property
    def __wrapped__(self):
        return types.MethodType(type(self.args[0]).forward, self.args[0])

    @property
    def __signature__(self):
        return inspect.signature(self.__wrapped__)

    # Pickled like a bound method: getattr(module, "forward") finds the class's again where it loads
    # (and the module works without actpage there).
    def __reduce__(self):
        return (getattr, (self.args[0], "forward"))

    # A deep copy of the module gets its own, bound to the copy (as a bound method would be).
    def __deepcopy__(self, memo):
        return type(self)(self.func, copy.deepcopy(self.args[0], memo))

    def __repr__(self):
        return "<actpage forward of %s>" % type(self.args[0]).__qualname__


def _in_graph_forward(module, *args, **kwargs):
    """What torch.compile traces in place of _fastrange.forward: the class's forward, no range (what
    the Python wrapper does while compiling)."""
    return type(module).forward(module, *args, **kwargs)


_stand_in_lock = threading.Lock()
_stand_in_state = {"registered": False, "failed": None}


def _register_compile_stand_in(fast):
    """Registers _in_graph_forward for fast.forward with torch.compiler.substitute_in_graph, once per
    process. Returns None, or why it could not."""
    with _stand_in_lock:
        if _stand_in_state["registered"] or _stand_in_state["failed"]:
            return _stand_in_state["failed"]
        try:
            torch.compiler.substitute_in_graph(fast.forward, skip_signature_check=True)(_in_graph_forward)
            _stand_in_state["registered"] = True
        except Exception as error:
            _stand_in_state["failed"] = repr(error)
        return _stand_in_state["failed"]


def fast_forward_support(fast=None, torch_module=None):
    """Whether a C forward (fast, default _fastrange) can be used with this torch: 'yes' (torch
    without torch.compile), 'stand-in' (torch.compile traces a registered stand-in), or None (no
    extension, or a torch.compile without substitute_in_graph)."""
    fast = _fastrange if fast is None else fast
    torch_module = torch if torch_module is None else torch_module
    if not fast:
        return None
    if not hasattr(torch_module, "compile"):
        return "yes"
    compiler = getattr(torch_module, "compiler", None)
    return "stand-in" if compiler is not None and hasattr(compiler, "substitute_in_graph") else None


def _is_our_forward(bound):
    """Whether a module's instance forward is one the hooks put there (C forward or Python wrapper)."""
    return isinstance(bound, _FastForward) or getattr(getattr(bound, "__func__", None), "_actpage_wrapper", False)


def _rebind_forward(replica, module):
    """Binds the forward that `replica` copied from `module`'s __dict__, when it is ours, to `replica`."""
    bound = replica.__dict__.get("forward")
    if not _is_our_forward(bound) or bound.__self__ is not module:
        return
    if isinstance(bound, _FastForward):
        replica.__dict__["forward"] = _FastForward(bound.func, replica)
    else:
        replica.__dict__["forward"] = types.MethodType(bound.__func__, replica)
