// Physical chunks and reserved address ranges, as move-only owners over the
// real driver's VMM calls: the one place that creates, maps and releases them.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <utility>

#include "vmm/driver.h"

namespace gmem::vmm {

// Physical memory made with cuMemCreate on a device, exportable as a POSIX fd.
class Chunk {
 public:
  Chunk() = default;
  static CUresult create(const Driver& driver, int device, std::size_t size, Chunk* out);
  Chunk(Chunk&& other) noexcept { *this = std::move(other); }
  Chunk& operator=(Chunk&& other) noexcept;
  ~Chunk();

  CUmemGenericAllocationHandle handle() const { return handle_; }
  std::size_t size() const { return size_; }

 private:
  const Driver* driver_ = nullptr;
  CUmemGenericAllocationHandle handle_ = 0;
  std::size_t size_ = 0;
};

// A reserved virtual address range; chunks are mapped into it back to back.
class Reservation {
 public:
  Reservation() = default;
  static CUresult reserve(const Driver& driver, std::size_t size, Reservation* out);
  Reservation(Reservation&& other) noexcept { *this = std::move(other); }
  Reservation& operator=(Reservation&& other) noexcept;
  ~Reservation();

  CUdeviceptr base() const { return base_; }
  std::size_t size() const { return size_; }

  // Maps `chunk` at `offset` and gives `device` read-write access to it.
  CUresult map(std::size_t offset, const Chunk& chunk, int device) const;
  // Unmaps everything mapped in [offset, offset + size).
  CUresult unmap(std::size_t offset, std::size_t size) const;

 private:
  const Driver* driver_ = nullptr;
  CUdeviceptr base_ = 0;
  std::size_t size_ = 0;
};

// The device's allocation granularity for pinned device memory.
CUresult granularity(const Driver& driver, int device, std::size_t* out);

}  // namespace gmem::vmm
