/* What loading the shim costs a process that never calls CUDA: the time to map
 * and relocate it (dlopen), against loading the real driver the same way.
 * Usage: bench_load SHIM REAL_DRIVER */
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

static double load_us(const char* path) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  clock_gettime(CLOCK_MONOTONIC, &b);
  if (!h) {
    fprintf(stderr, "bench_load: %s\n", dlerror());
    return -1;
  }
  return (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: bench_load SHIM REAL_DRIVER\n");
    return 2;
  }
  double shim = load_us(argv[1]);
  double native = load_us(argv[2]);
  if (shim < 0 || native < 0) return 1;
  printf("BENCH shim_load %.1f us\nBENCH shim_load_native %.1f us\n", shim, native);
  return 0;
}
