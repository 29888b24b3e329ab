#!/usr/bin/env bash
# Installs what gmem needs (Debian/Ubuntu), builds it, and runs a job larger
# than the device without gmem and then under it (scripts/quickstart-demo.sh):
# on the GPU when this machine has a CUDA driver, otherwise on the emulated
# driver that the tests use.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in $(cat scripts/debian-packages.txt); do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "quickstart: installing ${missing[*]}"
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

toolkit=/usr/local/cuda
if [ ! -f "$toolkit/include/cuda.h" ] || [ ! -f "$toolkit/lib64/stubs/libcuda.so" ]; then
  echo "quickstart: gmem builds against the CUDA toolkit's cuda.h and stub libcuda.so in $toolkit," \
    "which are missing: install NVIDIA's CUDA toolkit (https://developer.nvidia.com/cuda-downloads) and run this again" >&2
  exit 1
fi
[ -d build ] || meson setup build
ninja -C build
exec scripts/quickstart-demo.sh build
