/* What loading the shim costs a process that never calls CUDA: the time to map,
 * relocate and initialise it (dlopen), against loading the real driver the same
 * way. Each figure is the median over fresh processes, as each job pays it once.
 * Usage: bench_load SHIM REAL_DRIVER */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { runs = 21 };

/* Loads `path` in a new process; returns the microseconds it took, or -1. */
static double load_us(const char* path) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t child = fork();
  if (child == 0) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double us = h ? (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3 : -1;
    if (!h) fprintf(stderr, "bench_load: %s\n", dlerror());
    _exit(write(fds[1], &us, sizeof us) == sizeof us ? 0 : 1);
  }
  double us = -1;
  close(fds[1]);
  if (read(fds[0], &us, sizeof us) != sizeof us) us = -1;
  close(fds[0]);
  waitpid(child, NULL, 0);
  return us;
}

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median_load_us(const char* path) {
  double t[runs];
  for (int i = 0; i < runs; ++i) {
    if ((t[i] = load_us(path)) < 0) return -1;
  }
  qsort(t, runs, sizeof t[0], by_value);
  return t[runs / 2];
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: bench_load SHIM REAL_DRIVER\n");
    return 2;
  }
  double shim = median_load_us(argv[1]);
  double native = median_load_us(argv[2]);
  if (shim < 0 || native < 0) return 1;
  printf("BENCH shim_load %.1f us\nBENCH shim_load_native %.1f us\n", shim, native);
  return 0;
}
