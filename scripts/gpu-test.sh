#!/usr/bin/env bash
# The GPU checks, run on the GPU machine from the repository root, with the bundle that
# scripts/gpu-bundle.sh stages in .gpu/ carried along. One run does every stage named, in order:
#
#   device   the Device contract on the real driver (tests/gpu/device)
#   hooks    every hooked call made directly, through cuGetProcAddress and cudaGetDriverEntryPoint*:
#            each appears once in the trace (tests/gpu/hooks)
#   smoke    a small Llama, plain and under actpage offloading its MLPs: same losses, memory given back
#   observe  observe-only against plain, three allocator settings, Llama and Qwen3-MoE (interposition)
#   paging   Llama MLPs (all but the last 2 layers) and Qwen3-MoE experts, 20 steps (paging)
#   safety   an unsafe policy (release at the MLP's own end): caught by poison, survived by host_mapped
#   graph    a CUDA-graph-captured training step under actpage
#   compile  the hooks' C forward (actpage_hooks._fastrange) under actpage run: eager results
#            unchanged, torch.compile traces through it (fullgraph toy, same graphs and loss on a Llama)
#   hookbench the Python hooks' own cost per module call, both scopes
#   diagnose the Llama job plain, observe-only, and offloading with one factor changed at a time
#   probe-vmm which VMM calls wait for the device, and whether one unmap may span mappings
#   observe-ab Qwen3-MoE observe-only vs plain, cudaMallocAsync, 8 interleaved repetitions pinned to
#            fixed CPU cores (the job syncs the CPU every layer: its step follows the host's noise)
#   observe-paired  observe-only vs plain, step times paired by repetition: the median of the paired
#            ratios, its 95% bootstrap interval and whether that lies within 1% (issue 4); Qwen3-MoE,
#            Llama too with OBSERVE_JOBS="qwen llama"; OBSERVE_ALLOCATORS, OBSERVE_REPS (see the stage)
#   observe-alternate  observe-only cost inside one process: recorded and paused steps alternate
#            (ABBA pairs, examples/common.py --alternate-actpage); Qwen3-MoE and Llama (OBSERVE_JOBS),
#            each allocator (OBSERVE_ALLOCATORS, default "async native expandable")
#   nearfree the Llama job (16 layers) plain and under the near-free policy four ways (per-tensor
#            ranges, no range cache, group windows, group windows unmapped in one batch), traced:
#            where the time and the memory go (docs/findings.md); NF_VARIANTS replaces the
#            variants, NF_JOB=qwen runs the Qwen3-MoE job (8 layers) instead, NF_PROFILE_STEP=N profiles
#            step N of each run and prints what the copy engines did in it (scripts/copy_timeline.py),
#            NF_CPUS=2-9 pins every run to those CPU cores (taskset; default unpinned)
#   recording-cost  the library's recording cost on a launch-bound loop of tiny ops, recorded and
#            paused blocks alternating in one process (bench/python/recording_cost.py), per allocator,
#            with and without the memory sampler and with NVTX ranges
#   demo     records the observe-only trace that examples/ ships for the simulated demo
#   plan     actpage calibrate; per job (Llama 16 layers, Qwen3-MoE 8 layers): an observe-only trace,
#            actpage plan for a target peak (PLAN_TARGET_FRACTION of the traced peak, default 0.9),
#            the job run with the planned policy, predicted vs measured peak and step time
#            (scripts/plan_compare.py, 10%), plots of both traces and a predicted trace; the jobs run
#            on CPU cores PLAN_CPUS (default 2-9, empty: unpinned)
#   reliability  (docs/reliability.md) a paging job SIGKILLed during offload leaves a trace that
#            `actpage dump` reads; the safety stage's poison check; Llama (tests/policies/llama-mlp.json) and
#            Qwen3-MoE (tests/policies/qwen3-moe-experts.json) 200 steps, plain vs actpage, losses compared
#            bit for bit under deterministic algorithms. Small models: ~5 minutes in all.
#   distributed  DDP and FSDP2 on 2 GPUs (torchrun, NCCL), each without and under actpage
#            (tests/policies/llama-mlp.json), 20 steps: per-rank losses, peaks and step times side by side
#
# Usage: scripts/gpu-test.sh STAGE...
# Logs, traces and JSON reports go to out/gpu (ACTPAGE_GPU_OUT); when $OUT is set (the device tool),
# they are also packed into $OUT/gpu-results.tar.gz, since only a few files come back from there.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${ACTPAGE_GPU_OUT:-$root/out/gpu}
mkdir -p "$out"
pack() { if [[ -n ${OUT:-} ]]; then tar czf "$OUT/gpu-results.tar.gz" -C "$out" . && ls -la "$OUT"; fi; }
trap pack EXIT
bundle=$root/.gpu
actpage=$bundle/bin/actpage
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
failed=0

say() { printf '\n=== %s\n' "$*"; }
check() {  # check NAME CMD...: runs, logs to $out/NAME.log, notes a failure
  local name=$1; shift
  if "$@" >"$out/$name.log" 2>&1; then echo "ok: $name"; else echo "FAILED: $name (exit $?)"; tail -n 25 "$out/$name.log"; failed=1; fi
}

