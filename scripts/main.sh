#!/usr/bin/env bash
# The main job, on a fresh Debian 12 machine: sets up, builds, then
# - with a CUDA GPU and PyTorch (+ transformers): trains the example Llama job twice, without actpage
#   and under `actpage run` in auto mode (no policy: what a user types; ACTPAGE_MAIN_POLICY pins one),
#   deterministic, and prints the two runs side by side (losses bit for bit, step time, device memory
#   in use);
# - without: runs the same pipeline on actpage's simulated device, replaying an observe-only trace
#   recorded on an H100 (examples/llama-observe.trace) with the default policy (replay needs a
#   policy; ACTPAGE_MAIN_POLICY names another), and says plainly that it is simulated and what the
#   policy would save.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build=${ACTPAGE_BUILD_DIR:-$root/build}
actpage=$build/bin/actpage
python=${PYTHON:-python3}
policy=${ACTPAGE_MAIN_POLICY:-}

if "$root/scripts/has-gpu.sh" && "$python" -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
  out=${ACTPAGE_MAIN_OUT:-$root/out/main}
  mkdir -p "$out"
  job=("$python" examples/train_llama.py --steps 12 --warmup 4 --deterministic)
  echo "main: training the example Llama job without actpage (cudaMallocAsync backend)"
  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync "${job[@]}" | tee "$out/plain.log"
  policy_args=()
  [[ -n $policy ]] && policy_args=(--policy "$policy")
  echo "main: the same job under actpage run ${policy_args[*]:-(auto mode)}"
  "$actpage" run "${policy_args[@]}" --trace "$out/actpage.trace" -- "${job[@]}" | tee "$out/actpage.log"
  "$python" scripts/gpu_report.py pair "$out/plain.log" "$out/actpage.log" --trace "$out/actpage.trace" --actpage "$actpage"
  echo "main: the trace: $actpage dump $out/actpage.trace"
else
  echo "main: no CUDA GPU with PyTorch here, so the job cannot run: running actpage's pipeline on its"
  echo "      simulated device instead, on a trace of the example Llama job recorded on an H100."
  echo
  "$actpage" dump examples/llama-observe.trace | sed -n '1,8p'
  echo
  "$actpage" replay examples/llama-observe.trace --policy "${policy:-config/default-policy.json}"
fi
