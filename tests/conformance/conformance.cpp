// Driver behaviours gmem relies on, run unchanged against the real driver, the
// real driver through the shim, and the emulated driver (and the shim on it).
// The emulator is trusted only as far as it passes what the real driver passes.
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "ipc_peer.h"

namespace {

constexpr std::size_t mib = 1 << 20;

class Driver : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDeviceGet(&dev_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, dev_), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }
  void TearDown() override { EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(dev_), CUDA_SUCCESS); }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
};

std::vector<uint32_t> pattern(std::size_t words, uint32_t seed) {
  std::vector<uint32_t> v(words);
  for (std::size_t i = 0; i < words; ++i) v[i] = seed * 2654435761u + static_cast<uint32_t>(i);
  return v;
}

// Runs this program again with `mode` as its argument, `fd` as its fd 3 (or
// none); returns its exit status, or -1.
int run_child(const char* mode, int fd = -1) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (fd >= 0) posix_spawn_file_actions_adddup2(&actions, fd, 3);
  std::string self = "/proc/self/exe";
  char* argv[] = {self.data(), const_cast<char*>(mode), nullptr};
  pid_t child = 0;
  int spawned = posix_spawn(&child, self.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  if (spawned != 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(Init, FlagsMustBeZero) { EXPECT_EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE); }

// A process that has not called cuInit: every call but the version and error
// queries says so (cuda.h).
int before_init_main() {
  int version = 0;
  if (cuDriverGetVersion(&version) != CUDA_SUCCESS || version < 13000) return 10;
  int count = -1;
  if (cuDeviceGetCount(&count) != CUDA_ERROR_NOT_INITIALIZED) return 11;
  CUdevice dev = -1;
  if (cuDeviceGet(&dev, 0) != CUDA_ERROR_NOT_INITIALIZED) return 12;
  CUdeviceptr p = 0;
  if (CUresult r = cuMemAlloc_v2(&p, 1 << 20); r != CUDA_ERROR_NOT_INITIALIZED) {
    fprintf(stderr, "before cuInit: cuMemAlloc_v2 returned %d\n", r);
    return 13;
  }
  const char* name = nullptr;
  if (cuGetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name) != CUDA_SUCCESS || !name ||
      std::strcmp(name, "CUDA_ERROR_NOT_INITIALIZED") != 0) {
    return 14;
  }
  return 0;
}

TEST(Init, CallsBeforeCuInitAreRefused) { EXPECT_EQ(run_child("--before-init"), 0); }

TEST(Init, DevicesAndTheirMemory) {
  int count = 0;
  ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  ASSERT_GE(count, 1);
  CUdevice dev = -1;
  EXPECT_EQ(cuDeviceGet(&dev, count), CUDA_ERROR_INVALID_DEVICE);
  ASSERT_EQ(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  std::size_t total = 0;
  ASSERT_EQ(cuDeviceTotalMem_v2(&total, dev), CUDA_SUCCESS);
  EXPECT_GE(total, std::size_t{1} << 30);
  char name[256] = {};
  ASSERT_EQ(cuDeviceGetName(name, sizeof name, dev), CUDA_SUCCESS);
  EXPECT_GT(std::strlen(name), 0u);
  // What gmem relies on: the test GPUs have all three.
  for (CUdevice_attribute a : {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                               CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                               CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED}) {
    int value = 0;
    ASSERT_EQ(cuDeviceGetAttribute(&value, a, dev), CUDA_SUCCESS);
    EXPECT_EQ(value, 1) << "attribute " << a;
  }
  // cuMemGetInfo's total is the device's.
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent_v2(ctx), CUDA_SUCCESS);
  std::size_t free_bytes = 0, info_total = 0;
  EXPECT_EQ(cuMemGetInfo_v2(&free_bytes, &info_total), CUDA_SUCCESS);
  EXPECT_EQ(info_total, total);
  CUcontext popped = nullptr;
  EXPECT_EQ(cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, ctx);
  EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(dev), CUDA_SUCCESS);
}

TEST(Init, ErrorNamesAndStrings) {
  const char* text = nullptr;
  ASSERT_EQ(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "CUDA_ERROR_OUT_OF_MEMORY");
  ASSERT_EQ(cuGetErrorName(CUDA_ERROR_NOT_FOUND, &text), CUDA_SUCCESS);
  EXPECT_STREQ(text, "CUDA_ERROR_NOT_FOUND");
  text = nullptr;
  ASSERT_EQ(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &text), CUDA_SUCCESS);
  ASSERT_NE(text, nullptr);
  EXPECT_GT(std::strlen(text), 0u);
  // An unknown code: CUDA_ERROR_INVALID_VALUE and a NULL string (cuda.h).
  text = "unchanged";
  EXPECT_EQ(cuGetErrorName(static_cast<CUresult>(12345), &text), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(text, nullptr);
}

