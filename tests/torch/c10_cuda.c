// Reproduces what DeviceCachingAllocator::malloc of torch 2.x
// (c10/cuda/CUDACachingAllocator.cpp) asks of the driver: a cached segment
// that fits; else cudaMalloc (alloc_block); on out of memory,
// release_available_cached_blocks (a no-op unless max_split_size is set: then
// it frees oversize segments, and tries again only if they cover the
// request), then release_cached_blocks synchronizes and frees every cached
// segment, then one last attempt, then OutOfMemoryError. Built as
// libc10_cuda.so, the name gmem looks for on the stack (interpose/torch_retry.h).
#include "c10_cuda.h"

enum { max_segments = 256 };

static struct {
  CUdeviceptr ptr;
  size_t size;
  int cached;
} segments[max_segments];
static unsigned count, refusals, calls;
static size_t max_split;

static int find(CUdeviceptr ptr) {
  for (unsigned i = 0; i < count; ++i)
    if (segments[i].ptr == ptr) return (int)i;
  return -1;
}

static void forget(unsigned i) { segments[i] = segments[--count]; }

// The smallest cached segment that holds `size`; -1 if none.
static int best_fit(size_t size) {
  int best = -1;
  for (unsigned i = 0; i < count; ++i) {
    if (segments[i].cached && segments[i].size >= size && (best < 0 || segments[i].size < segments[best].size))
      best = (int)i;
  }
  return best;
}

static CUresult alloc_block(CUdeviceptr* ptr, size_t size) {
  CUresult status = cuMemAlloc(ptr, size);
  if (status == CUDA_ERROR_OUT_OF_MEMORY) ++refusals;
  return status;
}

void c10_empty_cache(void) {
  cuCtxSynchronize();  // synchronize_and_free_events
  for (unsigned i = 0; i < count;) {
    if (segments[i].cached) {
      cuMemFree(segments[i].ptr);
      forget(i);
    } else {
      ++i;
    }
  }
}

void c10_set_max_split_size(size_t size) { max_split = size; }

// The largest cached oversize segment; -1 if none.
static int largest_oversize(void) {
  int best = -1;
  for (unsigned i = 0; i < count; ++i) {
    if (segments[i].cached && segments[i].size >= max_split && (best < 0 || segments[i].size > segments[best].size))
      best = (int)i;
  }
  return best;
}

// Frees oversize cached segments, largest first, until they cover `size`;
// whether they did.
static int release_available(size_t size) {
  if (!max_split) return 0;
  const size_t want = size < max_split ? max_split : size;
  size_t freed = 0;
  for (int i = largest_oversize(); i >= 0 && freed < want; i = largest_oversize()) {
    freed += segments[i].size;
    cuMemFree(segments[i].ptr);
    forget((unsigned)i);
  }
  return freed >= want;
}

CUresult c10_malloc(CUdeviceptr* ptr, size_t size) {
  int fit = best_fit(size);
  if (fit >= 0) {
    segments[fit].cached = 0;
    *ptr = segments[fit].ptr;
    return CUDA_SUCCESS;
  }
  if (count == max_segments) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult status = alloc_block(ptr, size);
  if (status == CUDA_ERROR_OUT_OF_MEMORY && release_available(size)) status = alloc_block(ptr, size);
  if (status == CUDA_ERROR_OUT_OF_MEMORY) {
    c10_empty_cache();  // release_cached_blocks
    status = alloc_block(ptr, size);
  }
  if (status != CUDA_SUCCESS) return status;
  segments[count].ptr = *ptr;
  segments[count].size = size;
  segments[count].cached = 0;
  ++count;
  return CUDA_SUCCESS;
}

void c10_free(CUdeviceptr ptr) {
  int i = find(ptr);
  if (i >= 0) segments[i].cached = 1;
}

size_t c10_cached_bytes(void) {
  size_t bytes = 0;
  for (unsigned i = 0; i < count; ++i) bytes += segments[i].cached ? segments[i].size : 0;
  return bytes;
}

unsigned c10_refusals(void) { return refusals; }

void c10_call(void (*work)(void*), void* arg) {
  work(arg);
  ++calls;  // after the call: this frame stays on the stack during it
}
