/* Spilled memory moving back to the device under running kernels. Run under
 * the shim with a small device_budget and migrate_after_ms, as spill.c: fills
 * the device (A), makes an allocation B that spills in part to pinned host
 * memory (host) or to a peer GPU (peer), and starts one thread per stream, each
 * counting in its own slice of B: a kernel adds 1 to every word of one half and
 * checks both halves against the count, then a copy (odd steps) or a memset
 * (even steps) makes the other half equal again. A is freed while they run;
 * gmem must move B's spilled part back to the device (the real driver's
 * placement, GMEM_REAL_LIBCUDA) within TIMEOUT_S (30), and afterwards every
 * word of every slice must hold its stream's count. Prints BENCH lines on the
 * move. Exit 0 on success; 77 (skipped) where kernels cannot run (the
 * emulator, a build without nvcc) or, for peer, without a second GPU it can map.
 *   migrate host|peer FILL_MIB BLOCK_MIB SPAN_MIB [TIMEOUT_S] */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROGRAM "migrate"
#include "check.h"
#include "spill_common.h"

/* The kernel (migrate_kernels.cu) as a fatbin; empty in a build without nvcc. */
extern const unsigned char gmem_migrate_kernels[];
extern const size_t gmem_migrate_kernels_size;

enum { streams = 4, threads = 256, shown = 5 };
static const size_t mib = 1 << 20;
/* Each stream steps at least `least_steps` times and for `phase_s` seconds
 * before A is freed and again once B is on the device, so that its steps span
 * the move whatever the launches cost (compute-sanitizer slows them a lot). */
static const double phase_s = 1.0, poll_s = 0.01;
static const unsigned least_steps = 4;

/* One stream's part: its thread, its slice of B, what it has done. */
struct worker {
  CUcontext ctx;
  CUfunction step;
  unsigned blocks;
  CUdeviceptr x, y; /* the halves of its slice */
  size_t half;      /* bytes in each */
  CUdeviceptr bad;  /* the kernel's two counters, past the pool */
  atomic_int* stop;
  atomic_uint steps;   /* steps launched; each adds 1 to every word */
  atomic_uint synced;  /* steps known to be done */
  double longest_call; /* seconds: the longest launch, copy or memset call */
  _Atomic(const char*) failed; /* the call that failed, or NULL */
  CUresult error;
  pthread_t thread;
};

#define WORKER_CHECK(call)     \
  do {                         \
    CUresult s_ = (call);      \
    if (s_ != CUDA_SUCCESS) {  \
      w->error = s_;           \
      w->failed = #call;       \
      return NULL;             \
    }                          \
  } while (0)

/* A submitting call, timed: gmem holds these at their entry while it moves. */
#define WORKER_SUBMIT(call)                                              \
  do {                                                                   \
    const double t_ = now();                                             \
    WORKER_CHECK(call);                                                  \
    const double took_ = now() - t_;                                     \
    if (took_ > w->longest_call) w->longest_call = took_;                \
  } while (0)

/* Steps until told to stop; never more than two steps ahead of the GPU. */
static void* work(void* arg) {
  struct worker* w = arg;
  CUstream stream;
  WORKER_CHECK(cuCtxSetCurrent(w->ctx));
  WORKER_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  WORKER_SUBMIT(cuMemsetD32Async(w->x, 0, w->half / 4, stream));
  WORKER_SUBMIT(cuMemsetD32Async(w->y, 0, w->half / 4, stream));
  unsigned long long n = w->half / 16;
  unsigned count = 0;
  while (!atomic_load(w->stop)) {
    unsigned expect = count;
    void* args[] = {&w->x, &w->y, &n, &expect, &w->bad};
    WORKER_SUBMIT(cuLaunchKernel(w->step, w->blocks, 1, 1, threads, 1, 1, 0, stream, args, NULL));
    ++count;
    if (count % 2) {
      WORKER_SUBMIT(cuMemcpyDtoDAsync(w->y, w->x, w->half, stream));
    } else {
      WORKER_SUBMIT(cuMemsetD32Async(w->y, count, w->half / 4, stream));
    }
    atomic_store(&w->steps, count);
    if (count % 2 == 0) {
      WORKER_CHECK(cuStreamSynchronize(stream));
      atomic_store(&w->synced, count);
    }
  }
  WORKER_CHECK(cuStreamSynchronize(stream));
  atomic_store(&w->synced, count);
  WORKER_CHECK(cuStreamDestroy(stream));
  return NULL;
}

