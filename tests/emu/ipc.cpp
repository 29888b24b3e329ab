// Legacy CUDA IPC in the emulator: cuIpcGetMemHandle moves a cuMemAlloc
// allocation's pages onto a memfd (same addresses, same bytes), and another
// process opens that memfd through /proc/<pid>/fd and maps it shared, so a
// write by either process is seen by the other, as on a GPU. What the driver
// refuses is refused the same way: memory that is not legacy-IPC capable
// (VMM mappings, stream-ordered pools, managed and host memory), opening in
// the exporting process, a handle that names nothing.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "emu.h"

namespace emu {
namespace {

struct Handle {
  char magic[8];
  int32_t pid;
  int32_t fd;  // the exporter's memfd, in the exporter
  uint64_t inode;
  unsigned long long id;  // the allocation's buffer id
  uint64_t size;
  uint64_t footprint;
  uint64_t reserved[2];
};
static_assert(sizeof(Handle) == sizeof(CUipcMemHandle));
constexpr char magic[8] = "emu-ipc";

}  // namespace

void unshare_ipc_pages(const Allocation& a, CUdeviceptr start) {
  if (a.ipc_fd < 0 && !a.ipc_from) return;
  mmap(reinterpret_cast<void*>(start), a.footprint, PROT_READ | PROT_WRITE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (a.ipc_fd >= 0) close(a.ipc_fd);
}

}  // namespace emu

using namespace emu;

EMU_API CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  if (CUresult r = context_check()) return r;
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mutex);
  // An interior pointer names its allocation, as on the GPU.
  auto it = find_allocation(dptr);
  if (it == s.allocations.end() || it->second.kind != Kind::device || it->second.pool || it->second.ipc_from) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Allocation& a = it->second;
  void* start = reinterpret_cast<void*>(it->first);
  if (a.ipc_fd < 0) {
    int fd = memfd_create("gmem-emu-ipc", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(a.footprint)) != 0 ||
        pwrite(fd, start, a.footprint, 0) != static_cast<ssize_t>(a.footprint) ||
        mmap(start, a.footprint, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
      if (fd >= 0) close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a.ipc_fd = fd;
  }
  struct stat st;
  fstat(a.ipc_fd, &st);
  Handle h{};
  std::memcpy(h.magic, magic, sizeof magic);
  h.pid = getpid();
  h.fd = a.ipc_fd;
  h.inode = st.st_ino;
  h.id = a.id;
  h.size = a.size;
  h.footprint = a.footprint;
  std::memcpy(handle, &h, sizeof h);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  if (CUresult r = context_check()) return r;
  if (!dptr || (flags & ~unsigned{CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS})) return CUDA_ERROR_INVALID_VALUE;
  Handle h;
  std::memcpy(&h, &handle, sizeof h);
  if (std::memcmp(h.magic, magic, sizeof magic) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (h.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  Context* c = current_context();
  State& s = state();
  std::lock_guard lock(s.mutex);
  // Opened again in this context: the same address, one more reference.
  for (auto& [start, a] : s.allocations) {
    if (a.ipc_from == h.pid && a.ipc_id == h.id && a.context == c) {
      ++a.ipc_references;
      *dptr = start;
      return CUDA_SUCCESS;
    }
  }
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct stat st;
  // The exporter freed it (or exited): its memfd is gone, or another file has the number.
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_ino != h.inode || st.st_size < static_cast<off_t>(h.footprint)) {
    if (fd >= 0) close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::size_t footprint = 0;
  void* start = take_device_range(h.size, &footprint);
  if (!start || mmap(start, footprint, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    if (start) give_device_range(start, footprint);
    close(fd);
    return CUDA_ERROR_MAP_FAILED;
  }
  close(fd);  // the mapping holds the memory
  Allocation a{h.size, footprint, c->device, c, Kind::device};
  a.id = s.next_buffer_id++;
  a.ipc_from = h.pid;
  a.ipc_id = h.id;
  a.ipc_references = 1;
  *dptr = reinterpret_cast<CUdeviceptr>(start);
  s.allocations[*dptr] = a;
  return CUDA_SUCCESS;
}

#undef cuIpcOpenMemHandle  // cuda.h's name for _v2; the CUDA 4.1 ABI is the same
EMU_ALIAS(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2)

EMU_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  if (CUresult r = context_check()) return r;
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto it = s.allocations.find(dptr);
  if (it == s.allocations.end() || !it->second.ipc_from) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.ipc_references == 0) drop_allocation(it);
  return CUDA_SUCCESS;
}
