#include "ipc/importer.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "gmem/internal/log.h"
#include "ipc/fd_passing.h"

namespace gmem::ipc {

namespace {

constexpr int reply_timeout_ms = 30000;

// A connection to the exporter of `h`; -1 if it does not answer (gone).
int connect_to(const Handle& h) {
  const std::string name = socket_name(h.pid, h.nonce);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, name.data(), name.size());
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), length) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

}  // namespace

CUresult Importer::fetch(const Handle& handle, int device, Opened* out) {
  int connection = connect_to(handle);
  if (connection < 0) {
    log_message(LogLevel::warn,
                "cuIpcOpenMemHandle: process %u, which exported this memory of its device %u, does not answer on its "
                "socket (it exited, or runs in another network namespace)",
                handle.pid, handle.device);
    return CUDA_ERROR_INVALID_VALUE;
  }
  Request request;
  request.id = handle.id;
  Reply reply;
  std::vector<int> fds;
  CUresult status = CUDA_ERROR_INVALID_VALUE;
  if (fds::send(connection, &request, sizeof request) &&
      fds::receive(connection, &reply, sizeof reply, &fds, reply_timeout_ms) && reply.magic == protocol_magic) {
    status = static_cast<CUresult>(reply.status);
  }
  fds::close_all(fds);
  // Each chunk in turn: imported (the memory is held from here on), its fd closed.
  std::size_t total = 0;
  for (uint64_t i = 0; status == CUDA_SUCCESS && i < reply.chunks; ++i) {
    ChunkMessage chunk;
    if (!fds::receive(connection, &chunk, sizeof chunk, &fds, reply_timeout_ms) || fds.size() != 1) {
      status = CUDA_ERROR_INVALID_VALUE;
    } else {
      vmm::Chunk imported;
      status = vmm::Chunk::import(driver_, fds[0], chunk.size, &imported);
      out->chunks.push_back(std::move(imported));
      total += chunk.size;
    }
    fds::close_all(fds);
  }
  ::close(connection);
  if (status != CUDA_SUCCESS) return status;
  if (reply.chunks == 0 || reply.offset + reply.size > total) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult reserved = vmm::Reservation::reserve(driver_, total, &out->va)) return reserved;
  std::size_t offset = 0;
  for (const vmm::Chunk& c : out->chunks) {
    if (CUresult mapped = out->va.map(offset, c, device)) {
      if (offset) out->va.unmap(0, offset);
      return mapped;
    }
    offset += c.size();
  }
  out->block.base = out->va.base() + reply.offset;
  out->block.size = reply.size;
  out->block.device = device;
  out->block.physical = total;
  return CUDA_SUCCESS;
}

CUresult Importer::open(CUdeviceptr* ptr, const Handle& handle, unsigned flags) {
  if (!ptr || (flags & ~unsigned{CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS})) return CUDA_ERROR_INVALID_VALUE;
  CUcontext context = nullptr;
  if (CUresult status = driver_.cuCtxGetCurrent(&context)) return status;
  CUdevice device = 0;
  if (!context || driver_.cuCtxGetDevice(&device) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
  // As the driver: a handle does not open in the process that exported it.
  if (handle.pid == static_cast<uint32_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
  const Key key{handle.pid, handle.nonce, handle.id, context};
  auto opened_before = [&] {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return false;
    ++opened_.at(it->second)->references;
    *ptr = it->second;
    return true;
  };
  {
    std::lock_guard lock(mutex_);
    if (opened_before()) return CUDA_SUCCESS;
  }
  // Without the lock: pointer queries go on while the exporter answers.
  auto opened = std::make_unique<Opened>();
  opened->key = key;
  opened->block.context = context;
  if (CUresult status = fetch(handle, device, opened.get())) return status;
  std::lock_guard lock(mutex_);
  if (opened_before()) {  // another thread opened it meanwhile: its mapping serves
    opened->va.unmap(0, opened->va.size());
    return CUDA_SUCCESS;
  }
  *ptr = opened->block.base;
  by_key_.emplace(key, *ptr);
  opened_.emplace(*ptr, std::move(opened));
  return CUDA_SUCCESS;
}

std::optional<CUresult> Importer::close(CUdeviceptr ptr) {
  std::lock_guard lock(mutex_);
  auto it = opened_.find(ptr);
  if (it == opened_.end()) return std::nullopt;
  Opened& o = *it->second;
  if (--o.references > 0) return CUDA_SUCCESS;
  // No work queued before may still use the memory once it is unmapped.
  driver_.cuCtxSynchronize();
  drop(it);
  return CUDA_SUCCESS;
}

void Importer::drop(std::map<CUdeviceptr, std::unique_ptr<Opened>>::iterator it) {
  it->second->va.unmap(0, it->second->va.size());
  by_key_.erase(it->second->key);
  opened_.erase(it);  // the address range, then the chunks, go back
}

void Importer::context_destroyed(CUcontext context) {
  std::lock_guard lock(mutex_);
  for (auto it = opened_.begin(); it != opened_.end();) {
    auto next = std::next(it);
    if (it->second->key.context == context) drop(it);
    it = next;
  }
}

std::optional<pool::Block> Importer::find(CUdeviceptr ptr) const {
  std::lock_guard lock(mutex_);
  auto it = opened_.upper_bound(ptr);
  if (it == opened_.begin()) return std::nullopt;
  const pool::Block& b = std::prev(it)->second->block;
  if (ptr < b.base || ptr >= b.base + b.size) return std::nullopt;
  return b;
}

}  // namespace gmem::ipc
