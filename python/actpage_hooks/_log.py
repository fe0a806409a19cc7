"""Diagnostics of the hook package: one line on stderr, prefixed like the library's ("[actpage]").

Never raises, never imports torch. Warnings are printed once per key; info lines only when
ACTPAGE_LOG_LEVEL asks for them (the library's option of the same name; default warn).
"""

import os
import sys
import threading

_LEVELS = {"trace": 0, "debug": 1, "info": 2, "warn": 3, "warning": 3, "error": 4, "off": 5}
_lock = threading.Lock()
_seen = set()


def _threshold():
    return _LEVELS.get(os.environ.get("ACTPAGE_LOG_LEVEL", "warn").strip().lower(), 3)


def _emit(level, message):
    try:
        if _LEVELS[level] < _threshold():
            return
        rank = os.environ.get("RANK", "")
        prefix = "[actpage rank %s]" % rank if rank not in ("", "0") else "[actpage]"
        sys.stderr.write("%s %s: python hooks: %s\n" % (prefix, "warning" if level == "warn" else level,
                                                          message))
        sys.stderr.flush()
    except Exception:  # diagnostics must never break the job
        pass


def first_time(key):
    """True the first time `key` is seen in this process."""
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
        return True


def warn_once(key, message):
    if first_time(key):
        _emit("warn", message)


def debug_once(key, message):
    if first_time(key):
        _emit("debug", message)


def info(message):
    _emit("info", message)


def debug(message):
    _emit("debug", message)


def reset():
    """Forgets which warnings were printed (tests)."""
    with _lock:
        _seen.clear()
