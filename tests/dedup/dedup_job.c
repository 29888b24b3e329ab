/* A driver-API program for the dedup tests, run under the shim: allocates
 * SIZE bytes, fills them with a pattern made from SEED, marks them with the
 * dedup C API (found with dlsym, as a program that also runs without gmem
 * would) and obeys commands, one per line on stdin, answering one line each:
 *   state      "state N" (enum gmem_dedup_state)
 *   check      "check ok" if the memory still holds the pattern, else "check bad AT"
 *   write      writes one byte from the host: "write R" (R: the CUresult)
 *   unmark     "unmark R" (R: enum gmem_dedup_status)
 *   free       frees it, then allocates, fills and frees SIZE bytes again: "free R"
 *   fill       allocates 2 MiB blocks until the device is full: "fill COUNT"
 *   unfill     frees those: "unfill COUNT"
 * Usage: dedup-job SIZE SEED; prints "ready BASE MARK_RESULT STATE MARK_MS"
 * first (MARK_MS: how long the marks took: hash, offer, compare, merge). */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROGRAM "dedup-job"
#include "../e2e/check.h"

static void fill(unsigned char* p, size_t size, unsigned seed) {
  unsigned long long x = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (unsigned char)x;
  }
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  size_t size = strtoull(argv[1], NULL, 10);
  unsigned seed = (unsigned)atoi(argv[2]);
  int (*mark)(unsigned long long, size_t) = (int (*)(unsigned long long, size_t))dlsym(RTLD_DEFAULT, "gmem_dedup_mark");
  int (*unmark)(unsigned long long) = (int (*)(unsigned long long))dlsym(RTLD_DEFAULT, "gmem_dedup_unmark");
  int (*query)(unsigned long long, int*) = (int (*)(unsigned long long, int*))dlsym(RTLD_DEFAULT, "gmem_dedup_query");
  if (!mark || !unmark || !query) {
    fprintf(stderr, "dedup-job: not under gmem (no gmem_dedup_mark)\n");
    return 3;
  }
  unsigned char* pattern = malloc(size);
  unsigned char* back = malloc(size);
  fill(pattern, size, seed);
  CUcontext context;
  CUdeviceptr base;
  CHECK(use_device0(&context));
  CHECK(cuMemAlloc(&base, size));
  CHECK(cuMemcpyHtoD(base, pattern, size));
  /* Two marks, the second completing the first: the allocation is offered then. */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int first = mark(base, size / 2);
  int result = first ? first : mark(base + size / 2, size - size / 2);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  int state = -1;
  query(base, &state);
  printf("ready %llu %d %d %.1f\n", (unsigned long long)base, result, state,
         (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
  fflush(stdout);
  static CUdeviceptr filler[4096];
  int filled = 0;
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
    if (strncmp(line, "state", 5) == 0) {
      query(base, &state);
      printf("state %d\n", state);
    } else if (strncmp(line, "check", 5) == 0) {
      CHECK(cuMemcpyDtoH(back, base, size));
      size_t at = 0;
      while (at < size && back[at] == pattern[at]) ++at;
      if (at == size) printf("check ok\n");
      else printf("check bad %zu\n", at);
    } else if (strncmp(line, "write", 5) == 0) {
      unsigned char byte = pattern[0] ^ 0xff;
      CUresult r = cuMemcpyHtoD(base, &byte, 1);
      if (r == CUDA_SUCCESS) pattern[0] = byte;
      printf("write %d\n", r);
    } else if (strncmp(line, "unmark", 6) == 0) {
      printf("unmark %d\n", unmark(base));
    } else if (strncmp(line, "fill", 4) == 0) {
      while (filled < 4096 && cuMemAlloc(&filler[filled], 2 << 20) == CUDA_SUCCESS) ++filled;
      printf("fill %d\n", filled);
    } else if (strncmp(line, "unfill", 6) == 0) {
      int freed = 0;
      while (filled > 0) freed += cuMemFree(filler[--filled]) == CUDA_SUCCESS;
      printf("unfill %d\n", freed);
    } else if (strncmp(line, "free", 4) == 0) {
      CUresult r = cuMemFree(base);
      CUdeviceptr again;
      if (r == CUDA_SUCCESS) r = cuMemAlloc(&again, size);
      if (r == CUDA_SUCCESS) r = cuMemcpyHtoD(again, back, size);  /* the new memory is writable */
      if (r == CUDA_SUCCESS) r = cuMemFree(again);
      printf("free %d\n", r);
    } else {
      printf("unknown\n");
    }
    fflush(stdout);
  }
  return 0;
}
