#!/usr/bin/env bash
# The test command: sets up, builds, and runs the whole CPU suite through CTest. GPU tests (label
# "gpu") run too when this machine has a CUDA GPU and driver, and are skipped by label otherwise;
# any other skip fails the run unless tests/may_skip.txt allows it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build=${ACTPAGE_BUILD_DIR:-$root/build}

label_args=(-LE gpu)
if "$root/scripts/has-gpu.sh"; then
  echo "test: a CUDA GPU is present: running the gpu label too"
  label_args=()
else
  echo "test: no CUDA GPU here: tests labelled gpu are skipped (scripts/gpu-test.sh runs them on a GPU machine)"
fi
cd "$build"
# CTest's output is kept: a test reported skipped that tests/may_skip.txt does not allow fails the
# run (a GoogleTest suite whose set-up fails has its tests skipped, which CTest does not count as
# failed: scripts/check_skips.py).
log="$build/Testing/ctest-output.log"
mkdir -p "$(dirname "$log")"
ctest --output-on-failure -j "${ACTPAGE_JOBS:-$(nproc)}" "${label_args[@]}" "$@" 2>&1 | tee "$log"
python3 "$root/scripts/check_skips.py" "$log"
