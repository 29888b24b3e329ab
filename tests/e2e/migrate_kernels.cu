// migrate.c's kernel, compiled by nvcc at build time and embedded as a fatbin
// (tests/meson.build): one step of a stream's count over its slice, checking
// every word it reads against the count the host expects.

__device__ __forceinline__ unsigned wrong(uint4 v, unsigned expect) {
  return (v.x != expect) + (v.y != expect) + (v.z != expect) + (v.w != expect);
}

// Every 32-bit word of x[0, n) and y[0, n) (y: x copied or memset after the
// step before) should be `expect`; each word of x becomes its value plus 1.
// bad[0] counts the words that were not `expect`; bad[1] is the least
// `expect` at which some were (start it at ~0).
extern "C" __global__ void gmem_migrate_step(uint4* x, const uint4* y, unsigned long long n, unsigned expect,
                                             unsigned long long* bad) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned long long count = 0;
  for (; i < n; i += stride) {
    uint4 a = x[i];
    count += wrong(a, expect) + wrong(y[i], expect);
    a.x += 1;
    a.y += 1;
    a.z += 1;
    a.w += 1;
    x[i] = a;
  }
  for (int s = 16; s > 0; s >>= 1) count += __shfl_down_sync(0xffffffffu, count, s);
  if ((threadIdx.x & 31) == 0 && count) {
    atomicAdd(&bad[0], count);
    atomicMin(&bad[1], (unsigned long long)expect);
  }
}
