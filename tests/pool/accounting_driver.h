// A driver that only keeps accounts (no memory behind it), for the pool's
// policy replays and the unit tests of its parts: one device whose host has
// a NUMA node for pinned chunks (the spill tiers' host tier), and with
// peer_total a second device, its peer; chunks made and released,
// mappings, copies (with contents, where a test asks: Accounts::cell), and events that complete `lag` calls after they were recorded,
// as on a GPU that runs behind the program. Single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "vmm/driver.h"

namespace gmem::accounting {

constexpr std::size_t granularity = 2 << 20;

struct Accounts {
  std::size_t total = std::size_t{80} << 30;
  std::size_t used = 0;       // device memory
  std::size_t host_used = 0;  // pinned host memory (the tiers keep its budget)
  std::size_t peer_total = 0, peer_used = 0;  // device 1's memory (0: no such device)
  struct Chunk {
    std::size_t size;
    bool host;  // pinned host memory, else the device's
    bool peer;  // device 1's
  };
  std::map<CUmemGenericAllocationHandle, Chunk> chunks;
  CUmemGenericAllocationHandle next_handle = 1;
  CUdeviceptr next_address = CUdeviceptr{1} << 40;
  uint64_t creates = 0, releases = 0, maps = 0, unmaps = 0, events = 0, syncs = 0, event_syncs = 0;
  uint64_t host_creates = 0, host_maps = 0;  // of creates and maps
  uint64_t host_mapped = 0;  // bytes of host chunks mapped (a GPU's mapping costs per page)
  uint64_t copied = 0;  // bytes, by cuMemcpyDtoDAsync and cuMemcpyDtoD
  // What each mapped address range maps, by its first address. cuMemMap over
  // a mapped address and cuMemUnmap of part of a mapping fail, as the
  // driver's do.
  struct Mapping {
    std::size_t size;
    CUmemGenericAllocationHandle handle;
  };
  std::map<CUdeviceptr, Mapping> mappings;
  // Handles cuMemRetainAllocationHandle gave out, not yet released again.
  std::map<CUmemGenericAllocationHandle, uint64_t> retained;
  // Where a test sets `cell` (after reset), the chunks' contents: one value
  // per `cell` bytes of each chunk, 0 when it is made; copies carry them.
  std::size_t cell = 0;
  std::map<CUmemGenericAllocationHandle, std::vector<uint64_t>> content;
};
// Memory behind addresses: `size` bytes of chunk `handle` from `offset`.
struct Backing {
  CUmemGenericAllocationHandle handle;
  std::size_t offset, size;
  bool operator==(const Backing&) const = default;
};
// The chunks behind [ptr, ptr + size), in address order; false, with `out`
// as far as it got, where some address in it is not mapped.
bool backing(CUdeviceptr ptr, std::size_t size, std::vector<Backing>* out);
// Contents (Accounts::cell): every cell of [ptr, ptr + size) set to `value`
// and its place (the cell's index from ptr), as a kernel would write it, so
// that bytes moved to another offset show; false where some address is not
// mapped or the range does not fall on cells.
bool write(CUdeviceptr ptr, std::size_t size, uint64_t value);
// Whether every cell of [ptr, ptr + size) holds what write(ptr, size, value)
// put there, as a kernel reads it.
bool holds(CUdeviceptr ptr, std::size_t size, uint64_t value);
// A hash of the cells of [ptr, ptr + size) (as VmmPool::ContentReader reads).
bool digest(CUdeviceptr ptr, std::size_t size, uint64_t* hash);
extern Accounts accounts;
// The GPU runs `lag` calls behind the program: an event recorded at call
// `now` completes once `now` has advanced by `lag` (0: at once); a
// synchronization completes every one.
extern uint64_t lag, now;
// A point in the program's calls, and whether the device has since reached
// it: `lag` calls on, or at any synchronization after it (which may have
// waited for less: a check of freed memory errs towards the free being done).
struct Moment {
  uint64_t at, syncs;
};
Moment moment();
bool reached(const Moment& m);
// Stream-ordered frees the device has not reached yet, each with the memory
// that lay behind its addresses when it was made: work queued before a free
// may still use them, so that memory must stay until the free completes.
class FreesInFlight {
 public:
  struct Freed {
    CUdeviceptr base;
    std::size_t bytes;
    std::vector<Backing> behind;
    uint64_t stream;
    Moment when;
  };
  // [base, base + bytes), `behind` it, freed now on `stream`.
  void freed(CUdeviceptr base, std::size_t bytes, std::vector<Backing> behind, uint64_t stream = 0);
  // The frees not reached yet (those reached are forgotten).
  const std::vector<Freed>& pending();
  // Of those, the ones whose addresses now map other memory than at the free.
  std::vector<const Freed*> remapped();

 private:
  std::vector<Freed> pending_;
};

// Fresh accounts for a device of `total` bytes (and a peer of `peer_total`), events forgotten.
void reset(std::size_t total = std::size_t{80} << 30, std::size_t peer_total = 0);
vmm::Driver driver();

}  // namespace gmem::accounting
