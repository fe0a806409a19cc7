"""A post-import hook for `torch`: runs a callback right after `import torch` has finished.

sitecustomize must not import torch itself (seconds of start-up for every Python process the job
starts, including ones that never touch torch), so it puts this finder first on sys.meta_path. The
finder ignores every name but "torch"; for torch it asks the other finders for the real spec and
wraps its loader, whose exec_module runs torch's own and then the callback. The finder removes itself
once the callback has run. Only the standard library is imported here.
"""

import sys
import threading

from . import _log


class _PostImportLoader:
    """Delegates to the real loader; after exec_module, calls the callback with the module."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        # Let the module see its real loader (importlib.resources, pkgutil and friends ask it).
        try:
            module.__loader__ = self._loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._loader
        except Exception:
            pass
        self._loader.exec_module(module)
        try:
            self._callback(module)
        except Exception as error:  # never let actpage break `import torch`
            _log.warn_once("post-import-callback", "setting up after `import torch` failed: %r" % (error,))

    def __getattr__(self, name):
        return getattr(self._loader, name)


class TorchImportHook:
    """sys.meta_path finder that calls `callback(torch_module)` once torch has been imported."""

    def __init__(self, callback, module_name="torch"):
        self._callback = callback
        self._name = module_name
        self._local = threading.local()
        self.fired = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self._name or getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find_spec = getattr(finder, "find_spec", None)
                if find_spec is None:
                    continue
                spec = find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._local.busy = False
        if spec is None or spec.loader is None:
            return None  # let the import system report it as it would without us
        spec.loader = _PostImportLoader(spec.loader, self._fire)
        return spec

    def _fire(self, module):
        self.fired = True
        self.remove()
        self._callback(module)

    def remove(self):
        try:
            while self in sys.meta_path:
                sys.meta_path.remove(self)
        except Exception:
            pass

    # importlib calls this on every finder when caches are invalidated.
    def invalidate_caches(self):
        pass


def install(callback, module_name="torch"):
    """Calls `callback(module)` right after `module_name` is first imported (at once if it already
    is). Returns the finder, or None when the module was already imported."""
    existing = sys.modules.get(module_name)
    if existing is not None:
        callback(existing)
        return None
    hook = TorchImportHook(callback, module_name)
    sys.meta_path.insert(0, hook)
    return hook
