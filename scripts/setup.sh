#!/usr/bin/env bash
# Installs what building and testing actpage needs on a fresh Debian 12 machine. Idempotent: only
# missing packages are installed. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config binutils file clang
  libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-dev python3-torch python3-torchvision python3-numpy python3-matplotlib
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cuda_root=${ACTPAGE_CUDA_ROOT:-/usr/local/cuda}
if [[ ! -f "$cuda_root/include/cuda.h" || ! -d "$cuda_root/include/nvtx3" ]]; then
  echo "setup: the CUDA toolkit headers (cuda.h, nvtx3/) are needed at $cuda_root/include;" \
       "install the CUDA toolkit or set ACTPAGE_CUDA_ROOT" >&2
  exit 1
fi
