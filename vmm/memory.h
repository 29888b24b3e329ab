// Physical chunks and reserved address ranges, as move-only owners over the
// real driver's VMM calls: the one place that creates, maps and releases them.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <utility>

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

// Physical memory made with cuMemCreate on a device, exportable as a POSIX fd.
class Chunk : public Owned {
 public:
  Chunk() = default;
  Chunk(Chunk&&) noexcept = default;
  Chunk& operator=(Chunk&&) noexcept = default;
  ~Chunk();
  static CUresult create(const Driver& driver, int device, std::size_t size, Chunk* out);
  // Physical memory another process exported as a POSIX fd (the caller keeps
  // `fd`); `size` is the size the exporter made it with.
  static CUresult import(const Driver& driver, int fd, std::size_t size, Chunk* out);

  CUmemGenericAllocationHandle handle() const { return id_; }
  // A POSIX fd for this chunk (close-on-exec), for another process to import;
  // the caller closes it.
  CUresult export_fd(int* fd) const;

 private:
  using Owned::Owned;
};

// A reserved virtual address range; chunks are mapped into it back to back.
class Reservation : public Owned {
 public:
  Reservation() = default;
  Reservation(Reservation&&) noexcept = default;
  Reservation& operator=(Reservation&&) noexcept = default;
  ~Reservation();
  static CUresult reserve(const Driver& driver, std::size_t size, Reservation* out);

  CUdeviceptr base() const { return id_; }

  // Maps `chunk` at `offset` and gives `device` read-write access to it (read
  // only with `read_only`: a kernel write through it is an illegal address).
  CUresult map(std::size_t offset, const Chunk& chunk, int device, bool read_only = false) const;
  // Unmaps everything mapped in [offset, offset + size).
  CUresult unmap(std::size_t offset, std::size_t size) const;

 private:
  using Owned::Owned;
};

// A POSIX fd (close-on-exec) for the physical memory behind `handle`, for
// another process to import; the caller closes it.
CUresult export_fd(const Driver& driver, CUmemGenericAllocationHandle handle, int* fd);

// The device's allocation granularity for pinned device memory.
CUresult granularity(const Driver& driver, int device, std::size_t* out);

}  // namespace gmem::vmm
