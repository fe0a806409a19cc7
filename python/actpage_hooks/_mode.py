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

# python_hooks_scope: which modules get hooks (see _hooks.ModuleHooks).
BLOCKS = "blocks"
ALL = "all"
_LIBRARY_SCOPES = {0: BLOCKS, 1: ALL}

# python_hooks_backward: which hooked modules mark their backward pass (blocks scope). The library
# answers with auto resolved by its mode (offload: layers, observe: none).
LAYERS = "layers"
HOOKED = "hooked"
NONE = "none"
_LIBRARY_BACKWARD = {0: LAYERS, 1: HOOKED, 2: NONE}

# python_hooks_call: how a hooked module's forward is entered.
HOOKS = "hooks"
WRAP = "wrap"
_LIBRARY_CALL = {0: HOOKS, 1: WRAP}

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


def _process_symbol(name, restype, argtypes):
    """A function of the preloaded libactpage.so, or None when it is not in the process."""
    try:
        import ctypes

        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.restype = restype
    function.argtypes = argtypes
    return function


def _library_choice(symbol, choices, default):
    """The answer of the library's int-valued option query `symbol`, mapped through `choices`
    (unknown values: `default`), or None when libactpage.so is not loaded."""
    import ctypes

    query = _process_symbol(symbol, ctypes.c_int, [])
    return None if query is None else choices.get(int(query()), default)


def _resolve_choice(library, environ, variable, others, default):
    """The library's answer, else the word of `others` the environment variable names, else `default`."""
    answer = library()
    if answer is not None:
        return answer
    environ = os.environ if environ is None else environ
    word = environ.get(variable, "").strip().lower()
    return word if word in others else default


def library_scope():
    """The library's python_hooks_scope as BLOCKS/ALL, or None when libactpage.so is not loaded."""
    return _library_choice("actpage_python_hooks_scope", _LIBRARY_SCOPES, BLOCKS)


def resolve_scope(library=None, environ=None):
    """The effective scope: the library's answer, else ACTPAGE_PYTHON_HOOKS_SCOPE, else blocks."""
    return _resolve_choice(library or library_scope, environ, "ACTPAGE_PYTHON_HOOKS_SCOPE", (ALL,), BLOCKS)


def library_backward():
    """The library's python_hooks_backward as LAYERS/HOOKED, or None when libactpage.so is not loaded."""
    return _library_choice("actpage_python_hooks_backward", _LIBRARY_BACKWARD, LAYERS)


def resolve_backward(library=None, environ=None):
    """Which modules mark backward: the library's answer, else ACTPAGE_PYTHON_HOOKS_BACKWARD (hooked or
    none), else layers. Without the library there is no mode to resolve auto by: layers."""
    return _resolve_choice(library or library_backward, environ, "ACTPAGE_PYTHON_HOOKS_BACKWARD", (HOOKED, NONE),
                           LAYERS)


def library_call():
    """The library's python_hooks_call as HOOKS/WRAP, or None when libactpage.so is not loaded."""
    return _library_choice("actpage_python_hooks_call", _LIBRARY_CALL, WRAP)


def resolve_call(library=None, environ=None):
    """How hooked modules are entered: the library's answer, else ACTPAGE_PYTHON_HOOKS_CALL, else wrap."""
    return _resolve_choice(library or library_call, environ, "ACTPAGE_PYTHON_HOOKS_CALL", (HOOKS,), WRAP)


def library_rule_matcher():
    """A function name -> bool telling whether a module rule of the library's policy matches the
    name, or None when libactpage.so is not loaded (then no module is known to be selected)."""
    import ctypes

    query = _process_symbol("actpage_module_rule_matches", ctypes.c_int, [ctypes.c_char_p])
    if query is None:
        return None
    return lambda name: bool(query(name.encode("utf-8", "replace")))


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
