"""actpage's sitecustomize: installed by `actpage run` through PYTHONPATH.

1. Installs a light import hook: right after the job imports torch, actpage_hooks registers its
   module hooks (NVTX ranges per nn.Module). torch is not imported here.
2. Runs the sitecustomize that this one shadows (the next one on sys.path, e.g. Debian's), as if
   ours were not there.
Nothing here may break the job: every failure is reported on stderr and ignored.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _same_dir(entry):
    try:
        return os.path.realpath(entry or os.curdir) == os.path.realpath(_HERE)
    except Exception:
        return False


def _install_hooks():
    try:
        import actpage_hooks

        actpage_hooks.install_import_hook()
    except Exception as error:
        sys.stderr.write("[actpage] warning: python hooks: not installed: %r\n" % (error,))


def _chain_next_sitecustomize():
    """Imports the next `sitecustomize` on sys.path with our folder temporarily taken off it."""
    ours = sys.modules.get("sitecustomize")
    removed = [(index, entry) for index, entry in enumerate(sys.path) if _same_dir(entry)]
    if not removed:
        return
    sys.path[:] = [entry for entry in sys.path if not _same_dir(entry)]
    sys.modules.pop("sitecustomize", None)
    try:
        import importlib

        chained = importlib.import_module("sitecustomize")
        sys.modules["actpage_chained_sitecustomize"] = chained
    except ImportError as error:
        if getattr(error, "name", None) != "sitecustomize":
            sys.stderr.write("[actpage] warning: the chained sitecustomize failed: %r\n" % (error,))
    except Exception as error:  # what site.py does with a failing sitecustomize: report, go on
        sys.stderr.write("[actpage] warning: the chained sitecustomize failed: %r\n" % (error,))
    finally:
        # Put our folder back where it was; keep whatever the chained one added.
        for index, entry in removed:
            sys.path.insert(min(index, len(sys.path)), entry)
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_install_hooks()
_chain_next_sitecustomize()
