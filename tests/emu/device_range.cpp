// The emulator's device address range: one large PROT_NONE reservation whose
// 2 MiB slabs are mapped read-write while an allocation lies in them and
// unmapped when the last one goes, so device pointers look like device pointers
// (2 MiB aligned from 2 MiB up) and freed memory goes back to the host. Small
// allocations share slabs: most of them cost no system call.
#include <sys/mman.h>

#include <cstdint>
#include <map>
#include <vector>

#include "emu.h"

namespace emu {
namespace {

struct DeviceRange {
  std::uintptr_t base = 0;
  std::size_t bytes = 0;
  std::map<std::uintptr_t, std::size_t> free;  // start -> length, coalesced
  std::vector<unsigned> slab_users;             // allocations touching each slab

  // Room for every device's memory several times over (small allocations
  // take whole pages); PROT_NONE and MAP_NORESERVE cost no memory.
  bool reserve() {
    bytes = std::size_t{64} << 30;
    for (const Device& d : state().devices) bytes += 4 * d.total;
    bytes = (bytes + granularity - 1) / granularity * granularity;
    void* p = mmap(nullptr, bytes + granularity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    base = (reinterpret_cast<std::uintptr_t>(p) + granularity - 1) / granularity * granularity;
    free[base] = bytes;
    slab_users.resize(bytes / granularity);
    return true;
  }

  std::uintptr_t take(std::size_t length, std::size_t align) {
    for (auto it = free.begin(); it != free.end(); ++it) {
      std::uintptr_t start = (it->first + align - 1) / align * align;
      std::uintptr_t end = it->first + it->second;
      if (start + length > end) continue;
      std::uintptr_t extent = it->first;
      free.erase(it);
      if (start > extent) free[extent] = start - extent;
      if (end > start + length) free[start + length] = end - (start + length);
      return start;
    }
    return 0;
  }

  // Counts an allocation in (or out of) the slabs it touches, mapping or
  // unmapping those it is the first (or last) in; false if mapping failed.
  bool use_slabs(std::uintptr_t start, std::size_t length, bool use) {
    const std::size_t first = (start - base) / granularity, last = (start + length - 1 - base) / granularity;
    for (std::size_t i = first; i <= last; ++i) {
      if ((use ? slab_users[i]++ : --slab_users[i]) != 0) continue;
      void* slab = reinterpret_cast<void*>(base + i * granularity);
      int prot = use ? PROT_READ | PROT_WRITE : PROT_NONE;
      if (mmap(slab, granularity, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
        for (std::size_t j = first; j <= i; ++j) --slab_users[j];
        return false;
      }
    }
    return true;
  }

  void give(std::uintptr_t start, std::size_t length) {
    auto next = free.lower_bound(start);
    if (next != free.end() && start + length == next->first) {
      length += next->second;
      next = free.erase(next);
    }
    if (next != free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        prev->second += length;
        return;
      }
    }
    free[start] = length;
  }
};

DeviceRange& range() {
  static DeviceRange* r = new DeviceRange;
  return *r;
}

}  // namespace

void* take_device_range(std::size_t size, std::size_t* footprint) {
  DeviceRange& r = range();
  if (!r.base && !r.reserve()) return nullptr;
  const std::size_t unit = size >= granularity ? granularity : page;
  const std::size_t length = (size + unit - 1) / unit * unit;
  std::uintptr_t start = r.take(length, unit);
  if (!start) return nullptr;
  if (!r.use_slabs(start, length, true)) {
    r.give(start, length);
    return nullptr;
  }
  *footprint = length;
  return reinterpret_cast<void*>(start);
}

void give_device_range(void* start, std::size_t footprint) {
  DeviceRange& r = range();
  r.use_slabs(reinterpret_cast<std::uintptr_t>(start), footprint, false);
  r.give(reinterpret_cast<std::uintptr_t>(start), footprint);
}

bool device_address(CUdeviceptr ptr) {
  const DeviceRange& r = range();
  if (r.base && ptr >= r.base && ptr < r.base + r.bytes) return true;
  const auto& reservations = state().reservations;
  auto it = reservations.upper_bound(ptr);
  return it != reservations.begin() && ptr < std::prev(it)->first + std::prev(it)->second;
}

}  // namespace emu
