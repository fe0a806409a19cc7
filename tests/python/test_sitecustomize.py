"""sitecustomize.py and the import hook, in fresh Python processes (as `actpage run` starts them)."""

import json
import os
import subprocess
import tempfile
import textwrap
import unittest

from helpers import PYTHON, PYTHON_DIR, clean_environment

PROBE = textwrap.dedent("""
    import json, sys
    state = {
        "torch_imported": "torch" in sys.modules,
        "hooks_package": "actpage_hooks" in sys.modules,
        "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
        "chained": getattr(sys.modules.get("actpage_chained_sitecustomize"), "__file__", None),
        "finder_first": type(sys.meta_path[0]).__name__,
        "path": sys.path,
    }
    print(json.dumps(state))
""")


def run_python(code, env_extra=None, pythonpath=None, preload=None):
    extra = dict(env_extra or {})
    extra["PYTHONPATH"] = os.pathsep.join(pythonpath or [PYTHON_DIR])
    if preload:
        extra["LD_PRELOAD"] = preload
    done = subprocess.run([PYTHON, "-c", code], env=clean_environment(extra), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=240)
    return done


def probe(**kwargs):
    done = run_python(PROBE, **kwargs)
    if done.returncode != 0:
        raise AssertionError(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


class SiteCustomizeTest(unittest.TestCase):
    def test_installs_the_import_hook_without_importing_torch(self):
        state, stderr = probe()
        self.assertFalse(state["torch_imported"])
        self.assertTrue(state["hooks_package"])
        self.assertEqual(os.path.realpath(state["sitecustomize"]),
                         os.path.realpath(os.path.join(PYTHON_DIR, "sitecustomize.py")))
        self.assertEqual(state["finder_first"], "TorchImportHook")
        self.assertEqual(stderr, "")

    def test_chains_to_the_next_sitecustomize_and_keeps_its_changes(self):
        with tempfile.TemporaryDirectory() as other:
            with open(os.path.join(other, "sitecustomize.py"), "w") as handle:
                handle.write("import os, sys\nos.environ['CHAINED_RAN'] = 'yes'\nsys.path.append('/added/by/chained')\n")
            code = PROBE.replace("print(json.dumps(state))",
                                 "import os\nstate['env'] = os.environ.get('CHAINED_RAN')\nprint(json.dumps(state))")
            state, _ = probe_code(code, pythonpath=[PYTHON_DIR, other])
            self.assertEqual(state["env"], "yes")
            self.assertEqual(os.path.realpath(state["chained"]), os.path.realpath(os.path.join(other, "sitecustomize.py")))
            self.assertIn("/added/by/chained", state["path"])
            # our folder is back where PYTHONPATH put it, before the other one
            real = [os.path.realpath(p) for p in state["path"]]
            self.assertLess(real.index(os.path.realpath(PYTHON_DIR)), real.index(os.path.realpath(other)))
            self.assertEqual(os.path.realpath(os.path.dirname(state["sitecustomize"])), os.path.realpath(PYTHON_DIR))

    def test_a_failing_chained_sitecustomize_is_reported_and_the_job_goes_on(self):
        with tempfile.TemporaryDirectory() as other:
            with open(os.path.join(other, "sitecustomize.py"), "w") as handle:
                handle.write("raise RuntimeError('broken site')\n")
            done = run_python("print('job ran')", pythonpath=[PYTHON_DIR, other])
            self.assertEqual(done.returncode, 0)
            self.assertIn("job ran", done.stdout)
            self.assertIn("broken site", done.stderr)

    def test_chains_to_the_system_sitecustomize_when_there_is_one(self):
        done = subprocess.run([PYTHON, "-c", "import sitecustomize; print(sitecustomize.__file__)"],
                              env=clean_environment(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              universal_newlines=True)
        if done.returncode != 0:
            self.skipTest("this Python has no sitecustomize of its own")
        state, _ = probe()
        self.assertEqual(os.path.realpath(state["chained"]), os.path.realpath(done.stdout.strip()))


def probe_code(code, **kwargs):
    done = run_python(code, **kwargs)
    if done.returncode != 0:
        raise AssertionError(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


AFTER_TORCH = textwrap.dedent("""
    import json, sys
    import torch
    import actpage_hooks
    print(json.dumps({"installed": actpage_hooks.installed() is not None,
                      "loader": type(torch.__spec__.loader).__name__,
                      "finder_left": any(type(f).__name__ == "TorchImportHook" for f in sys.meta_path)}))
""")

RECORDED_JOB = textwrap.dedent("""
    import json
    import torch
    import actpage_hooks
    events = []
    actpage_hooks.set_range_functions(events.append, lambda: events.append(None))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    model(torch.randn(2, 4)).sum().backward()
    print(json.dumps(events))
""")


class TorchImportTest(unittest.TestCase):
    def test_hooks_installed_right_after_import_torch_when_forced_on(self):
        state, stderr = probe_code(AFTER_TORCH, env_extra={"ACTPAGE_PYTHON_HOOKS": "on"})
        self.assertTrue(state["installed"])
        self.assertNotEqual(state["loader"], "_PostImportLoader")  # torch sees its real loader
        self.assertFalse(state["finder_left"])

    def test_nothing_installed_without_the_library_unless_forced(self):
        for value in (None, "auto", "off"):
            with self.subTest(ACTPAGE_PYTHON_HOOKS=value):
                env = {} if value is None else {"ACTPAGE_PYTHON_HOOKS": value}
                state, _ = probe_code(AFTER_TORCH, env_extra=env)
                self.assertFalse(state["installed"])

    def test_hooks_from_the_import_hook_record_forward_and_backward(self):
        events, _ = probe_code(RECORDED_JOB, env_extra={"ACTPAGE_PYTHON_HOOKS": "on"})
        pushed = [e for e in events if e is not None]
        self.assertEqual(pushed[:4], ["Sequential", "0", "1", "2"])
        self.assertEqual(pushed[4:], ["Sequential.backward", "2.backward", "1.backward", "0.backward"])
        self.assertEqual(events.count(None), len(pushed))


def library_path():
    path = os.environ.get("ACTPAGE_TEST_LIBRARY")
    return path if path and os.path.isfile(path) else None


class RealLibraryTest(unittest.TestCase):
    """With the real libactpage.so preloaded, the mode comes from the library (skipped while the
    library does not export the C API yet)."""

    def setUp(self):
        self.library = library_path()
        if self.library is None:
            self.skipTest("ACTPAGE_TEST_LIBRARY not set or not built")
        done = run_python("import ctypes; print(ctypes.CDLL(None).actpage_python_hooks_mode())",
                          preload=self.library)
        if done.returncode != 0:
            self.skipTest("libactpage.so does not export actpage_python_hooks_mode yet")

    def mode_and_installed(self, value):
        code = AFTER_TORCH.replace("print(json.dumps({", "import ctypes\nprint(json.dumps({'mode': ctypes.CDLL(None).actpage_python_hooks_mode(), ")
        state, _ = probe_code(code, env_extra={"ACTPAGE_PYTHON_HOOKS": value}, preload=self.library)
        return state["mode"], state["installed"]

    def test_modes_from_the_library(self):
        self.assertEqual(self.mode_and_installed("off"), (2, False))
        self.assertEqual(self.mode_and_installed("on"), (1, True))
        self.assertEqual(self.mode_and_installed("auto"), (0, True))


if __name__ == "__main__":
    unittest.main()
