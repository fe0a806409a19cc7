#!/usr/bin/env bash
# The side-by-side benchmark (docs/benchmarks.md): each example job run every way a user could keep
# its activation memory down, interleaved with repetitions, on one allocator backend
# (backend:cudaMallocAsync, the one actpage uses), then one table of ratios against the baseline and
# a PNG of memory saved against slowdown (scripts/bench_report.py).
#
# Run on the GPU machine from the repository root with the bundle in .gpu/ (scripts/gpu-bundle.sh):
#   scripts/bench.sh              # both jobs (about 8 minutes)
#   scripts/bench.sh llama        # or one job per call (about 4 minutes each); results accumulate
#   scripts/bench.sh qwen         # in out/bench
#
# Variants (examples/compare_runs.py names them so that bench_report.py knows their roles):
#   none               the job as is
#   actpage-observe    actpage run, config/observe.json (tag and trace only)
#   actpage-near-free  actpage run, the near-free policy (what the copy engine moves during forward)
#   actpage-all        actpage run, every MLP (Llama: config/llama-mlp-capped.json, keep_last 0, with
#                      vmm.prefill_cache, a 6 GiB cache and a 1 GiB offload_backlog_bytes) or expert
#                      block (Qwen3-MoE: config/qwen3-moe-experts.json, keep_last 2)
#   actpage-near-free-prefill-drain  the near-free policy with vmm.prefill_cache (3 GiB cache) and
#                      offload_drain_at_layers_end: more saving for some time (docs/performance.md)
#   actpage-near-free-catch-up  Llama config/llama-near-free-7.json, Qwen3-MoE
#                      config/qwen3-moe-near-free-6.json: the near-free settings (prefill, drain,
#                      vmm.trim_job_pool_catch_up) with one more layer, whose copy the drain may wait for:
#                      more saving for some time
#   actpage-all-drain  Llama: the actpage-all policy with offload_drain_at_backward_start, every MLP
#                      off the device before backward's first allocation (all 5.5 GiB, at the link's
#                      pace)
#   actpage-all-prefill-cap  Qwen3-MoE: the experts policy with vmm.prefill_cache (6 GiB cache) and a
#                      1 GiB offload_backlog_bytes
#   save_on_cpu        torch.autograd.graph.save_on_cpu(pin_memory=True), fewer steps (it is ~6.5x slower)
#   checkpointing      the model's gradient checkpointing
#   stream_offload     saved-tensor hooks and a side stream inside the job (examples/common.py)
# The three actpage variants after actpage-all and the last three, the peers, run BENCH_PEER_REPS times
# (default 1), the rest BENCH_REPS times (2): each run is a fresh process whose start (~15 s) costs more
# than its steps, and the targets are the first three actpage variants'. Both jobs: 28 runs, about 9 minutes on the H100.
#
# Settings (environment): BENCH_REPS (2), BENCH_PEER_REPS (1), BENCH_STEPS (12), BENCH_WARMUP (4),
# BENCH_SLOW_STEPS (6) and BENCH_SLOW_WARMUP (2) for save_on_cpu, BENCH_TRACE (1: trace the actpage
# runs, which the peak-share target needs; 0: no traces, that target is then not measured), BENCH_OUT
# (out/bench), BENCH_THREAD_STATS (0.5: every run's threads and the host's steal time of the job's CPUs
# looked at through /proc every 0.5 s, examples/thread_stats.py, which the report shows beside each
# variant's step time; 0: not watched), BENCH_CPU_PROBE (0.05: seconds a fixed Python loop is timed on
# each of the job's CPUs before and after every run, compare_runs.py --cpu-probe, shown as the
# slowest CPU against the call's usual rate; 0: not probed), PYTHON (python3), BENCH_JOB_PYTHON (the jobs' interpreter, default $PYTHON),
# BENCH_ACTPAGE (default .gpu/bin/actpage), BENCH_RUN_TIMEOUT (240 seconds a run), BENCH_CPUS (the CPU
# cores every job runs on, `taskset -c` syntax; default 2-9 where the machine has at least 10 cores and
# `taskset` is there, empty: unpinned). Pinned, a CPU-bound job (Qwen3-MoE syncs the host every layer)
# no longer follows the scheduler's moves between processes: its baseline's repetitions were up to 19%
# apart unpinned, which no variant's cost can be read through.
# Results: out/bench/JOB/{results.json,results.md,logs/,meta.json}, traces in out/bench/traces (not
# packed), the report in out/bench/{report.txt,report.json,bench.png,results.md}. When $OUT is set (the
# device tool), everything but the traces is packed into $OUT/bench-results.tar.gz.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${BENCH_OUT:-$root/out/bench}
mkdir -p "$out"
pack() { if [[ -n ${OUT:-} ]]; then tar czf "$OUT/bench-results.tar.gz" --exclude='*.trace' -C "$out" . && ls -la "$OUT"; fi; }
trap pack EXIT
python=${PYTHON:-python3}
job_python=${BENCH_JOB_PYTHON:-$python}
actpage=${BENCH_ACTPAGE:-$root/.gpu/bin/actpage}
reps=${BENCH_REPS:-2}
peer_reps=${BENCH_PEER_REPS:-1}
trace=${BENCH_TRACE:-1}
thread_stats=${BENCH_THREAD_STATS:-0.5}
cpu_probe=${BENCH_CPU_PROBE:-0.05}
run_timeout=${BENCH_RUN_TIMEOUT:-240}  # seconds a run may take: a hung run must not use up the device command
steps=${BENCH_STEPS:-12}
warmup=${BENCH_WARMUP:-4}
slow_steps=${BENCH_SLOW_STEPS:-6}
slow_warmup=${BENCH_SLOW_WARMUP:-2}
export PYTHONUNBUFFERED=1
if [[ -z ${BENCH_CPUS+set} ]]; then
  cpus=""
  if command -v taskset >/dev/null && [[ $(nproc 2>/dev/null || echo 1) -ge 10 ]]; then cpus=2-9; fi
