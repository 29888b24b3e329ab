// The keys of GMEM_CONF (GMEM_CONF=key:value,key:value), in one table: the shim
// parses them from it, and the README's table is checked against it.
#pragma once

// X(name, type, default, doc). Types: flag (0/1), level (a log level),
// source (driver or vmm), percent (a number from 0 to 1000), path (an
// absolute directory), amount (bytes with an optional K/M/G/T suffix, or a
// percentage of a capacity: 50%), mem_info (device or tiers), bring_in (off,
// tried or always), gbps (a rate in GB/s), socket (an
// absolute path, or empty for the default), file (an absolute path, or empty
// for none), plan (an absolute path, auto, or empty for none), millis (a
// whole number of milliseconds, at most an hour).
#define GMEM_CONFIG_KEYS(X)                                                          \
  X(disable, flag, "0",                                                              \
    "1: forward every driver call untouched; no pool, no accounting")                \
  X(report, flag, "0",                                                               \
    "1: print a summary of the allocations seen (counts, live and peak bytes) to "   \
    "stderr at exit")                                                                \
  X(pool, source, "vmm",                                                             \
    "where cuMemAlloc memory comes from: vmm (gmem's pool of cached, stitched VMM "   \
    "chunks, which spills past the device) or driver (the real driver, as without " \
    "gmem; the pass-through)")                                                       \
  X(pool_headroom, percent, "1.5",                                                   \
    "pool:vmm makes new memory while it holds at most this percentage more than its " \
    "peak use; beyond, it remakes free chunks at the size needed and waits for "       \
    "pending frees instead (more: less waiting, less: less memory)")                  \
  X(device_budget, amount, "100%",                                                   \
    "pool:vmm holds at most this much of each device's own memory (a size such as "   \
    "60G, or a share of the device's memory); what does not fit spills to a peer "    \
    "GPU, then to pinned host memory")                                                \
  X(device_reserve, amount, "1G",                                                    \
    "device memory a spill leaves free for the driver's own use (kernels' local "    \
    "memory, modules): a device filled to its last chunk fails kernels with out of " \
    "memory (a size, or a share of the device's memory)")                            \
  X(peer_budget, amount, "100%",                                                     \
    "the most pool:vmm spills to each peer GPU the device can reach (P2P, NVLink "    \
    "first), as a size or a share of the peer's memory; 0: no peer tier")            \
  X(peer_reserve, amount, "10%",                                                     \
    "memory always left free on a peer GPU for its own jobs (a size, or a share of " \
    "the peer's memory)")                                                            \
  X(host_budget, amount, "50%",                                                      \
    "the most pinned host memory pool:vmm spills to, on the GPU's NUMA node (a size, " \
    "or a share of the host's available memory when first needed; pinned memory "    \
    "cannot be swapped, so half stays for the job's own host memory); 0: no host "   \
    "tier")                                                                           \
  X(host_prepare, amount, "1G",                                                      \
    "pinned host memory a background thread prepares ahead of need, in host_chunk "   \
    "chunks, once a device is near full (a size, or a share of host_budget); 0: no "  \
    "thread")                                                                         \
  X(host_chunk, amount, "256M",                                                       \
    "pinned host memory is made in chunks of this size (at most a 16th of "           \
    "host_budget), and a spill needing less in the smallest power of two of the "     \
    "granularity that holds it, so that a freed chunk serves later spills of any "    \
    "size (a size, or a share of host_budget)")                                       \
  X(host_pool, flag, "1",                                                            \
    "1: host chunks of host_chunk's size, and smaller ones where gmemd pinned "      \
    "some, are borrowed from gmemd's host pool (gmemd --host-pool: pinned before "   \
    "the job started) before any is pinned, when gmemd answers on "                  \
    "host_pool_socket; 0: the job pins all its own")                                 \
  X(host_pool_socket, socket, "",                                                    \
    "gmemd's host pool socket; empty: $XDG_RUNTIME_DIR/gmem/host-pool.sock "          \
    "(/run/gmem/host-pool.sock for root, /tmp/gmem-UID/host-pool.sock without "      \
    "XDG_RUNTIME_DIR)")                                                               \
  X(migrate_after_ms, millis, "1000",                                              \
    "with move_back:1, pool:vmm moves the spilled memory of live allocations back to " \
    "the device once no allocation has been served with spilled memory for this long " \
    "(and for twice the longest gap between such allocations, at most 5 minutes) and " \
    "the device has room again, the time the pool takes to serve such an allocation "  \
    "not counted as a gap; the program's launches and copies pause while it moves; "   \
    "bring_in and evict move memory only where it is not 0")                         \
  X(move_back, flag, "0",                                                            \
    "1: with pool:vmm and migrate_after_ms, live spilled memory moves back to the "    \
    "device as migrate_after_ms says (evict does so whatever this says); 0: it stays " \
    "where it lies. Off while a move back seems to change a deterministic LM's "       \
    "losses: on an H200, all 8 runs that moved 2 MiB back computed other losses than " \
    "the job in memory, and all runs without the move that reached the same "         \
    "reserved peak the same ones, though check_moves found every move exact "         \
    "(docs/results.md, forty-third to forty-fifth sessions)")                         \
  X(check_mappings, flag, "0",                                                       \
    "1: with pool:vmm, after every allocation that takes a range and every move, "     \
    "each chunk of each live range is checked against the driver's mappings "        \
    "(report:1 prints book_checks, book_mismatches and first_mismatch_request); a "    \
    "driver call per chunk, for finding where the pool's books and mappings part, "   \
    "not for speed")                                                                  \
  X(check_moves, flag, "0",                                                          \
    "1: with move_back, each chunk moved back is hashed by a kernel before and after " \
    "the move and read by a copy, and the chunk it left is kept out of use for 1024 " \
    "requests and hashed again (report:1 prints move_checks, move_mismatches, "      \
    "copy_stale, stale_checks, stale_writes and first_move_request); from the first " \
    "move on, the books are checked as check_mappings does; nothing is checked "      \
    "before the first move, so the pool's history up to it is the one without it")    \
  X(track_access, flag, "1",                                                         \
    "1: with pool:vmm, each kernel launch's parameters are looked up in the pool's "  \
    "ranges, counting per range the launches that reference it and the host and "    \
    "peer bytes they may pull (stats: host_access_bytes); 0: launches are not "       \
    "looked at")                                                                      \
  X(track_from, percent, "75",                                                       \
    "with track_access, launches are counted once the pool holds this percentage " \
    "of a device's memory, or the device spills (placing by use learns from the "  \
    "steps before its first peak); until then a launch costs only the gate; 0: "   \
    "from the first launch")                                                         \
  X(place_by_use, flag, "1",                                                         \
    "1: with pool:vmm and track_access, once a device spills and its steps repeat, " \
    "the large allocations alive at its peak use that kernels pass over least are "  \
    "placed off the device when requested, as much as the device lacked at the last "\
    "peak (launches over host memory are timed on the GPU: passes over a kind whose "\
    "kernels ran there 1.5x slower per byte than the fastest count that much more); "\
    "the plan is tried for three steps (more while they pin host memory) after "     \
    "four in the order requested and kept only if the mean of its last two is at least 5% shorter (report:1 prints " \
    "the trial); 0: the device first for every request, in the order made")         \
  X(pack_step, flag, "0",                                                            \
    "1 (an experiment): with place_by_use, the plan places every large request of "  \
    "the job's repeated step, each known by its number among its kind's requests "   \
    "since the step began, rather than those alive at the peak: the last step's "    \
    "lives are packed onto the device's room, the costliest first, each on the "     \
    "device as far as it fits through its life, the rest off it (pool/uses.h); 0: "  \
    "the plan places the kinds alive at the peak")                                     \
  X(recall_steps, flag, "1",                                                         \
    "1: with pool:vmm, while a device spills (and no evictor evicts there) and a "   \
    "step's requests of 64 MiB or more repeat the last step's (their sizes, in order), each takes the range that " \
    "served the same request of the last step, however it lies, a range whose "      \
    "chunks other ranges use is first made whole at its addresses with free chunks " \
    "(once its own free completed), "                                                 \
    "and a range made for one takes the free chunks of the ranges that served the "  \
    "step's later requests only where no others serve, and makes again first a "     \
    "device chunk mapped in no range with host chunks: steps settle with no mapping " \
    "where requests of one size would take each other's ranges (docs/results.md); "  \
    "0: a request takes the range that served it last by its size and the "          \
    "allocations of that size live")                                                 \
  X(keep_host_ranges, flag, "0",                                                    \
    "1 (an experiment): with pool:vmm, where the mover brings onto the device a "    \
    "range that lay wholly in host memory, its host chunks stay mapped at an "       \
    "address of their own, mapped while the copy runs, as a cached range that "      \
    "serves the requests that recalled the range moved; 0: they are unmapped, and "  \
    "such a request that repeats each step maps a range of host chunks again (the "  \
    "GCN capped at 31G of an H100: 100 host chunks a step, 240-280 ms with its "     \
    "stream out of work). Off by default: on an H100 that GCN's settled steps "      \
    "were 7.7% shorter with it, but it took three more steps, each 1.7-2.4x as "     \
    "long, to settle; the LM at 2.1x neither gained nor lost (docs/results.md)")     \
  X(plan_file, plan, "",                                                             \
    "with pool:vmm and place_by_use, the plan of the job's last run is read from "    \
    "this file at start, where it exists, and this run's is written there at exit "   \
    "(where its trial reached a verdict): a job run again places by use, or in the "  \
    "order requested if its plan was dropped, from the start, with no trial (under "  \
    "evict:tried, it evicts from the start where the last run kept eviction); a job " \
    "that changed plans its own kinds at its peaks; auto: a file per job in "         \
    "$XDG_CACHE_HOME/gmem/plans (else ~/.cache/gmem/plans), named for a hash of its " \
    "command line, working directory, GMEM_CONF, RANK and the machine's GPU models; " \
    "empty: none")                                                                    \
  X(evict, evict, "0",                                                               \
    "1: with pool:vmm, track_access and migrate_after_ms, while a device spills, "    \
    "large allocations no launch has referenced lately move to the host (the oldest " \
    "first) to keep room on the device for new requests, and come back, the last "   \
    "moved first, once room opens; a launch of a range on its way to the host keeps " \
    "it on the device, one of a range on its way back waits for it, and the job is "  \
    "never held while the device drains. While it evicts, an allocation that lay "    \
    "off the device since it was requested comes back too, as room opens. tried: "    \
    "the same, with place_by_use, on trial for three steps (more while they pin host memory) once placing by use's "    \
    "trial has ended and two more steps have been timed as its verdict places them, " \
    "and from then on only if the mean of its second and third steps was at least "   \
    "5% shorter than theirs (report:1 prints the trial); 0: never. "                  \
    "An allocation whose address a copy from host memory wrote into device memory "  \
    "stays on the device; kernels that reach memory through pointers they or other " \
    "calls wrote there are not seen, and fault if it moves (docs/eviction.md): an "   \
    "experiment, off by default")                                                    \
  X(evict_park, flag, "0",                                                           \
    "1: with evict, what the evictor moves off the device is parked: copied into "   \
    "host chunks mapped once at addresses of their own, and the allocation's "        \
    "addresses left unmapped until a call references it (then mapped onto those "     \
    "host chunks first) or the evictor brings it back; no host chunk is given the "  \
    "device's access at each move. A kernel that reaches a parked allocation "       \
    "through a reference gmem does not see (a pointer kept in device memory that "   \
    "no copy from host memory wrote) faults: off by default (docs/eviction.md)")      \
  X(bring_in, bring_in, "tried",                                                     \
    "with pool:vmm, track_access and migrate_after_ms (not evict:1; with "          \
    "evict:tried, not on a device on eviction's trial or that kept it), a kernel launch " \
    "whose parameters reference a large allocation lying partly in host memory "      \
    "waits while that memory is copied onto the device, where the device has room "  \
    "for all of it (free chunks, or its budget); the program's calls pause "          \
    "meanwhile, as for migrate_after_ms. tried: with place_by_use, once its trial "    \
    "dropped the plan, for three steps (more while they pin host memory), and "     \
    "from then on only if the mean of the last two was shorter than the shortest in the order requested; always: at "     \
    "every such launch; off: never")                                                  \
  X(slow_launch, gbps, "25",                                                         \
    "with bring_in tried or always and place_by_use or a trace (launches over host " \
    "memory timed on the GPU): a kernel whose last timed launch ran at fewer GB/s "   \
    "than this over the bytes its large references held in host memory (one that "  \
    "reads a range out of order: on an H100 the GCN's index_add_ read its source "    \
    "there at 16 GB/s) brings them onto the device at its next launches, as "         \
    "bring_in does, whatever bring_in's trial says (on an H200 capped at 31G the "    \
    "GCN kept its plan and stepped 2.70-2.73 s, against 5.25-5.28 s with 0; the LM "  \
    "once settled 4.74 s against 4.88 s: docs/results.md); 0: never")                 \
  X(torch_retry, flag, "1",                                                          \
    "1: under pool:vmm, PyTorch's caching allocator (a cuMemAlloc called from "        \
    "libc10_cuda.so) gives its cached blocks back before anything spills: its first "  \
    "request that would spill is refused with out of memory, torch frees its cache "   \
    "and asks again, and that retry is served, spilling if it must; no other caller "  \
    "is ever refused")                                                                  \
  X(mem_info, mem_info, "device",                                                    \
    "what cuMemGetInfo reports under pool:vmm: device (the device's memory, "         \
    "truthfully) or tiers (plus what peers and the host may still hold, for "        \
    "frameworks that size themselves from it)")                                      \
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
  X(trace, file, "",                                                                 \
    "pool:vmm writes every request it serves to this file (%p: the process id) as an " \
    "allocation trace (tests/traces/README.md; each allocation with the bytes placed " \
    "off the device by use, the large allocations each counted launch referenced, "  \
    "and the GPU time of each kernel launch over host memory), to be replayed "       \
    "without a GPU by pool-policy; empty: none")                                       \
  X(log_level, level, "warn",                                                        \
    "messages on stderr at or above this level: trace, debug, info, warn, error, "   \
    "critical, off")

// Exit status of a job stopped because GMEM_CONF could not be read (EX_CONFIG).
#define GMEM_EXIT_BAD_CONFIG 78
