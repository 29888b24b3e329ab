// Physical chunks and reserved address ranges, as move-only owners over the
// real driver's VMM calls: the one place that creates, maps and releases them.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "vmm/driver.h"

namespace gmem::vmm {

// Something the driver made, identified by a 64-bit id and a size, that its
// owner gives back when destroyed. Moving transfers the duty.
class Owned {
 public:
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Owned(Owned&& other) noexcept { *this = std::move(other); }
  Owned& operator=(Owned&& other) noexcept {
    std::swap(driver_, other.driver_);
    std::swap(id_, other.id_);
    std::swap(size_, other.size_);
    return *this;
  }
  std::size_t size() const { return size_; }

 protected:
  Owned(const Driver& driver, uint64_t id, std::size_t size) : driver_(&driver), id_(id), size_(size) {}
  ~Owned() = default;

  const Driver* driver_ = nullptr;  // null: nothing owned
  uint64_t id_ = 0;
  std::size_t size_ = 0;
};

// Where a chunk's physical memory lives: a GPU's memory (the device that uses
// it, or a peer), or pinned memory of a host NUMA node.
struct Location {
  enum class Kind : uint8_t { device, host_numa, host };
  Kind kind = Kind::device;
  int id = 0;  // device ordinal, or host NUMA node (none for host)

  static Location device(int ordinal) { return {Kind::device, ordinal}; }
  static Location host_numa(int node) { return {Kind::host_numa, node}; }
  // Pinned host memory where the system has no NUMA node for the device.
  static Location host() { return {Kind::host, 0}; }
  CUmemLocation cu() const;
  bool in_host_memory() const { return kind != Kind::device; }
  bool operator==(const Location&) const = default;
};

class Chunk;

// Told what becomes of the chunks made with it: where they are mapped, and when
// they go back to the driver (the tiers keep their budgets and placement so).
// Called with no lock of vmm/ held; must not throw.
class ChunkObserver {
 public:
  virtual void mapped(const Chunk& chunk, CUdeviceptr at) = 0;
  virtual void unmapped(CUmemGenericAllocationHandle handle, CUdeviceptr at) = 0;
  virtual void released(const Chunk& chunk) = 0;

 protected:
  ~ChunkObserver() = default;
};

// Physical memory made with cuMemCreate at a location, exportable as a POSIX fd.
class Chunk : public Owned {
 public:
  Chunk() = default;
  Chunk(Chunk&& other) noexcept { *this = std::move(other); }
  Chunk& operator=(Chunk&& other) noexcept {
    Owned::operator=(std::move(other));
    std::swap(location_, other.location_);
    std::swap(observer_, other.observer_);
    return *this;
  }
  ~Chunk();
  // On `device`'s own memory.
  static CUresult create(const Driver& driver, int device, std::size_t size, Chunk* out);
  // At `where`; `observer` (optional) hears of its mappings and its release.
  static CUresult create(const Driver& driver, Location where, std::size_t size, Chunk* out,
                         ChunkObserver* observer = nullptr);

  CUmemGenericAllocationHandle handle() const { return id_; }
  Location location() const { return location_; }
  ChunkObserver* observer() const { return observer_; }
  // Physical memory another process exported as a POSIX fd (the caller keeps
  // `fd`); `size` is the size the exporter made it with, `where` its location.
  static CUresult import(const Driver& driver, int fd, std::size_t size, Chunk* out,
                         Location where = Location::device(0), ChunkObserver* observer = nullptr);
  // A POSIX fd for this chunk (close-on-exec), for another process to import;
  // the caller closes it.
  CUresult export_fd(int* fd) const;

 private:
  using Owned::Owned;
  Location location_;
  ChunkObserver* observer_ = nullptr;
};

// A reserved virtual address range; chunks are mapped into it back to back.
class Reservation : public Owned {
 public:
  Reservation() = default;
  Reservation(Reservation&& other) noexcept { *this = std::move(other); }
  Reservation& operator=(Reservation&& other) noexcept {
    Owned::operator=(std::move(other));
    std::swap(observed_, other.observed_);
    return *this;
  }
  ~Reservation();
  static CUresult reserve(const Driver& driver, std::size_t size, Reservation* out);

  CUdeviceptr base() const { return id_; }

  // Maps `chunk` at `offset` and gives `device` read-write access to it (read
  // only with `read_only`: a kernel write through it is an illegal address),
  // wherever the chunk lives (a peer's memory or the host's: the device that
  // uses it needs the access, not the owner).
  CUresult map(std::size_t offset, const Chunk& chunk, int device, bool read_only = false);
  // Unmaps everything mapped in [offset, offset + size).
  CUresult unmap(std::size_t offset, std::size_t size);

 private:
  using Owned::Owned;
  // Mapped chunks that have an observer, to tell it of their unmapping, and
  // host chunks (vmm/costs.h counts their unmapping apart).
  struct Observed {
    std::size_t offset;
    CUmemGenericAllocationHandle handle;
    ChunkObserver* observer;  // may be null
    bool host;
  };
  std::vector<Observed> observed_;
};

// A POSIX fd (close-on-exec) for the physical memory behind `handle`, for
// another process to import; the caller closes it.
CUresult export_fd(const Driver& driver, CUmemGenericAllocationHandle handle, int* fd);

// The allocation granularity for pinned memory on the device (or at `where`).
CUresult granularity(const Driver& driver, int device, std::size_t* out);
CUresult granularity(const Driver& driver, Location where, std::size_t* out);

}  // namespace gmem::vmm
