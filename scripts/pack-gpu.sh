#!/usr/bin/env bash
# Copies what the GPU suite needs from a meson build into .carry/ (git-ignored),
# which travels to the GPU machine with the working tree: the shim, the test
# programs that were built, and the benchmarks (into .carry/bench/). Strips each
# copy where that makes it smaller, and prints the sizes. Keeps .carry/samples/
# (cuda-samples built by hand; scripts/gpu-test.sh ipc-samples runs them);
# everything else in .carry/ goes, variants too: pack them after this.
#   scripts/pack-gpu.sh [BUILD_DIR]     (default: build)
# With --variant NAME, only the shim goes, into .carry/NAME/, beside what was
# packed before: another build of it for scripts/gpu-ab.sh to compare (build
# the change, pack it as a variant, undo the change, rebuild).
#   scripts/pack-gpu.sh --variant NAME [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
variant=
if [ "${1:-}" = --variant ]; then
  [[ ${2:-} =~ ^[A-Za-z0-9_-]+$ && $2 != base && $2 != bin && $2 != lib && $2 != bench && $2 != samples ]] ||
    { echo "pack-gpu: --variant needs a name of letters, digits, - and _ (not base, bin, lib, bench or samples)" >&2; exit 2; }
  variant=$2
  shift 2
fi
build=${1:-build}
[ -f "$build/interpose/libcuda.so.1" ] || { echo "pack-gpu: build $build first (ninja -C $build)" >&2; exit 1; }

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

if [ -n "$variant" ]; then
  [ -f .carry/libcuda.so.1 ] || { echo "pack-gpu: pack the base first (scripts/pack-gpu.sh)" >&2; exit 1; }
  mkdir -p ".carry/$variant"
  pack "$build/interpose/libcuda.so.1" ".carry/$variant"
  du -h ".carry/$variant/libcuda.so.1"
  exit 0
fi
# Everything but .carry/samples/: programs built there by hand from
# NVIDIA/cuda-samples (not part of the repository) for the ipc-samples step.
find .carry -mindepth 1 -maxdepth 1 ! -name samples -exec rm -rf {} + 2>/dev/null || true
mkdir -p .carry/bench

pack "$build/interpose/libcuda.so.1" .carry
# Test programs that scripts/gpu-test.sh runs; a missing one is skipped there.
for t in conformance/conformance driver-job driver-job-dlopen stress stitch spill spill-bw migrate pointer-table \
  lazy-probe replay-trace quickstart-job dedup/dedup-hash-check dedup/dedup-job; do
  if [ -f "$build/tests/$t" ]; then pack "$build/tests/$t" .carry; else echo "pack-gpu: no $build/tests/$t, left out"; fi
done
# Benchmarks: meson builds tests/bench/*.c* as tests/bench-*; either layout is
# taken. Not bench-gmemd: it measures gmemd over fake publishers (no driver),
# and runs here with `meson test --benchmark`.
for b in "$build"/tests/bench-* "$build"/tests/bench/* "$build"/tests/dedup/bench-*; do
  [ -f "$b" ] && [ -x "$b" ] && [ "${b##*/}" != bench-gmemd ] && pack "$b" .carry/bench
done
# The stats plane: gmemd and gmemctl with the libraries the GPU machine lacks
# (gRPC, protobuf, abseil...; everything but the C and C++ runtimes), found
# through an RPATH of $ORIGIN/../lib that reaches only these two programs,
# never the jobs they start. Needs patchelf.
if [ -x "$build/rpc/gmemd" ] && [ -x "$build/rpc/gmemctl" ]; then
  if command -v patchelf >/dev/null; then
    mkdir -p .carry/bin .carry/lib
    for p in gmemd gmemctl; do
      pack "$build/rpc/$p" .carry/bin
      # shellcheck disable=SC2016  # $ORIGIN is for the dynamic loader
      patchelf --force-rpath --set-rpath '$ORIGIN/../lib' ".carry/bin/$p"
    done
    ldd "$build/rpc/gmemd" "$build/rpc/gmemctl" | awk '/=>/ {print $3}' | sort -u |
      grep -Ev '/(libc|libm|libgcc_s|libstdc\+\+|libpthread|libdl|librt)\.so' |
      while read -r lib; do pack "$lib" .carry/lib; done  # under the name the programs ask for
  else
    echo "pack-gpu: no patchelf (apt-get install patchelf): gmemd and gmemctl left out"
  fi
fi
du -ah .carry | sort -h
