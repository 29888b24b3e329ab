// migrate.c's kernel, compiled by nvcc at build time and embedded as a fatbin
// (tests/meson.build): one step of a stream's count over its slice, checking
// every word it reads against the count the host expects.
#include "count_step.cuh"

// Every 32-bit word of x[0, n) and y[0, n) (y: x copied or memset after the
// step before) should be `expect`; each word of x becomes its value plus 1.
// bad[0] counts the words that were not `expect`; bad[1] is the least
// `expect` at which some were (start it at ~0).
extern "C" __global__ void gmem_migrate_step(uint4* x, const uint4* y, unsigned long long n, unsigned expect,
                                             unsigned long long* bad) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long count = 0;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    count += wrong(y[i], expect) + count_up(x, i, expect);
  }
  tell_wrong(count, expect, bad);
}
