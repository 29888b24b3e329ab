#!/usr/bin/env bash
# Copies what the GPU suite needs from a meson build into .carry/ (git-ignored),
# which travels to the GPU machine with the working tree: the shim, the test
# programs that were built, and the benchmarks (into .carry/bench/). Strips each
# copy where that makes it smaller, and prints the sizes.
#   scripts/pack-gpu.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/interpose/libcuda.so.1" ] || { echo "pack-gpu: build $build first (ninja -C $build)" >&2; exit 1; }
rm -rf .carry
mkdir -p .carry/bench

# pack FILE DEST_DIR: copies FILE, stripped if that saves space.
pack() {
  local copy
  copy=$2/$(basename "$1")
  cp "$1" "$copy"
  if strip --strip-unneeded -o "$copy.stripped" "$copy" 2>/dev/null &&
    [ "$(stat -c %s "$copy.stripped")" -lt "$(stat -c %s "$copy")" ]; then
    chmod --reference="$copy" "$copy.stripped"
    mv "$copy.stripped" "$copy"
  fi
  rm -f "$copy.stripped"
}

pack "$build/interpose/libcuda.so.1" .carry
# Test programs that scripts/gpu-test.sh runs; a missing one is skipped there.
for t in conformance/conformance driver-job driver-job-dlopen stress stitch lazy-probe replay-trace; do
  if [ -f "$build/tests/$t" ]; then pack "$build/tests/$t" .carry; else echo "pack-gpu: no $build/tests/$t, left out"; fi
done
# Benchmarks: meson builds tests/bench/*.c* as tests/bench-*; either layout is taken.
for b in "$build"/tests/bench-* "$build"/tests/bench/*; do
  [ -f "$b" ] && [ -x "$b" ] && pack "$b" .carry/bench
done
du -ah .carry | sort -h
