/* The live statistics a process under gmem publishes, as a file in shared
 * memory that readers (gmemd) map read-only. This layout is a public contract:
 * fields are only ever added (into reserved slots or after the last field), and
 * a change that moves or redefines a field changes GMEM_STATS_VERSION. A reader
 * that meets a version it does not know reports it and reads nothing more.
 *
 * File: <stats_dir>/gmem.<pid> (stats_dir from GMEM_CONF, default /dev/shm),
 * mode 0600, created at the process's first CUDA call and removed at its exit;
 * a process that dies without exiting leaves it for gmemd to sweep.
 *
 * Concurrency: one process writes, any number read, with no lock. Every field
 * is a naturally aligned 64-bit (or narrower, write-once) integer; the writer
 * updates counters with atomic 64-bit stores, so a reader loading each field
 * atomically sees each value whole (figures of one device may be a few
 * operations apart from each other). Placement entries are written under a
 * per-entry sequence lock: read `sequence`, the fields, then `sequence` again;
 * keep the entry only if both reads are equal and even. The header is complete
 * once `magic` reads GMEM_STATS_MAGIC (the writer stores it last). */
#ifndef GMEM_STATS_H
#define GMEM_STATS_H

#include <stdint.h>

#define GMEM_STATS_MAGIC UINT64_C(0x31534d454d47) /* "GMEMS1\0\0" little-endian */
#define GMEM_STATS_VERSION 1
#define GMEM_STATS_FILE_PREFIX "gmem."
#define GMEM_STATS_MAX_DEVICES 16
#define GMEM_STATS_DEVICE_SLOTS 32 /* uint64_t slots per device; unused ones are 0 */
#define GMEM_STATS_PLACEMENT_CAPACITY 65536
#define GMEM_STATS_TEXT 256

/* Per-device figures, X(name, doc), each one uint64_t, in this order.
 * Fragmentation = 1 - in_use_bytes / reserved_bytes. */
#define GMEM_DEVICE_STATS(X)                                                                      \
  X(reserved_bytes, "physical memory held for this device: gmem's chunks (spilled ones too), plus " \
                    "memory left to the driver (pool:driver) as the program requested it")        \
  X(in_use_bytes, "bytes of live allocations, as the program requested them")                     \
  X(cached_free_bytes, "held but not in use: reusable without asking the driver")                 \
  X(largest_free_bytes, "the largest free range reusable as it is, without stitching")            \
  X(stitched_ranges, "live mapped ranges made of more than one physical chunk")                   \
  X(mappings, "physical chunks mapped (each mapping costs a map and set-access call)")            \
  X(chunks, "physical chunks held")                                                               \
  X(peak_reserved_bytes, "highest reserved_bytes so far")                                         \
  X(peak_in_use_bytes, "highest in_use_bytes so far")                                             \
  X(allocations, "allocations served since the process started")                                 \
  X(frees, "frees since the process started")                                                     \
  X(stitches, "requests served by stitching cached chunks into a new range")                      \
  X(oom_releases, "times the driver was out of memory and the pool released cached memory")       \
  X(device_bytes, "live bytes placed in this device's memory")                                    \
  X(host_bytes, "live bytes of this device's allocations spilled to pinned host memory")          \
  X(peer_bytes, "live bytes of this device's allocations spilled to a peer GPU's memory")         \
  X(host_reserved_bytes, "pinned host memory held for this device (part of reserved_bytes)")     \
  X(peer_reserved_bytes, "peer GPU memory held for this device (part of reserved_bytes)")         \
  X(host_prepared_bytes, "pinned host memory prepared ahead of need, not yet used (on the device " \
                         "whose near-full started the preparer)")                          \
  X(dedup_marked_bytes, "live bytes marked read-only and offered for sharing (dedup), mapped "    \
                        "read-only")                                                              \
  X(dedup_shared_bytes, "live bytes mapped onto a copy another process made (dedup): device "     \
                        "memory this process saves")                                        \
  X(moved_back_bytes, "spilled bytes of live allocations moved back to this device's memory "    \
                      "since the process started (the program paused meanwhile)")       \
  X(access_launches, "kernel launches whose parameters held an address of this device's pool " \
                     "memory (track_access)")                                               \
  X(host_access_bytes, "for each such launch, the bytes of each pool range it referenced that " \
                       "lie in pinned host memory: an upper estimate of the bytes kernels "      \
                       "pulled over PCIe")                                                  \
  X(peer_access_bytes, "as host_access_bytes, for bytes in a peer GPU's memory (NVLink)")

