/* A kernel that reaches an allocation only through a pointer kept in device
 * memory, while gmem may move that allocation: the case docs/eviction.md
 * ("Correctness rules that must hold") says the gate cannot see. Run under the
 * shim with a small device_budget (and evict:1 for the case itself):
 * allocates B (BLOCK_MIB) and writes its address into a table in device
 * memory past the pool; each step's kernel reaches B through the table, checks
 * that every word of it holds the step's number and adds 1 to it. `seen`
 * passes B's address among the kernel's parameters too, where the launch
 * hooks find it (it is not read); the others pass 0. `seen` and `unseen`
 * write the table with cuMemcpyHtoD from host memory, `unified` with the
 * unified cuMemcpy from pageable memory; the gate's upload check finds B's
 * address in either copy (with the evictor on, B then stays on the device);
 * `hidden` writes it with two 32-bit sets, which nothing reads (as a pointer
 * a kernel wrote). After the first second, FILL_MIB more is allocated and
 * never touched, so that the device spills and the evictor, where it is on,
 * moves idle memory (B, never referenced where the gate looks, is idle). From then on, `seen` also pauses 20 ms every 64
 * steps, so that B lies idle long enough to be moved though the launches
 * reference it (the next launch then finds it evicted, or parked); the
 * others never pause, so that the evictor moves B while kernels run (on an
 * H100, with pauses an unparked move of B fell in a pause and kept every
 * word, without them it faulted). Steps for SECONDS (3), synchronizing every 8
 * steps and asking the real driver (GMEM_REAL_LIBCUDA) where B lies.
 * Prints the steps, whether B moved, and the words found wrong. Exit 0 where
 * no kernel saw a wrong word and B ends holding the step count; 1 where one
 * did, or a call failed (a kernel that reached B unmapped faults); 77 in a
 * build without nvcc (no kernels). A GPU program: the emulator loads no fatbin.
 *   pointer-table seen|unseen|unified|hidden FILL_MIB BLOCK_MIB [SECONDS] */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROGRAM "pointer-table"
#include "check.h"
#include "spill_common.h"

/* The kernel (pointer_table_kernels.cu) as a fatbin; empty in a build without nvcc. */
extern const unsigned char gmem_pointer_table_kernels[];
extern const size_t gmem_pointer_table_kernels_size;

enum { threads = 256, sync_every = 8, pause_every = 64, pause_ms = 20 };
static const size_t mib = 1 << 20;

/* What a run saw of B's place. */
struct seen_place {
  size_t most_host; /* the most of B on the host at a look */
  unsigned unmapped; /* looks that found some of B not mapped (parked) */
};

static void look(const struct real_driver* real, CUdeviceptr b, size_t size, struct seen_place* seen) {
  struct placement p;
  if (locate(real, b, size, 0, &p) != CUDA_SUCCESS) {
    ++seen->unmapped;
  } else if (p.bytes[tier_host] > seen->most_host) {
    seen->most_host = p.bytes[tier_host];
  }
}

/* Words of B (`words` of them, read back) that do not hold `count`; the first shown. */
static size_t wrong_words(const unsigned* host, size_t words, unsigned count) {
  size_t wrong = 0;
  for (size_t i = 0; i < words; ++i) {
    if (host[i] != count && wrong++ == 0) {
      fprintf(stderr, "%s: B's word %zu holds %u, not %u\n", PROGRAM, i, host[i], count);
    }
  }
  return wrong;
}