[[ -x $actpage ]] || { echo "no $actpage: run scripts/gpu-bundle.sh and carry .gpu" >&2; exit 2; }
say "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
echo "bundle: $(cat "$bundle/COMMIT" | tr '\n' ' ')"

small_llama=(--layers 4 --hidden 1024 --ffn 2816 --heads 8 --seq 1024 --batch 4)
llama=(--layers 16 --hidden 2048 --ffn 5632 --heads 16 --seq 2048 --batch 4)
qwen=(--layers 8 --hidden 1024 --experts 16 --top-k 4 --moe-ffn 768 --seq 2048 --batch 4)

for stage in "$@"; do
  case $stage in
    device)
      say "device: the Device contract on CUDA"
      check device "$bundle/tests/device_gpu_test"
      grep -E "PASSED|FAILED|SKIPPED" "$out/device.log" | head -5
      ;;
    hooks)
      say "hooks: every hooked call once in the trace"
      ACTPAGE_PRELOAD_LIBRARY=$bundle/lib/libactpage.so ACTPAGE_GPU_HOOKS_PROGRAM=$bundle/tests/actpage_gpu_hooks_program \
        ACTPAGE_GPU_HOOKS_OUT=$out check hooks "$bundle/tests/gpu_hooks_test"
      grep -E "PASSED|FAILED|SKIPPED|calls" "$out/hooks.log" | head -20
      ;;
    smoke)
      say "smoke: small Llama, plain vs offloading the MLPs"
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check smoke-plain \
        "$python" examples/train_llama.py "${small_llama[@]}" --steps 8 --warmup 3 --deterministic
      check smoke-actpage "$actpage" run --policy tests/policies/llama-mlp.json --trace "$out/smoke.trace" -- \
        "$python" examples/train_llama.py "${small_llama[@]}" --steps 8 --warmup 3 --deterministic
      "$python" scripts/gpu_report.py pair "$out/smoke-plain.log" "$out/smoke-actpage.log" --trace "$out/smoke.trace" \
        --actpage "$actpage" --json "$out/smoke.json" || failed=1
      ;;
    observe)
      say "observe: observe-only vs plain, three allocators"
      check observe-llama "$python" examples/compare_runs.py --policy config/observe.json --reps 2 --actpage "$actpage" \
        --out "$out/observe-llama" -- "$python" examples/train_llama.py "${llama[@]}" --layers 8 --steps 12 --warmup 4 --deterministic
      tail -n 12 "$out/observe-llama.log"
      check observe-qwen "$python" examples/compare_runs.py --policy config/observe.json --reps 2 --actpage "$actpage" \
        --out "$out/observe-qwen" -- "$python" examples/train_qwen3_moe.py "${qwen[@]}" --layers 4 --steps 12 --warmup 4 --deterministic
      tail -n 12 "$out/observe-qwen.log"
      ;;
    observe-qwen-async)
      say "observe: Qwen3-MoE observe-only vs plain, cudaMallocAsync, more repetitions (short steps are noisy)"
      check observe-qwen-async "$python" examples/compare_runs.py --policy config/observe.json --reps 5 --actpage "$actpage" \
        --allocators async --out "$out/observe-qwen-async" -- "$python" examples/train_qwen3_moe.py "${qwen[@]}" --layers 4 \
        --steps 16 --warmup 4 --deterministic
      tail -n 6 "$out/observe-qwen-async.log"
      ;;
    probe-vmm)
      say "probe-vmm: VMM calls with the GPU idle and busy"
      check probe-vmm "$bundle/tests/vmm_sync_probe" 40
      grep "^probe" "$out/probe-vmm.log"
      ;;
    observe-ab)
      say "observe-ab: Qwen3-MoE observe-only vs plain (async), 8 interleaved repetitions on fixed cores"
      check observe-ab "$python" examples/compare_runs.py --policy config/observe.json --reps 8 --actpage "$actpage" \
        --allocators async --out "$out/observe-ab" -- taskset -c 2-9 "$python" examples/train_qwen3_moe.py "${qwen[@]}" \
        --layers 4 --steps 24 --warmup 6 --deterministic
      tail -n 6 "$out/observe-ab.log"
      ;;
    observe-paired)
      # Is observe-only within 1% of plain? The Qwen3-MoE step varies a few % from one process to the
      # next, so compare_runs pairs each rep's actpage run with the plain run of the same rep and gives
      # the median of those ratios with a 95% bootstrap interval; --within 0.01 says whether the interval
      # lies inside [0.99, 1.01]. OBSERVE_JOBS: "qwen" (default) and/or "llama"; OBSERVE_ALLOCATORS:
      # default "native async expandable"; OBSERVE_REPS: default 8. Jobs pinned to cores 2-9 (as in
      # observe-ab), PYTHONHASHSEED=0, results in $out/observe-paired-JOB (cleared first).
      # Time: compare_runs' wall_s in the H100 bench runs (bench-qwen-e22073b, 2026-11-23-bench-0c8bc5f)
      # is 14-19 s a run for Qwen3-MoE (8 layers, 12 steps) and 16-23 s for Llama (16 layers, 12 steps),
      # nearly all of it start-up (import, model build, CUDA); plan5's log times give 15 s for a Qwen run.
      # At ~16 s a run, 2 x allocators x reps runs: Qwen with the defaults 48 runs, ~13 min (more than
      # the device tool's 10 minutes a command: there, one allocator a call), OBSERVE_ALLOCATORS=async 16
      # runs, ~4.5 min; Llama (8 layers, 16 steps, ~16 s a run) as much again.
      say "observe-paired: observe-only vs plain, step times paired by repetition, within 1%?"
      read -ra paired_allocators <<<"${OBSERVE_ALLOCATORS:-native async expandable}"
      paired_allocators_csv=$(IFS=,; echo "${paired_allocators[*]}")
      for paired_job in ${OBSERVE_JOBS:-qwen}; do
        case $paired_job in
          qwen) paired_cmd=(examples/train_qwen3_moe.py "${qwen[@]}" --layers 4 --steps 30 --warmup 6 --deterministic) ;;
          llama) paired_cmd=(examples/train_llama.py "${llama[@]}" --layers 8 --steps 16 --warmup 4 --deterministic) ;;
          *) echo "FAILED: observe-paired: OBSERVE_JOBS names $paired_job (known: qwen, llama)"; failed=1; continue ;;
        esac
        paired_out=$out/observe-paired-$paired_job
        rm -rf "$paired_out"
        check "observe-paired-$paired_job" "$python" examples/compare_runs.py --policy config/observe.json \
          --reps "${OBSERVE_REPS:-8}" --allocators "$paired_allocators_csv" --within 0.01 --timeout 300 \
          --actpage "$actpage" --out "$paired_out" -- env PYTHONHASHSEED=0 taskset -c 2-9 "$python" "${paired_cmd[@]}"
        grep -E '^(\||within )' "$out/observe-paired-$paired_job.log"
      done
      ;;
    observe-alternate)
      # actpage's observe-only cost inside one process: --alternate-actpage pauses what actpage records
      # (module ranges, allocation records) every other step, in ABBA pairs, so that the machine's
      # drift (the CPU-bound Qwen3-MoE step moves 5-10% between and within processes) cancels out.
      # Per job and allocator: the median of the pairs' ratios recorded/paused and its 95% interval.
      # A paused step runs with the module hooks taken off (blocks scope). OBSERVE_QWEN_STEPS (default
      # 66), OBSERVE_TAG: a suffix for the result names (e.g. one per python_hooks_call).
      say "observe-alternate: observe-only cost as recorded/paused step pairs inside one process"
      for alt_job in ${OBSERVE_JOBS:-qwen llama}; do
        case $alt_job in
          qwen) alt_cmd=(examples/train_qwen3_moe.py "${qwen[@]}" --layers 4 --steps "${OBSERVE_QWEN_STEPS:-66}" --warmup 6 --deterministic) ;;
          llama) alt_cmd=(examples/train_llama.py "${llama[@]}" --layers 8 --steps 46 --warmup 6 --deterministic) ;;
          *) echo "FAILED: observe-alternate: OBSERVE_JOBS names $alt_job"; failed=1; continue ;;
        esac
        for alt_alloc in ${OBSERVE_ALLOCATORS:-async native expandable}; do
          case $alt_alloc in
            async) alt_conf=backend:cudaMallocAsync ;;
            native) alt_conf=backend:native ;;
            expandable) alt_conf=expandable_segments:True ;;
            *) alt_conf=$alt_alloc ;;
          esac
          name=alt-$alt_job-$alt_alloc${OBSERVE_TAG:-}
          PYTORCH_CUDA_ALLOC_CONF=$alt_conf check "$name" "$actpage" run --policy config/observe.json \
            --trace "$out/$name.trace" -- env PYTHONHASHSEED=0 taskset -c 2-9 "$python" "${alt_cmd[@]}" --alternate-actpage
          "$python" - "$out/$name.log" "$name" <<'PY'
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("ACTPAGE_RESULT ")][-1]
r = json.loads(line[len("ACTPAGE_RESULT "):])
a, f = r["alternate"], r["alternate_fwd"]
print("%s: step recorded/paused x%s %s over %d pairs (%s / %s ms); forward x%s %s; active %s" % (
    sys.argv[2], a["paired_ratio_median"], a["paired_ratio_ci95"], a["pairs"], a["recorded_median_ms"],
    a["paused_median_ms"], f["paired_ratio_median"], f["paired_ratio_ci95"], r["actpage"]["active"]))
