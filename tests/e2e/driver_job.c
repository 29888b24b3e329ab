/* A small CUDA job written against the driver API: allocations of every kind
 * the shim intercepts, data moved through them, and a checksum of the results.
 * Built twice: linked against libcuda.so.1 like a plain program, and (with
 * GMEM_JOB_DLOPEN) opening libcuda.so.1 and resolving every function with
 * cuGetProcAddress_v2, as cudart does. Prints what it allocated, so a test can
 * compare it with gmem's report; the output is identical under any driver that
 * keeps native semantics. */
#include <cuda.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define API(X)                                                                     \
  X(cuInit, cuInit, 2000)                                                          \
  X(cuDeviceGet, cuDeviceGet, 2000)                                                \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000)                      \
  X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, 11000)                \
  X(cuCtxSetCurrent, cuCtxSetCurrent, 4000)                                        \
  X(cuStreamCreate, cuStreamCreate, 2000)                                          \
  X(cuStreamSynchronize, cuStreamSynchronize, 2000)                                \
  X(cuStreamDestroy, cuStreamDestroy_v2, 4000)                                     \
  X(cuMemAlloc, cuMemAlloc_v2, 3020)                                               \
  X(cuMemAllocPitch, cuMemAllocPitch_v2, 3020)                                     \
  X(cuMemAllocManaged, cuMemAllocManaged, 6000)                                    \
  X(cuMemAllocAsync, cuMemAllocAsync, 11020)                                       \
  X(cuMemFreeAsync, cuMemFreeAsync, 11020)                                         \
  X(cuMemFree, cuMemFree_v2, 3020)                                                 \
  X(cuMemGetAddressRange, cuMemGetAddressRange_v2, 3020)                           \
  X(cuMemcpyHtoD, cuMemcpyHtoD_v2, 3020)                                           \
  X(cuMemcpyDtoH, cuMemcpyDtoH_v2, 3020)                                           \
  X(cuMemcpyDtoD, cuMemcpyDtoD_v2, 3020)                                           \
  X(cuMemsetD32, cuMemsetD32_v2, 3020)                                             \
  X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020)           \
  X(cuMemCreate, cuMemCreate, 10020)                                               \
  X(cuMemAddressReserve, cuMemAddressReserve, 10020)                               \
  X(cuMemMap, cuMemMap, 10020)                                                     \
  X(cuMemSetAccess, cuMemSetAccess, 10020)                                         \
  X(cuMemUnmap, cuMemUnmap, 10020)                                                 \
  X(cuMemRelease, cuMemRelease, 10020)                                             \
  X(cuMemAddressFree, cuMemAddressFree, 10020)

static struct {
#define MEMBER(name, symbol, version) __typeof__(&symbol) name;
  API(MEMBER)
#undef MEMBER
} api;

static void load_api(void) {
#ifdef GMEM_JOB_DLOPEN
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fprintf(stderr, "driver_job: %s\n", dlerror());
    exit(2);
  }
  __typeof__(&cuGetProcAddress_v2) get = (__typeof__(&cuGetProcAddress_v2))dlsym(lib, "cuGetProcAddress_v2");
  CUdriverProcAddressQueryResult found;
