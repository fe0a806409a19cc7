"""actpage's PyTorch hooks: name each nn.Module's forward and backward with an NVTX range.

`actpage run` puts the folder holding this package first on PYTHONPATH; its sitecustomize calls
`install_import_hook()`, which waits for the job's own `import torch` (importing this package costs
no torch import) and then calls `on_torch_imported()`: that asks libactpage.so for the python_hooks
mode (see _mode.py) and, unless it is off, registers global module hooks (see _hooks.py) that push
a range per module forward, named by module path ("model.layers.3.mlp"), and mark each module's
backward with a range "<path>.backward". libactpage.so, loaded as the NVTX injection library, sees
those ranges and tags device allocations with them. With the module hooks on, it also installs
torch's default saved-tensor hooks (see _saved.py) when the library offloads or writes a trace: they
tell it which allocations autograd saves (recorded in the trace: SAVED records) and make backward
wait for one that is not back yet.

Public functions, for jobs and tests:
  install(mode=None, force=False, push=None, pop=None)  registers the hooks now (imports torch)
  uninstall()                                          removes them (outside a forward pass)
  installed()                                          the ModuleHooks object, or None
  set_range_functions(push, pop)                       replaces torch.cuda.nvtx.range_push/pop, e.g.
                                                       with a recorder; None restores them
  module_name(module)                                  the name the hooks use for a module
  set_paused(paused)                                   pauses/resumes the ranges and the library's
                                                       allocation records (measurements)
  install_saved_tensor_hooks()                         the saved-tensor hooks, with the module hooks
                                                       (on_torch_imported calls it)
"""

import threading

from . import _log, _mode

__all__ = ["install", "uninstall", "installed", "install_import_hook", "on_torch_imported",
           "install_saved_tensor_hooks", "set_range_functions", "module_name", "resolve_mode", "set_paused"]

_lock = threading.RLock()
_installed = None
_import_hook = None


def resolve_mode():
    """'auto', 'on' or 'off': from the preloaded library, else ACTPAGE_PYTHON_HOOKS (see _mode)."""
    return _mode.resolve()


def installed():
    """The installed hooks (an _hooks.ModuleHooks), or None."""
    return _installed


def install(mode=None, force=False, push=None, pop=None, use_node_prehook=None, scope=None,
            pass_functions=None, backward=None, call=None):
    """Registers the global module hooks (idempotent; imports torch).

    mode: 'auto' or 'on' (default: resolve_mode(); 'off' installs nothing and returns None).
    force: push ranges even when CUDA is not available (tests). Custom push/pop functions imply it.
    use_node_prehook: mark backward with grad_fn pre-hooks (default when torch has them) or, False,
    with tensor hooks on the outputs (the fallback for older torch).
    scope: 'blocks' or 'all' (default: the library's python_hooks_scope, else
    ACTPAGE_PYTHON_HOOKS_SCOPE, else 'blocks'); see _hooks.ModuleHooks.
    pass_functions: (begin_forward_pass, set_backward_pass) standing in for the library's
    (default: libactpage.so's when it is loaded, else none).
    backward: 'layers', 'hooked' or 'none' (default: the library's python_hooks_backward, auto
    resolved by its mode, else ACTPAGE_PYTHON_HOOKS_BACKWARD, else 'layers'): which hooked modules
    mark their backward pass; see _hooks.ModuleHooks.
    call: 'hooks' or 'wrap' (default: the library's python_hooks_call, else ACTPAGE_PYTHON_HOOKS_CALL,
    else 'wrap'): how a hooked module's forward is entered in blocks scope; see _hooks.ModuleHooks.
    """
    global _installed
    with _lock:
        if _installed is not None:
            if push is not None or pop is not None:
                _installed.set_range_functions(push, pop)
            return _installed
        mode = resolve_mode() if mode is None else mode
        if mode == _mode.OFF:
            _log.debug("off (python_hooks mode)")
            return None
        from . import _hooks as hooks_module

        scope = _mode.resolve_scope() if scope is None else scope
        backward = _mode.resolve_backward() if backward is None else backward
        call = _mode.resolve_call() if call is None else call
        _installed = hooks_module.ModuleHooks(mode, push=push, pop=pop, force=force,
                                              use_node_prehook=use_node_prehook, scope=scope,
                                              rule_matches=_mode.library_rule_matcher(),
                                              pass_functions=pass_functions, backward=backward,
                                              call=call).install()
        _log.debug("installed (mode %s, scope %s, backward %s, call %s)" % (mode, scope, backward, call))
        return _installed


def uninstall():
    """Removes the hooks (call outside a forward pass). Safe when none are installed."""
    global _installed
    with _lock:
        if _installed is not None:
            _installed.remove()
            _installed = None


def set_range_functions(push, pop):
    """Swaps the functions that push and pop ranges (None: torch.cuda.nvtx's). Custom functions
    make the hooks push even without CUDA."""
    with _lock:
        if _installed is not None:
            _installed.set_range_functions(push, pop)


def module_name(module):
    """The range name the hooks give `module` (names its tree if needed); None when not installed."""
    hooks = _installed
    return hooks.name_of(module) if hooks is not None else None


def set_paused(paused, set_recording=None):
    """Pauses (True) or resumes (False) what actpage records, to measure its cost inside one process
    (examples/common.py --alternate-actpage): the module hooks push no new ranges (in blocks scope
    they come off the modules: paused steps run without actpage's Python side) and libactpage.so
    writes no allocation records (actpage_set_recording); memory is routed as before. Call between
    training steps: a step's backward markers come from its forward. set_recording stands in for the library's function (tests).
    Returns True when there was something to pause: hooks installed or the library loaded."""
    import ctypes

    with _lock:
        hooks = _installed
        if hooks is not None:
            hooks.set_paused(paused)
        if set_recording is None:
            set_recording = _mode._process_symbol("actpage_set_recording", ctypes.c_int, [ctypes.c_int])
        if set_recording is not None:
            set_recording(0 if paused else 1)
        return hooks is not None or set_recording is not None


def on_torch_imported(torch_module=None):
    """Called right after `import torch` (by the import hook). Never raises."""
    try:
        from . import _fingerprint

        if _fingerprint.wanted():  # `actpage validate` is running this process
            _fingerprint.install(torch_module)
    except Exception as error:
        _log.warn_once("fingerprint", "could not record the backward calls for actpage validate: %r" % (error,))
    try:
        install()
    except Exception as error:
        _log.warn_once("install", "could not install the module hooks: %r" % (error,))
    try:
        install_saved_tensor_hooks(torch_module)
    except Exception as error:
        _log.warn_once("saved-install", "could not install the saved-tensor hooks: %r" % (error,))


def install_saved_tensor_hooks(torch_module=None, sink=None):
    """With the module hooks installed, installs the saved-tensor hooks (_saved.install: only when
    the library exports their entry points and uses or records them) on the calling thread. Returns them, or
    None. `sink` stands in for the library (tests)."""
    if _installed is None:  # python_hooks off: the library sees no module ranges either
        return None
    from . import _saved

    hooks = _saved.install(sink, torch_module)
    if hooks is not None and hooks.scoped:
        _installed.on_forward_begin = hooks.forward_begins  # off in forwards the library cannot serve in
    return hooks


def install_import_hook():
    """Arranges for on_torch_imported() to run right after torch is first imported (at once if it
    already is). Imports nothing heavy. Idempotent."""
    global _import_hook
    with _lock:
        if _import_hook is not None:
            return _import_hook
        from . import _importhook

        _import_hook = _importhook.install(on_torch_imported) or True
        return _import_hook
