#!/usr/bin/env bash
# The CPU suite under sanitizers.
#
#   scripts/sanitize.sh [asan|tsan|all]   (default all)
#
# asan: AddressSanitizer + UndefinedBehaviorSanitizer build of everything (build-asan/, or
#       $ACTPAGE_ASAN_BUILD_DIR), then the whole CPU suite (labels gpu and fuzz excluded: the fuzzers
#       carry their own sanitizers). The preload tests put the sanitizer runtime first in LD_PRELOAD.
# tsan: ThreadSanitizer build (build-tsan/, or $ACTPAGE_TSAN_BUILD_DIR) of the engine and trace
#       writer tests only (the threads live there), then those tests.
# Each phase prints its wall time; any sanitizer report fails the run (-fno-sanitize-recover=all,
# halt_on_error).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
what=${1:-all}
jobs=${ACTPAGE_JOBS:-$(nproc)}
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DACTPAGE_BUILD_BENCH=OFF -DACTPAGE_BUILD_GPU_TESTS=OFF
        -DACTPAGE_FUZZ=OFF -DACTPAGE_CUDA_ROOT="${ACTPAGE_CUDA_ROOT:-/usr/local/cuda}")

timed() {
  local label=$1
  shift
  local start=$SECONDS
  "$@"
  echo "sanitize: $label took $((SECONDS - start)) s"
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

if [[ $what == asan || $what == all ]]; then
  build=${ACTPAGE_ASAN_BUILD_DIR:-$root/build-asan}
  timed "asan configure+build" bash -c "cmake -S '$root' -B '$build' ${common[*]} -DACTPAGE_SANITIZE=address,undefined >/dev/null && cmake --build '$build' -j $jobs >/dev/null"
  timed "asan suite" bash -c "cd '$build' && ctest --output-on-failure -j $jobs -LE 'gpu|fuzz'"
fi

if [[ $what == tsan || $what == all ]]; then
  build=${ACTPAGE_TSAN_BUILD_DIR:-$root/build-tsan}
  targets=(engine_test engine_torture_test engine_fault_test trace_writer_test)
  timed "tsan configure+build" bash -c "cmake -S '$root' -B '$build' ${common[*]} -DACTPAGE_SANITIZE=thread >/dev/null && cmake --build '$build' -j $jobs --target ${targets[*]} >/dev/null"
  # Fewer torture cases: TSan runs them ~10x slower.
  timed "tsan tests" bash -c "cd '$build' && ACTPAGE_TORTURE_SHORT_SEEDS=\${ACTPAGE_TORTURE_SHORT_SEEDS:-100} ctest --output-on-failure -j $jobs -R '^(Engine|EngineTorture|EngineFault|TraceWriter)\\.'"
fi
