#!/usr/bin/env bash
# The zoo benchmark (issue 33, docs/benchmarks.md): each job of the zoo's manifest
# (examples/zoo/jobs.json) run every way a user could keep its activation memory down, in one
# examples/compare_runs.py call per job with interleaved repetitions, all on one allocator backend
# (backend:cudaMallocAsync, the one actpage uses); then per job a Pareto table of device memory saved
# against step time, with losses checked and each saving as a share of the job's link bound, and one
# PNG with a panel per job (scripts/bench_report.py). No variant uses a policy written for one job.
#
# Run on the GPU machine from the repository root with the bundle in .gpu/ (scripts/gpu-bundle.sh):
#   scripts/bench.sh                          # every job of the manifest
#   scripts/bench.sh gpu_bound_llama resnet   # a subset; results accumulate in out/bench/JOB/
#   scripts/bench.sh --list [JOB...]          # what would run, and how many runs, without running
#   scripts/bench.sh --report                 # only rebuild the report from what out/bench holds
# A device command runs at most 10 minutes: give each call jobs worth at most ~8 minutes (below),
# then unpack each call's bench-results.tar.gz into out/bench and run `scripts/bench.sh --report`
# here (the CPU machine has matplotlib for the PNG; the GPU machine may not).
#
# Variants (compare_runs names them so that bench_report.py knows their roles):
#   none               the job as is: the baseline
#   actpage-observe    actpage run --policy config/observe.json (tag and trace only)
#   actpage            actpage run with no policy at all: what a new user types
#   actpage-default    actpage run --policy config/default-policy.json (every `*.mlp` and expert
#                      range: the shipped generic policy, not written for any one job)
#   actpage-device-memory  actpage run with no policy and a target for the peak of device memory in
#                      use (`--device-memory`, ACTPAGE_AUTO_DEVICE_MEMORY): BENCH_DEVICE_MEMORY (75%)
#                      of the job's peak in its preflight run (issue 37: "25% below the unpaged
#                      peak"); with it the preflight runs (BENCH_PREFLIGHT_STEPS, 3 when unset)
#   checkpointing      the job's gradient checkpointing (`--method checkpointing`), where the
#                      manifest says it has one ("checkpointing": "method")
#   actpage-default+checkpointing  actpage's default policy on top of that checkpointing
#   actpage+checkpointing  actpage run with no policy (auto mode) on top of that checkpointing
#   no-checkpointing   where the job checkpoints by default ("checkpointing": "default-on",
#                      long-context): its baseline already checkpoints, this turns it off
#   save_on_cpu        torch.autograd.graph.save_on_cpu(pin_memory=True), fewer steps (it is ~6x
#                      slower), where the manifest lists the method
#   stream_offload     the in-job streamed offload (saved-tensor hooks, a side stream) of the
#                      manifest's stream_offload_modules, where it lists the method
#
# The link bound: at the start this machine's pinned D2H rate is measured once (`actpage calibrate
# --quick`, else a small torch script: scripts/bench_link.py, out/bench/link.json says which); the
# report multiplies it by each job's baseline forward GPU time (median_fwd_ms, CUDA events).
#
# Time (the single-GPU zoo, 1 repetition): a job with checkpointing, save_on_cpu and stream_offload
# makes 10 runs and a short preflight, compiled and long-context 8: about 80 runs.
# A run is mostly the process's start (imports, model build, CUDA context, ~12-15 s): an 8-layer
# examples/train_llama.py took 19 s a run on an H200, save_on_cpu's 6 slow steps included; the zoo's
# larger jobs (hidden 4096, seq 4096-32k) and compiled's compilation take longer. At 20-25 s a run
# the zoo takes 30-35 minutes, ~4 minutes a job: give a device call two jobs (compiled and
# long-context alone: 32 steps of its 1.6 s add ~40 s a run), and
# fsdp2 its own call on nvidia-h100-x2 (4 variants took 100 s for a 4-layer FSDP2 Llama). Each
# further repetition (BENCH_REPS) adds the main variants' runs again; BENCH_SKIP_VARIANTS drops some.
# `--list` prints each job's runs and an estimate.
#
# Settings (environment): BENCH_MANIFEST (examples/zoo/jobs.json), BENCH_REPS (1: repetitions of
# the main variants), BENCH_PEER_REPS (1: of save_on_cpu and stream_offload), BENCH_STEPS (32),
# BENCH_WARMUP (20), BENCH_SLOW_STEPS (6) and BENCH_SLOW_WARMUP (2) for save_on_cpu, BENCH_TRACE (0:
# actpage runs untraced, as a user runs them, but for observe, which traces by its policy; 1: every
# actpage run traced into out/bench/traces/JOB, the report then shows the bytes off the device at
# actpage's peak), BENCH_OUT (out/bench), BENCH_THREAD_STATS (0.5: each run's threads and the host's
# steal of the job's CPUs every 0.5 s, examples/thread_stats.py; 0: off), BENCH_CPU_PROBE (0.05: a
# fixed loop timed on each of the job's CPUs around each run; 0: off), PYTHON (python3),
# BENCH_JOB_PYTHON (the jobs' interpreter, default $PYTHON), BENCH_ACTPAGE (.gpu/bin/actpage),
# BENCH_RUN_TIMEOUT (300 seconds a run: a hung run must not use up the device command), BENCH_CPUS
# (the cores every job runs on, `taskset -c` syntax; default 2-9 where the machine has at least 10
# cores and taskset is there; empty: unpinned), BENCH_GPUS (this machine's GPU count, default from
# `nvidia-smi -L`: jobs needing more are skipped with a message), BENCH_SKIP_VARIANTS (variant names
# not to run, comma-separated, e.g. save_on_cpu,stream_offload: a quicker pass), BENCH_VARIANTS (the
# only variants to run, comma-separated; none, the baseline, always runs), BENCH_EXTRA_VARIANTS
# (variants of the caller's, compare_runs --variant specs one a line, run besides whatever the two
# before leave: a change against main side by side on the zoo, e.g. the other build carried as
# .gpu-before: "actpage-before;actpage;async;policy=none;actpage=.gpu-before/bin/actpage"), BENCH_RUN_ESTIMATE_S
# (20: --list's seconds a run), BENCH_DEVICE_MEMORY (75%: actpage-device-memory's target as a share of
# the preflight's peak; 0: no such variant, and no preflight unless asked), BENCH_PREFLIGHT_STEPS (3
# with BENCH_DEVICE_MEMORY, else 0: a short plain run of each job first; a job that fails it is skipped).
# Results: out/bench/JOB/{results.json,results.md,meta.json,compare.log,logs/} (a skipped job:
# skipped.json), out/bench/{link.json,calibration.json}, the report in out/bench/{report.txt,
# report.json,results.md,bench.png}. When $OUT is set (the device tool), everything but the traces
# is packed into $OUT/bench-results.tar.gz.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${BENCH_OUT:-$root/out/bench}
mkdir -p "$out"
pack() { if [[ -n ${OUT:-} && $mode != list ]]; then tar czf "$OUT/bench-results.tar.gz" --exclude='*.trace' --exclude='./traces' -C "$out" . && ls -la "$OUT"; fi; }
mode=run
trap pack EXIT
manifest=${BENCH_MANIFEST:-$root/examples/zoo/jobs.json}
python=${PYTHON:-python3}
job_python=${BENCH_JOB_PYTHON:-$python}
actpage=${BENCH_ACTPAGE:-$root/.gpu/bin/actpage}
reps=${BENCH_REPS:-1}
peer_reps=${BENCH_PEER_REPS:-1}
trace=${BENCH_TRACE:-0}
thread_stats=${BENCH_THREAD_STATS:-0.5}
cpu_probe=${BENCH_CPU_PROBE:-0.05}
preflight_steps=${BENCH_PREFLIGHT_STEPS:-0}  # >0: a short plain run of each job first; a job that fails it is skipped
# The device-memory goal's target as a share of the preflight's peak: "75%" (default), 0: no such variant.
device_memory_share=${BENCH_DEVICE_MEMORY-75%}
device_memory_share=${device_memory_share%\%}
[[ $device_memory_share =~ ^[0-9]+$ ]] && (( device_memory_share < 100 )) ||
  { echo "bench: BENCH_DEVICE_MEMORY must be a share of the preflight's peak below 100%, such as 75%, or 0 (got ${BENCH_DEVICE_MEMORY-})" >&2; exit 2; }
