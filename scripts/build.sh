#!/usr/bin/env bash
# Configures and builds actpage into build/ (or $ACTPAGE_BUILD_DIR) with warnings as errors.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ACTPAGE_BUILD_DIR:-$root/build}
jobs=${ACTPAGE_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${ACTPAGE_BUILD_TYPE:-RelWithDebInfo} \
  -DACTPAGE_WERROR=ON -DACTPAGE_CUDA_ROOT="${ACTPAGE_CUDA_ROOT:-/usr/local/cuda}" "$@" >/dev/null
cmake --build "$build" -j "$jobs"