PY
        done
      done
      ;;
    diagnose-qwen)
      say "diagnose-qwen: Qwen3-MoE observe-only, one factor removed at a time (4 interleaved rounds)"
      job=("$python" examples/train_qwen3_moe.py "${qwen[@]}" --layers 4 --steps 14 --warmup 4 --deterministic)
      for round in 1 2 3 4; do
        PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check "dq-plain-$round" "${job[@]}"
        check "dq-observe-$round" "$actpage" run --policy config/observe.json -- "${job[@]}"
        ACTPAGE_TRACE_PATH= check "dq-notrace-$round" "$actpage" run --policy config/observe.json -- "${job[@]}"
        ACTPAGE_PYTHON_HOOKS=off ACTPAGE_TRACE_PATH= check "dq-nohooks-$round" "$actpage" run --policy config/observe.json -- "${job[@]}"
        ACTPAGE_ENABLED=false check "dq-disabled-$round" "$actpage" run --policy config/observe.json -- "${job[@]}"
      done
      "$python" - "$out" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
def median_of(path):
    line = [l for l in open(path) if l.startswith("ACTPAGE_RESULT ")][-1]
    return json.loads(line[len("ACTPAGE_RESULT "):])["median_step_ms"]
medians = {}
for name in ("plain", "observe", "notrace", "nohooks", "disabled"):
    values = [median_of(p) for p in sorted(glob.glob("%s/dq-%s-*.log" % (out, name)))]
    medians[name] = statistics.median(values)
    print("%-9s median of rounds %.2f ms  (rounds: %s)  x%.3f" % (name, medians[name], values, medians[name] / medians.get("plain", medians[name])))
