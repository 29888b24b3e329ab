/* Fills part of the device, then makes one allocation that gmem's pool must
 * spill (run with a small device_budget): checks the data through all of it,
 * that gmem answers every pointer query of it as device memory of device 0
 * with the allocation's bounds, and asks the real driver (GMEM_REAL_LIBCUDA,
 * opened past the shim) where each 2 MiB of it lives. Prints the copy-engine
 * bandwidth from its host-spilled part next to the same copy from host-NUMA
 * memory the program maps itself (BENCH lines). With `trim`, once all is
 * freed, trims device 0's default memory pool to nothing (gmem then gives its
 * spilled chunks back too). Exit 0 on success.
 *   spill FILL_MIB BLOCK_MIB SPAN_MIB [trim] */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "spill"
#include "check.h"
#include "spill_common.h"

enum { max_blocks = 1024 };
static const size_t mib = 1 << 20;

/* GB/s of a device-to-device copy of `bytes` from `src`, best of 5. */
static double copy_rate(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    double t = now();
    if (cuMemcpyDtoD(dst, src, bytes) != CUDA_SUCCESS || cuCtxSynchronize() != CUDA_SUCCESS) return -1;
    double rate = bytes / (now() - t) / 1e9;
    if (rate > best) best = rate;
  }
  return best;
}

int main(int argc, char** argv) {
  const int trim = argc == 5 && strcmp(argv[4], "trim") == 0;
  if (argc != 4 && !trim) {
    fprintf(stderr, "usage: spill FILL_MIB BLOCK_MIB SPAN_MIB [trim]\n");
    return 2;
  }
  size_t fill, block, span;
  struct real_driver real;
  CUcontext ctx;
  const int started = spill_start(argv + 1, &fill, &block, &span, &real, &ctx);
  if (started) return started;
  const CUdevice dev = 0;

  static CUdeviceptr blocks[max_blocks];
  int n = 0;
  for (size_t held = 0; held < fill && n < max_blocks; held += block) CHECK(cuMemAlloc(&blocks[n++], block));
  for (int i = 0; i < n; ++i) CHECK(cuMemsetD32(blocks[i], 0x5eed0000u + i, block / 4));
  CUdeviceptr big;
  double t = now();
  CHECK(cuMemAlloc(&big, span));
  printf("BENCH spill_alloc_%zuMiB %.3f ms\n", span / mib, (now() - t) * 1e3);

  /* Where the driver says each 2 MiB lives; gmem must say device 0 throughout. */
  struct placement where;
  CHECK(locate(&real, big, span, dev, &where));
  for (size_t off = 0; off < span; off += spill_step) {
    unsigned type = 0;
    int ordinal = -1;
    CUdeviceptr base = 0;
    size_t size = 0;
    int managed = -1;
    CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, big + off + 64));
    CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, big + off + 64));
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, big + off + 64));
    CHECK(cuMemGetAddressRange(&base, &size, big + off + 64));
    if (type != CU_MEMORYTYPE_DEVICE || ordinal != dev || managed != 0 || base != big || size != span) {
      fprintf(stderr, "spill: at +%zu MiB gmem answers type %u ordinal %d managed %d range +%zu MiB\n", off / mib,
              type, ordinal, managed, size / mib);
      return 1;
    }
  }
  printf("spill: the driver places the %zu MiB allocation on device %zu MiB, peer %zu MiB, host %zu MiB\n",
         span / mib, where.bytes[tier_device] / mib, where.bytes[tier_peer] / mib, where.bytes[tier_host] / mib);
  printf("spill: gmem answers device memory of device %d, with the allocation's bounds, for all of it\n", dev);

  unsigned* host = malloc(span);
  unsigned* back = calloc(1, span);
  for (size_t i = 0; i < span / 4; ++i) host[i] = (unsigned)(i * 2654435761u);
  CHECK(cuMemcpyHtoD(big, host, span));
  CHECK(cuMemcpyDtoH(back, big, span));
  if (memcmp(host, back, span) != 0) {
    fprintf(stderr, "spill: data differs after the round trip\n");
    return 1;
  }
  for (int i = 0; i < n; ++i) {
    unsigned first = 0, last = 0;
    CHECK(cuMemcpyDtoH(&first, blocks[i], 4));
    CHECK(cuMemcpyDtoH(&last, blocks[i] + block - 4, 4));
    if (first != 0x5eed0000u + i || last != first) {
      fprintf(stderr, "spill: block %d changed\n", i);
      return 1;
    }
  }

  const size_t host_run = where.run[tier_host];
  if (host_run) {
    /* The same copy from host-NUMA memory mapped by hand (the raw figure), each
     * into device memory the real driver maps (no pool, no budget). */
    CUmemLocation on_host, on_device = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
    struct raw_memory src, dst;
    CHECK(host_location(dev, &on_host));
    CHECK(raw_map(&real, on_host, host_run, dev, &src));
    CHECK(raw_map(&real, on_device, host_run, dev, &dst));
    printf("BENCH spill_host_copy_%zuMiB %.2f GB/s\n", host_run / mib,
           copy_rate(dst.ptr, big + where.start[tier_host], host_run));
    printf("BENCH spill_host_copy_%zuMiB_native %.2f GB/s\n", host_run / mib, copy_rate(dst.ptr, src.ptr, host_run));
    CHECK(raw_unmap(&real, &src));
    CHECK(raw_unmap(&real, &dst));
  }
  CHECK(cuMemFree(big));
  for (int i = 0; i < n; ++i) CHECK(cuMemFree(blocks[i]));
  if (trim) {
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    CHECK(cuMemPoolTrimTo(pool, 0));
    printf("trimmed\n");
  }
  printf("spill ok\n");
  return 0;
}