# Not when the variant is left out (BENCH_SKIP_VARIANTS, BENCH_VARIANTS below).
if [[ ,${BENCH_SKIP_VARIANTS:-}, == *,actpage-device-memory,* ]] ||
   [[ -n ${BENCH_VARIANTS:-} && ,$BENCH_VARIANTS, != *,actpage-device-memory,* ]]; then
  device_memory_share=0
fi
if (( device_memory_share > 0 )) && [[ -z ${BENCH_PREFLIGHT_STEPS:-} ]]; then preflight_steps=3; fi
run_timeout=${BENCH_RUN_TIMEOUT:-300}
# --list's estimate of a run's seconds, start included: an 8-layer examples/train_llama.py took 19 s a
# run (H200, 8 steps, 2026-11-27); bigger zoo jobs take longer.
run_estimate=${BENCH_RUN_ESTIMATE_S:-20}
skip_variants=${BENCH_SKIP_VARIANTS:-}
only_variants=${BENCH_VARIANTS:-}  # empty: every variant; else these (and none, the baseline)
extra_variants=${BENCH_EXTRA_VARIANTS:-}  # compare_runs --variant specs, one a line, run besides
# Auto mode's governor judges, probes and settles by the job's pass 12-22 (docs/engine.md, "The
# governor"): the steps measured come after that.
steps=${BENCH_STEPS:-32}
warmup=${BENCH_WARMUP:-20}
slow_steps=${BENCH_SLOW_STEPS:-6}
slow_warmup=${BENCH_SLOW_WARMUP:-2}
export PYTHONUNBUFFERED=1

