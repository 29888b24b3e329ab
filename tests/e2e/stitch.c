/* Fills the device with equal blocks, frees every other one, then asks for
 * three blocks' worth at once: with the device full and no free range that
 * large, gmem's VMM pool must stitch freed chunks into one contiguous range.
 * Checks the data through the whole range and what cuMemGetAddressRange says
 * of it; prints the time the stitched allocation took. Exit 0 on success. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROGRAM "stitch"
#include "check.h"

enum { max_blocks = 4096 };

int main(void) {
  CUcontext ctx;
  CHECK(use_device0(&ctx));
  size_t free_bytes, total;
  CHECK(cuMemGetInfo(&free_bytes, &total));
  size_t block = (total / 32) & ~((size_t)(2 << 20) - 1);
  if (block < (4 << 20)) block = 4 << 20;

  static CUdeviceptr blocks[max_blocks];
  int n = 0;
  while (n < max_blocks && cuMemAlloc(&blocks[n], block) == CUDA_SUCCESS) ++n;
  for (int i = 0; i < n; i += 2) CHECK(cuMemFree(blocks[i]));
  printf("stitch: %d blocks of %zu MiB filled the device; freed %d\n", n, block >> 20, (n + 1) / 2);

  size_t want = 3 * block;
  CUdeviceptr big;
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  CHECK(cuMemAlloc(&big, want));
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("BENCH stitched_alloc_%zuMiB %.3f ms\n", want >> 20, (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);

  CUdeviceptr base;
  size_t size;
  CHECK(cuMemGetAddressRange(&base, &size, big + want - 1));
  if (base != big || size != want) {
    fprintf(stderr, "stitch: address range %llx+%zu, expected %llx+%zu\n", base, size, big, want);
    return 1;
  }
  unsigned* host = malloc(want);
  for (size_t i = 0; i < want / 4; ++i) host[i] = (unsigned)(i * 2654435761u);
  CHECK(cuMemcpyHtoD(big, host, want));
  unsigned* back = calloc(1, want);
  CHECK(cuMemcpyDtoH(back, big, want));
  if (memcmp(host, back, want) != 0) {
    fprintf(stderr, "stitch: data differs after the round trip\n");
    return 1;
  }
  CHECK(cuMemFree(big));
  for (int i = 1; i < n; i += 2) CHECK(cuMemFree(blocks[i]));
  printf("stitch ok\n");
  return 0;
}
