#!/usr/bin/env bash
# Issue 35's GPU check: every zoo job under every policy `actpage plan` writes for it, losses bit for
# bit against the job as is. Per job: an observe-only run (config/observe-for-plan.json; a two-rank
# job traces each rank and plans from rank 0's), `actpage plan` for --max-slowdown 3%, 10% and 25% and
# --target-peak 0.9 x the traced peak (no calibration: what a user who skips `actpage calibrate` gets),
# identical policies run once, then examples/compare_runs.py: the job as is and each policy, one run
# each, --steps 5 --warmup 1.
#
#   OUT=DIR scripts/zoo_plan_sweep.sh [JOB...]     (default: every job of examples/zoo/jobs.json)
#
# Single-GPU jobs run one a GPU at a time on every GPU the machine has (CUDA_VISIBLE_DEVICES);
# a job of N GPUs waits for them all and takes the first N. Writes OUT/res/JOB/ (plans, logs,
# compare_runs' cmp/) and OUT/res/summary.txt; exits 1 when any run's losses differ or it failed.
# ACTPAGE: the CLI (default .gpu/bin/actpage, scripts/gpu-bundle.sh's).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PYTHONUNBUFFERED=1
A=${ACTPAGE:-$root/.gpu/bin/actpage}
res=${OUT:?set OUT to the folder for the results}/res
mkdir -p "$res"
manifest=examples/zoo/jobs.json
# name gpus launcher... per line
mapfile -t jobs < <(python3 - "$manifest" "$@" <<'PY'
import json, sys
jobs = json.load(open(sys.argv[1]))["jobs"]
wanted = sys.argv[2:]
for job in jobs:
    if wanted and job["name"] not in wanted:
        continue
    print(" ".join([job["name"], str(job["gpus"])] + (job["launcher"] or ["python3"]) + [job["script"]] + job["args"]))
PY
)
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
{ cat "${A%/bin/actpage}/COMMIT" 2>/dev/null; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; } > "$res/device.txt" 2>&1

sweep() {  # GPU-LIST NAME GPUS COMMAND...
  local visible=$1 name=$2 ranks=$3; shift 3
  local d=$res/$name cmd=("$@" --steps 5 --warmup 1)
  mkdir -p "$d"
  export CUDA_VISIBLE_DEVICES=$visible
  local trace=$d/observe.trace rank_args=()
  if ((ranks > 1)); then trace=$d/observe.rank%r.trace; rank_args=(--ranks "$ranks"); fi
  timeout 150 "$A" run --policy config/observe-for-plan.json --trace "$trace" -- "${cmd[@]}" > "$d/observe.log" 2>&1
  echo "$name: observe exit $?" >> "$res/done.txt"
  trace=$(ls "$d"/observe*.trace 2>/dev/null | head -1)
  local peak
  peak=$("$A" dump "$trace" --json 2>/dev/null | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["peak"]["live_bytes"]*0.9))') || peak=0
  plan() {
    timeout 100 "$A" plan "$trace" "$2" "$3" -o "$d/plan-$1.json" --json > "$d/plan-$1.report.json" 2> "$d/plan-$1.err"
    echo "$name: plan $1 ($2 $3) exit $? (3: goal not met, closest written)" >> "$res/done.txt"
  }
  for goal in 3 10 25; do plan "$goal" --max-slowdown "$goal%" & done
  if [[ $peak != 0 ]]; then plan mem --target-peak "$peak" & fi
  wait
  local variants=() seen="" goal sum
  for goal in 3 10 25 mem; do
    [[ -s $d/plan-$goal.json ]] || continue
    sum=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1])), sort_keys=True))' "$d/plan-$goal.json" | md5sum | cut -c1-8)
    if [[ $seen == *"$sum"* ]]; then echo "$name: plan $goal is an earlier goal's policy" >> "$res/done.txt"; continue; fi
    seen="$seen $sum"
    variants+=(--variant "p$goal;actpage;async;policy=$d/plan-$goal.json")
  done
  timeout 400 python3 examples/compare_runs.py --reps 1 "${rank_args[@]}" --actpage "$A" --out "$d/cmp" --timeout 150 \
    --baseline none --variant "none;plain;async" "${variants[@]}" -- "${cmd[@]}" > "$d/cmp.log" 2>&1
  echo "$name: compare_runs exit $?" >> "$res/done.txt"
  rm -f "$d"/observe*.trace  # hundreds of MiB on the larger jobs
}

# Single-GPU jobs: GPU g takes the manifest's jobs g, g + GPUs, ...; multi-GPU jobs after them, alone.
single=() multi=()
for line in "${jobs[@]}"; do
  read -r name n _ <<<"$line"
  if ((n == 1)); then single+=("$line"); elif ((n <= gpus)); then multi+=("$line"); else
    echo "$name: needs $n GPUs, this machine has $gpus: not run" >> "$res/done.txt"; fi
done
for ((gpu = 0; gpu < gpus; ++gpu)); do
  (
    for ((index = gpu; index < ${#single[@]}; index += gpus)); do
      read -r -a parts <<<"${single[index]}"
      sweep "$gpu" "${parts[0]}" 1 "${parts[@]:2}"
    done
  ) &
done
wait
for line in "${multi[@]}"; do
  read -r -a parts <<<"$line"
  sweep "$(seq -s, 0 $((parts[1] - 1)))" "${parts[0]}" "${parts[1]}" "${parts[@]:2}"
done

status=0
shopt -s nullglob
for d in "$res"/*/; do
  name=$(basename "$d")
  echo "== $name"
  if [[ -s $d/cmp/results.md ]]; then
    sed -n '/^| variant/,/^$/p' "$d/cmp/results.md" | head -n 8 | cut -d'|' -f2,6,9,10,12
    # compare_runs' table: "yes" in "losses = ref" for every policy row, else a difference or a failure.
    python3 - "$d/cmp/results.json" <<'PY' || status=1
import json, sys
summary = json.load(open(sys.argv[1]))["summary"]
bad = [r["variant"] for r in summary
       if r["variant"] != "none" and (r.get("ok") != r.get("runs") or r.get("losses_identical_to_reference") is not True)]
print("losses bit for bit: " + ("every policy" if not bad else "NOT " + ", ".join(bad)))
sys.exit(1 if bad else 0)
PY
  else
    echo "no comparison (see $d)"
  fi
done > "$res/summary.txt"
cat "$res/done.txt" "$res/summary.txt"
exit $status