report() {
  "$python" scripts/bench_report.py "$out" --manifest "$manifest" --png "$out/bench.png" --json "$out/report.json" \
    --markdown "$out/results.md" | tee "$out/report.txt"
  return "${PIPESTATUS[0]}"
}

[[ ,$skip_variants, != *,none,* ]] || { echo "bench: BENCH_SKIP_VARIANTS cannot drop none, the baseline" >&2; exit 2; }
case ${1:-} in
  --report) report; exit $? ;;
  --list) mode=list; shift ;;
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  -*) echo "bench: unknown option $1 (--list, --report, --help)" >&2; exit 2 ;;
esac

[[ -f $manifest ]] || { echo "bench: no manifest $manifest (the zoo, issue 33; or set BENCH_MANIFEST)" >&2; exit 2; }
all_jobs=$("$python" scripts/bench_manifest.py "$manifest" names) || exit 2
jobs=("$@")
[[ ${#jobs[@]} -gt 0 ]] || mapfile -t jobs <<<"$all_jobs"
for job in "${jobs[@]}"; do
  grep -qxF -- "$job" <<<"$all_jobs" || { echo "bench: unknown job $job (jobs: ${all_jobs//$'\n'/ })" >&2; exit 2; }
done

if [[ -z ${BENCH_CPUS+set} ]]; then
  cpus=""
  if command -v taskset >/dev/null && [[ $(nproc 2>/dev/null || echo 1) -ge 10 ]]; then cpus=2-9; fi
else
  cpus=$BENCH_CPUS
fi
pin=()
[[ -z $cpus ]] || pin=(taskset -c "$cpus")
gpus_here=${BENCH_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}

has_method() { local m; for m in "${job_methods[@]}"; do [[ $m == "$1" ]] && return 0; done; return 1; }

# The variants of the job whose manifest fields are in job_* (bench_manifest.py shell), into
# `variants`: compare_runs --variant specs, NAME;MODE;ALLOC[;OPTION...][;EXTRA ARGS].
job_variants() {
  local observe="actpage-observe;actpage;async;policy=config/observe.json"
  # Untraced, observe still traces (its policy asks for it): into the traces folder, not the cwd.
  [[ $trace != 0 ]] || observe+=";env=ACTPAGE_TRACE_PATH=$out/traces/$job/actpage-observe.%p.trace"
  variants=(
    "none;plain;async"
    "$observe"
    "actpage;actpage;async;policy=none"
    "actpage-default;actpage;async;policy=config/default-policy.json"
  )
  # The target comes from the preflight's peak (device_memory_target, set where it ran; none: left out).
  if (( device_memory_share > 0 )) && [[ -n ${device_memory_target:-} ]]; then
    variants+=("actpage-device-memory;actpage;async;policy=none;env=ACTPAGE_AUTO_DEVICE_MEMORY=$device_memory_target")
  fi
  case $job_checkpointing in
    method) variants+=("checkpointing;plain;async;--method checkpointing"
                       "actpage-default+checkpointing;actpage;async;policy=config/default-policy.json;--method checkpointing"
                       "actpage+checkpointing;actpage;async;policy=none;--method checkpointing") ;;
    default-on) variants+=("no-checkpointing;plain;async;--no-checkpointing") ;;
  esac
  if has_method save_on_cpu; then
    variants+=("save_on_cpu;plain;async;reps=$peer_reps;--method save_on_cpu --steps $slow_steps --warmup $slow_warmup")
  fi
  if has_method stream_offload; then
    variants+=("stream_offload;plain;async;reps=$peer_reps;--method stream_offload${job_stream_offload_modules:+ --offload-modules $job_stream_offload_modules}")
  fi
  local kept=() spec
  for spec in "${variants[@]}"; do
    local name=${spec%%;*}
    [[ ,${skip_variants}, == *",$name,"* ]] && continue
    [[ -z $only_variants || $name == none || ,${only_variants}, == *",$name,"* ]] || continue
    kept+=("$spec")
  done
  # The caller's own variants, always run: another build of actpage beside this one, an option's
  # other value (`actpage=PATH`, `env=NAME=VALUE`).
  while IFS= read -r spec; do
    [[ -n $spec ]] && kept+=("$spec")
  done <<<"$extra_variants"
  variants=("${kept[@]}")
}

# The job's command (into `command`) and compare_runs' options for its ranks (into `ranks_args`).
job_command() {
  ranks_args=()
  if [[ ${#job_launcher[@]} -gt 0 ]]; then
    local launcher=("${job_launcher[@]}")
    if [[ ${launcher[0]} == torchrun ]] && ! command -v torchrun >/dev/null; then
      launcher=("$job_python" -m torch.distributed.run "${launcher[@]:1}")
    fi
    command=("${pin[@]}" "${launcher[@]}" "$job_script" "${job_args[@]}")
    ranks_args=(--ranks "$job_gpus")
  else
    command=("${pin[@]}" "$job_python" "$job_script" "${job_args[@]}")
  fi
  command+=(--steps "$steps" --warmup "$warmup")
  # A deterministic job runs deterministic whether or not its manifest args already say so.
  if [[ $job_deterministic == true && " ${job_args[*]} " != *" --deterministic "* ]]; then
    command+=(--deterministic)
  fi
}

if [[ $mode == list ]]; then
  total=0
  for job in "${jobs[@]}"; do
    fields=$("$python" scripts/bench_manifest.py "$manifest" shell "$job") && eval "$fields" || exit 2
    device_memory_target="${device_memory_share}%-of-the-preflight's-peak"
    job_variants
    job_command
    runs=0
    for spec in "${variants[@]}"; do
      n=$reps
      [[ $spec =~ \;reps=([0-9]+) ]] && n=${BASH_REMATCH[1]}
      runs=$((runs + n))
    done
    total=$((total + runs))
    skip=""
    (( job_gpus <= gpus_here || job_gpus == 1 )) || skip=" (skipped here: needs $job_gpus GPUs, this machine has $gpus_here)"
    echo "$job: $job_gpus GPU(s), $runs runs$skip: ${command[*]}"
    for spec in "${variants[@]}"; do echo "  $spec"; done
  done
  echo "total: $total runs, about $(( (total * run_estimate + 59) / 60 )) minutes at ~${run_estimate} s a run"
  exit 0
fi

[[ -x $actpage ]] || { echo "bench: no $actpage: run scripts/gpu-bundle.sh and carry .gpu" >&2; exit 2; }
device=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
commit=$(tr '\n' ' ' <"$root/.gpu/COMMIT" 2>/dev/null || git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
echo "bench: device ${device:-unknown} ($gpus_here GPUs); bundle ${commit}; jobs ${jobs[*]}; reps $reps (peers $peer_reps), steps $steps (warm-up $warmup); cores ${cpus:-unpinned}"

# The link: this machine's pinned D2H rate, once per call.
link_args=(--out "$out/link.json" --torch)
if "$actpage" calibrate --quick --out "$out/calibration.json" >"$out/calibrate.log" 2>&1; then
  link_args+=(--calibration "$out/calibration.json")
else
  echo "bench: actpage calibrate failed ($(tail -n 1 "$out/calibrate.log")); timing the copies with torch instead"
  rm -f "$out/calibration.json"
fi
"$python" scripts/bench_link.py "${link_args[@]}"

failed=0
for job in "${jobs[@]}"; do
  fields=$("$python" scripts/bench_manifest.py "$manifest" shell "$job") && eval "$fields" || exit 2
  job_out=$out/$job
  if (( job_gpus > 1 && gpus_here < job_gpus )); then
    echo "=== $job: skipped: needs $job_gpus GPUs, this machine has $gpus_here (run it on nvidia-h100-x$job_gpus)"
    if [[ -f $job_out/results.json ]]; then
      echo "bench: $job: keeping the results of an earlier call in $job_out"
    else
      mkdir -p "$job_out"
      BENCH_SKIP_JOB=$job BENCH_SKIP_GPUS=$job_gpus BENCH_SKIP_HERE=$gpus_here "$python" - "$job_out/skipped.json" <<'PY'
import json, os, sys
env = os.environ
with open(sys.argv[1], "w") as handle:
    json.dump({"job": env["BENCH_SKIP_JOB"], "gpus": int(env["BENCH_SKIP_GPUS"]), "gpus_on_machine": int(env["BENCH_SKIP_HERE"]),
               "reason": "needs %s GPUs, this machine has %s" % (env["BENCH_SKIP_GPUS"], env["BENCH_SKIP_HERE"])}, handle)
    handle.write("\n")
PY
    fi
    continue
  fi
  job_command
  device_memory_target=""
  if (( preflight_steps > 0 )); then
    # A job that cannot run plain is not worth its variants' device time: one short plain run first.
    rm -rf "$job_out"
    mkdir -p "$job_out"
    preflight=("${command[@]}")
    preflight+=(--steps "$preflight_steps" --warmup 0)
    echo "=== $job: preflight, $preflight_steps steps plain"
    if ! PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync timeout "$run_timeout" "${preflight[@]}" >"$job_out/preflight.log" 2>&1; then
      echo "bench: $job: the preflight run failed; its variants are skipped (last lines of $job_out/preflight.log):"
      tail -n 15 "$job_out/preflight.log"
      BENCH_SKIP_JOB=$job BENCH_SKIP_LOG=$job_out/preflight.log "$python" - "$job_out/skipped.json" <<'PY'
import json, os, sys
lines = [l for l in open(os.environ["BENCH_SKIP_LOG"], errors="replace").read().splitlines() if l.strip()]
with open(sys.argv[1], "w") as handle:
    json.dump({"job": os.environ["BENCH_SKIP_JOB"], "failed": True,
               "reason": "the preflight run failed: " + (lines[-1][:300] if lines else "no output")}, handle)
    handle.write("\n")
PY
      failed=1
      continue
    fi
    if (( device_memory_share > 0 )); then
      # The device-memory goal's target: the share of the peak the preflight's job measured.
      device_memory_target=$("$python" - "$job_out/preflight.log" "$device_memory_share" <<'PY'
import sys
sys.path.insert(0, "examples")
from common import parse_result_lines
results = parse_result_lines(open(sys.argv[1], errors="replace").read())
peak = results[-1].get("device_used_peak_mib") if results else None
if peak:
    print("%dMiB" % int(float(peak) * int(sys.argv[2]) / 100))
PY
      )
      [[ -n $device_memory_target ]] ||
        echo "bench: $job: its preflight printed no device peak: no actpage-device-memory variant"
    fi
  fi
  job_variants
  variant_args=()
  for spec in "${variants[@]}"; do variant_args+=(--variant "$spec"); done
  watch_args=()  # compare_runs options: traces, thread watch, CPU probe
  [[ $trace == 0 ]] || watch_args+=(--trace-dir "$out/traces/$job")
  [[ $thread_stats == 0 ]] || watch_args+=(--thread-stats "$thread_stats")
  [[ $cpu_probe == 0 ]] || watch_args+=(--cpu-probe "$cpu_probe")
  rm -rf "$job_out" "$out/traces/$job"
  mkdir -p "$job_out" "$out/traces/$job"
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  echo "=== $job: ${command[*]}"
  "$python" examples/compare_runs.py --reps "$reps" --actpage "$actpage" --out "$job_out" --timeout "$run_timeout" \
    "${watch_args[@]}" "${ranks_args[@]}" --baseline none "${variant_args[@]}" -- "${command[@]}" \
    2>&1 | tee "$job_out/compare.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "bench: $job: some runs failed (see $job_out/logs)"; failed=1; }
  BENCH_META_STARTED=$started BENCH_META_DEVICE=$device BENCH_META_GPUS=$gpus_here BENCH_META_COMMIT=$commit \
  BENCH_META_REPS=$reps BENCH_META_PEER_REPS=$peer_reps BENCH_META_STEPS=$steps BENCH_META_WARMUP=$warmup \
  BENCH_META_SLOW_STEPS=$slow_steps BENCH_META_SLOW_WARMUP=$slow_warmup BENCH_META_CPUS=$cpus \
  BENCH_META_TRACE=$trace BENCH_META_LINK=$out/link.json \
    "$python" scripts/bench_manifest.py "$manifest" meta "$job" "$job_out/meta.json" || failed=1
done

echo "=== report"
report || failed=1
exit $failed
