#!/usr/bin/env bash
# A quick pass over the example jobs on a GPU machine: small models, a few steps, every method, plain
# and under `actpage run`. Prints each run's ACTPAGE_RESULT summary; exit status 1 if any run failed.
#
#   examples/smoke.sh [BUILD_DIR]        (default: build; needs BUILD_DIR/bin/actpage for the actpage runs)
# Environment: PYTHON (default python3), SMOKE_ARGS (extra job arguments), SMOKE_OUT (log folder).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
python="${PYTHON:-python3}"
out="${SMOKE_OUT:-${TMPDIR:-/tmp}/actpage-smoke}"
mkdir -p "$out"
small_llama=(--layers 2 --hidden 512 --ffn 1376 --heads 8 --seq 512 --batch 2 --steps 5 --warmup 2)
small_qwen=(--layers 2 --hidden 512 --experts 8 --top-k 2 --moe-ffn 256 --heads 8 --kv-heads 4 --seq 512 --batch 2 --steps 5 --warmup 2)
failed=0

summarise() {  # the result line of a log, briefly
  "$python" - "$1" <<'EOF'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("ACTPAGE_RESULT ")]
if not lines:
    print("  no ACTPAGE_RESULT"); sys.exit(1)
r = json.loads(lines[-1][len("ACTPAGE_RESULT "):])
print("  %-14s losses %s  median %s ms  device-used peak %s MiB  torch peak %s MiB  actpage %s" % (
    r["method"], " ".join("%.4f" % v for v in r["loss_values"][:3] if v is not None), r["median_step_ms"],
    r["device_used_peak_mib"], r["torch_peak_mib"], r["actpage"]))
EOF
}

run() {  # run NAME CMD...
  local name="$1"; shift
  echo "== $name"
  if "$@" >"$out/$name.log" 2>"$out/$name.err"; then
    case "$name" in
      hooks-*) tail -n 1 "$out/$name.log" | sed 's/^/  /' ;;
      *) summarise "$out/$name.log" || failed=1 ;;
    esac
  else
    echo "  FAILED (exit $?), last lines of $out/$name.err:"; tail -n 15 "$out/$name.err" | sed 's/^/    /'
    failed=1
  fi
}

run hooks-llama "$python" "$here/check_hooks.py" --model llama
run hooks-qwen3 "$python" "$here/check_hooks.py" --model qwen3_moe
for method in none checkpointing save_on_cpu stream_offload cuda_graph; do
  run "llama-$method" "$python" "$here/train_llama.py" "${small_llama[@]}" --method "$method" ${SMOKE_ARGS:-}
done
for method in none stream_offload cuda_graph; do
  run "qwen3-$method" "$python" "$here/train_qwen3_moe.py" "${small_qwen[@]}" --method "$method" ${SMOKE_ARGS:-}
done
if [ -x "$build/bin/actpage" ]; then
  run actpage-llama "$build/bin/actpage" run -- "$python" "$here/train_llama.py" "${small_llama[@]}" ${SMOKE_ARGS:-}
  run actpage-llama-graph "$build/bin/actpage" run -- "$python" "$here/train_llama.py" "${small_llama[@]}" --method cuda_graph ${SMOKE_ARGS:-}
else
  echo "== (no $build/bin/actpage: actpage runs skipped)"
fi
echo "logs: $out"
exit $failed
