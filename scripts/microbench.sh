#!/usr/bin/env bash
# CPU microbenchmarks of the hot paths (Google Benchmark): the intercepted call (bench/interpose_bench),
# the trace record (bench/trace_bench) and the engine's decision and tag lookup (bench/engine_bench).
# Builds them in a Release build dir (ACTPAGE_BENCH_BUILD_DIR, default build-bench) and runs each;
# extra arguments go to every benchmark binary (e.g. --benchmark_filter=Hook).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ACTPAGE_BENCH_BUILD_DIR:-$root/build-bench}
"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DACTPAGE_BUILD_BENCH=ON >/dev/null
cmake --build "$build" -j "${ACTPAGE_JOBS:-$(nproc)}" --target interpose_bench trace_bench engine_bench
for bench in interpose_bench trace_bench engine_bench; do
  echo "=== $bench"
  "$build/bin/$bench" --benchmark_min_time=${ACTPAGE_BENCH_MIN_TIME:-0.5} "$@"
done
