/* A driver-API program that allocates and then holds its memory until its
 * standard input closes, so that gmemd can be asked about it while it lives.
 * Usage: holding-job DEVICE:MIB... ; prints "ready" and one line per
 * allocation, "DEVICE BASE SIZE" (decimal), before waiting. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(call)                                                \
  do {                                                             \
    CUresult status_ = (call);                                     \
    if (status_ != CUDA_SUCCESS) {                                 \
      fprintf(stderr, "holding-job: %s failed: %d\n", #call, status_); \
      return 1;                                                    \
    }                                                              \
  } while (0)

int main(int argc, char** argv) {
  CUdeviceptr bases[64];
  int count = argc - 1 < 64 ? argc - 1 : 64;
  CHECK(cuInit(0));
  char report[64 * 64] = "";
  size_t used = 0;
  for (int i = 0; i < count; ++i) {
    int ordinal = atoi(argv[i + 1]);
    const char* colon = strchr(argv[i + 1], ':');
    size_t size = (size_t)strtoull(colon ? colon + 1 : "1", NULL, 10) << 20;
    CUdevice device;
    CUcontext context;
    CHECK(cuDeviceGet(&device, ordinal));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    CHECK(cuMemAlloc(&bases[i], size));
    used += (size_t)snprintf(report + used, sizeof report - used, "%d %llu %zu\n", ordinal,
                             (unsigned long long)bases[i], size);
  }
  printf("ready\n%s", report);
  fflush(stdout);
  char byte;
  while (read(0, &byte, 1) > 0) {
  }
  for (int i = 0; i < count; ++i) CHECK(cuMemFree(bases[i]));
  return 0;
}
