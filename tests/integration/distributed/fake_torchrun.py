"""A stand-in for torchrun: starts N workers of one command, each with the environment torchrun gives
its workers (RANK, LOCAL_RANK, WORLD_SIZE, ...), waits for all and exits with the first failure.

Usage: fake_torchrun.py [--start-actpage-after] --nproc-per-node N COMMAND [ARGS...]

Like torchrun, it is itself a Python process that does no CUDA work: under `actpage run` it carries
the preload and passes its environment on to the workers unchanged, plus the rank variables.
--start-actpage-after: once the workers have exited, it makes one hooked CUDA call that allocates
nothing (cuMemFree_v2(0)), which starts the preloaded library in this process as torch's import
under the hook package starts it in torchrun's agent (no RANK here: rank 0 to a trace path's %r)."""

import ctypes
import os
import subprocess
import sys


def start_actpage():
    """A hooked call that allocates nothing, resolved in the process's global scope (the preload)."""
    free = getattr(ctypes.CDLL(None), "cuMemFree_v2", None)
    if free is None:
        sys.stderr.write("fake_torchrun: cuMemFree_v2 is not in the process (no preload?)\n")
        return
    free.argtypes = [ctypes.c_uint64]
    free(0)


def main(argv):
    start_after = bool(argv) and argv[0] == "--start-actpage-after"
    if start_after:
        argv = argv[1:]
    if len(argv) < 3 or argv[0] != "--nproc-per-node":
        sys.stderr.write("usage: fake_torchrun.py [--start-actpage-after] --nproc-per-node N COMMAND [ARGS...]\n")
        return 2
    count = int(argv[1])
    command = argv[2:]
    workers = []
    for rank in range(count):
        env = dict(os.environ)
        env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(count),
                    "LOCAL_WORLD_SIZE": str(count), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "fake"})
        workers.append(subprocess.Popen(command, env=env))
    codes = [worker.wait() for worker in workers]
    if start_after:
        start_actpage()
    failed = [code for code in codes if code != 0]
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
