#!/usr/bin/env bash
# Before and after: the example jobs in auto mode (no policy, what a user runs) and under a fixed
# policy (tests/policies/) run by two builds of actpage side by side, in one examples/compare_runs.py
# call per job with interleaved repetitions, so that a change meant to keep behaviour (a
# refactoring) is shown to keep the step time, the memory and the losses bit for bit.
#
#   scripts/bench_ab.sh BEFORE_ACTPAGE [llama] [qwen]     # on the GPU machine, from the repository root
#
# BEFORE_ACTPAGE is the other build's CLI (e.g. a bundle of the old commit carried as .gpu-before:
# `git worktree add /tmp/before COMMIT && (cd /tmp/before && scripts/gpu-bundle.sh)`, then copy its
# .gpu). The "after" build is $BENCH_ACTPAGE (.gpu/bin/actpage). Each build runs with its own Python
# hook package (actpage run puts the one beside it on PYTHONPATH) and the policies of this checkout.
# Variants per job: none (the job as is, the reference for losses), before-auto and after-auto
# (`actpage run -- JOB`), and for the job's fixed policy P (Llama: tests/policies/llama-mlp.json,
# every MLP; Qwen3-MoE: tests/policies/qwen3-moe-experts.json, the experts) before-P and after-P.
# Settings: BENCH_REPS (2), BENCH_STEPS (12), BENCH_WARMUP (4), BENCH_RUN_TIMEOUT (240 s), BENCH_OUT
# (out/bench-ab), PYTHON (python3), BENCH_JOB_PYTHON.
# Results: out/bench-ab/JOB/{results.json,results.md,compare.log,logs/}; with $OUT set (the device
# tool) everything is packed into $OUT/bench-ab.tar.gz.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[[ $# -ge 1 ]] || { echo "usage: scripts/bench_ab.sh BEFORE_ACTPAGE [llama] [qwen]" >&2; exit 2; }
before=$1
shift
after=${BENCH_ACTPAGE:-$root/.gpu/bin/actpage}
for build in "$before" "$after"; do
  [[ -x $build ]] || { echo "bench_ab: $build is not an executable actpage" >&2; exit 2; }
done
out=${BENCH_OUT:-$root/out/bench-ab}
python=${PYTHON:-python3}
job_python=${BENCH_JOB_PYTHON:-$python}
reps=${BENCH_REPS:-2}
steps=${BENCH_STEPS:-12}
warmup=${BENCH_WARMUP:-4}
run_timeout=${BENCH_RUN_TIMEOUT:-240}
export PYTHONUNBUFFERED=1
jobs=("$@")
[[ ${#jobs[@]} -gt 0 ]] || jobs=(llama qwen)
mkdir -p "$out"
trap '[[ -z ${OUT:-} ]] || tar czf "$OUT/bench-ab.tar.gz" -C "$out" .' EXIT

failed=0
for job in "${jobs[@]}"; do
  case $job in
    llama)
      script=examples/train_llama.py
      args=(--layers 16 --hidden 2048 --ffn 5632 --heads 16 --seq 2048 --batch 4)
      policies=(none tests/policies/llama-mlp.json)
      ;;
    qwen)
      script=examples/train_qwen3_moe.py
      args=(--layers 8 --hidden 1024 --experts 16 --top-k 4 --moe-ffn 768 --seq 2048 --batch 4)
      policies=(none tests/policies/qwen3-moe-experts.json)
      ;;
    *) echo "bench_ab: unknown job $job (llama, qwen)" >&2; exit 2 ;;
  esac
  variants=(--variant "none;plain;async")
  for policy in "${policies[@]}"; do
    # none: auto mode, compare_runs' policy=none (no --policy, no ACTPAGE_POLICY)
    if [[ $policy == none ]]; then name=auto; else name=$(basename "$policy" .json); fi
    variants+=(--variant "before-$name;actpage;async;policy=$policy;actpage=$before"
               --variant "after-$name;actpage;async;policy=$policy;actpage=$after")
  done
  job_out=$out/$job
  rm -rf "$job_out"
  mkdir -p "$job_out"
  echo "=== $job: $script ${args[*]}; before $before ($(tr '\n' ' ' <"$(dirname "$before")/../COMMIT" 2>/dev/null))," \
       "after $after ($(tr '\n' ' ' <"$(dirname "$after")/../COMMIT" 2>/dev/null))"
  "$python" examples/compare_runs.py --reps "$reps" --actpage "$after" --out "$job_out" --timeout "$run_timeout" \
    --baseline none "${variants[@]}" \
    -- "$job_python" "$script" "${args[@]}" --steps "$steps" --warmup "$warmup" --deterministic \
    2>&1 | tee "$job_out/compare.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "bench_ab: $job: some runs failed (see $job_out/logs)"; failed=1; }
done
exit $failed
