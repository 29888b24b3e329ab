// The VMM pool's dedup block (whole_range_chunks, adopt_shared, make_private)
// on the emulated driver, in process: what each promises about access,
// content, the pool's figures, and failure (nothing changed).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "pool/vmm_pool.h"

namespace {

using gmem::pool::Block;
using gmem::pool::VmmPool;
using gmem::vmm::Chunk;

constexpr std::size_t mib = 1 << 20;

class PoolShared : public testing::Test {
 protected:
  void SetUp() override {
    lib_ = dlopen(GMEM_EMU_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib_, nullptr) << dlerror();
    if (!d_.cuMemCreate) d_ = gmem::vmm::Driver::from([&](const char* name) { return dlsym(lib_, name); });
    auto init = reinterpret_cast<decltype(&cuInit)>(dlsym(lib_, "cuInit"));
    auto retain = reinterpret_cast<decltype(&cuDevicePrimaryCtxRetain)>(dlsym(lib_, "cuDevicePrimaryCtxRetain"));
    auto set_current = reinterpret_cast<decltype(&cuCtxSetCurrent)>(dlsym(lib_, "cuCtxSetCurrent"));
    get_access_ = reinterpret_cast<decltype(&cuMemGetAccess)>(dlsym(lib_, "cuMemGetAccess"));
    htod_ = reinterpret_cast<decltype(&cuMemcpyHtoD_v2)>(dlsym(lib_, "cuMemcpyHtoD_v2"));
    static const CUresult initialised = init(0);  // once per process
    ASSERT_EQ(initialised, CUDA_SUCCESS);
    ASSERT_EQ(retain(&context_, 0), CUDA_SUCCESS);
    ASSERT_EQ(set_current(context_), CUDA_SUCCESS);
    // One pool for the process, never destroyed, as in the shim (a pool
    // destroyed with ranges mapped leaves the emulator's mappings behind).
    static VmmPool* pool = new VmmPool(d_, nullptr);
    pool_ = pool;
  }
  // A live whole-range allocation of `size` filled with `seed`'s bytes.
  Block allocate(std::size_t size, unsigned char seed) {
    Block b;
    EXPECT_EQ(pool_->alloc(&b, size, 0, context_, 0, false), CUDA_SUCCESS);
    std::vector<unsigned char> bytes(size);
    for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<unsigned char>(i * 13 + seed);
    EXPECT_EQ(htod_(b.base, bytes.data(), size), CUDA_SUCCESS);
    return b;
  }
  bool holds(const Block& b, unsigned char seed) {
    std::vector<unsigned char> bytes(b.size);
    EXPECT_EQ(d_.cuMemcpyDtoH_v2(bytes.data(), b.base, b.size), CUDA_SUCCESS);
    for (std::size_t i = 0; i < b.size; ++i) {
      if (bytes[i] != static_cast<unsigned char>(i * 13 + seed)) return false;
    }
    return true;
  }
  unsigned long long access(CUdeviceptr p) {
    unsigned long long flags = 0;
    CUmemLocation device{CU_MEM_LOCATION_TYPE_DEVICE, 0};
    EXPECT_EQ(get_access_(&flags, &device, p), CUDA_SUCCESS);
    return flags;
  }
  // The chunks behind `b`, imported again through exported fds (`claimed`:
  // the size the import says each has; 0: the true one).
  std::vector<Chunk> imported(const Block& b, std::size_t claimed = 0) {
    std::vector<VmmPool::ChunkView> views;
    std::size_t range = 0;
    int device = -1;
    EXPECT_EQ(pool_->whole_range_chunks(b.base, &views, &range, &device), CUDA_SUCCESS);
    std::vector<Chunk> out;
    for (const auto& v : views) {
      int fd = -1;
      EXPECT_EQ(gmem::vmm::export_fd(d_, v.handle, &fd), CUDA_SUCCESS);
      Chunk c;
      EXPECT_EQ(Chunk::import(d_, fd, claimed ? claimed : v.size, &c), CUDA_SUCCESS);
      close(fd);
      out.push_back(std::move(c));
    }
    return out;
  }

