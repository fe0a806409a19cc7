"""examples/thread_stats.py: a process tree's threads watched through /proc (Linux, no GPU)."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import helpers  # noqa: F401  (puts examples/ on sys.path)

import thread_stats

# A job with a named thread that burns CPU while its main thread sleeps, and a child process whose
# main thread burns CPU too: the watch must find both (the child by its parent id) and tell them apart.
BUSY_JOB = textwrap.dedent("""
    import ctypes, subprocess, sys, threading, time
    def name_thread(name):
        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
    def burn(seconds):  # CPU seconds of this thread, so a loaded machine only makes it take longer
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
    def worker():
        name_thread("busy-worker")
        burn(0.6)
    child = subprocess.Popen([sys.executable, "-c",
        "import ctypes, time\\nctypes.CDLL(None).prctl(15, b'busy-child', 0, 0, 0)\\n"
        "end = time.thread_time() + 0.6\\nwhile time.thread_time() < end: pass\\n"])
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    child.wait()
""")


class ParseTest(unittest.TestCase):
    def test_a_name_with_spaces_and_parentheses(self):
        fields = ["S", "7", "7", "7", "0", "-1", "4194560", "123", "0", "4", "0", "250", "30"]
        fields += ["0"] * 23 + ["5"] + ["0"] * 10
        stat = thread_stats.parse_stat("42 (a (b) c) " + " ".join(fields))
        self.assertEqual(stat["name"], "a (b) c")
        self.assertEqual((stat["state"], stat["ppid"]), ("S", 7))
        self.assertEqual((stat["minflt"], stat["majflt"], stat["utime"], stat["stime"]), (123, 4, 250, 30))
        self.assertEqual(stat["processor"], 5)

    def test_status_switches(self):
        status = thread_stats.parse_status("Name:\tx\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n")
        self.assertEqual(status, {"voluntary_ctxt_switches": 12, "nonvoluntary_ctxt_switches": 3})


class WatchTest(unittest.TestCase):
    def test_finds_each_thread_of_the_tree_and_its_cpu_time(self):
        with tempfile.TemporaryDirectory() as tmp:
            job = os.path.join(tmp, "job.py")
            with open(job, "w") as handle:
                handle.write(BUSY_JOB)
            child = subprocess.Popen([sys.executable, job])
            watch = thread_stats.ThreadWatch(child.pid, interval_s=0.02).start()
            self.assertEqual(child.wait(), 0)
            summary = watch.stop()
        json.dumps(summary)  # JSON-ready
        by_name = {t["name"]: t for t in summary["threads"]}
        self.assertIn("busy-worker", by_name, summary["threads"])
        self.assertIn("busy-child", by_name, summary["threads"])
        worker, child_main = by_name["busy-worker"], by_name["busy-child"]
        # Each burned 0.6 s of CPU; the watch may miss the last interval before a thread ends.
        self.assertGreater(worker["cpu_ms"], 250)
        self.assertGreater(child_main["cpu_ms"], 250)
        self.assertFalse(worker["main"])
        self.assertTrue(child_main["main"])
        self.assertNotEqual(worker["pid"], child_main["pid"])
        # The sleeping main thread of the job: listed, with next to no CPU time.
        job_main = [t for t in summary["threads"] if t["main"] and t["pid"] == child.pid]
        self.assertEqual(len(job_main), 1)
        self.assertLess(job_main[0]["cpu_ms"], worker["cpu_ms"])
        self.assertGreater(sum(worker["cpus"].values()), 5)
        self.assertEqual(sum(worker["cpus"].values()), worker["active_intervals"])
        self.assertIn("busy-worker", thread_stats.format_summary(summary))


class CpuProbeTest(unittest.TestCase):
    def test_each_cpu_gets_a_rate_and_a_busy_cpu_gives_the_probe_less_of_its_time(self):
        cpu = max(os.sched_getaffinity(0))
        rates = thread_stats.cpu_speed([cpu], seconds=0.1)
        self.assertEqual(list(rates), [str(cpu)])
        self.assertGreater(rates[str(cpu)], 0)
        # The same CPU shared with a busy process: the probe is on it for about half of the time. Any
        # other load only lowers that share, so the bound holds however busy the machine is (a
        # comparison of two rates would not: a loaded machine slows the unshared measurement too).
        with tempfile.TemporaryDirectory() as tmp:
            hog = os.path.join(tmp, "hog.py")
            ready = os.path.join(tmp, "ready")
            with open(hog, "w") as handle:
                handle.write("import os, time\nos.sched_setaffinity(0, {%d})\nopen(%r, 'w').close()\n"
                             "end = time.time() + 30\nwhile time.time() < end:\n    pass\n" % (cpu, ready))
            busy = subprocess.Popen([sys.executable, hog])
            try:
                while not os.path.exists(ready) and busy.poll() is None:
                    time.sleep(0.01)
                shared = thread_stats.cpu_speed([cpu], seconds=0.3, detail=True)
            finally:
                busy.kill()
                busy.wait()
        self.assertEqual(set(shared[str(cpu)]), {"rate", "share"})
        self.assertLess(shared[str(cpu)]["share"], 0.8, shared)

    def test_a_cpu_it_may_not_use_is_left_out_and_no_cpus_give_nothing(self):
        allowed = os.sched_getaffinity(0)
        outside = max(allowed) + 1000
        self.assertEqual(list(thread_stats.cpu_speed([outside, max(allowed)], seconds=0.01)), [str(max(allowed))])
        self.assertEqual(thread_stats.cpu_speed([]), {})

    def test_the_cpus_of_a_command(self):
        self.assertEqual(thread_stats.cpus_of_command(["taskset", "-c", "2-4,7", "python3", "x.py"]), [2, 3, 4, 7])
        self.assertEqual(thread_stats.cpus_of_command(["python3", "x.py"]), sorted(os.sched_getaffinity(0)))


if __name__ == "__main__":
    unittest.main()