PY
      ;;
    attribution)
      say "attribution: trace bytes by module vs torch's allocated-bytes counter (cudaMallocAsync)"
      check attribution "$actpage" run --policy config/observe.json --trace "$out/attribution.trace" -- \
        "$python" examples/train_llama.py "${small_llama[@]}" --steps 4 --warmup 1 --deterministic
      "$python" scripts/gpu_report.py attribution "$out/attribution.log" --trace "$out/attribution.trace" \
        --actpage "$actpage" --json "$out/attribution.json" || failed=1
      ;;
    paging)
      say "paging: Llama MLPs (keep_last 2) and Qwen3-MoE experts, 20 steps"
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check paging-llama-plain \
        "$python" examples/train_llama.py "${llama[@]}" --steps 20 --warmup 5 --deterministic
      check paging-llama-actpage "$actpage" run --policy tests/policies/llama-mlp.json --trace "$out/paging-llama.trace" -- \
        "$python" examples/train_llama.py "${llama[@]}" --steps 20 --warmup 5 --deterministic
      "$python" scripts/gpu_report.py pair "$out/paging-llama-plain.log" "$out/paging-llama-actpage.log" \
        --trace "$out/paging-llama.trace" --actpage "$actpage" --json "$out/paging-llama.json" || failed=1
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check paging-qwen-plain \
        "$python" examples/train_qwen3_moe.py "${qwen[@]}" --steps 20 --warmup 5 --deterministic
      check paging-qwen-actpage "$actpage" run --policy tests/policies/qwen3-moe-experts.json --trace "$out/paging-qwen.trace" -- \
        "$python" examples/train_qwen3_moe.py "${qwen[@]}" --steps 20 --warmup 5 --deterministic
      "$python" scripts/gpu_report.py pair "$out/paging-qwen-plain.log" "$out/paging-qwen-actpage.log" \
        --trace "$out/paging-qwen.trace" --actpage "$actpage" --json "$out/paging-qwen.json" || failed=1
      ;;
    reliability)
      say "reliability: SIGKILL during offload, poison on an unsafe policy, 200 steps bit-identical"
      rel_llama=(--layers 6 --hidden 1024 --ffn 2816 --heads 8 --seq 512 --batch 4)
      rel_qwen=(--layers 4 --hidden 1024 --experts 16 --top-k 4 --moe-ffn 768 --seq 2048 --batch 2)
      # (a) Killed mid-offload: wait until the live trace shows offloads, then SIGKILL the whole job.
      killed=$out/rel-killed.trace
      rm -f "$killed"
      setsid "$actpage" run --policy tests/policies/llama-mlp.json --trace "$killed" -- \
        "$python" examples/train_llama.py "${rel_llama[@]}" --steps 100000 --warmup 1 >"$out/rel-killed.log" 2>&1 &
      job_pid=$!
      offloads=0
      for _ in $(seq 1 240); do
        sleep 0.5
        offloads=$("$actpage" dump --json "$killed" 2>/dev/null | "$python" -c 'import json,sys; print(json.load(sys.stdin)["offload"]["count"])' 2>/dev/null || echo 0)
        [[ ${offloads:-0} -gt 0 ]] && break
      done
      sleep 1
      kill -KILL -- "-$job_pid" 2>/dev/null
      wait "$job_pid" 2>/dev/null
      echo "killed with $offloads offloads in the trace"
      check rel-killed-dump "$actpage" dump "$killed"
      "$actpage" dump --json "$killed" >"$out/rel-killed-dump.json" 2>"$out/rel-killed-dump.err"
      "$python" - "$out/rel-killed-dump.json" "$offloads" <<'PY' || failed=1
import json, sys
report = json.load(open(sys.argv[1]))
ok = report["offload"]["count"] > 0 and int(sys.argv[2]) > 0
print("killed trace: %s records, %s offloads (%s unfinished), warnings: %s -> %s" % (
    report["records"]["total"], report["offload"]["count"], report["offload"]["unfinished"],
    report["warnings"][:3], "readable" if ok else "NOT readable or no offload seen"))