/* Where an allocation's memory lives. */
enum gmem_tier { GMEM_TIER_DEVICE = 0, GMEM_TIER_HOST = 1, GMEM_TIER_PEER = 2 };

/* What the program asked for (the pool's allocation kinds). */
enum gmem_kind {
  GMEM_KIND_DEVICE = 0,  /* cuMemAlloc */
  GMEM_KIND_PITCHED = 1, /* cuMemAllocPitch */
  GMEM_KIND_MANAGED = 2, /* cuMemAllocManaged */
  GMEM_KIND_ASYNC = 3,   /* cuMemAllocAsync / FromPoolAsync */
  GMEM_KIND_VMM = 4      /* cuMemCreate by the program itself */
};

struct gmem_device_stats {
  uint8_t uuid[16]; /* CUuuid of the device; all zero until the device is first used */
  uint64_t slots[GMEM_STATS_DEVICE_SLOTS];
};

/* Index of each figure in gmem_device_stats.slots. */
enum gmem_device_stat {
#define GMEM_DEVICE_STAT_INDEX(name, doc) GMEM_STAT_##name,
  GMEM_DEVICE_STATS(GMEM_DEVICE_STAT_INDEX)
#undef GMEM_DEVICE_STAT_INDEX
  GMEM_DEVICE_STAT_COUNT
};

/* One live allocation. A slot with size 0 is unused. */
struct gmem_placement {
  uint64_t sequence; /* odd while the writer changes the entry */
  uint64_t base;     /* device address the program holds */
  uint64_t size;     /* bytes as requested */
  uint64_t physical; /* physical bytes behind it (size rounded to the pool's granularity) */
  int32_t device;    /* device ordinal of the allocating context, -1 if unknown */
  uint8_t tier;      /* enum gmem_tier */
  uint8_t kind;      /* enum gmem_kind */
  uint16_t chunks;   /* physical chunks mapped for it; > 1: stitched */
  uint64_t host_bytes; /* of `size`, bytes in pinned host memory (tier: the slowest part's) */
  uint64_t peer_bytes; /* of `size`, bytes in a peer GPU's memory */
};

struct gmem_stats_header {
  uint64_t magic;              /* GMEM_STATS_MAGIC, stored last */
  uint32_t version;            /* GMEM_STATS_VERSION */
  uint32_t header_bytes;       /* sizeof(struct gmem_stats_header) */
  int32_t pid;                 /* the writing process */
  uint32_t uid;                /* its real uid */
  uint64_t start_ticks;        /* its start time, field 22 of /proc/<pid>/stat: tells pid reuse */
  uint64_t start_unix_ns;      /* its start time, CLOCK_REALTIME */
  uint32_t device_count;       /* highest device ordinal used + 1 (<= GMEM_STATS_MAX_DEVICES) */
  uint32_t device_offset;      /* offset of gmem_device_stats[GMEM_STATS_MAX_DEVICES] */
  uint32_t device_stride;      /* sizeof(struct gmem_device_stats) */
  uint32_t placement_offset;   /* offset of gmem_placement[placement_capacity] */
  uint32_t placement_stride;   /* sizeof(struct gmem_placement) */
  uint32_t placement_capacity; /* entries in the table */
  uint64_t placement_dropped;  /* live allocations not listed because the table was full */
  char command[GMEM_STATS_TEXT]; /* argv joined by spaces, truncated, NUL-terminated */
  char config[GMEM_STATS_TEXT];  /* GMEM_CONF as given, truncated, NUL-terminated */
  uint64_t reserved[16];
};

#endif /* GMEM_STATS_H */