else
  cpus=$BENCH_CPUS
fi
pin=()
[[ -z $cpus ]] || pin=(taskset -c "$cpus")

[[ -x $actpage ]] || { echo "bench: no $actpage: run scripts/gpu-bundle.sh and carry .gpu" >&2; exit 2; }
jobs=("$@")
[[ ${#jobs[@]} -gt 0 ]] || jobs=(llama qwen)
for job in "${jobs[@]}"; do
  [[ $job == llama || $job == qwen ]] || { echo "bench: unknown job $job (llama, qwen)" >&2; exit 2; }
done

device=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
commit=$(tr '\n' ' ' <"$root/.gpu/COMMIT" 2>/dev/null || git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
echo "bench: device ${device:-unknown}; bundle ${commit}; jobs ${jobs[*]}; reps $reps (peers $peer_reps), steps $steps (warm-up $warmup); cores ${cpus:-unpinned}"

failed=0
for job in "${jobs[@]}"; do
  case $job in
    llama)
      script=examples/train_llama.py
      args=(--layers 16 --hidden 2048 --ffn 5632 --heads 16 --seq 2048 --batch 4)
      near=config/llama-near-free.json
      all=config/llama-mlp-capped.json
      all_peer=(actpage-all-drain "policy=$all" env=ACTPAGE_OFFLOAD_DRAIN_AT_BACKWARD_START=true)
      catch_up=(policy=config/llama-near-free-7.json)
      ;;
    qwen)
      script=examples/train_qwen3_moe.py
      args=(--layers 8 --hidden 1024 --experts 16 --top-k 4 --moe-ffn 768 --seq 2048 --batch 4)
      near=config/qwen3-moe-near-free.json
      all=config/qwen3-moe-experts.json
      all_peer=(actpage-all-prefill-cap "policy=$all" env=ACTPAGE_VMM_PREFILL_CACHE=true
                env=ACTPAGE_VMM_CACHE_BYTES=6GiB env=ACTPAGE_OFFLOAD_BACKLOG_BYTES=1GiB)
      catch_up=(policy=config/qwen3-moe-near-free-6.json)
      ;;
  esac
  all_peer_spec=$(IFS=';'; echo "${all_peer[0]};actpage;async;reps=$peer_reps;${all_peer[*]:1}")
  catch_up_spec=$(IFS=';'; echo "${catch_up[*]}")
  job_out=$out/$job
  watch_args=()  # compare_runs.py options: traces, thread watch, CPU probe
  [[ $trace == 0 ]] || watch_args+=(--trace-dir "$out/traces/$job")
  [[ $thread_stats == 0 ]] || watch_args+=(--thread-stats "$thread_stats")
  [[ $cpu_probe == 0 ]] || watch_args+=(--cpu-probe "$cpu_probe")
  rm -rf "$job_out"
  mkdir -p "$job_out"
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  echo "=== $job: $script ${args[*]}"
  "$python" examples/compare_runs.py --reps "$reps" --actpage "$actpage" --out "$job_out" --timeout "$run_timeout" \
    "${watch_args[@]}" --baseline none \
    --variant "none;plain;async" \
    --variant "actpage-observe;actpage;async;policy=config/observe.json" \
    --variant "actpage-near-free;actpage;async;policy=$near" \
    --variant "actpage-all;actpage;async;policy=$all" \
    --variant "actpage-near-free-prefill-drain;actpage;async;reps=$peer_reps;policy=$near;env=ACTPAGE_VMM_PREFILL_CACHE=true;env=ACTPAGE_VMM_CACHE_BYTES=3GiB;env=ACTPAGE_OFFLOAD_DRAIN_AT_LAYERS_END=true" \
    --variant "actpage-near-free-catch-up;actpage;async;reps=$peer_reps;$catch_up_spec" \
    --variant "$all_peer_spec" \
    --variant "save_on_cpu;plain;async;reps=$peer_reps;--method save_on_cpu --steps $slow_steps --warmup $slow_warmup" \
    --variant "checkpointing;plain;async;reps=$peer_reps;--method checkpointing" \
    --variant "stream_offload;plain;async;reps=$peer_reps;--method stream_offload" \
    -- "${pin[@]}" "$job_python" "$script" "${args[@]}" --steps "$steps" --warmup "$warmup" --deterministic \
    2>&1 | tee "$job_out/compare.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "bench: $job: some runs failed (see $job_out/logs)"; failed=1; }
  BENCH_META_JOB=$job BENCH_META_STARTED=$started BENCH_META_DEVICE=$device BENCH_META_COMMIT=$commit \
  BENCH_META_REPS=$reps BENCH_META_PEER_REPS=$peer_reps BENCH_META_STEPS=$steps BENCH_META_WARMUP=$warmup \
  BENCH_META_NEAR=$near BENCH_META_ALL=$all BENCH_META_CPUS=$cpus "$python" - "$job_out/meta.json" <<'PY'
import datetime, json, os, sys
env = os.environ
meta = {"job": env["BENCH_META_JOB"], "started": env["BENCH_META_STARTED"],
        "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": env["BENCH_META_DEVICE"] or None, "commit": env["BENCH_META_COMMIT"].strip() or None,
        "reps": int(env["BENCH_META_REPS"]), "peer_reps": int(env["BENCH_META_PEER_REPS"]), "steps": int(env["BENCH_META_STEPS"]),
        "warmup": int(env["BENCH_META_WARMUP"]), "cpus": env["BENCH_META_CPUS"] or None,
        "policies": {"actpage-observe": "config/observe.json", "actpage-near-free": env["BENCH_META_NEAR"],
                     "actpage-all": env["BENCH_META_ALL"]}}
with open(sys.argv[1], "w") as handle:
    json.dump(meta, handle, indent=2, sort_keys=True)
    handle.write("\n")
PY
done

echo "=== report"
"$python" scripts/bench_report.py "$out" --png "$out/bench.png" --json "$out/report.json" \
  --markdown "$out/results.md" | tee "$out/report.txt"
[[ ${PIPESTATUS[0]} -eq 0 ]] || failed=1
exit $failed
