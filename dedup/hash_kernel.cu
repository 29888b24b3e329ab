// Dedup's kernels: the content hash (one thread block of 256 threads per 64 KiB
// block of content) and the byte-for-byte comparison. dedup/hash.h defines the function; hash.cpp's
// CPU reference computes exactly the same. Compiled by nvcc at build time and
// embedded into the shim (dedup/meson.build).
#include <stdint.h>

#include "dedup/hash_function.h"

namespace {

__device__ __forceinline__ uint64_t word_at(const unsigned char* block, uint64_t offset, uint64_t valid) {
  if (offset + 8 <= valid) return __ldg(reinterpret_cast<const unsigned long long*>(block + offset));
  uint64_t w = 0;
  for (uint64_t b = 0; offset + b < valid && b < 8; ++b) w |= uint64_t(block[offset + b]) << (8 * b);
  return w;
}

}  // namespace

// out[i]: the hash of 64 KiB block i of [data, data + size). `data` is 8-byte aligned.
extern "C" __global__ void __launch_bounds__(256) gmem_dedup_hash_blocks(const unsigned char* data,
                                                                        unsigned long long size,
                                                                        unsigned long long* out) {
  using namespace gmem::dedup::fn;
  const unsigned lane = threadIdx.x;
  const uint64_t start = uint64_t(blockIdx.x) * block_bytes;
  const unsigned char* block = data + start;
  const uint64_t valid = size - start < block_bytes ? size - start : block_bytes;
  uint64_t acc = lane_seed(lane);
  if (valid == block_bytes) {
    const unsigned long long* words = reinterpret_cast<const unsigned long long*>(block);
    uint64_t w[lane_steps];
#pragma unroll
    for (unsigned s = 0; s < lane_steps; ++s) w[s] = __ldg(words + s * lanes + lane);
#pragma unroll
    for (unsigned s = 0; s < lane_steps; ++s) acc = lane_step(acc, w[s], s);
  } else {
    for (unsigned s = 0; s < lane_steps; ++s) {
      const uint64_t offset = uint64_t(s * lanes + lane) * 8;
      acc = lane_step(acc, offset < valid ? word_at(block, offset, valid) : 0, s);
    }
  }
  uint64_t h = lane_final(acc);
  // The tree of hash_function.h: at stride s, lane i (i % 2s == 0) takes in lane i + s.
#pragma unroll
  for (unsigned s = 1; s < 32; s <<= 1) {
    const uint64_t other = __shfl_down_sync(0xffffffffu, h, s);
    h = combine(h, other);  // only lanes at multiples of 2s keep a meaningful value
  }
  __shared__ uint64_t warps[lanes / 32];
  if ((lane & 31) == 0) warps[lane / 32] = h;
  __syncthreads();
  if (lane < 32) {
    h = lane < lanes / 32 ? warps[lane] : 0;
#pragma unroll
    for (unsigned s = 1; s < lanes / 32; s <<= 1) {
      const uint64_t other = __shfl_down_sync(0xffffffffu, h, s);
      h = combine(h, other);
    }
    if (lane == 0) out[blockIdx.x] = h;
  }
}

// *differ becomes 1 if [a, a + size) and [b, b + size) differ anywhere (both
// 16-byte aligned); dedup compares candidates byte for byte with it before a
// merge. A grid-stride loop over 16-byte pairs; the tail byte by byte.
extern "C" __global__ void __launch_bounds__(256) gmem_dedup_compare(const unsigned char* a, const unsigned char* b,
                                                                    unsigned long long size, unsigned int* differ) {
  const uint64_t pairs = size / 16;
  const ulonglong2* x = reinterpret_cast<const ulonglong2*>(a);
  const ulonglong2* y = reinterpret_cast<const ulonglong2*>(b);
  bool same = true;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += uint64_t(gridDim.x) * blockDim.x) {
    const ulonglong2 u = __ldg(x + i), v = __ldg(y + i);
    same &= (u.x == v.x) & (u.y == v.y);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (uint64_t i = pairs * 16; i < size; ++i) same &= a[i] == b[i];
  }
  if (__syncthreads_or(!same) && threadIdx.x == 0) *differ = 1;
}
