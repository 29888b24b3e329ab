// The test stand-in for PyTorch's CUDA caching allocator (libc10_cuda.so):
// freed segments stay cached, and on out of memory the cache goes back to the
// driver and the request is tried once more, as torch does.
#pragma once

#include <cuda.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// A segment of at least `size` bytes: a cached one that fits, else new memory.
CUresult c10_malloc(CUdeviceptr* ptr, size_t size);
// Back into the cache; the driver keeps the memory.
void c10_free(CUdeviceptr ptr);
// Every cached segment back to the driver (torch.cuda.empty_cache()).
void c10_empty_cache(void);
size_t c10_cached_bytes(void);
// The requests the driver refused with out of memory, retried or not.
unsigned c10_refusals(void);
// PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb: segments of at least `size`
// bytes are oversize, and on out of memory torch first frees only those (0:
// unset, torch's default).
void c10_set_max_split_size(size_t size);
// Calls `work`, as torch calls a library (cuBLAS) that may allocate itself.
void c10_call(void (*work)(void*), void* arg);

#ifdef __cplusplus
}
#endif
