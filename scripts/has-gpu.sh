#!/usr/bin/env bash
# Exit 0 when this machine has a usable CUDA GPU (driver loaded and a device visible).
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU " && exit 0
exit 1
