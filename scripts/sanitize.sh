#!/usr/bin/env bash
# The CPU suite under sanitizers.
#
#   scripts/sanitize.sh [asan|tsan|all]   (default all)
#
# asan: AddressSanitizer + UndefinedBehaviorSanitizer build of everything (build-asan/, or
#       $ACTPAGE_ASAN_BUILD_DIR), then the whole CPU suite (labels gpu and fuzz excluded: the fuzzers
#       carry their own sanitizers). The preload tests put the sanitizer runtime first in LD_PRELOAD;
#       the fork test runs apart, its hang (a known limit of the runtime) retried (see below).
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

# Runs a phase and prints its wall time, also when it fails (then with its exit status).
timed() {
  local label=$1
  shift
  local start=$SECONDS status=0
  "$@" || status=$?
  if ((status == 0)); then
    echo "sanitize: $label took $((SECONDS - start)) s"
  else
    echo "sanitize: $label took $((SECONDS - start)) s and FAILED (exit status $status)"
  fi
  return $status
}

# verify_asan_link_order=0: `actpage run` (tests/integration/run) preloads the library into the job
# it starts, by design first in LD_PRELOAD. In this build the library is instrumented and the job
# (/bin/sh, python3, a test program) is not, so the ASan runtime arrives as the library's dependency
# rather than first, and ASan would refuse to start the job ("ASan runtime does not come first").
# The option only matters in such processes; instrumented test programs link the runtime themselves
# and the preload tests put it first in LD_PRELOAD.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1:verify_asan_link_order=0}
# Leaks inside torch, in the python3 jobs of the Python tests, are torch's (scripts/lsan.supp).
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/scripts/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# no_huge_pages_for_shadow=0: the engine tests allocate and free many large buffers, and TSan resets
# the shadow of each freed one; on 4 KiB shadow pages that is ~1.8 million page faults and TLB
# shootdowns in one test (AutoMode.NothingFitsPagesNothing: 5 s of system time beside 1.5 s of
# user time). With huge pages allowed for the shadow (where the kernel's transparent_hugepage is
# madvise or always) the TSan step's tests took 272 s of CPU instead of 417 s (144 s instead of
# 216 s on 2 cores, 2026-11-28). Only how the shadow is paged changes: what TSan checks and reports
# is the same.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:no_huge_pages_for_shadow=0}

if [[ $what == asan || $what == all ]]; then
  build=${ACTPAGE_ASAN_BUILD_DIR:-$root/build-asan}
  timed "asan configure+build" bash -c "cmake -S '$root' -B '$build' ${common[*]} -DACTPAGE_SANITIZE=address,undefined >/dev/null && cmake --build '$build' -j $jobs >/dev/null"
  # The fork test on its own: its parent has other threads, and GCC 12's ASan runtime (unlike glibc's
  # malloc) does not hold its allocator's locks across fork(), so once in a while the child's first
  # allocation waits for a lock that a thread of the parent held at the fork and that nobody is left
  # to release (seen once in three full runs, on a loaded machine: docs/reliability.md). A timeout is
  # retried; a failure (a sanitizer report) is not.
  fork_test='^PreloadTest\.AForkedChildTracesIntoAFileOfItsOwn$'
  timed "asan suite" bash -c "cd '$build' && ctest --output-on-failure -j $jobs -LE 'gpu|fuzz' -E '$fork_test'"
  timed "asan fork test" bash -c "cd '$build' && ctest --output-on-failure -R '$fork_test' --timeout 60 --repeat after-timeout:3"
fi

if [[ $what == tsan || $what == all ]]; then
  build=${ACTPAGE_TSAN_BUILD_DIR:-$root/build-tsan}
  # ACTPAGE_TSAN_TARGETS / ACTPAGE_TSAN_TESTS: the binaries built and the tests run (a CTest regex),
  # for a shorter run (.ci/run's); by default all of the engine's and the trace writer's.
  read -r -a targets <<<"${ACTPAGE_TSAN_TARGETS:-engine_test engine_range_cache_test engine_job_pool_test engine_torture_test engine_fault_test engine_saved_test engine_temporary_keys_test engine_gpu_clock_test engine_auto_test engine_auto_goal_test trace_writer_test}"
  tests=${ACTPAGE_TSAN_TESTS:-'^(Engine|EngineLockGaps|EngineTorture|EngineFault|SavedTensors|TemporaryKeys|GpuClock|AutoMode|TraceWriter)[./]'}
  # -g1: line tables and inlined frames only, all that TSan's reports print (function, file:line,
  # inlined callers, the global's name). The 7 binaries from scratch on 2 cores took 163 s of CPU
  # and 106 s instead of 216 s and 144 s with the full -g (2026-11-28).
  timed "tsan configure+build" bash -c "cmake -S '$root' -B '$build' ${common[*]} -DCMAKE_CXX_FLAGS_RELWITHDEBINFO='-O2 -g1 -DNDEBUG' -DACTPAGE_SANITIZE=thread >/dev/null && cmake --build '$build' -j $jobs --target ${targets[*]} >/dev/null"
  # Fewer torture cases: TSan runs them ~10x slower. The slowest single-scenario engine tests stay in
  # the plain suite only (15-66 s each under TSan, 225 s together on 2 cores, 2026-11-27): their
  # threads are the workers the torture, fault and threaded tests drive here (ACTPAGE_TSAN_SKIP=''
  # runs them too).
  skip=${ACTPAGE_TSAN_SKIP-'^Engine\.(PrefilledCacheServesTheWholeForwardWithoutMapsOrGrants|PrefillCreatesNoMoreThanTheJobsPoolGivesBack|RecyclingWhileCopiesRunGrantsAccessOnceForSeveralRanges|TheLayersEndWaitsUntilEverySealedActivationHasLeft|EachCopiedActivationsPagesGoBackWithAtMostOneUnmap|OffloadCopiesGoOutInChunksAndEveryByteComesBack|TheTraceShowsTheJobsWaitsAndThePoolsPinning)$'}
  timed "tsan tests" bash -c "cd '$build' && ACTPAGE_TORTURE_SHORT_SEEDS=\${ACTPAGE_TORTURE_SHORT_SEEDS:-50} ctest --output-on-failure -j $jobs -R '$tests' -E '${skip:-^\$}'"
fi
