#include "vmm/memory.h"

#include <algorithm>

#include "vmm/costs.h"

namespace gmem::vmm {

namespace {

CUmemAllocationProp pinned_prop(Location where) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = where.cu();
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

}  // namespace

CUmemLocation Location::cu() const {
  switch (kind) {
    case Kind::device: return {CU_MEM_LOCATION_TYPE_DEVICE, id};
    case Kind::host_numa: return {CU_MEM_LOCATION_TYPE_HOST_NUMA, id};
    case Kind::host: break;
  }
  return {CU_MEM_LOCATION_TYPE_HOST, 0};
}

CUresult granularity(const Driver& driver, Location where, std::size_t* out) {
  CUmemAllocationProp prop = pinned_prop(where);
  return driver.cuMemGetAllocationGranularity(out, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

CUresult granularity(const Driver& driver, int device, std::size_t* out) {
  return granularity(driver, Location::device(device), out);
}

CUresult Chunk::create(const Driver& driver, Location where, std::size_t size, Chunk* out, ChunkObserver* observer) {
  CUmemAllocationProp prop = pinned_prop(where);
  CUmemGenericAllocationHandle handle = 0;
  CUresult status = timed(Call::create, where.in_host_memory(), size,
                          [&] { return driver.cuMemCreate(&handle, size, &prop, 0); });
  if (status == CUDA_SUCCESS) {
    *out = Chunk(driver, handle, size);
    out->location_ = where;
    out->observer_ = observer;
  }
  return status;
}

CUresult Chunk::create(const Driver& driver, int device, std::size_t size, Chunk* out) {
  return create(driver, Location::device(device), size, out);
}

CUresult Chunk::import(const Driver& driver, int fd, std::size_t size, Chunk* out, Location where,
                       ChunkObserver* observer) {
  CUmemGenericAllocationHandle handle = 0;
  CUresult status = timed(Call::import, where.in_host_memory(), size, [&] {
    return driver.cuMemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  });
  if (status == CUDA_SUCCESS) {
    *out = Chunk(driver, handle, size);
    out->location_ = where;
    out->observer_ = observer;
  }
  return status;
}

CUresult export_fd(const Driver& driver, CUmemGenericAllocationHandle handle, int* fd) {
  return driver.cuMemExportToShareableHandle(fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
}

CUresult Chunk::export_fd(int* fd) const { return vmm::export_fd(*driver_, id_, fd); }

// A mapped chunk lives on until unmapped: releasing the handle is safe at once.
// The observer hears first, while the handle cannot name another chunk yet.
Chunk::~Chunk() {
  if (!driver_) return;
  if (observer_) observer_->released(*this);
  CallTimer timer(Call::release, location_.in_host_memory(), size_);
  driver_->cuMemRelease(id_);
}

CUresult Reservation::reserve(const Driver& driver, std::size_t size, Reservation* out) {
  CUdeviceptr base = 0;
  CUresult status = timed(Call::reserve, false, size, [&] { return driver.cuMemAddressReserve(&base, size, 0, 0, 0); });
  if (status == CUDA_SUCCESS) *out = Reservation(driver, base, size);
  return status;
}

Reservation::~Reservation() {
  if (!driver_) return;
  CallTimer timer(Call::unreserve, false, size_);
  driver_->cuMemAddressFree(id_, size_);
}

CUresult Reservation::map(std::size_t offset, const Chunk& chunk, int device, bool read_only) {
  const bool host = chunk.location().in_host_memory();
  CUresult status = timed(Call::map, host, chunk.size(),
                          [&] { return driver_->cuMemMap(id_ + offset, chunk.size(), 0, chunk.handle(), 0); });
  if (status != CUDA_SUCCESS) return status;
  CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, device},
                         read_only ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  status = timed(Call::access, host, chunk.size(),
                 [&] { return driver_->cuMemSetAccess(id_ + offset, chunk.size(), &access, 1); });
  if (status != CUDA_SUCCESS) {
    CallTimer timer(Call::unmap, host, chunk.size());
    driver_->cuMemUnmap(id_ + offset, chunk.size());
    return status;
  }
  ChunkObserver* observer = chunk.observer();
  if (observer || host) observed_.push_back({offset, chunk.handle(), observer, host});
  if (observer) observer->mapped(chunk, id_ + offset);
  return status;
}

CUresult Reservation::unmap(std::size_t offset, std::size_t size) {
  const bool host = std::any_of(observed_.begin(), observed_.end(), [&](const Observed& o) {
    return o.host && o.offset >= offset && o.offset < offset + size;
  });
  CUresult status = timed(Call::unmap, host, size, [&] { return driver_->cuMemUnmap(id_ + offset, size); });
  if (status == CUDA_SUCCESS) {
    std::erase_if(observed_, [&](const Observed& o) {
      if (o.offset < offset || o.offset >= offset + size) return false;
      if (o.observer) o.observer->unmapped(o.handle, id_ + o.offset);
      return true;
    });
  }
  return status;
}

}  // namespace gmem::vmm
