#!/usr/bin/env bash
# Copies what the GPU suite needs from a meson build into .carry/ (git-ignored),
# which travels to the GPU machine with the working tree.
#   scripts/pack-gpu.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/interpose/libcuda.so.1" ] || { echo "pack-gpu: build $build first (ninja -C $build)" >&2; exit 1; }
rm -rf .carry
mkdir -p .carry
cp "$build/interpose/libcuda.so.1" .carry/
for t in driver-job driver-job-dlopen stress stitch lazy-probe bench-shim bench-load conformance/conformance; do
  cp "$build/tests/$t" .carry/
done
strip --strip-unneeded .carry/*
du -sh .carry/* | sort -h