TEST_F(Driver, AllocCopyFreeRoundtrip) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 4 * mib), CUDA_SUCCESS);
  EXPECT_EQ(p % 512, 0u);
  auto in = pattern(mib, 3);
  std::vector<uint32_t> out(mib);
  ASSERT_EQ(cuMemcpyHtoD_v2(p, in.data(), 4 * mib), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH_v2(out.data(), p, 4 * mib), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  ASSERT_EQ(cuMemsetD32_v2(p, 0xabcdef01u, mib), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH_v2(out.data(), p, 4 * mib), CUDA_SUCCESS);
  EXPECT_EQ(std::count(out.begin(), out.end(), 0xabcdef01u), static_cast<long>(mib));
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

TEST_F(Driver, BadFreesAreRefused) {
  CUdeviceptr zero = 0;
  EXPECT_EQ(cuMemAlloc_v2(&zero, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAlloc_v2(nullptr, 4096), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 2 * mib), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p + 4096), CUDA_ERROR_INVALID_VALUE);  // interior pointer
  int on_stack = 0;
  EXPECT_EQ(cuMemFree_v2(reinterpret_cast<CUdeviceptr>(&on_stack)), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);  // double free
}

// verify on GPU: stream-ordered frees are checked like cuMemFree; memory from
// cuMemAlloc may be freed on a stream (CUDA programming guide, stream ordered
// memory allocator); a free with another context current still frees.
TEST_F(Driver, StreamOrderedBadFreesAreRefused) {
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr p = 0, q = 0;
  // Unlike cuMemAlloc, a stream-ordered request for 0 bytes succeeds (driver 580).
  ASSERT_EQ(cuMemAllocAsync(&p, 0, stream), CUDA_SUCCESS);
  printf("cuMemAllocAsync of 0 bytes gave %#llx\n", static_cast<unsigned long long>(p));
  if (p) {
    EXPECT_EQ(cuMemFreeAsync(p, stream), CUDA_SUCCESS);
  }
  ASSERT_EQ(cuMemAllocAsync(&p, 2 * mib, stream), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(p + 4096, stream), CUDA_ERROR_INVALID_VALUE);  // interior pointer
  ASSERT_EQ(cuMemFreeAsync(p, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(p, stream), CUDA_ERROR_INVALID_VALUE);  // double free
  ASSERT_EQ(cuMemAlloc_v2(&q, 2 * mib), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(q, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(q), CUDA_ERROR_INVALID_VALUE);

  CUcontext other = nullptr;
  ASSERT_EQ(cuMemAlloc_v2(&q, 2 * mib), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxCreate(&other, nullptr, 0, dev_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(q), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxDestroy_v2(other), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(q), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

// verify on GPU: sizes no device holds, up to 2^64 - 1, are out of memory.
TEST_F(Driver, HopelessSizesAreOutOfMemory) {
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  for (std::size_t size : {~std::size_t{0}, ~std::size_t{0} - 4096, std::size_t{1} << 63, std::size_t{1} << 45}) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc_v2(&p, size), CUDA_ERROR_OUT_OF_MEMORY) << size;
    EXPECT_EQ(cuMemAllocAsync(&p, size, stream), CUDA_ERROR_OUT_OF_MEMORY) << size;
  }
  EXPECT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

// verify on GPU: only VMM mappings have an allocation handle to retain.
TEST_F(Driver, OrdinaryMemoryHasNoAllocationHandle) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 2 * mib), CUDA_SUCCESS);
  CUmemGenericAllocationHandle handle = 0;
  EXPECT_EQ(cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(p)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

TEST_F(Driver, OutOfMemory) {
  std::size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cuMemGetInfo_v2(&free_bytes, &total), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc_v2(&p, 2 * total), CUDA_ERROR_OUT_OF_MEMORY);
}

TEST_F(Driver, GetInfoIsTruthfulAndToleratesNullOutputs) {
  std::size_t free_before = 0, total = 0, free_after = 0;
  ASSERT_EQ(cuMemGetInfo_v2(&free_before, &total), CUDA_SUCCESS);
  EXPECT_GT(total, 0u);
  EXPECT_LE(free_before, total);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 64 * mib), CUDA_SUCCESS);
  ASSERT_EQ(cuMemGetInfo_v2(&free_after, &total), CUDA_SUCCESS);
  EXPECT_LE(free_after + 64 * mib, free_before);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  // Driver 580 fills what it is given: either output may be NULL.
  std::size_t total_again = 0, free_again = 0;
  EXPECT_EQ(cuMemGetInfo_v2(nullptr, &total_again), CUDA_SUCCESS);
  EXPECT_EQ(total_again, total);
  EXPECT_EQ(cuMemGetInfo_v2(&free_again, nullptr), CUDA_SUCCESS);
  EXPECT_GT(free_again, 0u);
  EXPECT_EQ(cuMemGetInfo_v2(nullptr, nullptr), CUDA_SUCCESS);
}

