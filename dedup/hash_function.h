// The content hash of gmem's dedup, as one set of inline functions that the
// GPU kernel (hash_kernel.cu) and the CPU reference (hash.cpp) both use, so
// the two compute the same function by construction.
//
// Definition. Content of `size` bytes is zero-padded to whole 64 KiB blocks.
// In a block, 64-bit little-endian word i (0..8191) belongs to lane i % 256 at
// step i / 256. Each lane folds its 32 words in step order with lane_step
// (an XXH3-style 32x32->64 multiply of the word keyed by its step, plus the
// word itself) and finishes with lane_final (murmur3's fmix64). The 256 lane
// values are combined by a fixed binary tree: at stride 1, 2, 4, ..., 128,
// lane i (a multiple of 2*stride) becomes combine(v[i], v[i + stride]); v[0]
// is the block's hash. The content's hash folds its length and its block
// hashes in order: h = fmix64(size ^ K3), then h = fmix64((h ^ b_i) * K1 + i).
// Not cryptographic: a match only makes a candidate, merged after a byte-for-
// byte comparison.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define GMEM_HASH_FN __host__ __device__ __forceinline__
#else
#define GMEM_HASH_FN inline
#endif

namespace gmem::dedup::fn {

constexpr uint64_t block_bytes = 64 << 10;
constexpr unsigned lanes = 256;
constexpr unsigned lane_steps = block_bytes / 8 / lanes;  // 32
constexpr uint64_t k1 = 0x9E3779B185EBCA87ull, k2 = 0xC2B2AE3D27D4EB4Full, k3 = 0x165667B19E3779F9ull;

GMEM_HASH_FN uint64_t fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

GMEM_HASH_FN uint64_t lane_seed(unsigned lane) { return k3 ^ (uint64_t(lane) * k2); }

GMEM_HASH_FN uint64_t lane_step(uint64_t acc, uint64_t word, unsigned step) {
  const uint64_t keyed = word ^ (k1 * (step + 1));  // a constant once the loop is unrolled
  return acc + uint64_t(uint32_t(keyed)) * uint64_t(uint32_t(keyed >> 32)) + word;
}

GMEM_HASH_FN uint64_t lane_final(uint64_t acc) { return fmix64(acc); }

GMEM_HASH_FN uint64_t combine(uint64_t left, uint64_t right) { return fmix64(left * k1 + right); }

GMEM_HASH_FN uint64_t fold_start(uint64_t size) { return fmix64(size ^ k3); }

GMEM_HASH_FN uint64_t fold(uint64_t h, uint64_t block_hash, uint64_t index) {
  return fmix64((h ^ block_hash) * k1 + index);
}

}  // namespace gmem::dedup::fn
