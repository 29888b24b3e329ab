#!/usr/bin/env bash
# The quickstart's demo, on a built tree: a job that holds 1.5x its device's
# memory at once (tests/e2e/quickstart_job.c) runs without gmem (out of
# memory), then under gmem with a gmemd started for it, and one screen says
# where its bytes went, what the pool's stitching saved, and what gmemctl
# shows while it runs. On the GPU when this machine has a CUDA driver,
# otherwise on gmem's emulated driver, as a 4 GiB device. The spill goes to
# pinned host memory, of which gmem takes at most half of what the host has
# free by default (host_budget): where 1.5x the device would not fit in the
# device and 9/10 of that budget, less a tenth of the device (what the device
# keeps back, and the pool's rounding while it spills), the job holds less (an
# H200 on a host with 125 GiB free: 1.3x).
#   scripts/quickstart-demo.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
# By a path relative to here: it is the command gmemctl shows.
job=$(realpath --relative-to=. "$build")/tests/quickstart-job
shim=$build/interpose/libcuda.so.1
conf=report:1  # gmem's defaults (the pool included), and its report at exit

native=()
if /sbin/ldconfig -p | grep -q 'libcuda.so.1 ' && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "quickstart: a job larger than this GPU, without gmem and then under gmem"
  device_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
else
  echo "quickstart: no GPU here: gmem's emulated driver (tests/emu) plays a 4 GiB one"
  device_mib=4096
  export GMEM_EMU_DEVICE_MEMORY=${device_mib}M
  native=(env "LD_LIBRARY_PATH=$build/tests/emu")
  export GMEM_REAL_LIBCUDA=$build/tests/emu/libcuda.so.1
fi
# How many times the device's memory the job holds: 1.5, or what the device
# and 9/10 of gmem's default host budget (half of MemAvailable) hold, less a
# tenth of the device.
available_mib=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
times=$(awk -v d="$device_mib" -v a="$available_mib" \
  'BEGIN { t = 1 + (0.9 * a / 2 - 0.1 * d) / d; printf "%.2f", t < 1.5 ? t : 1.5 }')
if awk -v t="$times" 'BEGIN { exit !(t < 1.1) }'; then
  echo "quickstart: this host has $available_mib MiB of memory available; gmem's default host budget (half of it)" \
    "cannot hold a job 1.1x this ${device_mib} MiB device: free host memory, or run on a host with more" >&2
  exit 1
fi

echo "without gmem:"
if "${native[@]}" "$job" "$times" | sed 's/^/  /'; then
  echo "quickstart: the job ran without gmem: it is not larger than this device" >&2
  exit 1
fi

tmp=$(mktemp -d)
gmemd_pid=
cleanup() {
  [ -z "$gmemd_pid" ] || kill "$gmemd_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# A gmemd of its own (its socket in $tmp), reading the stats files in /dev/shm,
# where the job publishes them by default.
"$build/rpc/gmemd" --socket "$tmp/gmemd.sock" >"$tmp/gmemd.log" 2>&1 &
gmemd_pid=$!
gmemctl=("$build/rpc/gmemctl" --socket "$tmp/gmemd.sock")
for _ in $(seq 100); do
  grep -q "gmemd: serving" "$tmp/gmemd.log" && break
  sleep 0.1
done

echo "with gmem (LD_PRELOAD=$shim):"
# The job holds its memory until its standard input (a fifo) closes.
mkfifo "$tmp/stdin"
LD_PRELOAD=$shim GMEM_CONF=$conf "$job" --hold "$times" <"$tmp/stdin" >"$tmp/out" 2>"$tmp/report" &
pid=$!
exec 3>"$tmp/stdin"
until grep -q '^holding' "$tmp/out"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    cat "$tmp/out" "$tmp/report" >&2
    wait "$pid" || exit
  fi
  sleep 0.1
done
sed 's/^/  /' "$tmp/out"
echo "\$ gmemctl stats $pid"
"${gmemctl[@]}" stats "$pid" | sed 's/^/  /'
"${gmemctl[@]}" stats "$pid" --json >"$tmp/stats.json"
echo "\$ gmemctl placement $pid --top 3"
"${gmemctl[@]}" placement "$pid" --top 3 | sed 's/^/  /'
exec 3>&-
wait "$pid"
sed '1,/^holding/d; s/^/  /' "$tmp/out"

# One figure of the stats (proto3 JSON writes 64-bit integers as strings).
figure() { grep -o "\"$1\":\"[0-9]*\"" "$tmp/stats.json" | grep -o '[0-9]*' | head -1; }
# One key=value of report:1's lines ("gmem: report <what> key=value ...").
report() { grep "gmem: report $1 " "$tmp/report" | grep -o " $2=[0-9]*" | cut -d= -f2; }
bytes() {
  awk -v b="$1" 'BEGIN { if (b >= 2^30) printf "%.1f GiB", b / 2^30; else if (b > 0) printf "%.0f MiB", b / 2^20;
                         else printf "0 B" }'
}
echo "what gmem did:"
echo "  bytes:     $(bytes "$(figure device_bytes)") on the device," \
  "$(bytes "$(figure host_bytes)") spilled to pinned host memory, $(bytes "$(figure peer_bytes)") to a peer GPU"
echo "  stitching: $(figure stitches) requests were served by mapping chunks side by side into one range," \
  "freed ones first,"
echo "             so the pool held $(bytes "$(report vmm-pool reserved_peak)") at most" \
  "for $(bytes "$(report vmm-pool used_peak)") in use at most"
echo "  driver:    the job made $(report total allocs) allocations ($(bytes "$(report total bytes)") in all);" \
  "gmem served $(report vmm-pool hits) from memory it held"
echo "             and made $(report vmm-pool chunks_made) chunks with the driver; without gmem each allocation" \
  "is a driver call"
