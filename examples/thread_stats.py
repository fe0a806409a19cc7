#!/usr/bin/env python3
"""Watches a process tree's threads from outside, through /proc: CPU time, context switches, faults
and the CPUs each ran on, so that a slow run can be told from a fast one by what its threads did.

    watch = ThreadWatch(pid, interval_s=0.1)
    watch.start()
    ...                      # the process runs
    summary = watch.stop()   # a dict, JSON-ready

Every `interval_s` it lists the tree's processes (the root and its descendants, found by their
parent ids) and reads each thread's /proc/PID/task/TID/stat and status. A thread's figures are the
last read before it ended, less the first (so a thread that ran before the watch began counts from
then). Where a thread ran: for each interval in which its CPU time grew, the CPU it was last on
(stat's `processor`), counted; `with_main` counts the intervals in which it was active on the same
CPU as its process's main thread, also active (two threads taking turns on one core). The machine's
own account: steal and idle time per CPU over the watch (/proc/stat), for the CPUs the root may run
on.

Run as a script, it watches a command: thread_stats.py [--interval S] -- COMMAND...
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_stat(text):
    """Fields of a /proc stat line, the name (which may hold spaces and parentheses) apart."""
    open_paren, close_paren = text.index("("), text.rindex(")")
    name = text[open_paren + 1:close_paren]
    rest = text[close_paren + 2:].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return {
        "name": name,
        "state": rest[0],
        "ppid": int(rest[1]),
        "minflt": int(rest[7]),
        "majflt": int(rest[9]),
        "utime": int(rest[11]),
        "stime": int(rest[12]),
        "processor": int(rest[36]) if len(rest) > 36 else None,
    }


def parse_status(text):
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            out[key] = int(value.strip())
    return out


def read_text(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:  # the thread or process ended between the listing and the read
        return None


def descendants(root, proc="/proc"):
    """The root and every process whose chain of parents leads to it."""
    children = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return [root]
    for entry in entries:
        if not entry.isdigit():
            continue
        text = read_text(os.path.join(proc, entry, "stat"))
        if text is None:
            continue
        try:
            children.setdefault(parse_stat(text)["ppid"], []).append(int(entry))
        except (ValueError, IndexError):
            continue
    tree, queue = [], [root]
    while queue:
        pid = queue.pop()
        tree.append(pid)
        queue.extend(children.get(pid, []))
    return tree


# A fixed pure-Python loop, timed on one CPU after another in a child interpreter: the CPUs' speed as
# a CPU-bound Python thread (the job's) sees it. A KVM guest's CPU can run slower with no steal
# accounted (the host's other work on the same core); this is what shows it.
_PROBE_SCRIPT = r"""
import json, os, sys, time
cpus, seconds, detail = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "detail"
rates = {}
for cpu in cpus:
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        continue
    time.sleep(0.002)  # let the move happen
    count, x = 0, 0
    start_cpu = time.thread_time()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for i in range(1000):
            x = (x * 31 + i) & 0xFFFF
        count += 1
    rate = round(count / (seconds * 1000.0), 3)  # thousands of loop rounds per ms
    share = round((time.thread_time() - start_cpu) / seconds, 3)  # of the wall time, on the CPU
    rates[str(cpu)] = {"rate": rate, "share": share} if detail else rate
print(json.dumps(rates))
"""


def cpu_speed(cpus, seconds=0.05, python=None, detail=False):
    """{cpu (str): rounds of the probe loop per ms} for each CPU of `cpus`, measured `seconds` each,
    one after another in a child interpreter; {} if it could not run. detail: {cpu: {"rate": rounds
    per ms, "share": the part of the wall time the probe was on the CPU}} (a CPU other threads
    share gives the probe less than all of it)."""
    if not cpus:
        return {}
    try:
        done = subprocess.run([python or sys.executable, "-c", _PROBE_SCRIPT, json.dumps(sorted(cpus)), str(seconds),
                               "detail" if detail else "rates"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True,
                              timeout=10 + 2 * seconds * len(cpus))
        return json.loads(done.stdout) if done.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def cpus_of_command(command):
    """The CPUs a command will run on: its leading `taskset -c LIST`, else this process's."""
    if len(command) > 2 and os.path.basename(command[0]) == "taskset" and command[1] == "-c":
        cpus = set()
        for part in command[2].split(","):
            low, _, high = part.partition("-")
            try:
                cpus.update(range(int(low), int(high or low) + 1))
            except ValueError:
                return sorted(os.sched_getaffinity(0))
        return sorted(cpus)
    return sorted(os.sched_getaffinity(0))


