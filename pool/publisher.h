// Writes the process's live figures into its stats file (include/gmem/stats.h)
// for gmemd to read. Every update is a few relaxed atomic operations on the
// mapped file: no lock, no syscall, no allocation on the hot path.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "gmem/stats.h"

namespace gmem::pool {

class Publisher {
 public:
  static constexpr uint32_t no_slot = UINT32_MAX;

  // Creates <dir>/gmem.<pid>; nullptr with `error` set when it cannot.
  static std::unique_ptr<Publisher> create(const std::string& dir, const char* config_text, std::string* error);
  ~Publisher();  // unmaps and removes the file
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // At exit: readers are told the process is gone (the mapping stays, for
  // threads still running).
  void remove_file();
  // In a forked child, which must not write into its parent's figures.
  void detach_after_fork();

  // Device figures; devices outside [0, GMEM_STATS_MAX_DEVICES) are not published.
  // add() of reserved_bytes or in_use_bytes also raises the matching peak.
  void add(int device, gmem_device_stat stat, int64_t delta);
  void set(int device, gmem_device_stat stat, uint64_t value);
  void set_uuid(int device, const uint8_t (&uuid)[16]);
  enum class Event : bool { allocation, free };
  // One allocation or free of `bytes`: counts, in-use bytes, the bytes of each
  // tier (`host` and `peer` of them spilled, the rest on the device), and
  // reserved bytes where the driver, not the pool, holds the memory (`reserved`).
  void account(int device, Event event, uint64_t bytes, bool reserved, uint64_t host = 0, uint64_t peer = 0);

  // Lists an allocation; returns its slot, or no_slot when the table is full
  // (counted in placement_dropped). unplace() takes a slot back.
  uint32_t place(const gmem_placement& entry);
  void unplace(uint32_t slot);

 private:
  Publisher(std::string path, void* map, std::size_t bytes);
  uint64_t* slot(int device, gmem_device_stat stat) const;
  gmem_placement& entry(uint32_t index) const;

  std::string path_;
  void* map_;
  std::size_t bytes_;
  gmem_stats_header* header_;
  // Free placement slots: a lock-free stack (index in the low half of head_,
  // a change count in the high half against ABA), then never-used slots.
  std::unique_ptr<std::atomic<uint32_t>[]> next_free_;
  std::atomic<uint64_t> head_{no_slot};
  std::atomic<uint32_t> fresh_{0};
};

}  // namespace gmem::pool