#define LOAD(name, symbol, version)                                                    \
  if (!get || get(#name, (void**)&api.name, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &found) || \
      found != CU_GET_PROC_ADDRESS_SUCCESS) {                                          \
    fprintf(stderr, "driver_job: cuGetProcAddress_v2(%s) failed\n", #name);            \
    exit(2);                                                                           \
  }
  API(LOAD)
#undef LOAD
#else
#define LOAD(name, symbol, version) api.name = &symbol;
  API(LOAD)
#undef LOAD
#endif
}

#define CHECK(call)                                                      \
  do {                                                                   \
    CUresult status_ = (call);                                           \
    if (status_ != CUDA_SUCCESS) {                                       \
      fprintf(stderr, "driver_job: %s failed: %d\n", #call, status_);    \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

static uint64_t checksum(const uint32_t* words, size_t count) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < count; ++i) h = (h ^ words[i]) * 1099511628211ull;
  return h;
}

/* Fills `bytes` of device memory with a pattern, copies it through a second
 * buffer and back, and folds what came back into the checksum. */
static uint64_t roundtrip(CUdeviceptr dst, CUdeviceptr scratch, size_t bytes, uint32_t seed) {
  size_t words = bytes / 4;
  uint32_t* host = malloc(bytes);
  for (size_t i = 0; i < words; ++i) host[i] = seed * 2654435761u + (uint32_t)i;
  CHECK(api.cuMemcpyHtoD(scratch, host, bytes));
  CHECK(api.cuMemcpyDtoD(dst, scratch, bytes));
  CHECK(api.cuMemsetD32(scratch, 0, words));
  memset(host, 0, bytes);
  CHECK(api.cuMemcpyDtoH(host, dst, bytes));
  uint64_t h = checksum(host, words);
  free(host);
  return h;
}

int main(int argc, char** argv) {
  load_api();
  CUresult init = api.cuInit(0);
  if (init != CUDA_SUCCESS) {
    printf("cuInit=%d\n", init);
    return 3;
  }
  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  CHECK(api.cuDeviceGet(&dev, 0));
  CHECK(api.cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(api.cuCtxSetCurrent(ctx));
  CHECK(api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  const size_t mib = 1 << 20;
  uint64_t sum = 0;
  CUdeviceptr scratch;
  CHECK(api.cuMemAlloc(&scratch, 8 * mib));

  /* cuMemAlloc of several sizes; the driver describes each allocation whole. */
  const size_t sizes[] = {4096, 3 * mib, 8 * mib};
  for (int i = 0; i < 3; ++i) {
    CUdeviceptr p, base;
    size_t size;
    CHECK(api.cuMemAlloc(&p, sizes[i]));
    CHECK(api.cuMemGetAddressRange(&base, &size, p + sizes[i] / 2));
    if (base != p || size != sizes[i]) {
      fprintf(stderr, "driver_job: address range of %zu bytes is wrong\n", sizes[i]);
      return 1;
    }
    sum ^= roundtrip(p, scratch, sizes[i], (uint32_t)i);
    CHECK(api.cuMemFree(p));
  }

  CUdeviceptr pitched;
  size_t pitch;
  CHECK(api.cuMemAllocPitch(&pitched, &pitch, 1000, 64, 4));
  sum ^= roundtrip(pitched, scratch, pitch * 64, 7);
  CHECK(api.cuMemFree(pitched));

  CUdeviceptr managed;
  CHECK(api.cuMemAllocManaged(&managed, mib, CU_MEM_ATTACH_GLOBAL));
  sum ^= roundtrip(managed, scratch, mib, 11);
  CHECK(api.cuMemFree(managed));

  CUdeviceptr async;
  CHECK(api.cuMemAllocAsync(&async, 2 * mib, stream));
  CHECK(api.cuStreamSynchronize(stream));
  sum ^= roundtrip(async, scratch, 2 * mib, 13);
  CHECK(api.cuMemFreeAsync(async, stream));
  CHECK(api.cuStreamSynchronize(stream));

  /* The VMM sequence of PyTorch's expandable segments. */
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t granularity;
  CHECK(api.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  CUmemGenericAllocationHandle handle;
  CUdeviceptr va;
  CHECK(api.cuMemCreate(&handle, 2 * granularity, &prop, 0));
  CHECK(api.cuMemAddressReserve(&va, 2 * granularity, 0, 0, 0));
  CHECK(api.cuMemMap(va, 2 * granularity, 0, handle, 0));
  CUmemAccessDesc access = {prop.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CHECK(api.cuMemSetAccess(va, 2 * granularity, &access, 1));
  sum ^= roundtrip(va, scratch, 2 * granularity, 17);
  CHECK(api.cuMemUnmap(va, 2 * granularity));
  CHECK(api.cuMemRelease(handle));
  CHECK(api.cuMemAddressFree(va, 2 * granularity));

  CHECK(api.cuMemFree(scratch));

  /* A child that never calls CUDA, exec'd from a process that did. */
  if (argc == 3 && strcmp(argv[1], "--exec") == 0) {
    pid_t child = fork();
    if (child == 0) {
      execl(argv[2], argv[2], (char*)NULL);
      _exit(127);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("child exit=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }

  CHECK(api.cuStreamDestroy(stream));
  CHECK(api.cuDevicePrimaryCtxRelease(dev));
  printf("checksum=%016" PRIx64 "\n", sum);
  /* What this job allocated, in the terms of gmem's report. */
  printf("expect device allocs=4 bytes=%zu\n", 8 * mib + 4096 + 3 * mib + 8 * mib);
  printf("expect pitched allocs=1 bytes=%zu\n", pitch * 64);
  printf("expect managed allocs=1 bytes=%zu\n", mib);
  printf("expect async allocs=1 bytes=%zu\n", 2 * mib);
  printf("expect vmm allocs=1 bytes=%zu\n", 2 * granularity);
  return 0;
}
