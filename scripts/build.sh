#!/usr/bin/env bash
# Configures and builds actpage into build/ (or $ACTPAGE_BUILD_DIR) with warnings as errors.
#
# ACTPAGE_DEBUG_LEVEL: the debug info of the RelWithDebInfo build, -g<level>; 2 (-g, CMake's own
# flags) unless set. CI (.ci/run) sets 1: line tables, function names and inlined frames, what a
# backtrace or a sanitizer report prints, no local variables. GCC emits the same machine code at
# either level (objdump -d -r of every object file compared, 2026-11-28), so CI tests the same code
# as -g builds it; the compile takes about a quarter less CPU (-g1: 422 s, -g: 576 s for the
# build's 154 files). Set on every configure, so that a folder built by CI goes back to -g.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ACTPAGE_BUILD_DIR:-$root/build}
jobs=${ACTPAGE_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${ACTPAGE_BUILD_TYPE:-RelWithDebInfo} \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g${ACTPAGE_DEBUG_LEVEL:-2} -DNDEBUG" \
  -DACTPAGE_WERROR=ON -DACTPAGE_CUDA_ROOT="${ACTPAGE_CUDA_ROOT:-/usr/local/cuda}" "$@" >/dev/null
cmake --build "$build" -j "$jobs"
