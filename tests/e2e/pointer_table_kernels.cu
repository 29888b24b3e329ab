// pointer_table.c's kernel, compiled by nvcc at build time and embedded as a
// fatbin (tests/meson.build): one step over memory the kernel reaches through
// a pointer kept in device memory.
#include "count_step.cuh"

// x = table[0]: every 32-bit word of x[0, n) should be `expect`; each becomes
// its value plus 1. `seen` is not read: the program passes x there or 0, so
// that the launch's parameters hold x's address or not. bad[0] counts the
// words that were not `expect`; bad[1] is the least `expect` at which some
// were (start it at ~0).
extern "C" __global__ void gmem_pointer_table_step(uint4* const* table, const uint4* seen, unsigned long long n,
                                                   unsigned expect, unsigned long long* bad) {
  (void)seen;
  uint4* x = table[0];
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long count = 0;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    count += count_up(x, i, expect);
  }
  tell_wrong(count, expect, bad);
}
