#!/usr/bin/env bash
# Builds what runs on the GPU machine (the preload library, the CLI, the Python hook package and the
# GPU test programs) as a stripped Release build and stages it in .gpu/ at the repository root, to be
# carried to the GPU machine (which has none of the Debian libraries: everything here is checked to
# need only libstdc++/libgcc_s/libc, plus libcudart/libcuda for the CUDA test program).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ACTPAGE_GPU_BUILD_DIR:-$root/build-gpu}
stage=$root/.gpu
"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DACTPAGE_WERROR=ON -DACTPAGE_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "${ACTPAGE_JOBS:-$(nproc)}" --target actpage actpage_preload actpage_python \
  device_gpu_test gpu_hooks_test actpage_gpu_hooks_program vmm_sync_probe
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/tests"
cp "$build/bin/actpage" "$stage/bin/"
cp "$build/lib/libactpage.so" "$stage/lib/"
mkdir -p "$stage/python"
cp -r "$root/python/actpage_hooks" "$root/python/sitecustomize.py" "$stage/python/"
# The package's C forward and saved-tensor hooks (abi3: load in the GPU machine's Python whatever its
# minor version).
extensions=(_fastrange.abi3.so _fastsaved.abi3.so)
for extension in "${extensions[@]}"; do
  [[ -f $build/python/actpage_hooks/$extension ]] ||
    { echo "gpu-bundle: $build/python/actpage_hooks/$extension was not built (Python headers missing?)" >&2; exit 1; }
  cp "$build/python/actpage_hooks/$extension" "$stage/python/actpage_hooks/"
done
for test in device_gpu_test gpu_hooks_test actpage_gpu_hooks_program vmm_sync_probe; do
  cp "$build/bin/$test" "$stage/tests/"
done
strip --strip-unneeded "$stage/bin/actpage" "$stage/lib/libactpage.so" "$stage"/tests/* "$stage"/python/actpage_hooks/*.abi3.so
for binary in "$stage/bin/actpage" "$stage/lib/libactpage.so" "$stage/tests/device_gpu_test" "$stage/tests/gpu_hooks_test" \
              "$stage"/python/actpage_hooks/*.abi3.so; do
  if readelf -d "$binary" | grep NEEDED | grep -E -q "spdlog|fmt|benchmark|gtest"; then
    echo "gpu-bundle: $binary needs a library the GPU machine lacks:" >&2
    readelf -d "$binary" | grep NEEDED >&2
    exit 1
  fi
done
git -C "$root" rev-parse HEAD > "$stage/COMMIT"
git -C "$root" status --short | grep -q . && echo "+uncommitted changes" >> "$stage/COMMIT"
du -sh "$stage"
