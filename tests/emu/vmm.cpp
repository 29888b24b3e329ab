// Virtual memory management in the emulator: physical memory is a memfd,
// mapping it is mmap(MAP_SHARED|MAP_FIXED) into a reserved range, so two
// mappings of one handle alias, and an exported fd imports in another process.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <string>
#include <thread>

#include "emu.h"

namespace emu {
namespace {

bool valid_location(const CUmemLocation& l) {
  if (l.type == CU_MEM_LOCATION_TYPE_DEVICE) return l.id >= 0 && static_cast<std::size_t>(l.id) < state().devices.size();
  if (l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) return l.id >= 0 && l.id < state().numa_nodes;
  return l.type == CU_MEM_LOCATION_TYPE_HOST;
}

bool on_device(const CUmemLocation& l) { return l.type == CU_MEM_LOCATION_TYPE_DEVICE; }

// Physical memory counts against its device's memory, or the host's pinned memory.
bool charge_location(const CUmemLocation& l, std::size_t bytes) {
  if (on_device(l)) return bytes <= state().device_chunk_max && charge(l.id, bytes);
  State& s = state();
  if (bytes > s.host_total - s.host_used) return false;
  s.host_used += bytes;
  return true;
}

void refund_location(const CUmemLocation& l, std::size_t bytes) {
  if (on_device(l)) {
    refund(l.id, bytes);
  } else {
    state().host_used -= bytes;
  }
}

// Drops one reference to a physical allocation; the last one frees it.
void unreference(std::map<CUmemGenericAllocationHandle, Physical>::iterator it) {
  if (--it->second.references > 0) return;
  if (it->second.charged) refund_location(it->second.location, it->second.size);
  close(it->second.fd);
  state().physical.erase(it);
}

// True if [ptr, ptr + size) is made of whole, adjacent mappings.
bool whole_mappings(CUdeviceptr ptr, std::size_t size) {
  const auto& mappings = state().mappings;
  std::size_t covered = 0;
  for (auto m = mappings.find(ptr); m != mappings.end() && m->first == ptr + covered && covered < size; ++m) {
    covered += m->second.size;
  }
  return size > 0 && covered == size;
}

CUresult add_handle(CUmemGenericAllocationHandle* handle, Physical physical) {
  State& s = state();
  *handle = s.next_handle++;
  s.physical[*handle] = physical;
  return CUDA_SUCCESS;
}

// The memfd's name carries the location, so that an importing process knows it.
std::string memfd_name(const CUmemLocation& l) {
  return "gmem-emu-" + std::to_string(static_cast<int>(l.type)) + "-" + std::to_string(l.id);
}

CUmemLocation location_of(int fd) {
  char link[64], target[256] = {};
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  CUmemLocation l{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  int type = 0, id = 0;
  if (readlink(link, target, sizeof target - 1) > 0 && std::sscanf(target, "/memfd:gmem-emu-%d-%d", &type, &id) == 2) {
    l.type = static_cast<CUmemLocationType>(type);
    l.id = id;
  }
  return l;
}

}  // namespace
}  // namespace emu

using namespace emu;

EMU_API CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags) {
  if (CUresult r = init_check()) return r;
  if (!granularity || !prop || !valid_location(prop->location)) return CUDA_ERROR_INVALID_VALUE;
  *granularity = emu::granularity;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  if (CUresult r = init_check()) return r;
  if (!handle || !prop || flags != 0 || size == 0 || size % granularity != 0 ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || !valid_location(prop->location)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
      prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_NOT_SUPPORTED;  // fabric and Win32 handles: not on this "platform"
  }
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE && state().pin_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(state().pin_ms));  // not under the lock: as the driver, others go on
  }
  std::lock_guard lock(state().mutex);
  if (!charge_location(prop->location, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = memfd_create(memfd_name(prop->location).c_str(), MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    refund_location(prop->location, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return add_handle(handle, Physical{fd, size, prop->location, prop->requestedHandleTypes, true});
}

EMU_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (CUresult r = init_check()) return r;
  std::lock_guard lock(state().mutex);
  auto it = state().physical.find(handle);
  if (it == state().physical.end()) return CUDA_ERROR_INVALID_VALUE;
  unreference(it);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* address) {
  if (CUresult r = init_check()) return r;
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto ptr = reinterpret_cast<CUdeviceptr>(address);
  auto m = find_mapping(ptr);
  if (m == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  ++s.physical[m->second.handle].references;
  *handle = m->second.handle;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                        CUmemGenericAllocationHandle handle) {
  if (CUresult r = init_check()) return r;
  if (!prop) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  auto it = state().physical.find(handle);
  if (it == state().physical.end()) return CUDA_ERROR_INVALID_VALUE;
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location = it->second.location;
  prop->requestedHandleTypes = it->second.handle_types;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr, unsigned long long) {
  if (CUresult r = init_check()) return r;
  if (!ptr || size == 0 || size % granularity != 0 || (alignment & (alignment - 1))) return CUDA_ERROR_INVALID_VALUE;
  std::size_t align = alignment > granularity ? alignment : granularity;
  void* p = mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  auto start = reinterpret_cast<uintptr_t>(p);
  uintptr_t aligned = (start + align - 1) / align * align;
  if (aligned > start) munmap(p, aligned - start);
  if (start + align > aligned) munmap(reinterpret_cast<void*>(aligned + size), start + align - aligned);
  *ptr = aligned;
  std::lock_guard lock(state().mutex);
  state().reservations[*ptr] = size;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  if (CUresult r = init_check()) return r;
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  if (CUresult r = init_check()) return r;
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto phys = s.physical.find(handle);
  if (phys == s.physical.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (offset != 0) return CUDA_ERROR_NOT_SUPPORTED;
  if (flags != 0 || size != phys->second.size || ptr % granularity != 0) return CUDA_ERROR_INVALID_VALUE;
  auto r = s.reservations.upper_bound(ptr);
  if (r == s.reservations.begin() || ptr + size > (--r)->first + r->second) return CUDA_ERROR_INVALID_VALUE;
  auto next = s.mappings.lower_bound(ptr);
  if ((next != s.mappings.end() && next->first < ptr + size) ||
      (next != s.mappings.begin() && std::prev(next)->first + std::prev(next)->second.size > ptr)) {
    return CUDA_ERROR_INVALID_VALUE;  // overlaps a mapping
  }
  if (mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, phys->second.fd, 0) == MAP_FAILED) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ++phys->second.references;
  s.mappings[ptr] = Mapping{size, handle, CU_MEM_ACCESS_FLAGS_PROT_NONE};
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  if (CUresult r = init_check()) return r;
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!whole_mappings(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.mappings.find(ptr);
  mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  while (it != s.mappings.end() && it->first < ptr + size) {
    unreference(s.physical.find(it->second.handle));
    it = s.mappings.erase(it);
  }
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (CUresult r = init_check()) return r;
  if (!desc || count == 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!whole_mappings(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  // The host's view is the widest access any device is given.
  CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_location(desc[i].location)) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    if (desc[i].flags > CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].flags > access) access = desc[i].flags;
  }
  int prot = access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
             : access == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                          : PROT_NONE;
  if (mprotect(reinterpret_cast<void*>(ptr), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
  for (auto m = s.mappings.find(ptr); m != s.mappings.end() && m->first < ptr + size; ++m) m->second.access = access;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  if (CUresult r = init_check()) return r;
  if (!flags || !location || !valid_location(*location)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  auto m = find_mapping(ptr);
  if (m == state().mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  *flags = m->second.access;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType type, unsigned long long) {
  if (CUresult r = init_check()) return r;
  if (!shareable || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  auto it = state().physical.find(handle);
  // Only a handle created for export may be exported.
  if (it == state().physical.end() || !(it->second.handle_types & type)) return CUDA_ERROR_INVALID_VALUE;
  int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* shareable,
                                                CUmemAllocationHandleType type) {
  if (CUresult r = init_check()) return r;
  if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  int fd = static_cast<int>(reinterpret_cast<intptr_t>(shareable));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard lock(state().mutex);
  // It lives where the exporter made it, and is charged there, to the exporter.
  return add_handle(handle, Physical{own, static_cast<std::size_t>(st.st_size), location_of(own),
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, false});
}
