"""Backward-root fingerprints, for `actpage validate`.

`actpage validate -- CMD` runs a job twice, plain and with its policy under stray_access poison, and
compares what the two runs computed. What a job computes, for any job: the tensors it calls backward
on (its losses). With ACTPAGE_VALIDATE_OUT naming a folder, every call of torch.autograd.backward
(Tensor.backward goes through it) and torch.autograd.grad appends one line per root tensor to
FOLDER/rank<RANK>.fingerprint:

    <call> <root> <value>

<call> counts the process's backward calls from 0, <root> the call's root tensors, and <value> is
the root's value as float.hex when it has one element (a loss), else "<float.hex of its sum>/<numel>".
Reading the value synchronises with the device: this runs only when validating.

With ACTPAGE_VALIDATE_DETERMINISTIC=1, torch.use_deterministic_algorithms(True) is set as soon as torch
is imported (the CLI sets CUBLAS_WORKSPACE_CONFIG before the job starts), so that two runs of a job
can agree bit for bit at all.

Nothing here may break the job: a failure to read a root is written as "error:<what>" in its place.
"""

import os
import threading

ENV_OUT = "ACTPAGE_VALIDATE_OUT"
ENV_DETERMINISTIC = "ACTPAGE_VALIDATE_DETERMINISTIC"

_lock = threading.Lock()
_installed = None


def wanted():
    """Whether this process is being validated."""
    return bool(os.environ.get(ENV_OUT))


def fingerprint_path(folder, environ=None):
    """The file this process writes: one per rank (torchrun's RANK, else 0)."""
    environ = os.environ if environ is None else environ
    rank = environ.get("RANK", "0").strip() or "0"
    return os.path.join(folder, "rank%s.fingerprint" % rank)


def root_value(tensor):
    """A root tensor's value as text: float.hex of its one element, else of its sum and its size."""
    try:
        values = tensor.detach().float()
        count = values.numel()
        if count == 1:
            return float(values.reshape(()).item()).hex()
        return "%s/%d" % (float(values.sum().item()).hex(), count)
    except Exception as error:  # a root we cannot read must not stop the job
        return "error:%s" % type(error).__name__


def _roots(tensors):
    import torch

    if isinstance(tensors, torch.Tensor):
        return [tensors]
    try:
        return [t for t in tensors if isinstance(t, torch.Tensor)]
    except TypeError:
        return []


class Recorder:
    """Wraps torch.autograd.backward and torch.autograd.grad; writes each call's roots."""

    def __init__(self, path, torch_module=None):
        if torch_module is None:
            import torch as torch_module
        self._torch = torch_module
        self.path = path
        self.calls = 0
        self._originals = None

    def record(self, tensors):
        with _lock:
            call = self.calls
            self.calls += 1
            lines = ["%d %d %s\n" % (call, index, root_value(root)) for index, root in enumerate(_roots(tensors))]
            with open(self.path, "a") as handle:
                handle.writelines(lines)

    def install(self):
        autograd = self._torch.autograd
        original_backward, original_grad = autograd.backward, autograd.grad
        recorder = self

        def backward(tensors, *args, **kwargs):
            recorder.record(tensors)
            return original_backward(tensors, *args, **kwargs)

        def grad(outputs, *args, **kwargs):
            recorder.record(outputs)
            return original_grad(outputs, *args, **kwargs)

        for wrapper, original in ((backward, original_backward), (grad, original_grad)):
            wrapper.__wrapped__ = original
            wrapper.__doc__ = original.__doc__
            wrapper.__name__ = original.__name__
        autograd.backward, autograd.grad = backward, grad
        self._originals = (original_backward, original_grad)
        return self

    def remove(self):
        if self._originals is not None:
            self._torch.autograd.backward, self._torch.autograd.grad = self._originals
            self._originals = None


def install(torch_module=None, environ=None):
    """Installs the recorder when the process is being validated (ACTPAGE_VALIDATE_OUT), and the
    deterministic mode when asked; returns the Recorder or None. Idempotent."""
    global _installed
    environ = os.environ if environ is None else environ
    folder = environ.get(ENV_OUT)
    if not folder:
        return None
    with _lock:
        if _installed is not None:
            return _installed
        if torch_module is None:
            import torch as torch_module
        if environ.get(ENV_DETERMINISTIC) == "1":
            torch_module.use_deterministic_algorithms(True)
        os.makedirs(folder, exist_ok=True)
        _installed = Recorder(fingerprint_path(folder, environ), torch_module).install()
        return _installed


def uninstall():
    global _installed
    with _lock:
        if _installed is not None:
            _installed.remove()
            _installed = None
