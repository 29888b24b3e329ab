#include "ipc/exporter.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "gmem/internal/log.h"
#include "ipc/fd_passing.h"

namespace gmem::ipc {

namespace {

constexpr int request_timeout_ms = 10000;
Exporter* the_exporter = nullptr;  // for the fork handler

}  // namespace

std::optional<CUresult> Exporter::get_handle(CUipcMemHandle* handle, CUdeviceptr ptr) {
  std::optional<pool::Block> block = pool_.find(ptr);
  if (!block) return std::nullopt;
  if (!handle || block->size == 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(mutex_);
  if (!listening()) return CUDA_ERROR_OUT_OF_MEMORY;
  auto it = exports_.find(block->base);
  if (it == exports_.end()) {
    pool::VmmPool::Exported memory;
    if (CUresult status = pool_.export_allocation(block->base, &memory)) {
      log_message(LogLevel::warn,
                  "cuIpcGetMemHandle(%#llx): memory that dedup shares read-only cannot be exported; "
                  "gmem_dedup_unmark it first",
                  static_cast<unsigned long long>(ptr));
      return status;
    }
    Export e{++next_id_, memory.size, memory.offset, block->context, {}, {}};
    for (const auto& chunk : memory.chunks) {
      int fd = -1;
      if (CUresult status = vmm::export_fd(driver_, chunk.handle, &fd)) {
        fds::close_all(e.fds);
        return status;
      }
      e.fds.push_back(fd);
      e.sizes.push_back(chunk.size);
    }
    it = exports_.emplace(block->base, std::move(e)).first;
    count_.store(exports_.size(), std::memory_order_relaxed);
  }
  Handle h{};
  h.pid = static_cast<uint32_t>(getpid());
  h.device = static_cast<uint32_t>(block->device);
  h.nonce = nonce_;
  h.id = it->second.id;
  h.offset = it->second.offset;
  h.size = it->second.size;
  *handle = encode(h);
  return CUDA_SUCCESS;
}

bool Exporter::listening() {
  if (listener_ >= 0 && listener_pid_ == getpid()) return true;
  if (getrandom(&nonce_, sizeof nonce_, 0) != sizeof nonce_) nonce_ = static_cast<uint64_t>(getpid()) << 32 ^ next_id_;
  const std::string name = socket_name(static_cast<uint32_t>(getpid()), nonce_);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, name.data(), name.size());
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), length) != 0 || listen(fd, 64) != 0) {
    log_message(LogLevel::error,
                "cuIpcGetMemHandle: cannot listen on a unix socket for importers (%s); no handle given",
                strerror(errno));
    if (fd >= 0) close(fd);
    return false;
  }
  listener_ = fd;
  listener_pid_ = getpid();
  if (!the_exporter) {
    the_exporter = this;
    pthread_atfork(nullptr, nullptr, after_fork_in_child);
  }
  std::thread([this, fd] { serve(fd); }).detach();
  return true;
}

// A forked child has no listener and its parent's exports are not its own:
// the copies of the chunks' fds would keep the memory alive in it.
void Exporter::after_fork_in_child() {
  Exporter& e = *the_exporter;
  new (&e.mutex_) std::mutex;  // another thread of the parent may have held it
  for (auto& [base, x] : e.exports_) fds::close_all(x.fds);
  e.exports_.clear();
  e.count_.store(0, std::memory_order_relaxed);
  if (e.listener_ >= 0) close(e.listener_);
  e.listener_ = -1;
}

void Exporter::serve(int listener) {
  for (;;) {
    int connection = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      return;
    }
    ucred peer{};
    socklen_t length = sizeof peer;
    if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0 && peer.uid == geteuid()) {
      answer(connection);
    }
    close(connection);
  }
}

void Exporter::answer(int connection) {
  Request request;
  std::vector<int> none;
  if (!fds::receive(connection, &request, sizeof request, &none, request_timeout_ms)) return;
  fds::close_all(none);
  Reply reply;
  std::vector<int> fds;  // copies, sent without the lock
  std::vector<uint64_t> sizes;
  {
    std::lock_guard lock(mutex_);
    const Export* found = nullptr;
    for (const auto& [base, e] : exports_) {
      if (e.id == request.id) found = &e;
    }
    if (request.magic != protocol_magic || !found) {
      reply.status = CUDA_ERROR_INVALID_VALUE;
    } else {
      for (int fd : found->fds) fds.push_back(fcntl(fd, F_DUPFD_CLOEXEC, 0));
      sizes = found->sizes;
      reply.chunks = sizes.size();
      reply.offset = found->offset;
      reply.size = found->size;
    }
  }
  if (std::find(fds.begin(), fds.end(), -1) != fds.end()) {
    reply = Reply{};
    reply.status = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (fds::send(connection, &reply, sizeof reply) && reply.status == CUDA_SUCCESS) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      ChunkMessage chunk{sizes[i]};
      if (!fds::send(connection, &chunk, sizeof chunk, {fds[i]})) break;
    }
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
}

void Exporter::forget(std::map<CUdeviceptr, Export>::iterator it) {
  fds::close_all(it->second.fds);
  exports_.erase(it);
  count_.store(exports_.size(), std::memory_order_relaxed);
}

CUresult Exporter::before_free(CUdeviceptr ptr) {
  if (count_.load(std::memory_order_relaxed) == 0) return CUDA_SUCCESS;
  std::lock_guard lock(mutex_);
  if (auto it = exports_.find(ptr); it != exports_.end()) forget(it);
  return CUDA_SUCCESS;
}

void Exporter::before_context_destroyed(CUcontext context) {
  if (count_.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard lock(mutex_);
  for (auto it = exports_.begin(); it != exports_.end();) {
    auto next = std::next(it);
    if (it->second.context == context) forget(it);
    it = next;
  }
}

}  // namespace gmem::ipc