  void* lib_ = nullptr;
  static inline gmem::vmm::Driver d_;  // the pool keeps a reference
  CUcontext context_ = nullptr;
  decltype(&cuMemGetAccess) get_access_ = nullptr;
  decltype(&cuMemcpyHtoD_v2) htod_ = nullptr;
  VmmPool* pool_ = nullptr;
};

TEST_F(PoolShared, OnlyLiveWholeRangesHaveChunksToShare) {
  Block big = allocate(5 * mib + 3, 1), small = allocate(64 << 10, 2);
  std::vector<VmmPool::ChunkView> views;
  std::size_t range = 0;
  int device = -1;
  ASSERT_EQ(pool_->whole_range_chunks(big.base, &views, &range, &device), CUDA_SUCCESS);
  EXPECT_EQ(range, 6 * mib);
  EXPECT_EQ(device, 0);
  std::size_t total = 0;
  for (const auto& v : views) total += v.size;
  EXPECT_EQ(total, range);
  EXPECT_EQ(pool_->whole_range_chunks(small.base, &views, &range, &device), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(pool_->whole_range_chunks(big.base + 4096, &views, &range, &device), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(pool_->free(big.base), CUDA_SUCCESS);
  EXPECT_EQ(pool_->whole_range_chunks(big.base, &views, &range, &device), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(pool_->make_private(big.base, true), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(PoolShared, OwnMemoryImportedBackIsReadOnlyAndStaysCounted) {
  Block b = allocate(6 * mib, 3);
  const auto before = pool_->figures(0);
  ASSERT_EQ(pool_->adopt_shared(b.base, imported(b), true), CUDA_SUCCESS);
  EXPECT_EQ(access(b.base), CU_MEM_ACCESS_FLAGS_PROT_READ);
  EXPECT_TRUE(holds(b, 3));
  EXPECT_EQ(pool_->figures(0).reserved, before.reserved);
  EXPECT_EQ(pool_->figures(0).used, before.used);
  // Private again: read-write, the same bytes, still one copy counted.
  ASSERT_EQ(pool_->make_private(b.base, true), CUDA_SUCCESS);
  EXPECT_EQ(access(b.base), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_TRUE(holds(b, 3));
  EXPECT_EQ(pool_->figures(0).reserved, before.reserved);
}

TEST_F(PoolShared, AnotherCopyReplacesOwnMemoryWhichGoesBack) {
  Block mine = allocate(6 * mib, 4), theirs = allocate(6 * mib, 4);
  const auto before = pool_->figures(0);
  // `theirs` stands for another process's copy: its chunks, imported.
  ASSERT_EQ(pool_->adopt_shared(mine.base, imported(theirs)), CUDA_SUCCESS);
  EXPECT_EQ(pool_->figures(0).reserved, before.reserved - 6 * mib);
  EXPECT_EQ(access(mine.base), CU_MEM_ACCESS_FLAGS_PROT_READ);
  EXPECT_TRUE(holds(mine, 4));
  // The two ranges are one memory now: a write to theirs shows in mine.
  unsigned char x = 0xee;
  ASSERT_EQ(htod_(theirs.base, &x, 1), CUDA_SUCCESS);
  unsigned char seen = 0;
  ASSERT_EQ(d_.cuMemcpyDtoH_v2(&seen, mine.base, 1), CUDA_SUCCESS);
  EXPECT_EQ(seen, 0xee);
  // Private without the copy (a free): new memory, counted; theirs unchanged.
  ASSERT_EQ(pool_->make_private(mine.base, false), CUDA_SUCCESS);
  EXPECT_EQ(pool_->figures(0).reserved, before.reserved);
  EXPECT_EQ(access(mine.base), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(pool_->free(mine.base), CUDA_SUCCESS);
  ASSERT_EQ(d_.cuMemcpyDtoH_v2(&seen, theirs.base, 1), CUDA_SUCCESS);
  EXPECT_EQ(seen, 0xee);
}

TEST_F(PoolShared, AFailedRemapChangesNothing) {
  Block b = allocate(6 * mib, 5), other = allocate(2 * mib + 1, 6);
  const auto before = pool_->figures(0);
  // Sizes that do not add up to the range.
  EXPECT_EQ(pool_->adopt_shared(b.base, imported(other)), CUDA_ERROR_INVALID_VALUE);
  // Sizes that add up but that the driver will not map (a 4 MiB chunk claimed as 6 MiB).
  EXPECT_NE(pool_->adopt_shared(b.base, imported(other, 6 * mib)), CUDA_SUCCESS);
  EXPECT_EQ(access(b.base), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_TRUE(holds(b, 5));
  EXPECT_EQ(pool_->figures(0).reserved, before.reserved);
  // Once read-only, a failed remap leaves it read-only.
  ASSERT_EQ(pool_->adopt_shared(b.base, imported(b), true), CUDA_SUCCESS);
  EXPECT_NE(pool_->adopt_shared(b.base, imported(other, 6 * mib)), CUDA_SUCCESS);
  EXPECT_EQ(access(b.base), CU_MEM_ACCESS_FLAGS_PROT_READ);
  EXPECT_TRUE(holds(b, 5));
}

}  // namespace

namespace {

// CUDA IPC (ipc/): an exported allocation keeps the chunks another process
// maps, so dedup neither offers nor remaps it; memory dedup maps read-only is
// not exported.
TEST_F(PoolShared, ExportedMemoryIsNeverRemappedAndSharedMemoryIsNotExported) {
  Block b = allocate(6 * mib, 5);
  VmmPool::Exported x;
  ASSERT_EQ(pool_->export_allocation(b.base + 4096, &x), CUDA_SUCCESS);  // any address in it
  EXPECT_EQ(x.base, b.base);
  EXPECT_EQ(x.size, 6 * mib);
  EXPECT_EQ(x.offset, 0u);
  std::size_t total = 0;
  std::vector<Chunk> again;
  for (const auto& v : x.chunks) {
    total += v.size;
    int fd = -1;
    ASSERT_EQ(gmem::vmm::export_fd(d_, v.handle, &fd), CUDA_SUCCESS);
    Chunk c;
    ASSERT_EQ(Chunk::import(d_, fd, v.size, &c), CUDA_SUCCESS);
    close(fd);
    again.push_back(std::move(c));
  }
  EXPECT_EQ(total, 6 * mib);
  std::vector<VmmPool::ChunkView> views;
  std::size_t range = 0;
  int device = -1;
  EXPECT_EQ(pool_->whole_range_chunks(b.base, &views, &range, &device), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(pool_->adopt_shared(b.base, std::move(again), true), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(pool_->make_private(b.base, true), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(access(b.base), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_TRUE(holds(b, 5));

  // A small allocation: its slab's chunks, and where in them it starts.
  Block first = allocate(64 << 10, 6), second = allocate(64 << 10, 7);
  VmmPool::Exported one, two;
  ASSERT_EQ(pool_->export_allocation(first.base, &one), CUDA_SUCCESS);
  ASSERT_EQ(pool_->export_allocation(second.base, &two), CUDA_SUCCESS);
  EXPECT_EQ(two.base, second.base);
  EXPECT_EQ(two.size, std::size_t{64 << 10});
  ASSERT_EQ(one.chunks.size(), two.chunks.size());
  EXPECT_EQ(one.chunks[0].handle, two.chunks[0].handle);  // one slab
  EXPECT_EQ(two.offset - one.offset, second.base - first.base);

  Block shared = allocate(6 * mib, 8);
  ASSERT_EQ(pool_->adopt_shared(shared.base, imported(shared), true), CUDA_SUCCESS);
  EXPECT_EQ(pool_->export_allocation(shared.base, &x), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(pool_->make_private(shared.base, false), CUDA_SUCCESS);
  for (const Block& freed : {b, first, second, shared}) EXPECT_EQ(pool_->free(freed.base), CUDA_SUCCESS);
}

}  // namespace