TEST_F(Driver, AllocationsDieWithTheirContext) {
  CUcontext own = nullptr;
  ASSERT_EQ(cuCtxCreate(&own, nullptr, 0, dev_), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 2 * mib), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxDestroy_v2(own), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Driver, AddressRangeOfAnInteriorPointer) {
  CUdeviceptr p = 0, base = 0;
  std::size_t size = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 3 * mib), CUDA_SUCCESS);
  ASSERT_EQ(cuMemGetAddressRange_v2(&base, &size, p + mib + 17), CUDA_SUCCESS);
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, 3 * mib);
  EXPECT_EQ(cuMemGetAddressRange_v2(nullptr, &size, p + 1), CUDA_SUCCESS);  // either output may be NULL
  EXPECT_EQ(cuMemGetAddressRange_v2(&base, nullptr, p + 1), CUDA_SUCCESS);
  int on_stack = 0;
  EXPECT_EQ(cuMemGetAddressRange_v2(&base, &size, reinterpret_cast<CUdeviceptr>(&on_stack)), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

TEST_F(Driver, PointerAttributes) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 2 * mib), CUDA_SUCCESS);
  unsigned type = 0;
  int ordinal = -1;
  CUcontext owner = nullptr;
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 100), CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
  ASSERT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p), CUDA_SUCCESS);
  EXPECT_EQ(ordinal, dev_);
  ASSERT_EQ(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p), CUDA_SUCCESS);
  EXPECT_EQ(owner, ctx_);
  CUdeviceptr start = 0;
  std::size_t size = 0;
  ASSERT_EQ(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 5), CUDA_SUCCESS);
  ASSERT_EQ(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 5), CUDA_SUCCESS);
  EXPECT_EQ(start, p);
  EXPECT_EQ(size, 2 * mib);

  // A plain host pointer: the single query refuses it, the batch query says
  // it is no CUDA memory (memory type 0).
  int on_stack = 0;
  auto host = reinterpret_cast<CUdeviceptr>(&on_stack);
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, host), CUDA_ERROR_INVALID_VALUE);
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  unsigned batch_type = 77;
  int batch_ordinal = 77;
  void* data[] = {&batch_type, &batch_ordinal};
  ASSERT_EQ(cuPointerGetAttributes(2, attrs, data, p), CUDA_SUCCESS);
  EXPECT_EQ(batch_type, CU_MEMORYTYPE_DEVICE);
  EXPECT_EQ(batch_ordinal, dev_);
  ASSERT_EQ(cuPointerGetAttributes(2, attrs, data, host), CUDA_SUCCESS);
  EXPECT_EQ(batch_type, 0u);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

TEST_F(Driver, PitchRules) {
  CUdeviceptr p = 0;
  std::size_t pitch = 0;
  ASSERT_EQ(cuMemAllocPitch_v2(&p, &pitch, 1000, 33, 4), CUDA_SUCCESS);
  EXPECT_GE(pitch, 1000u);
  EXPECT_EQ(pitch % 512, 0u);
  std::size_t size = 0;
  ASSERT_EQ(cuMemGetAddressRange_v2(nullptr, &size, p), CUDA_SUCCESS);
  EXPECT_GE(size, pitch * 33);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAllocPitch_v2(&p, &pitch, 1000, 33, 3), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAllocPitch_v2(&p, &pitch, 1000, 33, 2), CUDA_ERROR_INVALID_VALUE);  // 4, 8 or 16 only
  ASSERT_EQ(cuMemAllocPitch_v2(&p, &pitch, 512, 4, 16), CUDA_SUCCESS);
  EXPECT_EQ(pitch, 512u);  // already aligned: no padding. verify on GPU
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

