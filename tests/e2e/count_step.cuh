// What the e2e programs' kernels share (migrate_kernels.cu,
// pointer_table_kernels.cu): a step of a count kept in every 32-bit word of
// device memory, checked as it goes.
#pragma once

// The words of `v` that are not `expect`.
__device__ __forceinline__ unsigned wrong(uint4 v, unsigned expect) {
  return (v.x != expect) + (v.y != expect) + (v.z != expect) + (v.w != expect);
}

// Adds 1 to each word of x[i]; returns how many of them were not `expect`.
__device__ __forceinline__ unsigned count_up(uint4* x, unsigned long long i, unsigned expect) {
  uint4 a = x[i];
  const unsigned count = wrong(a, expect);
  a.x += 1;
  a.y += 1;
  a.z += 1;
  a.w += 1;
  x[i] = a;
  return count;
}

// Adds the warp's `count` of wrong words to bad[0], and lowers bad[1] to
// `expect` where there were some (start it at ~0).
__device__ __forceinline__ void tell_wrong(unsigned long long count, unsigned expect, unsigned long long* bad) {
  for (int s = 16; s > 0; s >>= 1) count += __shfl_down_sync(0xffffffffu, count, s);
  if ((threadIdx.x & 31) == 0 && count) {
    atomicAdd(&bad[0], count);
    atomicMin(&bad[1], (unsigned long long)expect);
  }
}