static void sleep_s(double s) {
  struct timespec t = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
  nanosleep(&t, NULL);
}

/* Waits `phase_s` and until every stream has finished `least_steps` more than
 * in `from` (NULL: none); `at` gets each stream's steps then. 0, or 1 where a
 * stream failed. */
static int run_phase(struct worker* w, const unsigned* from, unsigned* at) {
  const double start = now();
  for (int done = 0; !done;) {
    sleep_s(poll_s);
    done = now() - start >= phase_s;
    for (int i = 0; i < streams; ++i) {
      if (w[i].failed) return 1;
      if (atomic_load(&w[i].synced) < (from ? from[i] : 0) + least_steps) done = 0;
    }
  }
  for (int i = 0; i < streams; ++i) at[i] = atomic_load(&w[i].steps);
  return 0;
}

static unsigned total(const unsigned* steps) {
  unsigned sum = 0;
  for (int i = 0; i < streams; ++i) sum += steps[i];
  return sum;
}

/* Polls the real driver until all of B is on the device, for at most
 * `timeout` seconds: 0, or 1 with what it saw. A query that fails (an address
 * between its unmap and its map) is asked again. */
static int wait_moved(const struct real_driver* real, CUdeviceptr b, size_t span, CUdevice dev, double timeout,
                      struct worker* w) {
  const double start = now();
  struct placement where = {{0}, {0}, {0}};
  CUresult last = CUDA_SUCCESS;
  for (;;) {
    for (int i = 0; i < streams; ++i) {
      if (w[i].failed) return 1;
    }
    struct placement p;
    last = locate(real, b, span, dev, &p);
    if (last == CUDA_SUCCESS) {
      where = p;
      if (where.bytes[tier_device] == span) return 0;
    }
    if (now() - start > timeout) break;
    sleep_s(poll_s);
  }
  fprintf(stderr,
          "migrate: B was not moved back within %.0f s: the driver places it on device %zu MiB, peer %zu MiB, host "
          "%zu MiB (last query: %d); is migrate_after_ms on?\n",
          timeout, where.bytes[tier_device] / mib, where.bytes[tier_peer] / mib, where.bytes[tier_host] / mib, last);
  return 1;
}

/* Every word of each stream's slice holds its count, and its kernels saw no
 * word that did not: 0, or 1 with the first mismatches. */
static int verify(struct worker* w, const unsigned* steps, CUdeviceptr b) {
  int failed = 0;
  unsigned* host = malloc(w[0].half);
  if (!host) return 1;
  for (int i = 0; i < streams && failed < shown; ++i) {
    unsigned long long bad[2] = {0, 0};
    CHECK(cuMemcpyDtoH(bad, w[i].bad, sizeof bad));
    if (bad[0]) {
      fprintf(stderr, "migrate: stream %d: its kernels read %llu words that missed the count, first at step %llu\n",
              i, bad[0], bad[1] + 1);
      ++failed;
    }
    const CUdeviceptr halves[2] = {w[i].x, w[i].y};
    for (int h = 0; h < 2; ++h) {
      CHECK(cuMemcpyDtoH(host, halves[h], w[i].half));
      for (size_t k = 0; k < w[i].half / 4 && failed < shown; ++k) {
        if (host[k] == steps[i]) continue;
        fprintf(stderr, "migrate: stream %d: the word at B + %zu holds %u, expected %u\n", i,
                (size_t)(halves[h] - b) + 4 * k, host[k], steps[i]);
        ++failed;
      }
    }
  }
  free(host);
  return failed != 0;
}

