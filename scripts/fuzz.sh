#!/usr/bin/env bash
# Runs the libFuzzer targets (tests/fuzz): the policy loader and the trace reader.
#
#   scripts/fuzz.sh [--seconds N] [--jobs J] [--bin DIR] [--work DIR] [target...]
#
# --seconds  per target (default 600: the long run; the suite's fuzz_short test passes 10)
# --jobs     parallel fuzzing processes per target (default 1)
# --bin      folder holding the built fuzzers; without it they are built with clang into
#            build-fuzz/ (ACTPAGE_FUZZ_BUILD_DIR)
# --work     where the growing corpus and any crash reproducer go (default build-fuzz/work)
#
# Seeds: config/*.json, tests/policies/*.json and tests/unit/policy/data/*.json (policy files), a
# few environment values for each ACTPAGE_* variable, tests/golden/*.trace.bin and the head of
# examples/llama-observe.trace (whole and cut short, as a killed job leaves it), and the inputs of
# tests/fuzz/regressions that once failed. Prints one line per target:
#   fuzz: fuzz_policy: 123456 executions in 10 s, corpus 321 inputs, no failure
# and exits non-zero on a crash, a leak, an assertion of the target, or an input that runs past
# --timeout seconds (a hang); the reproducer is kept under --work.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=600
jobs=1
bin=""
work=""
per_input_timeout=10
targets=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --timeout) per_input_timeout=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=(fuzz_policy fuzz_trace_reader)

if [[ -z $bin ]]; then
  bin=${ACTPAGE_FUZZ_BUILD_DIR:-$root/build-fuzz}
  clangxx=$(command -v clang++ || command -v clang++-14 || true)
  if [[ -z $clangxx ]]; then
    echo "fuzz.sh: clang++ is needed for libFuzzer (scripts/setup.sh installs it)" >&2
    exit 1
  fi
  cmake -S "$root/tests/fuzz" -B "$bin" -DCMAKE_CXX_COMPILER="$clangxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$bin" -j "${ACTPAGE_JOBS:-$(nproc)}" >/dev/null
fi
work=${work:-$bin/work}
mkdir -p "$work"

# The seed corpus, written afresh each run (read-only input; new finds go to $work/corpus/<target>).
seeds=$work/seeds
rm -rf "$seeds"
mkdir -p "$seeds/fuzz_policy" "$seeds/fuzz_trace_reader"
n=0
for file in "$root"/config/*.json "$root"/tests/policies/*.json "$root"/tests/unit/policy/data/*.json; do
  # First byte even: the rest is a policy file.
  { printf '\x00'; cat "$file"; } >"$seeds/fuzz_policy/file-$((n++))"
done
# First byte odd: the rest is the value of ACTPAGE_* variable number (byte / 2).
env_values=(true false 0 1 2GiB 512KiB 1.5GB -3 99999999999999999999TiB offload observe poison
            'model.layers.*.mlp,*.experts' '*.backward' auto '[0-13]' '%p-%r.trace' '' ' ' $'\xff\xfe')
for index in $(seq 0 31); do
  for value in "${env_values[@]}"; do
    { printf "\\x$(printf %02x $((index * 2 + 1)))"; printf '%s' "$value"; } >"$seeds/fuzz_policy/env-$((n++))"
  done
done
for file in "$root"/tests/golden/*.trace.bin; do cp "$file" "$seeds/fuzz_trace_reader/"; done
if [[ -f $root/examples/llama-observe.trace ]]; then
  head -c 16384 "$root/examples/llama-observe.trace" >"$seeds/fuzz_trace_reader/llama-head"
  head -c 5000 "$root/examples/llama-observe.trace" >"$seeds/fuzz_trace_reader/llama-cut"
fi

# Inputs that once failed (tests/fuzz/regressions/<target>/), kept so that every run, the suite's
# short one included, tries them again first.
for target in fuzz_policy fuzz_trace_reader; do
  if [[ -d $root/tests/fuzz/regressions/$target ]]; then
    cp "$root/tests/fuzz/regressions/$target"/* "$seeds/$target/"
  fi
done

status=0
for target in "${targets[@]}"; do
  exe=$bin/$target
  if [[ ! -x $exe ]]; then
    echo "fuzz.sh: $exe is not built" >&2
    exit 1
  fi
  corpus=$work/corpus/$target
  mkdir -p "$corpus" "$work/artifacts"
  log=$work/$target.log
  args=(-max_total_time="$seconds" -timeout="$per_input_timeout" -rss_limit_mb=2048 -max_len=16384
        -artifact_prefix="$work/artifacts/$target-" -print_final_stats=1)
  if ((jobs > 1)); then args+=(-fork="$jobs"); fi
  start=$(date +%s.%N)
  if ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$exe" "${args[@]}" "$corpus" "$seeds/$target" >"$log" 2>&1; then
    result="no failure"
  else
    result="FAILED (see $log and $work/artifacts/)"
    status=1
  fi
  elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.0f", e - s }')
  # "stat::number_of_executed_units: N" (final stats); fork mode prints "#N ... DONE" lines instead.
  execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1 || true)
  if [[ -z $execs ]]; then execs=$(grep -Eo '^#[0-9]+' "$log" | tail -1 | tr -d '#' || true); fi
  inputs=$(find "$corpus" -type f | wc -l)
  echo "fuzz: $target: ${execs:-?} executions in $elapsed s, corpus $inputs inputs, $result"
  if [[ $result != "no failure" ]]; then tail -40 "$log" >&2; fi
done
exit $status
