/* Cross-process dedup of read-only device memory: the C API a program (or the
 * Python helper, scripts/gmem_dedup.py) calls to declare content read-only.
 * The shim exports these functions next to the driver's; call them through
 * dlsym(RTLD_DEFAULT, "gmem_dedup_mark") so that a program also runs without
 * gmem (the symbol is then absent).
 *
 * Contract (docs/dedup.md): with GMEM_CONF=pool:vmm,dedup:1, an allocation
 * of the VMM pool larger than 1 MiB whose every byte has been marked becomes
 * a candidate: its content is hashed, offered to the dedup broker (gmemd
 * --dedup-socket), and, when another process of the same user holds identical
 * bytes (compared byte for byte, never on the hash alone), the allocation is
 * remapped read-only onto the other process's physical memory and its own
 * memory goes back to the driver. Marked memory must not be written: a write
 * through a shared, read-only mapping is an illegal-address error that ends
 * the process's CUDA context. Unmark first: it gives the range private,
 * writable memory with the same content (copy-on-write by hand). Freeing a
 * marked allocation unmarks it. */
#ifndef GMEM_DEDUP_H
#define GMEM_DEDUP_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the shim's public functions; scripts/gen_driver_api.py exports every
 * function declared with it in this header. */
#ifndef GMEM_API
#define GMEM_API
#endif

enum gmem_dedup_status {
  GMEM_DEDUP_OK = 0,
  GMEM_DEDUP_DISABLED = 1,     /* dedup is off (GMEM_CONF dedup:0, or disable:1) */
  GMEM_DEDUP_INVALID = 2,      /* null address, zero size, or a range that wraps */
  GMEM_DEDUP_NOT_POOLED = 3,   /* not a live allocation of gmem's VMM pool (pool:vmm) larger than 1 MiB */
  GMEM_DEDUP_SPANS = 4,        /* the range runs past the end of its allocation */
  GMEM_DEDUP_NOT_MARKED = 5,   /* unmark of an allocation that has no mark */
  GMEM_DEDUP_DRIVER_ERROR = 6, /* a driver call failed (gmem_dedup_last_driver_error says which result) */
  GMEM_DEDUP_NO_BROKER = 7     /* marked, but no dedup broker answers: nothing is shared */
};

/* What gmem_dedup_query reports about an allocation. */
enum gmem_dedup_state {
  GMEM_DEDUP_PRIVATE = 0, /* not (wholly) marked */
  GMEM_DEDUP_MARKED = 1,  /* wholly marked, offered; its own memory, mapped read-write */
  GMEM_DEDUP_SHARED = 2   /* mapped read-only onto a copy shared with another process */
};

/* Declares [ptr, ptr + size) read-only. Once every byte of its allocation is
 * marked, the allocation is hashed and offered (this call waits for that,
 * and for a merge when a match is found). */
GMEM_API int gmem_dedup_mark(unsigned long long ptr, size_t size);
/* Takes every mark off the allocation holding ptr; a shared allocation first
 * gets private, writable memory with the same content. */
GMEM_API int gmem_dedup_unmark(unsigned long long ptr);
/* The allocation's state (enum gmem_dedup_state) in *state. */
GMEM_API int gmem_dedup_query(unsigned long long ptr, int* state);
/* The CUresult of the last failed driver call of this thread's dedup call. */
GMEM_API int gmem_dedup_last_driver_error(void);

#ifdef __cplusplus
}
#endif

#endif /* GMEM_DEDUP_H */
