// How much memory each tier may hold: a size, or a share of the tier's
// capacity (the device's memory, a peer's memory, the host's available memory).
#pragma once

#include <cstdint>

namespace gmem::pool {

struct Amount {
  uint64_t bytes = 0;
  double share = -1;  // >= 0: a share of the capacity, bytes unused

  static constexpr Amount of_bytes(uint64_t n) { return {n, -1}; }
  static constexpr Amount of_share(double s) { return {0, s}; }
  uint64_t of(uint64_t capacity) const {
    return share < 0 ? bytes : static_cast<uint64_t>(static_cast<double>(capacity) * share);
  }
};

// What cuMemGetInfo reports: the device's own memory (truthfully), or the
// device plus what the spill tiers may still hold.
enum class MemInfo : bool { device, tiers };

// Whether a launch's spilled references come onto the device first where it
// has room (Pool::bring_in): never, on trial once the steps repeat (kept only
// if it shortens them: pool/uses.h), or at every launch.
enum class BringIn { off, tried, always };

// Whether live memory moves between the device and the spill tiers while a
// device spills (pool/evictor.h): never, at all times, or on trial once the
// steps repeat, after placing by use's (kept only if it shortens them:
// pool/uses.h).
enum class Evict { off, always, tried };

struct Budgets {
  Amount device = Amount::of_share(1.0);       // of the device's memory
  Amount device_reserve = Amount::of_bytes(uint64_t{1} << 30);  // left free by a spill
  Amount peer = Amount::of_share(1.0);         // of each peer's memory
  Amount peer_reserve = Amount::of_share(0.1); // left free on each peer
  Amount host = Amount::of_share(0.5);         // of MemAvailable when first needed
  Amount host_prepare = Amount::of_bytes(uint64_t{1} << 30);  // pinned ahead of need (of the host budget)
  Amount host_chunk = Amount::of_bytes(uint64_t{256} << 20);  // the unit of pinned host memory (of the host budget)
  MemInfo mem_info = MemInfo::device;
};

}  // namespace gmem::pool
