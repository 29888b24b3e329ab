// What the job does with its large allocations, by requested size: how many
// launches referenced each while it lived (pool/access.h) and how much of it
// lay in pinned host memory. Training steps repeat their requests, so a size
// names the same tensor from step to step; these figures are what placing
// memory by use would go on. report:1 prints them at exit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "pool/access.h"

namespace gmem::pool {

class Uses {
 public:
  // Allocations below this size are not followed (they live in slabs and
  // small ranges, shared with others).
  static constexpr std::size_t min_size = std::size_t{64} << 20;

  explicit Uses(AccessTable* table) : table_(table) {}

  struct Figures {
    uint64_t allocations = 0;  // freed, of this size
    uint64_t launches = 0;     // that referenced them, over their lives
    uint64_t host_bytes = 0;   // theirs in pinned host memory when freed
    bool operator==(const Figures&) const = default;
  };

  // The allocation at `base` was served: its range's counts start over.
  void served(CUdeviceptr base, std::size_t size);
  // The allocation at `base` is about to be freed: its counts join its size's.
  void freed(CUdeviceptr base, std::size_t size);
  // The figures of one size (zero if never freed).
  Figures of(std::size_t size) const;
  // "gmem: report use ..." lines: the `most` sizes with the most bytes freed
  // in host memory, then by bytes freed.
  std::string report(std::size_t most = 12) const;

 private:
  // The record of the range that starts at `base`, or null.
  AccessRecord* record(CUdeviceptr base, std::size_t size) const;

  AccessTable* const table_;
  mutable std::mutex mutex_;
  std::map<std::size_t, Figures> by_size_;
};

}  // namespace gmem::pool