sys.exit(0 if ok else 1)
PY
      # (b) Poison catches an unsafe policy (and host_mapped survives it): the safety stage's check.
      unsafe=$out/rel-unsafe-policy.json
      for mode in poison host_mapped; do
        printf '{"version": 1, "modules": [{"match": "*.mlp"}], "keep_last": 0, "release_after": "range_end", "stray_access": "%s"}\n' $mode >"$unsafe.$mode"
      done
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check rel-safety-plain \
        "$python" examples/train_llama.py "${small_llama[@]}" --steps 4 --warmup 1 --deterministic
      check rel-safety-poison "$actpage" run --policy "$unsafe.poison" -- \
        "$python" examples/train_llama.py "${small_llama[@]}" --steps 4 --warmup 1 --deterministic
      check rel-safety-host-mapped "$actpage" run --policy "$unsafe.host_mapped" -- \
        "$python" examples/train_llama.py "${small_llama[@]}" --steps 4 --warmup 1 --deterministic
      "$python" scripts/gpu_report.py safety "$out/rel-safety-plain.log" "$out/rel-safety-poison.log" \
        "$out/rel-safety-host-mapped.log" --json "$out/rel-safety.json" || failed=1
      # (c) 200 steps with and without actpage, deterministic: losses bit for bit.
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check rel-llama-plain \
        "$python" examples/train_llama.py "${rel_llama[@]}" --steps 200 --warmup 5 --deterministic
      check rel-llama-actpage "$actpage" run --policy tests/policies/llama-mlp.json --trace "$out/rel-llama.trace" -- \
        "$python" examples/train_llama.py "${rel_llama[@]}" --steps 200 --warmup 5 --deterministic
      "$python" scripts/gpu_report.py pair "$out/rel-llama-plain.log" "$out/rel-llama-actpage.log" \
        --trace "$out/rel-llama.trace" --actpage "$actpage" --json "$out/rel-llama.json" || failed=1
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check rel-qwen-plain \
        "$python" examples/train_qwen3_moe.py "${rel_qwen[@]}" --steps 200 --warmup 5 --deterministic
      check rel-qwen-actpage "$actpage" run --policy tests/policies/qwen3-moe-experts.json --trace "$out/rel-qwen.trace" -- \
        "$python" examples/train_qwen3_moe.py "${rel_qwen[@]}" --steps 200 --warmup 5 --deterministic
      "$python" scripts/gpu_report.py pair "$out/rel-qwen-plain.log" "$out/rel-qwen-actpage.log" \
        --trace "$out/rel-qwen.trace" --actpage "$actpage" --json "$out/rel-qwen.json" || failed=1
      ;;
    safety)
      say "safety: release at the MLP's own end (its output is read again by the residual add)"
      unsafe=$out/unsafe-policy.json
      printf '{"version": 1, "modules": [{"match": "*.mlp"}], "keep_last": 0, "release_after": "range_end", "stray_access": "%s"}\n' poison >"$unsafe.poison"
      printf '{"version": 1, "modules": [{"match": "*.mlp"}], "keep_last": 0, "release_after": "range_end", "stray_access": "%s"}\n' host_mapped >"$unsafe.host_mapped"
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check safety-plain \
        "$python" examples/train_llama.py "${small_llama[@]}" --steps 4 --warmup 1 --deterministic
      check safety-poison "$actpage" run --policy "$unsafe.poison" -- \
        "$python" examples/train_llama.py "${small_llama[@]}" --steps 4 --warmup 1 --deterministic
      check safety-host-mapped "$actpage" run --policy "$unsafe.host_mapped" --trace "$out/safety-host-mapped.trace" -- \
        "$python" examples/train_llama.py "${small_llama[@]}" --steps 4 --warmup 1 --deterministic
      "$python" scripts/gpu_report.py safety "$out/safety-plain.log" "$out/safety-poison.log" \
        "$out/safety-host-mapped.log" --json "$out/safety.json" || failed=1
      ;;
    graph)
      say "graph: a CUDA-graph-captured step under actpage"
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check graph-plain \
        "$python" examples/train_llama.py "${small_llama[@]}" --method cuda_graph --steps 8 --warmup 3 --deterministic
      check graph-actpage "$actpage" run --policy tests/policies/llama-mlp.json -- \
        "$python" examples/train_llama.py "${small_llama[@]}" --method cuda_graph --steps 8 --warmup 3 --deterministic
      "$python" scripts/gpu_report.py pair "$out/graph-plain.log" "$out/graph-actpage.log" --json "$out/graph.json" || failed=1
      ;;
    compile)
      say "compile: the C forward in eager and under torch.compile (examples/check_compile.py)"
      check compile "$actpage" run --policy config/observe.json -- "$python" examples/check_compile.py
      grep -E "C forward|no transformers|eager:|toy:|explain|compiled loss|stand-in|FAILED|check:" "$out/compile.log"
      ;;
    diagnose)
      say "diagnose: where the time goes (Llama 16 layers, one factor changed at a time)"
      job=("$python" examples/train_llama.py "${llama[@]}" --steps 10 --warmup 4 --deterministic)
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check diag-plain "${job[@]}"
      ACTPAGE_LOG_LEVEL=info check diag-observe "$actpage" run --policy config/observe.json -- "${job[@]}"
      ACTPAGE_LOG_LEVEL=info check diag-observe-nohooks env ACTPAGE_PYTHON_HOOKS=off "$actpage" run --policy config/observe.json -- "${job[@]}"
      ACTPAGE_LOG_LEVEL=info check diag-offload "$actpage" run --policy tests/policies/llama-mlp.json -- "${job[@]}"
      ACTPAGE_LOG_LEVEL=info ACTPAGE_TRACE_PATH=$out/diag-offload.trace ACTPAGE_TRACE_SAMPLE_MS=0 \
        check diag-offload-trace-nosampler "$actpage" run --policy tests/policies/llama-mlp.json -- "${job[@]}"
      ACTPAGE_LOG_LEVEL=info ACTPAGE_VMM_CACHE_BYTES=0 check diag-offload-nocache "$actpage" run --policy tests/policies/llama-mlp.json -- "${job[@]}"
      ACTPAGE_LOG_LEVEL=info ACTPAGE_MAX_INFLIGHT_COPIES=1 check diag-offload-inflight1 "$actpage" run --policy tests/policies/llama-mlp.json -- "${job[@]}"
      ACTPAGE_LOG_LEVEL=info ACTPAGE_MODULES='model.layers.[0-5].mlp' check diag-offload-6layers "$actpage" run --policy tests/policies/llama-mlp.json -- "${job[@]}"
      for variant in observe observe-nohooks offload offload-trace-nosampler offload-nocache offload-inflight1 offload-6layers; do
        echo "--- $variant"
        "$python" scripts/gpu_report.py pair "$out/diag-plain.log" "$out/diag-$variant.log" | grep -E "losses|median|device used"
        grep -o 'engine: {.*}' "$out/diag-$variant.log" | head -1
      done
      ;;
    nearfree)
      # NF_JOB=qwen runs the Qwen3-MoE job (8 layers) instead of the Llama one; NF_CPUS pins every run
      # (the CPU-bound Qwen3-MoE job's step moves by up to 19% between unpinned processes).
      nf_pin=()
      [[ -z ${NF_CPUS:-} ]] || nf_pin=(taskset -c "$NF_CPUS")
      if [[ ${NF_JOB:-llama} == qwen ]]; then
        say "nearfree: Qwen3-MoE 8 layers, policies and engine settings, traced; cores ${NF_CPUS:-unpinned}"
        job=("${nf_pin[@]}" "$python" examples/train_qwen3_moe.py "${qwen[@]}" --steps ${NF_STEPS:-8} --warmup 3 --deterministic)
      else
        say "nearfree: Llama 16 layers, near-free policies and engine settings, traced; cores ${NF_CPUS:-unpinned}"
        job=("${nf_pin[@]}" "$python" examples/train_llama.py "${llama[@]}" --steps ${NF_STEPS:-8} --warmup 3 --deterministic)
      fi
      # NF_PROFILE_STEP=N: profile step N of every run (torch.profiler; kept as nf-NAME.step.json.gz) and print
      # what the copy engines did in it (scripts/copy_timeline.py).
      prof() { [[ -n ${NF_PROFILE_STEP:-} ]] && echo --profile-step "$NF_PROFILE_STEP" --profile-out "$out/nf-$1.step.json.gz"; }
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check nf-plain "${job[@]}" $(prof plain)
      # NAME|MODULE GLOBS (JSON array)|KEEP_LAST|ENV (comma-separated VAR=VALUE): policies written here, so
      # that one run compares them. NF_VARIANTS replaces the list (variants separated by spaces).
      nf_variants=(${NF_VARIANTS:-"consecutive|[\"model.layers.[0-6].mlp\"]|0|" "even|[\"model.layers.0.mlp\",\"model.layers.2.mlp\",\"model.layers.4.mlp\",\"model.layers.6.mlp\",\"model.layers.8.mlp\",\"model.layers.10.mlp\",\"model.layers.12.mlp\"]|0|"
        "all|[\"model.layers.*.mlp\"]|2|"})
      names=()
      for spec in "${nf_variants[@]}"; do
        IFS='|' read -r name globs keep env_vars <<<"$spec"
        names+=("$name")
        printf '{"version": 1, "mode": "offload", "modules": [{"match": %s, "offload": true}], "keep_last": %s, "prefetch": {"ahead_bytes": "1GiB"}}\n' \
          "$globs" "$keep" >"$out/nf-$name.policy.json"
        "$actpage" check "$out/nf-$name.policy.json" >/dev/null || { echo "FAILED: policy $name"; cat "$out/nf-$name.policy.json"; failed=1; continue; }
        ACTPAGE_LOG_LEVEL=info check "nf-$name" env ${env_vars//,/ } "$actpage" run --policy "$out/nf-$name.policy.json" \
          --trace "$out/nf-$name.trace" -- "${job[@]}" $(prof "$name")
      done
      for name in "${names[@]}"; do
        echo "--- $name ($(tr -d '\n' <"$out/nf-$name.policy.json" | cut -c1-160))"
        "$python" scripts/gpu_report.py pair "$out/nf-plain.log" "$out/nf-$name.log" | grep -E "losses|median|device used"
        grep -o 'engine: {.*}' "$out/nf-$name.log" | head -1 | grep -oE '"(stalls|stall_ns|offloads_completed|offloads_cancelled|offload_unmaps|job_thread_vmm_calls|worker_vmm_calls|ranges_recycled|recycle_grants|ranges_prefilled|backlog_wait_ns)":[0-9]+' | tr '\n' ' '; echo
        "$actpage" dump "$out/nf-$name.trace" 2>/dev/null | grep -E "VMM time|off the device|peak used|^  (iteration|job's thread|offloads|reloads) "
        [[ -f $out/nf-$name.step.json.gz ]] && "$python" scripts/copy_timeline.py "$out/nf-$name.step.json.gz"
      done
      [[ -f $out/nf-plain.step.json.gz ]] && { echo "--- plain"; "$python" scripts/copy_timeline.py "$out/nf-plain.step.json.gz"; }
      ;;
    profile)
      say "profile: one step's GPU time, plain and offloading (torch.profiler)"
      job=("$python" examples/train_llama.py "${llama[@]}" --steps 9 --warmup 4 --deterministic --profile-step 7)
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check prof-plain "${job[@]}"
      ACTPAGE_LOG_LEVEL=info ACTPAGE_MODULES='model.layers.[0-5].mlp' check prof-offload-6layers "$actpage" run --policy tests/policies/llama-mlp.json -- "${job[@]}"
      ACTPAGE_LOG_LEVEL=info check prof-offload "$actpage" run --policy tests/policies/llama-mlp.json -- "${job[@]}"
      for variant in plain offload-6layers offload; do
        echo "--- $variant"
        "$python" - "$out/prof-$variant.log" <<'PY'
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("ACTPAGE_RESULT ")][-1]
r = json.loads(line[len("ACTPAGE_RESULT "):])
print("step ms", r["step_ms"][7], "fwd", r["fwd_ms"][7], "bwd", r["bwd_ms"][7])
print(json.dumps(r["profile"], indent=1))
PY
      done
      ;;
    hookbench)
      say "hookbench: the Python hooks' own cost per module call on this host (torch on the CPU), and an NVTX range's"
      check hookbench "$python" bench/python/hooks_overhead.py
      cat "$out/hookbench.log"
      check nvtxbench-plain "$python" bench/python/nvtx_overhead.py
      check nvtxbench-actpage "$actpage" run --policy config/observe.json --trace "$out/nvtxbench.trace" -- \
        "$python" bench/python/nvtx_overhead.py
      echo "plain: $(tail -n 1 "$out/nvtxbench-plain.log")"
      echo "under actpage run: $(tail -n 1 "$out/nvtxbench-actpage.log")"
      ;;
    recording-cost)
      # What the library's recording costs a launch-bound loop of tiny ops (bench/python/recording_cost.py:
      # recorded and paused blocks alternating in one process), Python hooks off. Under cudaMallocAsync
      # each op is a launch, an allocation and a free through the interposer; under expandable segments
      # a launch only. With and without the memory sampler (trace.sample_ms 0), and with NVTX ranges.
      say "recording-cost: recorded/paused blocks of tiny ops in one process"
      for rc_alloc in async expandable; do
        case $rc_alloc in async) rc_conf=backend:cudaMallocAsync ;; *) rc_conf=expandable_segments:True ;; esac
        for rc_variant in default nosampler ranges; do
          rc_env=(); rc_args=()
          case $rc_variant in
            nosampler) rc_env=(ACTPAGE_TRACE_SAMPLE_MS=0) ;;
            ranges) rc_args=(--ranges-every 10) ;;
          esac
          name=rc-$rc_alloc-$rc_variant
          check "$name" env "${rc_env[@]}" ACTPAGE_PYTHON_HOOKS=off PYTORCH_CUDA_ALLOC_CONF=$rc_conf \
            "$actpage" run --policy config/observe.json --trace "$out/$name.trace" -- \
            taskset -c 2-9 "$python" bench/python/recording_cost.py --blocks "${RC_BLOCKS:-400}" "${rc_args[@]}"
          echo "$name: $(grep '^recording cost' "$out/$name.log")"
        done
      done
      ;;
    demo)
      say "demo: the observe-only trace examples/ ships"
      check demo "$actpage" run --policy config/observe-for-plan.json --trace "$out/llama-observe.trace" -- \
        "$python" examples/train_llama.py "${llama[@]}" --layers 8 --steps 3 --warmup 1
      ls -la "$out/llama-observe.trace"
      ;;
    plan)
      say "plan: calibrate, trace observe-only, plan for a target peak, run the plan, compare"
      check plan-calibrate "$actpage" calibrate --out "$out/calibration.json"
      cat "$out/plan-calibrate.log"
      fraction=${PLAN_TARGET_FRACTION:-0.9}
      # Both runs of a job on the same CPU cores (PLAN_CPUS, empty: unpinned): the Qwen3-MoE job is
      # CPU-bound and ran its steps at two speeds on 2026-11-23 (docs/tools.md, "Planned vs measured").
      pin=()
      if [[ -n ${PLAN_CPUS-2-9} ]] && command -v taskset >/dev/null; then pin=(taskset -c "${PLAN_CPUS-2-9}"); fi
      for job in llama qwen; do
        if [[ $job == llama ]]; then
          cmd=("${pin[@]}" "$python" examples/train_llama.py "${llama[@]}" --steps 10 --warmup 4 --deterministic)
        else
          cmd=("${pin[@]}" "$python" examples/train_qwen3_moe.py "${qwen[@]}" --steps 10 --warmup 4 --deterministic)
        fi
        check "plan-$job-observe" "$actpage" run --policy config/observe-for-plan.json --trace "$out/plan-$job-observe.trace" -- "${cmd[@]}"
        "$actpage" dump "$out/plan-$job-observe.trace" --json >"$out/plan-$job-observe.dump.json" 2>/dev/null
        target=$("$python" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(int(d["peak"]["live_bytes"]*float(sys.argv[2])))' \
          "$out/plan-$job-observe.dump.json" "$fraction") || { echo "FAILED: no trace peak for $job"; failed=1; continue; }
        echo "$job: target peak $target bytes ($fraction of the traced peak)"
        "$actpage" plan "$out/plan-$job-observe.trace" --target-peak "$target" --calibration "$out/calibration.json" \
          --out "$out/plan-$job-policy.json" --json >"$out/plan-$job.json" 2>"$out/plan-$job.err"
        echo "plan exit $? (3: target not met, closest written)"; head -c 600 "$out/plan-$job.json"; echo
        "$actpage" replay "$out/plan-$job-observe.trace" --policy "$out/plan-$job-policy.json" \
          --calibration "$out/calibration.json" --predicted-trace "$out/plan-$job-predicted.trace" >"$out/plan-$job-replay.log" 2>&1
        check "plan-$job-planned" "$actpage" run --policy "$out/plan-$job-policy.json" --trace "$out/plan-$job-planned.trace" -- "${cmd[@]}"
        "$python" scripts/plan_compare.py "$job" --observe-log "$out/plan-$job-observe.log" --plan-json "$out/plan-$job.json" \
          --planned-log "$out/plan-$job-planned.log" --json "$out/plan-$job-compare.json" || failed=1
        for t in observe planned predicted; do
          "$actpage" dump "$out/plan-$job-$t.trace" --plot "$out/plan-$job-$t.png" >/dev/null 2>&1
        done
        "$actpage" dump "$out/plan-$job-observe.trace" --diff "$out/plan-$job-planned.trace" >"$out/plan-$job-diff.txt" 2>&1
        "$actpage" dump "$out/plan-$job-planned.trace" --perfetto "$out/plan-$job-planned.perfetto.json" >/dev/null 2>&1
        tail -n 3 "$out/plan-$job-diff.txt"
      done
      ;;
    distributed)
      say "distributed: DDP and FSDP2 on 2 GPUs, without and under actpage (tests/policies/llama-mlp.json), 20 steps"
      gpus=$(nvidia-smi -L | grep -c '^GPU')
      if (( gpus < 2 )); then
        echo "FAILED: distributed needs 2 GPUs, this machine has $gpus (ask for nvidia-h200-x2)"; failed=1; continue
      fi
      if command -v torchrun >/dev/null; then torchrun=(torchrun); else torchrun=("$python" -m torch.distributed.run); fi
      dist_llama=(--layers 8 --hidden 2048 --ffn 5632 --heads 16 --seq 2048 --batch 4 --steps 20 --warmup 5 --deterministic)
      for parallel in ddp fsdp2; do
        job=("${torchrun[@]}" --standalone --nproc-per-node 2 examples/train_distributed.py --parallel "$parallel" "${dist_llama[@]}")
        CUDA_VISIBLE_DEVICES=0,1 PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync check "dist-$parallel-plain" \
          "${job[@]}" --result-json "$out/dist-$parallel-plain-rank%r.json"
        CUDA_VISIBLE_DEVICES=0,1 ACTPAGE_LOG_LEVEL=info check "dist-$parallel-actpage" "$actpage" run --policy tests/policies/llama-mlp.json \
          --trace "$out/dist-$parallel-rank%r-%p.trace" -- "${job[@]}" --result-json "$out/dist-$parallel-actpage-rank%r.json"
        grep -E '\[actpage rank [0-9]+\] info: (tracing to|engine:)' "$out/dist-$parallel-actpage.log" | cut -c1-240
      done
      ls -la "$out"/dist-*.trace 2>/dev/null
      "$python" scripts/distributed_report.py "$out" --json "$out/distributed.json" || failed=1
      ;;
    *) echo "unknown stage $stage" >&2; failed=1 ;;
  esac
done
exit $failed
