#!/usr/bin/env bash
# Spilled training under several builds of the shim, one after the other on
# one GPU machine, from the repository root: the base build packed into
# .carry/ (scripts/pack-gpu.sh) and variants packed beside it
# (scripts/pack-gpu.sh --variant NAME, into .carry/NAME/).
#   bash scripts/gpu-ab.sh [--host-pool SIZE] NAME VARIANTS SPILL_TRAIN_ARGS...
# VARIANTS is a comma list; "base" is .carry/libcuda.so.1. A variant may add
# GMEM_CONF settings to --conf's after a '+' (base+recall_steps=1: the base
# build with recall_steps:1; '=' stands for ':' in them, so that V names
# files). For each variant V in turn it runs
#   python3 tests/gpu/spill_train.py --shim LIB --out $OUT/NAME-V SPILL_TRAIN_ARGS...
# with stdout and stderr in $OUT/NAME-V.txt ($OUT: /tmp/gmem-ab if unset), and
# prints the BENCH lines of each (and the evictor's report line, with
# report:1 and evict:1 in --conf). First, unless one runs, it starts gmemd with
# a host pool of SIZE (100G by default; 0: no gmemd), as the jobs' host tier:
# pinning 100G takes about a minute, paid once per machine. Exits non-zero if
# any run failed. Example (a trace per run: %p is the job's pid):
#   bash scripts/gpu-ab.sh gcn base,norecall --job gnn --sizes 5.4e6 --reference 3e6 \
#     --steps 10 --conf host_budget:85%,trace:$OUT/gcn-%p.trace
# On one H200 (128 GiB of host memory) a job at twice the H200 does not fit
# its host: cap the device instead, as docs/results.md's thirtieth session did
# (the LM at 300 is 2.26x a 58 GB budget; 92G holds all it parks):
#   bash scripts/gpu-ab.sh --host-pool 92G lm base --job lm --sizes 300 --reference 176 \
#     --steps 8 --conf host_budget:85%,report:1,device_budget:58G
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
pool=100G
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then usage; exit 0; fi
if [ "${1:-}" = --host-pool ]; then
  pool=${2:-}
  shift 2 || true
fi
if [ $# -lt 3 ] || [[ ! $1 =~ ^[A-Za-z0-9_.-]+$ ]] || [[ ! $pool =~ ^[0-9]+[KMGT]?$ ]]; then
  usage >&2
  exit 2
fi
name=$1 variants=$2
shift 2
out=${OUT:-/tmp/gmem-ab}
mkdir -p "$out"
carry=$PWD/.carry
# shim_of VARIANT: the path of its build's libcuda.so.1.
shim_of() {
  local build=${1%%+*}
  if [ "$build" = base ]; then echo "$carry/libcuda.so.1"; else echo "$carry/$build/libcuda.so.1"; fi
}
IFS=, read -ra list <<<"$variants"
for v in "${list[@]}"; do
  [[ $v =~ ^[A-Za-z0-9_.-]+(\+[A-Za-z0-9_.=%-]+)*$ ]] || { echo "gpu-ab: bad variant '$v'" >&2; exit 2; }
  [ -f "$(shim_of "$v")" ] || { echo "gpu-ab: no $(shim_of "$v"): pack it (scripts/pack-gpu.sh, --variant ${v%%+*})" >&2; exit 2; }
done
# args_of VARIANT: SPILL_TRAIN_ARGS with the variant's settings added to --conf's.
args_of() {
  local extra="" a conf=0 given=0
  [[ $1 == *+* ]] && extra=$(tr '+=' ',:' <<<"${1#*+}")
  for a in "${args[@]}"; do
    if [ $conf = 1 ]; then a="$a,$extra"; a=${a#,}; a=${a%,}; conf=0; given=1; fi
    [ "$a" = --conf ] && [ -n "$extra" ] && conf=1
    printf '%s\0' "$a"
  done
  [ -n "$extra" ] && [ $given = 0 ] && printf '%s\0' --conf "$extra"
  return 0
}
# Never NVLink multicast on the shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

if [ "$pool" != 0 ] && ! pgrep -x gmemd >/dev/null; then
  [ -x "$carry/bin/gmemd" ] || { echo "gpu-ab: no .carry/bin/gmemd: pack a build with rpc/ (and patchelf)" >&2; exit 2; }
  setsid "$carry/bin/gmemd" --host-pool "$pool" >"$out/gmemd.log" 2>&1 </dev/null &
  started=$SECONDS
  until grep -q " pinned in " "$out/gmemd.log"; do
    if ! pgrep -x gmemd >/dev/null || [ $((SECONDS - started)) -gt 300 ]; then
      echo "gpu-ab: gmemd did not pin its pool:" >&2
      cat "$out/gmemd.log" >&2
      exit 1
    fi
    sleep 1
  done
  echo "gpu-ab: $(grep " pinned in " "$out/gmemd.log")"
fi

failed=0
args=("$@")
for v in "${list[@]}"; do
  started=$SECONDS
  mapfile -d '' run_args < <(args_of "$v")
  python3 tests/gpu/spill_train.py --shim "$(shim_of "$v")" --out "$out/$name-$v" "${run_args[@]}" >"$out/$name-$v.txt" 2>&1
  rc=$?
  echo "== $name-$v: rc $rc, $((SECONDS - started)) s ($out/$name-$v.txt)"
  grep -E '^BENCH|^gmem: report evictor' "$out/$name-$v.txt"
  [ $rc -eq 0 ] || { failed=1; tail -5 "$out/$name-$v.txt"; }
done
exit $failed
