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

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

extern char** environ;

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

TEST(Init, FlagsMustBeZero) { EXPECT_EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE); }

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
      {"cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAllocAsync_ptsz"},
      {"cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemAllocAsync"},
      {"cuMemFreeAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemFreeAsync_ptsz"},
      {"cuMemGetInfo", 13000, 0, "cuMemGetInfo_v2"},
      {"cuMemcpyHtoD", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemcpyHtoD_v2_ptds"},
  };
  for (const Case& c : cases) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    ASSERT_EQ(cuGetProcAddress_v2(c.name, &fn, c.version, c.flags, &status), CUDA_SUCCESS) << c.name;
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    EXPECT_TRUE(is_function(fn, c.symbol)) << c.name << " at " << c.version << " should be " << c.symbol;
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
  ASSERT_EQ(cuMemCreate(&h, granularity_, &prop_, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 2 * granularity_, 0, 0, 0), CUDA_SUCCESS);
  // A physical allocation maps whole: driver 580 refuses an offset as unsupported.
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

  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sockets[1], 3);
  std::string self = "/proc/self/exe";
  char* argv[] = {self.data(), const_cast<char*>("--import-child"), nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, self.c_str(), &actions, nullptr, argv, environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  ASSERT_TRUE(FdMessage().send(sockets[0], fd));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
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
  testing::InitGoogleTest(&argc, argv);
  // No device is a skip (meson: 77), never a pass.
  CUresult init = cuInit(0);
  int count = 0;
  if (init == CUDA_ERROR_NO_DEVICE || (init == CUDA_SUCCESS && cuDeviceGetCount(&count) == CUDA_SUCCESS && count == 0)) {
    fprintf(stderr, "conformance: no CUDA device (cuInit=%d)\n", init);
    return 77;
  }
  return RUN_ALL_TESTS();
}
