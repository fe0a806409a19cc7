"""Which mode the hooks run in: asked of the preloaded libactpage.so, else of the environment.

The library owns the python_hooks option (policy file + ACTPAGE_PYTHON_HOOKS, validated at start-up)
and answers it through `actpage_python_hooks_mode()` (include/actpage/c_api.h): 0 auto, 1 on, 2 off.
When that symbol is not in the process the library is not loaded, and the hooks would only cost
time: they stay off unless ACTPAGE_PYTHON_HOOKS=on asks for them anyway.
"""

import os

AUTO = "auto"
ON = "on"
OFF = "off"

_LIBRARY_MODES = {0: AUTO, 1: ON, 2: OFF}
_TRUE_WORDS = ("on", "1", "true", "yes")


def library_mode():
    """The library's answer as AUTO/ON/OFF, or None when libactpage.so is not loaded."""
    try:
        import ctypes

        process = ctypes.CDLL(None)  # the global namespace: finds what LD_PRELOAD brought in
        query = process.actpage_python_hooks_mode
    except (OSError, AttributeError):
        return None
    query.restype = ctypes.c_int
    query.argtypes = []
    return _LIBRARY_MODES.get(int(query()), AUTO)


def environment_forces_on(environ=None):
    environ = os.environ if environ is None else environ
    return environ.get("ACTPAGE_PYTHON_HOOKS", "").strip().lower() in _TRUE_WORDS


def resolve(library=library_mode, environ=None):
    """The effective mode. `library` is a callable returning library_mode()'s answer (tests swap it)."""
    answer = library()
    if answer is None:
        return ON if environment_forces_on(environ) else OFF
    return answer


def job_emits_own_ranges(modules):
    """True when the job brings its own NVTX module ranges (Transformer Engine, Megatron core)."""
    return any(name in modules for name in ("transformer_engine", "megatron.core"))
