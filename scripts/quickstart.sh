#!/usr/bin/env bash
# Installs what gmem needs (Debian/Ubuntu), builds it, and runs a sample CUDA
# job under the shim with report:1: on the GPU when this machine has a CUDA
# driver, otherwise on the emulated driver that the tests use.
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

[ -d build ] || meson setup build
ninja -C build

shim=$PWD/build/interpose/libcuda.so.1
export LD_PRELOAD=$shim GMEM_CONF=report:1
if /sbin/ldconfig -p | grep -q 'libcuda.so.1 ' && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "quickstart: running the sample job on the GPU under gmem"
else
  echo "quickstart: no CUDA driver here; running the sample job on gmem's emulated driver"
  export GMEM_REAL_LIBCUDA=$PWD/build/tests/emu/libcuda.so.1
fi
exec build/tests/driver-job
