// The live allocations of the process, and the counters kept over them.
// Thread-safe: the map is sharded by key, one short lock per operation; the
// counters are atomic.
#pragma once

#include <array>
#include <atomic>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "pool/allocation.h"
#include "pool/publisher.h"

namespace gmem::pool {

// Counters per kind, shared by the registries of one pool; with a publisher,
// also the per-device figures and the placement table it publishes.
class Ledger {
 public:
  explicit Ledger(Publisher* publisher = nullptr) : publisher_(publisher) {}
  // Sets allocation.placement.
  void count_allocation(Allocation& allocation);
  void count_free(const Allocation& allocation);
  // Its memory moved: `host` and `peer` bytes of it now lie in those tiers.
  void count_move(Allocation& allocation, std::size_t host, std::size_t peer, uint16_t chunks);
  Stats stats() const;

 private:
  void place(Allocation& allocation);
  struct Counters {
    std::atomic<uint64_t> allocations{0}, frees{0}, bytes{0}, live_bytes{0}, peak_bytes{0};
  };
  Publisher* const publisher_;
  std::array<Counters, kind_count> counters_;
  std::atomic<uint64_t> live_bytes_{0}, peak_bytes_{0};
};

class Registry {
 public:
  explicit Registry(Ledger& ledger) : ledger_(ledger) {}

  // Records a new allocation. An entry already at the same key is stale (the
  // driver reused the address, so it was freed behind our back) and is counted
  // as freed.
  void insert(Allocation allocation);

  // Takes an allocation out of the map without counting a free: the caller frees
  // it in the driver, then calls count_free() on success or put_back() on failure.
  std::optional<Allocation> take(uint64_t key);
  void put_back(const Allocation& allocation);
  void count_free(const Allocation& allocation) { ledger_.count_free(allocation); }

  // Adds a reference (cuMemRetainAllocationHandle); false if the key is unknown.
  bool retain(uint64_t key);

  std::optional<Allocation> find(uint64_t key) const;

  // The pool moved the memory of the allocation at `key` (if still live):
  // `host` and `peer` bytes of it now lie in those tiers, in `chunks` chunks.
  void replace_placement(uint64_t key, std::size_t host, std::size_t peer, uint16_t chunks);

  // Forgets every allocation of a context the driver destroyed, counted as freed.
  void purge_context(CUcontext context);

  Stats stats() const { return ledger_.stats(); }

 private:
  struct Shard {
    mutable std::mutex mutex;
    std::unordered_map<uint64_t, Allocation> map;
  };
  Shard& shard(uint64_t key);
  const Shard& shard(uint64_t key) const;

  static constexpr std::size_t shard_count = 16;
  std::array<Shard, shard_count> shards_;
  Ledger& ledger_;
};

}  // namespace gmem::pool