def cpu_times(proc="/proc"):
    """{cpu: (steal, idle, total)} in clock ticks, from /proc/stat."""
    text = read_text(os.path.join(proc, "stat")) or ""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or not parts[0].startswith("cpu") or parts[0] == "cpu":
            continue
        values = [int(v) for v in parts[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        steal = values[7] if len(values) > 7 else 0
        out[int(parts[0][3:])] = (steal, idle, sum(values[:8]))
    return out


class ThreadRecord:
    def __init__(self, pid, tid, stat, status):
        self.pid, self.tid = pid, tid
        self.name = stat["name"]
        self.first = dict(stat, **status)
        self.last = self.first
        self.cpus = {}       # cpu -> intervals active there
        self.with_main = 0   # intervals active on the main thread's CPU while it was active too
        self.active = 0      # intervals in which its CPU time grew

    def update(self, stat, status):
        previous = self.last
        self.last = dict(stat, **status)
        self.name = stat["name"]  # a thread may name itself after it started
        grew = (stat["utime"] + stat["stime"]) > (previous["utime"] + previous["stime"])
        if grew:
            self.active += 1
            if stat["processor"] is not None:
                self.cpus[stat["processor"]] = self.cpus.get(stat["processor"], 0) + 1
        return grew

    def delta(self, key):
        return self.last.get(key, 0) - self.first.get(key, 0)

    def to_json(self):
        cpu_ms = (self.delta("utime") + self.delta("stime")) * 1000.0 / CLOCK_TICKS
        return {
            "pid": self.pid, "tid": self.tid, "name": self.name, "main": self.pid == self.tid,
            "cpu_ms": round(cpu_ms, 1),
            "user_ms": round(self.delta("utime") * 1000.0 / CLOCK_TICKS, 1),
            "system_ms": round(self.delta("stime") * 1000.0 / CLOCK_TICKS, 1),
            "voluntary_switches": self.delta("voluntary_ctxt_switches"),
            "involuntary_switches": self.delta("nonvoluntary_ctxt_switches"),
            "minor_faults": self.delta("minflt"),
            "active_intervals": self.active,
            "cpus": {str(cpu): count for cpu, count in sorted(self.cpus.items())},
            "with_main": self.with_main,
        }


class ThreadWatch:
    def __init__(self, pid, interval_s=0.1, proc="/proc"):
        self.root = pid
        self.interval = interval_s
        self.proc = proc
        self.threads = {}  # (pid, tid) -> ThreadRecord
        self.samples = 0
        self._stop = threading.Event()
        self._thread = None
        try:
            self.allowed_cpus = sorted(os.sched_getaffinity(pid))
        except (OSError, AttributeError):
            self.allowed_cpus = None
        self._cpu_start = cpu_times(proc)
        self._cpu_end = None
        self._started = time.monotonic()
        self._ended = None

    def sample(self):
        """One look at every thread of the tree; returns how many threads it read."""
        active_on = {}  # pid -> [(record, cpu)] of threads whose CPU time grew since the last look
        seen = 0
        for pid in descendants(self.root, self.proc):
            task_dir = os.path.join(self.proc, str(pid), "task")
            try:
                tids = [int(t) for t in os.listdir(task_dir) if t.isdigit()]
            except OSError:
                continue
            for tid in tids:
                stat_text = read_text(os.path.join(task_dir, str(tid), "stat"))
                status_text = read_text(os.path.join(task_dir, str(tid), "status"))
                if stat_text is None or status_text is None:
                    continue
                try:
                    stat = parse_stat(stat_text)
                except (ValueError, IndexError):
                    continue
                status = parse_status(status_text)
                seen += 1
                key = (pid, tid)
                record = self.threads.get(key)
                if record is None:
                    self.threads[key] = ThreadRecord(pid, tid, stat, status)
                    continue
                if record.update(stat, status):
                    active_on.setdefault(pid, []).append((record, stat["processor"]))
        for pid, active in active_on.items():
            main_cpu = next((cpu for record, cpu in active if record.tid == pid), None)
            if main_cpu is None:
                continue
            for record, cpu in active:
                if record.tid != pid and cpu == main_cpu:
                    record.with_main += 1
        self.samples += 1
        return seen

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def start(self):
        self.sample()
        self._thread = threading.Thread(target=self._run, name="thread-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._cpu_end = cpu_times(self.proc)
        self._ended = time.monotonic()
        return self.summary()

    def summary(self, min_cpu_ms=1.0):
        threads = [record.to_json() for record in self.threads.values()]
        threads = [t for t in threads if t["cpu_ms"] >= min_cpu_ms or t["main"]]
        threads.sort(key=lambda t: -t["cpu_ms"])
        machine = {}
        end = self._cpu_end or cpu_times(self.proc)
        for cpu in (self.allowed_cpus or sorted(end)):
            if cpu in end and cpu in self._cpu_start:
                steal = end[cpu][0] - self._cpu_start[cpu][0]
                idle = end[cpu][1] - self._cpu_start[cpu][1]
                total = end[cpu][2] - self._cpu_start[cpu][2]
                machine[str(cpu)] = {"steal_ms": round(steal * 1000.0 / CLOCK_TICKS, 1),
                                     "busy_ms": round((total - idle) * 1000.0 / CLOCK_TICKS, 1)}
        return {
            "interval_s": self.interval,
            "samples": self.samples,
            "seconds": round((self._ended or time.monotonic()) - self._started, 2),
            "allowed_cpus": self.allowed_cpus,
            "threads": threads,
            "cpus": machine,
        }


def format_summary(summary, top=12):
    lines = ["%-16s %7s %9s %9s %8s %8s %6s  %s" % (
        "thread", "tid", "cpu ms", "sys ms", "vol sw", "invol sw", "w/main", "cpus (intervals active)")]
    for t in summary["threads"][:top]:
        cpus = " ".join("%s:%d" % (cpu, n) for cpu, n in sorted(t["cpus"].items(), key=lambda kv: -kv[1])[:4])
        lines.append("%-16s %7d %9.1f %9.1f %8d %8d %6d  %s" % (
            (t["name"] + ("*" if t["main"] else ""))[:16], t["tid"], t["cpu_ms"], t["system_ms"],
            t["voluntary_switches"], t["involuntary_switches"], t["with_main"], cpus))
    steal = sum(c["steal_ms"] for c in summary["cpus"].values())
    lines.append("steal over the watched CPUs: %.1f ms in %.1f s" % (steal, summary["seconds"]))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between looks (default 0.1)")
    parser.add_argument("--json", default=None, help="also write the summary here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (thread_stats.py [--interval S] -- COMMAND...)")
    child = subprocess.Popen(command)
    watch = ThreadWatch(child.pid, args.interval).start()
    rc = child.wait()
    summary = watch.stop()
    print(format_summary(summary), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