TEST_F(Driver, ManagedMemory) {
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAllocManaged(&p, mib, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemAllocManaged(&p, mib, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  int managed = 0;
  ASSERT_EQ(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p), CUDA_SUCCESS);
  EXPECT_EQ(managed, 1);
  ASSERT_EQ(cuMemsetD8_v2(p, 7, mib), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(p)[mib - 1], 7);  // managed memory is host-readable
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

TEST_F(Driver, ContextStackAndAllocationWithoutAContext) {
  CUcontext current = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, ctx_);
  CUdevice dev = -1;
  ASSERT_EQ(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, dev_);
  ASSERT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, nullptr);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc_v2(&p, mib), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxPopCurrent_v2(&current), CUDA_ERROR_INVALID_CONTEXT);  // the stack is empty
  ASSERT_EQ(cuCtxPushCurrent_v2(ctx_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc_v2(&p, mib), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

// A context destroyed while current is popped from the caller's stack (cuda.h).
TEST_F(Driver, DestroyingTheCurrentContextPopsIt) {
  CUcontext own = nullptr, current = nullptr;
  ASSERT_EQ(cuCtxCreate(&own, nullptr, 0, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, own);
  ASSERT_EQ(cuCtxDestroy_v2(own), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, ctx_);
}

// verify on GPU: a reset primary context takes its allocations with it, as a
// destroyed context does; freeing one afterwards is CUDA_ERROR_INVALID_VALUE.
TEST_F(Driver, PrimaryContextResetFreesItsAllocations) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 2 * mib), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxReset_v2(dev_), CUDA_SUCCESS);
  unsigned flags = 0;
  int active = 1;
  ASSERT_EQ(cuDevicePrimaryCtxGetState(dev_, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 0);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, dev_), CUDA_SUCCESS);  // released by TearDown
  ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Driver, MemsetAndMemcpyOfEveryWidth) {
  CUdeviceptr a = 0, b = 0;
  ASSERT_EQ(cuMemAlloc_v2(&a, 64 * 1024), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc_v2(&b, 64 * 1024), CUDA_SUCCESS);
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  std::vector<unsigned char> bytes(64 * 1024);
  auto read = [&](CUdeviceptr p) { return cuMemcpyDtoH_v2(bytes.data(), p, bytes.size()); };

  ASSERT_EQ(cuMemsetD8_v2(a, 0x5a, 64 * 1024), CUDA_SUCCESS);
  ASSERT_EQ(read(a), CUDA_SUCCESS);
  EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0x5a), 64 * 1024);
  ASSERT_EQ(cuMemsetD16_v2(a, 0x1234, 32 * 1024), CUDA_SUCCESS);
  ASSERT_EQ(read(a), CUDA_SUCCESS);
  EXPECT_EQ(bytes[0], 0x34);
  EXPECT_EQ(bytes[64 * 1024 - 1], 0x12);
  ASSERT_EQ(cuMemsetD32Async(a, 0xdeadbeefu, 16 * 1024, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8Async(a, 0x11, 3, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoDAsync_v2(b, a, 64 * 1024, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  ASSERT_EQ(read(b), CUDA_SUCCESS);
  uint32_t first = 0, last = 0;
  std::memcpy(&first, bytes.data(), 4);
  std::memcpy(&last, bytes.data() + 64 * 1024 - 4, 4);
  EXPECT_EQ(first, 0xde111111u);  // stream order: the D8 fill came after the D32 one
  EXPECT_EQ(last, 0xdeadbeefu);

  // cuMemcpy takes unified addresses: host to device and back.
  auto in = pattern(1024, 4);
  std::vector<uint32_t> out(1024);
  ASSERT_EQ(cuMemcpy(a, reinterpret_cast<CUdeviceptr>(in.data()), 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoD_v2(b + 4096, a, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpy(reinterpret_cast<CUdeviceptr>(out.data()), b + 4096, 4096), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  EXPECT_EQ(cuMemcpyHtoDAsync_v2(a, in.data(), 4096, stream), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyDtoHAsync_v2(out.data(), a, 4096, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(in, out);

  EXPECT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(b), CUDA_SUCCESS);
}

TEST_F(Driver, PinnedHostMemory) {
  void* host = nullptr;
  ASSERT_EQ(cuMemAllocHost_v2(&host, mib), CUDA_SUCCESS);
  unsigned type = 0;
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(host)),
            CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_HOST);
  std::memset(host, 0x3c, mib);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, mib), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyHtoD_v2(p, host, mib), CUDA_SUCCESS);
  unsigned char last = 0;
  ASSERT_EQ(cuMemcpyDtoH_v2(&last, p + mib - 1, 1), CUDA_SUCCESS);
  EXPECT_EQ(last, 0x3c);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeHost(host), CUDA_SUCCESS);
}

TEST_F(Driver, EventsTimeAndStreamsAreNotCaptured) {
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  CUevent start = nullptr, end = nullptr, untimed = nullptr;
  ASSERT_EQ(cuEventCreate(&start, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&end, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  float ms = -1;
  EXPECT_EQ(cuEventElapsedTime(&ms, start, end), CUDA_ERROR_INVALID_HANDLE);  // never recorded (cuda.h)
  ASSERT_EQ(cuEventRecord(start, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(end, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(untimed, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuEventSynchronize(end), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(end), CUDA_SUCCESS);
  ASSERT_EQ(cuEventElapsedTime(&ms, start, end), CUDA_SUCCESS);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cuEventElapsedTime(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);  // timing disabled (cuda.h)
  ASSERT_EQ(cuStreamWaitEvent(nullptr, end, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(stream), CUDA_SUCCESS);
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  ASSERT_EQ(cuStreamGetCaptureInfo(stream, &capture, nullptr, nullptr, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(capture, CU_STREAM_CAPTURE_STATUS_NONE);
  for (CUevent e : {start, end, untimed}) EXPECT_EQ(cuEventDestroy_v2(e), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

// verify on GPU: the figures a stream-ordered pool reports. cuda.h: used
// memory is what the application holds, reserved what the pool holds; freed
// memory stays reserved until a synchronisation finds more than the release
// threshold, or cuMemPoolTrimTo releases it.
TEST_F(Driver, StreamOrderedPoolTellsTheTruth) {
  CUmemoryPool pool = nullptr, current = nullptr;
  ASSERT_EQ(cuDeviceGetDefaultMemPool(&pool, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuDeviceGetMemPool(&current, dev_), CUDA_SUCCESS);
  EXPECT_EQ(pool, current);
  auto figure = [&](CUmemPool_attribute a) {
    cuuint64_t value = ~0ull;
    EXPECT_EQ(cuMemPoolGetAttribute(pool, a, &value), CUDA_SUCCESS);
    return value;
  };
  cuuint64_t keep = 64 * mib;
  ASSERT_EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep), CUDA_SUCCESS);
  EXPECT_EQ(figure(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), keep);
  ASSERT_EQ(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
  const cuuint64_t used_before = figure(CU_MEMPOOL_ATTR_USED_MEM_CURRENT);

  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAllocAsync(&p, 16 * mib, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_GE(figure(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used_before + 16 * mib);
  EXPECT_GE(figure(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), figure(CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
  EXPECT_GE(figure(CU_MEMPOOL_ATTR_USED_MEM_HIGH), used_before + 16 * mib);
  CUmemoryPool owner = nullptr;
  ASSERT_EQ(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p), CUDA_SUCCESS);
  EXPECT_EQ(owner, pool);

  ASSERT_EQ(cuMemFreeAsync(p, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(figure(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used_before);
  EXPECT_GE(figure(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 16 * mib);  // kept: under the threshold
  ASSERT_EQ(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
  if (used_before == 0) {
    EXPECT_EQ(figure(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0u);  // nothing left to keep
  }

  // The high-water marks may be reset (to 0 only); the current figures are read-only.
  cuuint64_t zero = 0;
  EXPECT_EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero), CUDA_SUCCESS);
  EXPECT_EQ(figure(CU_MEMPOOL_ATTR_USED_MEM_HIGH), figure(CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
  EXPECT_EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

// True if `fn` is the function `symbol` of the library that holds it: the
// driver's own, or the shim's where the shim hooks it (the shim hands out the
// driver's pointer for everything else).
bool is_function(void* fn, const char* symbol) {
  Dl_info info{};
  if (!fn || !dladdr(fn, &info) || !info.dli_fname) return false;
  void* library = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  return library && dlsym(library, symbol) == fn;
}

TEST_F(Driver, ProcAddressFollowsVersionAndFlags) {
  struct Case {
    const char* name;
    int version;
    cuuint64_t flags;
    const char* symbol;
  } cases[] = {
      {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
      {"cuMemAlloc", 2000, 0, "cuMemAlloc"},
      {"cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAllocAsync_ptsz"},
      {"cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAllocAsync_ptsz"},
      {"cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemAllocAsync"},
      {"cuMemFreeAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemFreeAsync_ptsz"},
      {"cuMemGetInfo", 13000, 0, "cuMemGetInfo_v2"},
      {"cuMemcpyHtoD", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemcpyHtoD_v2_ptds"},
      // CUDA IPC: both ABIs of the open (the shim hooks both).
      {"cuIpcOpenMemHandle", 11000, 0, "cuIpcOpenMemHandle_v2"},
      {"cuIpcOpenMemHandle", 4010, 0, "cuIpcOpenMemHandle"},
      {"cuIpcGetMemHandle", 13000, 0, "cuIpcGetMemHandle"},
      {"cuIpcCloseMemHandle", 13000, 0, "cuIpcCloseMemHandle"},
  };
  // Both ABIs of cuGetProcAddress: this CUDA 12 one and the CUDA 11.3 one.
  using Legacy = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto legacy = reinterpret_cast<Legacy>(dlsym(dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_NOW), "cuGetProcAddress"));
  ASSERT_NE(legacy, nullptr);
  for (const Case& c : cases) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    ASSERT_EQ(cuGetProcAddress_v2(c.name, &fn, c.version, c.flags, &status), CUDA_SUCCESS) << c.name;
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    EXPECT_TRUE(is_function(fn, c.symbol)) << c.name << " at " << c.version << " should be " << c.symbol;
    fn = nullptr;
    ASSERT_EQ(legacy(c.name, &fn, c.version, c.flags), CUDA_SUCCESS) << c.name;
    EXPECT_TRUE(is_function(fn, c.symbol)) << "cuGetProcAddress (11.3 ABI): " << c.name << " at " << c.version;
  }
  // Driver 580: a request it cannot answer still returns CUDA_SUCCESS, with the
  // reason in the status (if one is asked for) and no pointer.
  void* fn = &fn;
  CUdriverProcAddressQueryResult status{};
  EXPECT_EQ(cuGetProcAddress_v2("cuMemAllocAsync", &fn, 11000, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(fn, nullptr);
  fn = &fn;
  EXPECT_EQ(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 13000, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  fn = &fn;
  EXPECT_EQ(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 13000, 0, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(fn, nullptr);
}

TEST_F(Driver, StreamOrderedAllocationThroughThePerThreadEntryPoints) {
  using Alloc = decltype(&cuMemAllocAsync);
  using Free = decltype(&cuMemFreeAsync);
  void* alloc = nullptr;
  void* release = nullptr;
  const auto per_thread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  ASSERT_EQ(cuGetProcAddress_v2("cuMemAllocAsync", &alloc, 13000, per_thread, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuGetProcAddress_v2("cuMemFreeAsync", &release, 13000, per_thread, nullptr), CUDA_SUCCESS);
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  for (CUstream s : {stream, static_cast<CUstream>(nullptr)}) {
    CUdeviceptr p = 0;
    ASSERT_EQ(reinterpret_cast<Alloc>(alloc)(&p, 3 * mib, s), CUDA_SUCCESS);
    auto in = pattern(3 * mib / 4, 9);
    std::vector<uint32_t> out(in.size());
    ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
    ASSERT_EQ(cuMemcpyHtoD_v2(p, in.data(), 3 * mib), CUDA_SUCCESS);
    ASSERT_EQ(cuMemcpyDtoH_v2(out.data(), p, 3 * mib), CUDA_SUCCESS);
    EXPECT_EQ(in, out);
    EXPECT_EQ(reinterpret_cast<Free>(release)(p, s), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  }
  EXPECT_EQ(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

class Vmm : public Driver {
 protected:
  void SetUp() override {
    Driver::SetUp();
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location = {CU_MEM_LOCATION_TYPE_DEVICE, dev_};
    prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    ASSERT_EQ(cuMemGetAllocationGranularity(&granularity_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  }
  // Maps `handle` at `va` with the given access.
  void map(CUdeviceptr va, CUmemGenericAllocationHandle handle, std::size_t size,
           CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
    ASSERT_EQ(cuMemMap(va, size, 0, handle, 0), CUDA_SUCCESS);
    CUmemAccessDesc access{prop_.location, flags};
    ASSERT_EQ(cuMemSetAccess(va, size, &access, 1), CUDA_SUCCESS);
  }

  CUmemAllocationProp prop_{};
  std::size_t granularity_ = 0;
};

TEST_F(Vmm, GranularityAndSizeRules) {
  EXPECT_EQ(granularity_, 2 * mib);
  CUmemGenericAllocationHandle h = 0;
  EXPECT_EQ(cuMemCreate(&h, granularity_ / 2, &prop_, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemCreate(&h, 2 * granularity_, &prop_, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 2 * granularity_, 0, 0, 0), CUDA_SUCCESS);
  // A physical allocation maps whole: driver 580 refuses an offset as
  // unsupported, even the second half of an allocation of two granules
  // (CUDA's current documentation allows offset + size within the
  // allocation; one pinned host chunk cannot back several ranges' pieces).
  EXPECT_EQ(cuMemMap(va, granularity_, granularity_, h, 0), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(cuMemAddressFree(va, 2 * granularity_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(h), CUDA_SUCCESS);
}

TEST_F(Vmm, TwoMappingsOfOneHandleAlias) {
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(cuMemCreate(&h, granularity_, &prop_, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 2 * granularity_, 0, 0, 0), CUDA_SUCCESS);
  map(va, h, granularity_);
  map(va + granularity_, h, granularity_, CU_MEM_ACCESS_FLAGS_PROT_READ);
  // The handle may go: the mappings keep the memory.
  ASSERT_EQ(cuMemRelease(h), CUDA_SUCCESS);
  auto in = pattern(granularity_ / 4, 5);
  std::vector<uint32_t> out(in.size());
  ASSERT_EQ(cuMemcpyHtoD_v2(va, in.data(), granularity_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH_v2(out.data(), va + granularity_, granularity_), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  CUmemGenericAllocationHandle retained = 0;
  ASSERT_EQ(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(va + granularity_ + 64)), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(retained), CUDA_SUCCESS);
  EXPECT_EQ(cuMemUnmap(va, 2 * granularity_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(va, 2 * granularity_), CUDA_SUCCESS);
}

// What the driver says about mapped memory: each mapping (chunk) is described
// by itself (DESIGN.md, measured on driver 580 for cuMemGetAddressRange).
TEST_F(Vmm, MappingsDescribeThemselves) {
  CUmemGenericAllocationHandle h[2] = {};
  prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  for (auto& handle : h) ASSERT_EQ(cuMemCreate(&handle, granularity_, &prop_, 0), CUDA_SUCCESS);
  CUmemAllocationProp seen{};
  ASSERT_EQ(cuMemGetAllocationPropertiesFromHandle(&seen, h[0]), CUDA_SUCCESS);
  EXPECT_EQ(seen.type, CU_MEM_ALLOCATION_TYPE_PINNED);
  EXPECT_EQ(seen.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(seen.location.id, dev_);
  // verify on GPU: a handle created for no export cannot be exported.
  int fd = -1;
  EXPECT_EQ(cuMemExportToShareableHandle(&fd, h[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_INVALID_VALUE);

  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 2 * granularity_, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(va % granularity_, 0u);
  map(va, h[0], granularity_);
  map(va + granularity_, h[1], granularity_, CU_MEM_ACCESS_FLAGS_PROT_READ);
  unsigned long long flags = 0;
  ASSERT_EQ(cuMemGetAccess(&flags, &prop_.location, va + 100), CUDA_SUCCESS);
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_EQ(cuMemGetAccess(&flags, &prop_.location, va + granularity_), CUDA_SUCCESS);
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READ);

  CUdeviceptr base = 0;
  std::size_t size = 0;
  ASSERT_EQ(cuMemGetAddressRange_v2(&base, &size, va + granularity_ + 4096), CUDA_SUCCESS);
  EXPECT_EQ(base, va + granularity_);
  EXPECT_EQ(size, granularity_);
  unsigned type = 0;
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 8), CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
  int ordinal = -1;
  ASSERT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va + 8), CUDA_SUCCESS);
  EXPECT_EQ(ordinal, dev_);

  // verify on GPU: only whole mappings unmap.
  EXPECT_EQ(cuMemUnmap(va, granularity_ / 2), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemUnmap(va, 2 * granularity_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemGetAddressRange_v2(&base, &size, va), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(cuMemAddressFree(va, 2 * granularity_), CUDA_SUCCESS);
  for (auto handle : h) EXPECT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
}

// The links between devices as the driver reports them; gmem's spill tiers
// pick peers from these answers.
TEST_F(Driver, PeerAccessAndHostNumaAttributes) {
  int count = 0;
  ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  int can = -1, value = -1;
  EXPECT_EQ(cuDeviceCanAccessPeer(&can, dev_, dev_), CUDA_SUCCESS);
  EXPECT_EQ(can, 0);  // a device is not its own peer
  EXPECT_EQ(cuDeviceCanAccessPeer(&can, dev_, count), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuDeviceGetP2PAttribute(&value, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, dev_, dev_),
            CUDA_ERROR_INVALID_DEVICE);
  for (int peer = 0; peer < count; ++peer) {
    if (peer == dev_) continue;
    ASSERT_EQ(cuDeviceCanAccessPeer(&can, dev_, peer), CUDA_SUCCESS);
    ASSERT_EQ(cuDeviceGetP2PAttribute(&value, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, dev_, peer), CUDA_SUCCESS);
    EXPECT_EQ(value, can) << "peer " << peer;
    EXPECT_EQ(cuDeviceGetP2PAttribute(nullptr, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, dev_, peer),
              CUDA_ERROR_INVALID_VALUE);
    int rank = -1;
    EXPECT_EQ(cuDeviceGetP2PAttribute(&rank, CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, dev_, peer), CUDA_SUCCESS);
    EXPECT_GE(rank, 0);
    printf("peer %d of device %d: access %d, performance rank %d\n", peer, dev_, can, rank);
  }
  int node = -2;
  ASSERT_EQ(cuDeviceGetAttribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev_), CUDA_SUCCESS);
  EXPECT_GE(node, -1);  // -1: no NUMA
  printf("host NUMA node of device %d: %d\n", dev_, node);
}

// Host-NUMA memory and device memory side by side in one reserved range: the
// device reads and writes across the boundary (DESIGN.md, measured on driver
// 580), and the driver calls the host part host memory.
TEST_F(Vmm, HostNumaChunkBesideADeviceChunk) {
  int supported = 0, node = -1;
  ASSERT_EQ(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev_),
            CUDA_SUCCESS);
  ASSERT_EQ(cuDeviceGetAttribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev_), CUDA_SUCCESS);
  if (!supported || node < 0) GTEST_SKIP() << "no host-NUMA VMM on this system";
  CUmemAllocationProp host = prop_;
  host.location = {CU_MEM_LOCATION_TYPE_HOST_NUMA, node};
  std::size_t host_granularity = 0;
  ASSERT_EQ(cuMemGetAllocationGranularity(&host_granularity, &host, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  ASSERT_EQ(host_granularity, granularity_);
  CUmemGenericAllocationHandle h[2] = {};
  ASSERT_EQ(cuMemCreate(&h[0], granularity_, &prop_, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemCreate(&h[1], granularity_, &host, 0), CUDA_SUCCESS);
  CUmemAllocationProp seen{};
  ASSERT_EQ(cuMemGetAllocationPropertiesFromHandle(&seen, h[1]), CUDA_SUCCESS);
  EXPECT_EQ(seen.location.type, CU_MEM_LOCATION_TYPE_HOST_NUMA);
  EXPECT_EQ(seen.location.id, node);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 2 * granularity_, 0, 0, 0), CUDA_SUCCESS);
  map(va, h[0], granularity_);
  map(va + granularity_, h[1], granularity_);  // access for the device, not the host
  auto in = pattern(granularity_ / 4, 31);
  std::vector<uint32_t> out(in.size());
  ASSERT_EQ(cuMemcpyHtoD_v2(va + granularity_ / 2, in.data(), granularity_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH_v2(out.data(), va + granularity_ / 2, granularity_), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  unsigned type = 0;
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + granularity_ + 8), CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_HOST);
  EXPECT_EQ(cuMemUnmap(va, 2 * granularity_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(va, 2 * granularity_), CUDA_SUCCESS);
  for (auto handle : h) EXPECT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
}

// A peer's memory mapped for this device: copies in this device's context
// reach it (cuMemSetAccess grants the access; no cuCtxEnablePeerAccess).
TEST_F(Vmm, PeerChunkMappedForThisDevice) {
  int count = 0, can = 0;
  ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  CUdevice peer = dev_ + 1;
  if (peer >= count || cuDeviceCanAccessPeer(&can, dev_, peer) != CUDA_SUCCESS || !can) {
    GTEST_SKIP() << "no peer device with P2P access";
  }
  CUmemAllocationProp on_peer = prop_;
  on_peer.location = {CU_MEM_LOCATION_TYPE_DEVICE, peer};
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(cuMemCreate(&h, granularity_, &on_peer, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, granularity_, 0, 0, 0), CUDA_SUCCESS);
  map(va, h, granularity_);  // access for dev_ only
  auto in = pattern(granularity_ / 4, 41);
  std::vector<uint32_t> out(in.size());
  ASSERT_EQ(cuMemcpyHtoD_v2(va, in.data(), granularity_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH_v2(out.data(), va, granularity_), CUDA_SUCCESS);
  EXPECT_EQ(in, out);
  int ordinal = -1;
  ASSERT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va), CUDA_SUCCESS);
  printf("device ordinal the driver reports for a peer chunk: %d (peer %d)\n", ordinal, peer);
  EXPECT_EQ(cuMemUnmap(va, granularity_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(va, granularity_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(h), CUDA_SUCCESS);
}

// One file descriptor over a unix socket (SCM_RIGHTS), with one byte of data.
struct FdMessage {
  char byte = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{&byte, 1};
  msghdr msg{};
  FdMessage() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  bool send(int socket, int fd) {
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(socket, &msg, 0) == 1;
  }
  int receive(int socket) {
    if (recvmsg(socket, &msg, 0) != 1 || !CMSG_FIRSTHDR(&msg)) return -1;
    int fd = -1;
    std::memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof fd);
    return fd;
  }
};

// The child half of the cross-process test: imports the handle whose fd
// arrives on `socket`, checks the parent's pattern, writes its own.
int child_main(int socket) {
  int fd = FdMessage().receive(socket);
  if (fd < 0) return 10;
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 11;
  CUmemGenericAllocationHandle h = 0;
  if (cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
    return 12;
  }
  const std::size_t size = 2 * mib;
  CUdeviceptr va = 0;
  CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  if (cuMemAddressReserve(&va, size, 0, 0, 0) || cuMemMap(va, size, 0, h, 0) || cuMemSetAccess(va, size, &access, 1)) {
    return 13;
  }
  std::vector<uint32_t> seen(size / 4);
  if (cuMemcpyDtoH_v2(seen.data(), va, size) || seen != pattern(size / 4, 21)) return 14;
  auto mine = pattern(size / 4, 22);
  if (cuMemcpyHtoD_v2(va, mine.data(), size) || cuCtxSynchronize()) return 15;
  cuMemUnmap(va, size);
  cuMemAddressFree(va, size);
  cuMemRelease(h);
  return 0;
}

TEST_F(Vmm, ExportedFdImportsInAnotherProcess) {
  const std::size_t size = 2 * mib;
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(cuMemCreate(&h, size, &prop_, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, size, 0, 0, 0), CUDA_SUCCESS);
  map(va, h, size);
  auto ours = pattern(size / 4, 21);
  ASSERT_EQ(cuMemcpyHtoD_v2(va, ours.data(), size), CUDA_SUCCESS);
  int fd = -1;
  ASSERT_EQ(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
  EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);  // the driver's fds are close-on-exec

  // A new program, not a fork that keeps using the parent's CUDA state; the fd
  // waits in the socket until the child reads it.
  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets), 0);
  ASSERT_TRUE(FdMessage().send(sockets[0], fd));
  EXPECT_EQ(run_child("--import-child", sockets[1]), 0);
  std::vector<uint32_t> now(size / 4);
  ASSERT_EQ(cuMemcpyDtoH_v2(now.data(), va, size), CUDA_SUCCESS);
  EXPECT_EQ(now, pattern(size / 4, 22));  // the child's write is visible here
  close(fd);
  close(sockets[0]);
  close(sockets[1]);
  EXPECT_EQ(cuMemUnmap(va, size), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(va, size), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(h), CUDA_SUCCESS);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--import-child") == 0) return child_main(3);
  if (argc == 2 && std::strcmp(argv[1], "--before-init") == 0) return before_init_main();
  if (argc == 2 && std::strcmp(argv[1], "--ipc-peer") == 0) return ipc_peer::serve(3);
  testing::InitGoogleTest(&argc, argv);
  // No device is a skip (meson: 77), never a pass. (A libcuda.so.1 that cannot
  // be loaded stops the program before main, with the loader's 127: a failure.)
  if (!dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_NOW)) {
    fprintf(stderr, "conformance: libcuda.so.1 is not loaded: %s\n", dlerror());
    return 77;
  }
  CUresult init = cuInit(0);
  if (init == CUDA_ERROR_NO_DEVICE) {
    fprintf(stderr, "conformance: no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)\n");
    return 77;
  }
  return RUN_ALL_TESTS();
}
