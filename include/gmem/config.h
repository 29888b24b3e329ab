// The keys of GMEM_CONF (GMEM_CONF=key:value,key:value), in one table: the shim
// parses them from it, and the README's table is checked against it.
#pragma once

// X(name, type, default, doc). Types: flag (0/1), level (a log level),
// source (driver or vmm), percent (a number from 0 to 1000), path (an
// absolute directory), socket (an absolute path, or empty for the default).
#define GMEM_CONFIG_KEYS(X)                                                          \
  X(disable, flag, "0",                                                              \
    "1: forward every driver call untouched; no pool, no accounting")                \
  X(report, flag, "0",                                                               \
    "1: print a summary of the allocations seen (counts, live and peak bytes) to "   \
    "stderr at exit")                                                                \
  X(pool, source, "driver",                                                          \
    "where cuMemAlloc memory comes from: driver (the real driver) or vmm (gmem's "  \
    "pool of cached, stitched VMM chunks; experimental)")                           \
  X(pool_headroom, percent, "1.5",                                                   \
    "pool:vmm grows while it holds at most this percentage more than its peak use; "  \
    "beyond, it restitches cached memory (more: faster, less: less memory)")          \
  X(stats, flag, "1",                                                                \
    "1: publish live figures (include/gmem/stats.h) for gmemd and gmemctl in a "      \
    "file in stats_dir, removed at exit")                                             \
  X(stats_dir, path, "/dev/shm",                                                     \
    "the directory of the stats files (gmemd --stats-dir must name the same)")       \
  X(dedup, flag, "0",                                                                \
    "1: with pool:vmm, allocations marked read-only (include/gmem/dedup.h) are "      \
    "shared with processes of the same user holding identical bytes, through the "    \
    "dedup broker (gmemd --dedup-socket); docs/dedup.md")                             \
  X(dedup_socket, socket, "",                                                        \
    "the dedup broker's unix socket; empty: $XDG_RUNTIME_DIR/gmem/dedup.sock "        \
    "(/run/gmem/dedup.sock for root, /tmp/gmem-UID/dedup.sock without XDG_RUNTIME_DIR)") \
  X(log_level, level, "warn",                                                        \
    "messages on stderr at or above this level: trace, debug, info, warn, error, "   \
    "critical, off")

// Exit status of a job stopped because GMEM_CONF could not be read (EX_CONFIG).
#define GMEM_EXIT_BAD_CONFIG 78
