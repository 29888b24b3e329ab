#!/usr/bin/env bash
# The GPU suite, run on a GPU machine from the repository root, on a build
# carried in .carry/ (scripts/pack-gpu.sh). Writes logs and summary.md (ready
# for docs/results.md) to $OUT, or /tmp/gmem-gpu. Runs every step even when one
# fails; exits non-zero if any failed.
#   bash scripts/gpu-test.sh [--quick] [STEP...]
#     --quick: fewer training steps; STEP...: run only the steps whose names
#     begin with one of these words (e.g. conformance sanitizer allreduce).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gmem-gpu}
mkdir -p "$out"
carry=$PWD/.carry
shim=$carry/libcuda.so.1
args=$*
steps=300
if [ "${1:-}" = "--quick" ]; then
  steps=60
  shift
fi
only=("$@")
# Never NVLink multicast on the shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
summary=$out/summary.md
failed=0

# step NAME COMMAND...: runs COMMAND, logs it to $out/NAME.log, records the
# outcome (exit 77 is "skipped", never "passed").
step() {
  local name=$1
  shift
  if [ ${#only[@]} -gt 0 ]; then
    local word wanted=""
    for word in "${only[@]}"; do [[ $name == "$word"* ]] && wanted=1; done
    [ -n "$wanted" ] || return 0
  fi
  local start=$SECONDS
  { echo "\$ $*"; "$@"; } >"$out/$name.log" 2>&1
  local rc=$?
  local verdict=PASS
  if [ $rc -eq 77 ]; then verdict=SKIPPED; elif [ $rc -ne 0 ]; then verdict="FAIL (exit $rc)"; failed=$((failed + 1)); fi
  printf '| %s | `%s` | %s | %ss |\n' "$name" "$*" "$verdict" $((SECONDS - start)) >>"$summary"
  echo "$name: $verdict"
}

real=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
gpus=$(nvidia-smi -L | wc -l)
{
  echo "## GPU suite, $(date -u +%Y-%m-%d)"
  echo
  echo "- GPUs: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c | sed 's/^ *//')"
  echo "- driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1); real libcuda: $real"
  echo "- torch: $(python3 -c 'import torch; print(torch.__version__)')"
  echo "- command: \`bash scripts/gpu-test.sh $args\`"
  echo
  echo "| step | command | result | time |"
  echo "| --- | --- | --- | --- |"
} >"$summary"

preload=(env LD_PRELOAD="$shim")
step conformance-real "$carry/conformance"
step conformance-shim "${preload[@]}" "$carry/conformance"
step conformance-shim-disabled "${preload[@]}" GMEM_CONF=disable:1 "$carry/conformance"
step conformance-shim-vmm-pool "${preload[@]}" GMEM_CONF=pool:vmm "$carry/conformance"
# The suite provokes API errors on purpose; memory errors are what count here.
sanitizer=(compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1)
step sanitizer-real "${sanitizer[@]}" "$carry/conformance"
step sanitizer-shim "${sanitizer[@]}" "${preload[@]}" "$carry/conformance"

# The same job, the same checksum, under every way of loading gmem; gmem's
# report equals the job's own count of what it allocated.
job_matches() {
  local reference
  reference=$("$carry/driver-job") || return 1
  echo "$reference"
  for mode in "LD_PRELOAD=$shim" "LD_LIBRARY_PATH=$carry:${LD_LIBRARY_PATH:-}"; do
    for job in driver-job driver-job-dlopen; do
      local got
      got=$(env "$mode" GMEM_CONF=report:1 "$carry/$job" 2>"$out/job.err") || return 1
      cat "$out/job.err"
      [ "$got" = "$reference" ] || { echo "$job with $mode: output differs"; return 1; }
      grep '^expect' <<<"$got" | while read -r _ kind allocs bytes; do
        grep -q "gmem: report $kind *$allocs frees=[0-9]* $bytes " "$out/job.err" ||
          { echo "$job with $mode: report misses $kind $allocs $bytes"; exit 1; }
      done || return 1
    done
  done
}
step driver-job job_matches
step lazy "${preload[@]}" "$carry/lazy-probe"
step exec-child-lazy "${preload[@]}" "$carry/driver-job" --exec "$carry/lazy-probe"
step stress "${preload[@]}" GMEM_CONF=report:1 "$carry/stress" 16 2000
step stress-vmm-pool "${preload[@]}" GMEM_CONF=report:1,pool:vmm "$carry/stress" 16 2000
step stitch-vmm-pool "${preload[@]}" GMEM_CONF=pool:vmm "$carry/stitch"

step train-matrix python3 tests/gpu/run_train_matrix.py --shim "$shim" --out "$out/train" --steps "$steps" --bench
step train-vmm-pool python3 tests/gpu/run_train_matrix.py --shim "$shim" --out "$out/train-vmm" --steps "$steps" \
  --conf pool:vmm --allocators default --bench
if [ "$gpus" -ge 2 ]; then
  step allreduce-native python3 tests/gpu/allreduce.py
  step allreduce-shim "${preload[@]}" GMEM_CONF=report:1 python3 tests/gpu/allreduce.py
elif [ ${#only[@]} -eq 0 ]; then
  printf '| allreduce | `python3 tests/gpu/allreduce.py` | SKIPPED (needs 2 GPUs, found %s) | |\n' "$gpus" >>"$summary"
fi
step bench-shim "${preload[@]}" "$carry/bench-shim"
step bench-load "$carry/bench-load" "$shim" "$real"

{
  echo
  echo "BENCH lines:"
  echo
  echo '```'
  cat "$out"/*.log | grep -h '^BENCH' || true
  echo '```'
  echo
  echo "Training matrix:"
  echo
  grep -h '^|' "$out/train-matrix.log" "$out/train-vmm-pool.log" 2>/dev/null || true
} >>"$summary"
cat "$summary"
exit $((failed > 0))