int main(int argc, char** argv) {
  struct tier_run run;
  const int started = tier_start(argc, argv, 1, " [TIMEOUT_S]", &run);
  if (started) return started;
  const double timeout = argc == 6 ? strtod(argv[5], NULL) : 30;
  const CUdevice dev = 0;
  CUmodule module;
  CUfunction step;
  int sms = 0;
  const int loaded =
      load_step(gmem_migrate_kernels, gmem_migrate_kernels_size, "gmem_migrate_step", dev, &module, &step, &sms);
  if (loaded != 0) return loaded;
  /* The kernels' counters live past the pool, so that the budget leaves the
   * placement alone: two per stream, 64 bytes apart. */
  struct raw_memory counters;
  const CUmemLocation on_device = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
  CHECK(raw_map(&run.real, on_device, spill_step, dev, &counters));
  CHECK(cuMemsetD32(counters.ptr, 0xffffffffu, spill_step / 4));

  /* A fills the device's budget; B spills. */
  static struct filled a;
  if (fill_then_spill(&run, dev, &a)) return 1;
  const CUdeviceptr b = a.big;
  const enum tier t = a.tier;
  struct placement where = a.where;
  const size_t spilled = where.bytes[t];
  if (spilled == 0) {
    fprintf(stderr, "migrate: nothing of B on the %s: the setup did not spill (raise SPAN_MIB or lower the budgets)\n",
            tier_names[t]);
    return 1;
  }

  static atomic_int stop;
  static struct worker w[streams];
  const size_t half = run.span / streams / 2 / 16 * 16;
  for (int i = 0; i < streams; ++i) {
    w[i] = (struct worker){.ctx = run.ctx, .step = step, .blocks = 4 * sms, .half = half, .stop = &stop};
    w[i].x = b + 2 * i * half;
    w[i].y = w[i].x + half;
    w[i].bad = counters.ptr + 64 * i;
    CHECK(cuMemsetD32(w[i].bad, 0, 2));
  }
  printf("migrate: %s: %d streams step over %zu MiB slices of it, %u blocks x %d threads; A (%zu MiB) goes next\n",
         run.name, streams, 2 * half / mib, w[0].blocks, threads, (size_t)a.n * run.block / mib);
  const double ts = now();
  int running = 0;
  for (; running < streams; ++running) {
    if (pthread_create(&w[running].thread, NULL, work, &w[running]) != 0) break;
  }
  unsigned before[streams], moved[streams], after[streams], steps[streams];
  int failed = running < streams;
  double t0 = ts, t1 = ts, t2 = ts;
  if (!failed) failed = run_phase(w, NULL, before);
  if (!failed) {
    /* Nothing moves while the device has no room. */
    const CUresult s = locate(&run.real, b, run.span, dev, &where);
    failed = s != CUDA_SUCCESS || where.bytes[t] != spilled;
    if (failed) {
      fprintf(stderr, "migrate: before A was freed, B has %zu MiB on the %s, not %zu MiB (query: %d)\n",
              where.bytes[t] / mib, tier_names[t], spilled / mib, s);
    }
  }
  if (!failed) {
    t0 = now();
    for (int i = 0; i < a.n; ++i) CHECK(cuMemFree(a.blocks[i]));
    failed = wait_moved(&run.real, b, run.span, dev, timeout, w);
    t1 = now();
    for (int i = 0; i < streams; ++i) moved[i] = atomic_load(&w[i].steps);
  }
  if (!failed) failed = run_phase(w, moved, after);
  t2 = now();
  atomic_store(&stop, 1);
  for (int i = 0; i < running; ++i) pthread_join(w[i].thread, NULL);
  if (running < streams) fprintf(stderr, "migrate: could not start stream %d's thread\n", running);
  for (int i = 0; i < streams; ++i) {
    if (w[i].failed) {
      fprintf(stderr, "migrate: stream %d: %s failed: %d\n", i, w[i].failed, w[i].error);
      failed = 1;
    }
  }
  if (failed) return 1;
  double longest = 0;
  for (int i = 0; i < streams; ++i) {
    steps[i] = atomic_load(&w[i].steps);
    if (w[i].longest_call > longest) longest = w[i].longest_call;
  }
  if (verify(w, steps, b)) return 1;

  printf("migrate ok: %zu MiB moved back while %u kernels ran on %d streams (%u while it moved)\n", spilled / mib,
         total(steps), streams, total(moved) - total(before));
  printf("BENCH migrate_%s_%zuMiB_ms %.1f ms\n", run.name, spilled / mib, (t1 - t0) * 1e3);
  printf("BENCH migrate_%s_kernels_while_moving %u kernels\n", run.name, total(moved) - total(before));
  printf("BENCH migrate_%s_longest_call_ms %.1f ms\n", run.name, longest * 1e3);
  printf("BENCH migrate_%s_kernels_per_s_spilled %.1f kernels/s\n", run.name, total(before) / (t0 - ts));
  printf("BENCH migrate_%s_kernels_per_s_moved %.1f kernels/s\n", run.name, (total(after) - total(moved)) / (t2 - t1));
  CHECK(cuMemFree(b));
  CHECK(raw_unmap(&run.real, &counters));
  return 0;
}
