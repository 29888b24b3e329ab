// The dedup content hash: its CPU reference (the definition every shim must
// agree on) and the host path of DeviceHasher on the emulated driver.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "dedup/hash.h"

namespace {

using gmem::dedup::hash_cpu;

std::vector<unsigned char> random_bytes(std::size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(size);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// Shims of different builds meet in one dedup broker: the function may never
// change silently. These values were computed by this definition once.
TEST(DedupHash, PinnedValues) {
  std::vector<unsigned char> pattern(200000);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 7 + (i >> 9));
  EXPECT_EQ(hash_cpu(nullptr, 0), 0xf490368aba8bfeacull);
  EXPECT_EQ(hash_cpu(pattern.data(), 3), 0xcd4aa7732062ef55ull);
  EXPECT_EQ(hash_cpu(pattern.data(), pattern.size()), 0x11e1bee52ca54b16ull);
}

TEST(DedupHash, WholeEqualsFoldedBlocks) {
  auto data = random_bytes((3 << 16) + 1001, 1);
  std::vector<uint64_t> blocks;
  for (std::size_t at = 0; at < data.size(); at += 1 << 16) {
    blocks.push_back(gmem::dedup::hash_block_cpu(data.data() + at, std::min<std::size_t>(1 << 16, data.size() - at)));
  }
  EXPECT_EQ(blocks.size(), gmem::dedup::block_count(data.size()));
  EXPECT_EQ(hash_cpu(data.data(), data.size()), gmem::dedup::fold_blocks(data.size(), blocks.data(), blocks.size()));
}

TEST(DedupHash, LengthCountsAsWellAsZeroPadding) {
  const unsigned char bytes[9] = {'a', 'b', 'c', 0, 0, 0, 0, 0, 0};
  EXPECT_NE(hash_cpu(bytes, 3), hash_cpu(bytes, 4));
  EXPECT_NE(hash_cpu(bytes, 8), hash_cpu(bytes, 9));
  std::vector<unsigned char> zeros(1 << 17);
  EXPECT_NE(hash_cpu(zeros.data(), 1 << 16), hash_cpu(zeros.data(), 1 << 17));
}

TEST(DedupHash, EveryChangedBitAndEveryMoveChangesIt) {
  auto data = random_bytes(5 * (1 << 16) + 123, 2);
  const uint64_t original = hash_cpu(data.data(), data.size());
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) {
    const std::size_t at = rng() % data.size();
    const unsigned char bit = static_cast<unsigned char>(1u << (rng() % 8));
    data[at] ^= bit;
    EXPECT_NE(hash_cpu(data.data(), data.size()), original) << "bit flipped at byte " << at;
    data[at] ^= bit;
  }
  EXPECT_EQ(hash_cpu(data.data(), data.size()), original);
  // Two words of one block trade places (same lane, other steps; other lanes).
  for (std::size_t other : {std::size_t(256 * 8), std::size_t(8), std::size_t(8 * 8191)}) {
    auto moved = data;
    std::swap_ranges(moved.begin(), moved.begin() + 8, moved.begin() + other);
    EXPECT_NE(hash_cpu(moved.data(), moved.size()), original) << "word 0 swapped with the word at " << other;
  }
  // Two whole blocks trade places.
  auto swapped = data;
  std::swap_ranges(swapped.begin(), swapped.begin() + (1 << 16), swapped.begin() + (1 << 16));
  EXPECT_NE(hash_cpu(swapped.data(), swapped.size()), original);
}

// On the emulated driver the kernel cannot load (its modules are PTX
// signatures, the embedded image a fatbin, or none without nvcc): the device
// memory is copied to the host and hashed there, to the same value.
TEST(DedupHash, EmulatorHashesOnTheHost) {
  void* lib = dlopen(GMEM_EMU_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto d = gmem::vmm::Driver::from([&](const char* name) { return dlsym(lib, name); });
  auto init = reinterpret_cast<decltype(&cuInit)>(dlsym(lib, "cuInit"));
  auto retain = reinterpret_cast<decltype(&cuDevicePrimaryCtxRetain)>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
  auto set_current = reinterpret_cast<decltype(&cuCtxSetCurrent)>(dlsym(lib, "cuCtxSetCurrent"));
  auto htod = reinterpret_cast<decltype(&cuMemcpyHtoD_v2)>(dlsym(lib, "cuMemcpyHtoD_v2"));
  ASSERT_EQ(init(0), CUDA_SUCCESS);
  CUcontext context = nullptr;
  ASSERT_EQ(retain(&context, 0), CUDA_SUCCESS);
  ASSERT_EQ(set_current(context), CUDA_SUCCESS);
  auto data = random_bytes((1 << 20) + 77, 4);
  CUdeviceptr ptr = 0;
  ASSERT_EQ(d.cuMemAlloc_v2(&ptr, data.size()), CUDA_SUCCESS);
  ASSERT_EQ(htod(ptr, data.data(), data.size()), CUDA_SUCCESS);
  gmem::dedup::DeviceHasher hasher(d);
  uint64_t h = 0;
  auto path = gmem::dedup::DeviceHasher::Path::gpu;
  ASSERT_EQ(hasher.hash(ptr, data.size(), &h, &path), CUDA_SUCCESS);
  EXPECT_EQ(path, gmem::dedup::DeviceHasher::Path::cpu);
  EXPECT_EQ(h, hash_cpu(data.data(), data.size()));
  EXPECT_EQ(hasher.launch_blocks(ptr, data.size(), 0, nullptr), CUDA_ERROR_NOT_SUPPORTED);
  // Comparison on the host: equal to itself, different from a copy with one byte changed.
  CUdeviceptr other = 0;
  ASSERT_EQ(d.cuMemAlloc_v2(&other, data.size()), CUDA_SUCCESS);
  ASSERT_EQ(d.cuMemcpyDtoD_v2(other, ptr, data.size()), CUDA_SUCCESS);
  bool equal = false;
  ASSERT_EQ(hasher.same_bytes(ptr, other, data.size(), &equal, &path), CUDA_SUCCESS);
  EXPECT_TRUE(equal);
  EXPECT_EQ(path, gmem::dedup::DeviceHasher::Path::cpu);
  unsigned char last = static_cast<unsigned char>(data.back() ^ 1);
  ASSERT_EQ(htod(other + data.size() - 1, &last, 1), CUDA_SUCCESS);
  ASSERT_EQ(hasher.same_bytes(ptr, other, data.size(), &equal), CUDA_SUCCESS);
  EXPECT_FALSE(equal);
  EXPECT_EQ(d.cuMemFree_v2(other), CUDA_SUCCESS);
  EXPECT_EQ(d.cuMemFree_v2(ptr), CUDA_SUCCESS);
}

}  // namespace
