#!/usr/bin/env python3
"""The zoo's manifest (examples/zoo/jobs.json), read for scripts/bench.sh and scripts/bench_report.py.

    bench_manifest.py MANIFEST names         # the jobs' names, one a line, in the manifest's order
    bench_manifest.py MANIFEST shell JOB     # bash assignments of JOB's fields (bench.sh evals them)
    bench_manifest.py MANIFEST meta JOB FILE # JOB's meta.json: its manifest entry, this call's
                                             # settings (BENCH_META_* variables) and link.json

A job is {"name", "script", "launcher": null or a command list, "gpus": 1|2, "args": [...],
"methods": [...], "checkpointing": "method" | "default-on" | null, "stream_offload_modules",
"deterministic", "loss_tolerance", "stands_for"}. A bad manifest is an error naming the job and the
key, before anything runs.
"""

import datetime
import json
import os
import shlex
import sys

CHECKPOINTING = ("method", "default-on", None)


class ManifestError(Exception):
    pass


def _check(job, index, key, ok, wanted):
    if not ok:
        name = job.get("name") if isinstance(job, dict) else None
        raise ManifestError("job %d%s: '%s' must be %s, not %s" % (
            index + 1, " (%s)" % name if name else "", key, wanted, json.dumps(job.get(key))))


def _string_list(value):
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def normalise(job, index):
    """The job with every field the bench uses, defaults filled in, types checked."""
    if not isinstance(job, dict):
        raise ManifestError("job %d: expected an object, not %s" % (index + 1, json.dumps(job)))
    _check(job, index, "name", isinstance(job.get("name"), str) and job["name"].strip() and "/" not in job["name"],
           "a non-empty name without '/'")
    _check(job, index, "script", isinstance(job.get("script"), str) and job["script"], "a path")
    out = dict(job)
    out.setdefault("launcher", None)
    out.setdefault("gpus", 1)
    out.setdefault("args", [])
    out.setdefault("methods", ["none"])
    out.setdefault("checkpointing", None)
    out.setdefault("stream_offload_modules", None)
    out.setdefault("deterministic", False)
    out.setdefault("loss_tolerance", 0.0)
    out.setdefault("stands_for", "")
    _check(out, index, "launcher", out["launcher"] is None or (_string_list(out["launcher"]) and out["launcher"]),
           "null or a non-empty list of strings")
    _check(out, index, "gpus", isinstance(out["gpus"], int) and not isinstance(out["gpus"], bool) and out["gpus"] >= 1,
           "a whole number of at least 1")
    _check(out, index, "args", _string_list(out["args"]), "a list of strings")
    _check(out, index, "methods", _string_list(out["methods"]), "a list of strings")
    _check(out, index, "checkpointing", out["checkpointing"] in CHECKPOINTING, '"method", "default-on" or null')
    _check(out, index, "stream_offload_modules", out["stream_offload_modules"] is None
           or isinstance(out["stream_offload_modules"], str), "null or a string")
    _check(out, index, "deterministic", isinstance(out["deterministic"], bool), "true or false")
    _check(out, index, "loss_tolerance", isinstance(out["loss_tolerance"], (int, float))
           and not isinstance(out["loss_tolerance"], bool) and out["loss_tolerance"] >= 0, "a number >= 0")
    return out


def load(path):
    """[job, ...] of the manifest, each normalised; ManifestError when it cannot be used."""
    try:
        with open(path) as handle:
            document = json.load(handle)
    except (OSError, ValueError) as error:
        raise ManifestError("%s: %s" % (path, error))
    if not isinstance(document, dict) or not isinstance(document.get("jobs"), list):
        raise ManifestError('%s: expected {"jobs": [...]}' % path)
    try:
        jobs = [normalise(job, index) for index, job in enumerate(document["jobs"])]
    except ManifestError as error:
        raise ManifestError("%s: %s" % (path, error))
    names = [job["name"] for job in jobs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ManifestError("%s: job names must be unique: %s" % (path, ", ".join(duplicates)))
    return jobs


def find(jobs, name):
    for job in jobs:
        if job["name"] == name:
            return job
    raise ManifestError("no job %s in the manifest (jobs: %s)" % (name, ", ".join(j["name"] for j in jobs)))


def shell_assignments(job):
    """Bash assignments of the fields bench.sh uses: scalars as job_X=..., lists as job_X=(...)."""
    def array(values):
        return "(%s)" % " ".join(shlex.quote(v) for v in values)

    lines = [
        "job_script=%s" % shlex.quote(job["script"]),
        "job_gpus=%d" % job["gpus"],
        "job_launcher=%s" % array(job["launcher"] or []),
        "job_args=%s" % array(job["args"]),
        "job_methods=%s" % array(job["methods"]),
        "job_checkpointing=%s" % shlex.quote(job["checkpointing"] or ""),
        "job_stream_offload_modules=%s" % shlex.quote(job["stream_offload_modules"] or ""),
        "job_deterministic=%s" % ("true" if job["deterministic"] else "false"),
        "job_loss_tolerance=%s" % shlex.quote(repr(float(job["loss_tolerance"]))),
    ]
    return "\n".join(lines)


def meta_record(job, environ, link=None, now=None):
    """meta.json of one job's bench call: the manifest entry, the call's settings, the link."""
    env = environ
    finished = now or datetime.datetime.now(datetime.timezone.utc)

    def number(key):
        value = env.get(key)
        return int(value) if value not in (None, "") else None

    return {
        "job": job["name"], "manifest": job,
        "started": env.get("BENCH_META_STARTED") or None,
        "finished": finished.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": env.get("BENCH_META_DEVICE") or None,
        "gpus_on_machine": number("BENCH_META_GPUS"),
        "commit": (env.get("BENCH_META_COMMIT") or "").strip() or None,
        "reps": number("BENCH_META_REPS"), "peer_reps": number("BENCH_META_PEER_REPS"),
        "steps": number("BENCH_META_STEPS"), "warmup": number("BENCH_META_WARMUP"),
        "slow_steps": number("BENCH_META_SLOW_STEPS"), "slow_warmup": number("BENCH_META_SLOW_WARMUP"),
        "cpus": env.get("BENCH_META_CPUS") or None,
        "traced": env.get("BENCH_META_TRACE") not in (None, "", "0"),
        "link": link,
    }


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[1] not in ("names", "shell", "meta"):
        sys.stderr.write(__doc__)
        return 2
    try:
        jobs = load(argv[0])
        if argv[1] == "names":
            print("\n".join(job["name"] for job in jobs))
        elif argv[1] == "shell" and len(argv) == 3:
            print(shell_assignments(find(jobs, argv[2])))
        elif argv[1] == "meta" and len(argv) == 4:
            link_path = os.environ.get("BENCH_META_LINK")
            link = None
            if link_path and os.path.isfile(link_path):
                with open(link_path) as handle:
                    link = json.load(handle)
            with open(argv[3], "w") as handle:
                json.dump(meta_record(find(jobs, argv[2]), os.environ, link), handle, indent=2, sort_keys=True)
                handle.write("\n")
        else:
            sys.stderr.write(__doc__)
            return 2
    except ManifestError as error:
        sys.stderr.write("bench: %s\n" % error)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
