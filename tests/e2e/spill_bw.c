/* Kernel read and write bandwidth on the part of an allocation that gmem's pool
 * spilled to pinned host memory (host) or to a peer GPU (peer), against raw VMM
 * memory of the same tier and size that the real driver maps for it in the same
 * run: cuMemCreate at the host NUMA node (resp. on device 1), mapped for device
 * 0. Run under the shim with a small device_budget, as spill.c. Every launch's
 * data is checked (a read's sum of a memset pattern, a write read back), so a
 * broken mapping cannot pass. Exit 0 when the data holds and both ratios
 * (spilled / raw) reach 0.95; 77 (skipped) where kernels cannot run (the
 * emulator, a build without nvcc) or, for peer, without a second GPU it can map.
 *   spill-bw host|peer FILL_MIB BLOCK_MIB SPAN_MIB */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "spill-bw"
#include "check.h"
#include "spill_common.h"

/* The kernels (spill_bw_kernels.cu) as a fatbin; empty in a build without nvcc. */
extern const unsigned char gmem_spill_bw_kernels[];
extern const size_t gmem_spill_bw_kernels_size;

enum { runs = 20, threads = 256 };
static const size_t mib = 1 << 20, least = 256 << 20;
static const double goal = 0.95;

struct bench {
  CUfunction read, write;
  unsigned blocks;
  struct raw_memory sum; /* the read kernel's sum, on the device */
  CUevent start, stop;
};

/* One launch of the read (or write) kernel over [data, data + bytes), timed;
 * a read's sum must be that of `value` in every 32-bit word. */
static int launch(const struct bench* b, int write, CUdeviceptr data, size_t bytes, unsigned value, float* ms) {
  unsigned long long n = bytes / 16;
  CUdeviceptr sum = b->sum.ptr;
  void* read_args[] = {&data, &n, &sum};
  void* write_args[] = {&data, &n, &value};
  if (!write) CHECK(cuMemsetD32(sum, 0, 2));
  CHECK(cuEventRecord(b->start, NULL));
  CHECK(cuLaunchKernel(write ? b->write : b->read, b->blocks, 1, 1, threads, 1, 1, 0, NULL,
                       write ? write_args : read_args, NULL));
  CHECK(cuEventRecord(b->stop, NULL));
  CHECK(cuEventSynchronize(b->stop));
  CHECK(cuEventElapsedTime(ms, b->start, b->stop));
  if (write) return 0;
  unsigned long long got = 0, want = 4ull * n * value;
  CHECK(cuMemcpyDtoH(&got, sum, sizeof got));
  if (got != want) {
    fprintf(stderr, "spill-bw: the read kernel's sum is %llu, expected %llu (4 x %llu x 0x%08x)\n", got, want, n,
            value);
    return 1;
  }
  return 0;
}

/* gbs[0], gbs[1]: the read and write GB/s over [data, data + bytes), best of
 * `runs` after a warm-up; reads of a memset `pattern`, then writes of its
 * complement, checked by the read kernel and by the copy engine. */
static int measure(const struct bench* b, CUdeviceptr data, size_t bytes, unsigned pattern, double gbs[2]) {
  const unsigned value[2] = {pattern, ~pattern};
  CHECK(cuMemsetD32(data, pattern, bytes / 4));
  for (int write = 0; write < 2; ++write) {
    gbs[write] = 0;
    for (int i = 0; i <= runs; ++i) {
      float ms = 0;
      if (launch(b, write, data, bytes, value[write], &ms)) return 1;
      if (i > 0 && bytes / (ms * 1e6) > gbs[write]) gbs[write] = bytes / (ms * 1e6);
    }
  }
  float ms = 0;
  unsigned first = 0, last = 0;
  if (launch(b, 0, data, bytes, value[1], &ms)) return 1;
  CHECK(cuMemcpyDtoH(&first, data, 4));
  CHECK(cuMemcpyDtoH(&last, data + bytes - 4, 4));
  if (first != value[1] || last != value[1]) {
    fprintf(stderr, "spill-bw: a copy reads 0x%08x, 0x%08x after the kernel wrote 0x%08x\n", first, last, value[1]);
    return 1;
  }
  return 0;
}

/* The kernels and what timing them needs; 77 where the driver cannot load them. */
static int bench_setup(const struct real_driver* real, CUdevice dev, struct bench* b) {
  CUmodule module;
  int sms = 0;
  const int loaded =
      load_step(gmem_spill_bw_kernels, gmem_spill_bw_kernels_size, "gmem_bw_read", dev, &module, &b->read, &sms);
  if (loaded != 0) return loaded;
  CHECK(cuModuleGetFunction(&b->write, module, "gmem_bw_write"));
  b->blocks = 8 * sms; /* 2048 threads per SM */
  /* The sum lives past the pool, so that the budget leaves the placement alone. */
  const CUmemLocation on_device = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
  CHECK(raw_map(real, on_device, spill_step, dev, &b->sum));
  CHECK(cuEventCreate(&b->start, CU_EVENT_DEFAULT));
  CHECK(cuEventCreate(&b->stop, CU_EVENT_DEFAULT));
  return 0;
}

int main(int argc, char** argv) {
  struct tier_run run;
  const int started = tier_start(argc, argv, 0, "", &run);
  if (started) return started;
  const CUdevice dev = 0, other = 1;
  struct bench b;
  const int ready = bench_setup(&run.real, dev, &b);
  if (ready != 0) return ready;

  static struct filled a;
  if (fill_then_spill(&run, dev, &a)) return 1;
  const size_t bytes = a.where.run[a.tier], start = a.where.start[a.tier];
  if (bytes < least) {
    fprintf(stderr, "spill-bw: %zu MiB in one run on the %s, %zu MiB needed: raise SPAN_MIB or lower the budgets\n",
            bytes / mib, tier_names[a.tier], least / mib);
    return 1;
  }
  printf("spill-bw: %s: %zu MiB at +%zu MiB, %u blocks x %d threads, best of %d after a warm-up\n", run.name,
         bytes / mib, start / mib, b.blocks, threads, runs);

  double spilled[2], raw[2];
  if (measure(&b, a.big + start, bytes, 0x5eed0001u, spilled)) return 1;
  CUmemLocation at = {CU_MEM_LOCATION_TYPE_DEVICE, other};
  if (!run.peer) CHECK(host_location(dev, &at));
  struct raw_memory m;
  CHECK(raw_map(&run.real, at, bytes, dev, &m));
  if (measure(&b, m.ptr, bytes, 0x5eed0002u, raw)) return 1;
  CHECK(raw_unmap(&run.real, &m));

  int below = 0;
  for (int write = 0; write < 2; ++write) {
    const char* op = write ? "write" : "read";
    const double ratio = spilled[write] / raw[write];
    printf("BENCH spill_%s_%s_gbs %.2f GB/s\n", run.name, op, spilled[write]);
    printf("BENCH raw_%s_%s_gbs %.2f GB/s\n", run.name, op, raw[write]);
    printf("BENCH spill_%s_%s_ratio %.4f ratio\n", run.name, op, ratio);
    if (ratio < goal) {
      fprintf(stderr, "spill-bw: %s %s: spilled %.4f of raw, below %.2f\n", run.name, op, ratio, goal);
      below = 1;
    }
  }
  CHECK(cuMemFree(a.big));
  for (int i = 0; i < a.n; ++i) CHECK(cuMemFree(a.blocks[i]));
  CHECK(raw_unmap(&run.real, &b.sum));
  if (below) return 1;
  printf("spill-bw %s ok\n", run.name);
  return 0;
}