int main(int argc, char** argv) {
  const char* reach = argc > 1 ? argv[1] : "";
  const int seen = strcmp(reach, "seen") == 0, hidden = strcmp(reach, "hidden") == 0;
  const int unified = strcmp(reach, "unified") == 0;
  const size_t fill = argc > 2 ? strtoull(argv[2], NULL, 10) << 20 : 0;
  const size_t block = argc > 3 ? strtoull(argv[3], NULL, 10) << 20 : 0;
  const double seconds = argc > 4 ? strtod(argv[4], NULL) : 3;
  const int known = seen || hidden || unified || strcmp(reach, "unseen") == 0;
  if (argc < 4 || argc > 5 || !known || block == 0 || !(seconds > 1)) {
    fprintf(stderr, "usage: %s seen|unseen|unified|hidden FILL_MIB BLOCK_MIB [SECONDS > 1]\n", PROGRAM);
    return 2;
  }
  struct real_driver real;
  if (open_real_driver(&real) != 0) {
    fprintf(stderr, "%s: set GMEM_REAL_LIBCUDA to the real driver (to ask it past the shim)\n", PROGRAM);
    return 2;
  }
  CUcontext ctx;
  CHECK(use_device0(&ctx));
  CUmodule module;
  CUfunction step;
  int sms = 0;
  const int loaded = load_step(gmem_pointer_table_kernels, gmem_pointer_table_kernels_size, "gmem_pointer_table_step",
                               0, &module, &step, &sms);
  if (loaded != 0) return loaded;

  /* The table and the kernel's counters live past the pool: B alone is the pool's. */
  struct raw_memory side;
  const CUmemLocation on_device = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CHECK(raw_map(&real, on_device, spill_step, 0, &side));
  CUdeviceptr table = side.ptr, bad = side.ptr + 64, b = 0;
  CHECK(cuMemAlloc(&b, block));
  CHECK(cuMemsetD32(b, 0, block / 4));
  if (hidden) {
    CHECK(cuMemsetD32(table, (unsigned)b, 1));
    CHECK(cuMemsetD32(table + 4, (unsigned)(b >> 32), 1));
  } else if (unified) {
    CHECK(cuMemcpy(table, (CUdeviceptr)&b, sizeof b));
  } else {
    CHECK(cuMemcpyHtoD(table, &b, sizeof b));
  }
  const unsigned long long start_bad[2] = {0, ~0ull};
  CHECK(cuMemcpyHtoD(bad, start_bad, sizeof start_bad));
  const size_t fills = (fill + block - 1) / block;
  CUdeviceptr* filler = calloc(fills ? fills : 1, sizeof *filler);
  unsigned* host = malloc(block);
  if (!filler || !host) return 1;
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  CUdeviceptr shown = seen ? b : 0;
  unsigned long long n = block / 16;
  struct seen_place place = {0, 0};
  unsigned count = 0;
  int filled = 0;
  const double start = now();
  while (now() - start < seconds) {
    if (!filled && now() - start >= 1) {
      for (size_t i = 0; i < fills; ++i) CHECK(cuMemAlloc(&filler[i], block));
      filled = 1;
    }
    unsigned expect = count;
    void* args[] = {&table, &shown, &n, &expect, &bad};
    CHECK(cuLaunchKernel(step, 4 * (unsigned)sms, 1, 1, threads, 1, 1, 0, stream, args, NULL));
    if (++count % sync_every == 0) {
      CHECK(cuStreamSynchronize(stream));
      look(&real, b, block, &place);
      if (seen && filled && count % pause_every == 0) {
        nanosleep(&(struct timespec){0, pause_ms * 1000000L}, NULL);
        look(&real, b, block, &place);
      }
    }
  }
  CHECK(cuStreamSynchronize(stream));
  unsigned long long found[2];
  CHECK(cuMemcpyDtoH(found, bad, sizeof found));
  CHECK(cuMemcpyDtoH(host, b, block));
  const size_t wrong = wrong_words(host, block / 4, count);
  const int ok = found[0] == 0 && wrong == 0;
  printf("%s: %s: %u steps over B (%zu MiB) in %.1f s, %zu MiB filled after 1 s; B at most %zu MiB on the host, "
         "unmapped at %u of %u looks; kernels saw %llu wrong words (first at step %llu), %zu wrong at the end: %s\n",
         PROGRAM, reach, count, block / mib, now() - start, fills * block / mib,
         place.most_host / mib, place.unmapped, count / sync_every, found[0], found[0] ? found[1] : 0, wrong,
         ok ? "PASS" : "FAIL");
  for (size_t i = 0; i < fills; ++i) CHECK(cuMemFree(filler[i]));
  CHECK(cuMemFree(b));
  CHECK(cuStreamDestroy(stream));
  CHECK(raw_unmap(&real, &side));
  free(filler);
  free(host);
  return ok ? 0 : 1;
}
