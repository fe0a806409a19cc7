#!/usr/bin/env bash
# Long randomised runs of the engine on the simulated device (tests/unit/engine/engine_torture_test):
# many more seeds than the suite's quick set, every byte checked, leaks checked after each case.
#
#   scripts/torture.sh [CASES] [FIRST_SEED]     (default 2000 cases from seed 1)
#
# Runs CASES large cases (2 MiB pages, tensors to 6 MiB), 10 x CASES short ones and CASES / 4
# threaded ones (2-6 job threads, each on its own stream). A failing case prints its seed; rerun it
# alone with ACTPAGE_TORTURE_SEEDS=1 ACTPAGE_TORTURE_FIRST=<seed> ACTPAGE_TEST_VERBOSE=1.
# Uses the build in $ACTPAGE_BUILD_DIR (default build/), building the test if needed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ACTPAGE_BUILD_DIR:-$root/build}
cases=${1:-2000}
first=${2:-1}
if [[ ! -x $build/bin/engine_torture_test ]]; then
  cmake -S "$root" -B "$build" >/dev/null
  cmake --build "$build" -j "${ACTPAGE_JOBS:-$(nproc)}" --target engine_torture_test >/dev/null
fi
start=$SECONDS
ACTPAGE_TORTURE_SEEDS=$cases ACTPAGE_TORTURE_FIRST=$first ACTPAGE_TORTURE_SHORT_SEEDS=$((cases * 10)) \
  ACTPAGE_TORTURE_THREAD_SEEDS=$((cases / 4)) "$build/bin/engine_torture_test" | grep -E '^torture|FAILED|PASSED|Failure|seed'
echo "torture.sh: $((SECONDS - start)) s"
