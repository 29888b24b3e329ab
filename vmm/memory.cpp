#include "vmm/memory.h"

namespace gmem::vmm {

namespace {

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

}  // namespace

CUresult granularity(const Driver& driver, int device, std::size_t* out) {
  CUmemAllocationProp prop = device_prop(device);
  return driver.cuMemGetAllocationGranularity(out, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

CUresult Chunk::create(const Driver& driver, int device, std::size_t size, Chunk* out) {
  CUmemAllocationProp prop = device_prop(device);
  CUmemGenericAllocationHandle handle = 0;
  CUresult status = driver.cuMemCreate(&handle, size, &prop, 0);
  if (status != CUDA_SUCCESS) return status;
  Chunk chunk;
  chunk.driver_ = &driver;
  chunk.handle_ = handle;
  chunk.size_ = size;
  *out = std::move(chunk);
  return CUDA_SUCCESS;
}

Chunk& Chunk::operator=(Chunk&& other) noexcept {
  std::swap(driver_, other.driver_);
  std::swap(handle_, other.handle_);
  std::swap(size_, other.size_);
  return *this;
}

// A mapped chunk lives on until unmapped: releasing the handle is safe at once.
Chunk::~Chunk() {
  if (driver_) driver_->cuMemRelease(handle_);
}

CUresult Reservation::reserve(const Driver& driver, std::size_t size, Reservation* out) {
  CUdeviceptr base = 0;
  CUresult status = driver.cuMemAddressReserve(&base, size, 0, 0, 0);
  if (status != CUDA_SUCCESS) return status;
  Reservation r;
  r.driver_ = &driver;
  r.base_ = base;
  r.size_ = size;
  *out = std::move(r);
  return CUDA_SUCCESS;
}

Reservation& Reservation::operator=(Reservation&& other) noexcept {
  std::swap(driver_, other.driver_);
  std::swap(base_, other.base_);
  std::swap(size_, other.size_);
  return *this;
}

Reservation::~Reservation() {
  if (driver_) driver_->cuMemAddressFree(base_, size_);
}

CUresult Reservation::map(std::size_t offset, const Chunk& chunk, int device) const {
  CUresult status = driver_->cuMemMap(base_ + offset, chunk.size(), 0, chunk.handle(), 0);
  if (status != CUDA_SUCCESS) return status;
  CUmemAccessDesc access{{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  status = driver_->cuMemSetAccess(base_ + offset, chunk.size(), &access, 1);
  if (status != CUDA_SUCCESS) driver_->cuMemUnmap(base_ + offset, chunk.size());
  return status;
}

CUresult Reservation::unmap(std::size_t offset, std::size_t size) const {
  return driver_->cuMemUnmap(base_ + offset, size);
}

}  // namespace gmem::vmm
