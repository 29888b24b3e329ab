#include "dedup/client.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "gmem/dedup.h"
#include "gmem/internal/log.h"
#include "ipc/fd_passing.h"
#include "vmm/memory.h"

namespace gmem::dedup {

namespace {

thread_local int last_error = CUDA_SUCCESS;
constexpr int reply_timeout_ms = 30000;

// Adds [start, end) to disjoint intervals; true when they then cover [0, size).
bool add_interval(std::map<std::size_t, std::size_t>& marks, std::size_t start, std::size_t end, std::size_t size) {
  auto it = marks.upper_bound(start);
  if (it != marks.begin() && std::prev(it)->second >= start) --it;
  while (it != marks.end() && it->first <= end) {
    start = std::min(start, it->first);
    end = std::max(end, it->second);
    it = marks.erase(it);
  }
  marks.emplace(start, end);
  return marks.size() == 1 && marks.begin()->first == 0 && marks.begin()->second >= size;
}

}  // namespace

Client::Client(const vmm::Driver& driver, pool::VmmPool& pool, pool::Publisher* publisher, std::string socket_path)
    : driver_(driver), pool_(pool), publisher_(publisher), socket_path_(std::move(socket_path)), hasher_(driver) {
  if (const char* forced = std::getenv("GMEM_DEDUP_TEST_HASH"); forced && *forced) {
    test_hash_ = std::strtoull(forced, nullptr, 16);
  }
  if (const char* crash = std::getenv("GMEM_DEDUP_TEST_CRASH"); crash && std::strcmp(crash, "compare") == 0) {
    test_crash_ = true;
  }
}

int Client::last_driver_error() { return last_error; }

int Client::driver_error(CUresult status) {
  last_error = status;
  return GMEM_DEDUP_DRIVER_ERROR;
}

void Client::publish(const Marked& m, int sign) {
  if (!publisher_) return;
  if (m.offered) publisher_->add(m.device, GMEM_STAT_dedup_marked_bytes, sign * int64_t(m.size));
  if (m.joined) publisher_->add(m.device, GMEM_STAT_dedup_shared_bytes, sign * int64_t(m.range_size));
}

bool Client::connected() {
  if (socket_ >= 0 && socket_pid_ == getpid()) return true;
  if (socket_ >= 0 && socket_pid_ != getpid()) socket_ = -1;  // the parent's: left to it
  int fd = fds::connect_to(socket_path_);
  if (fd < 0) {
    log_message(LogLevel::warn,
                "dedup: no broker answers on %s (%s); marked memory stays private. Start gmemd --dedup-socket %s",
                socket_path_.c_str(), strerror(errno), socket_path_.c_str());
    return false;
  }
  socket_ = fd;
  socket_pid_ = getpid();
  return true;
}

void Client::disconnect() {
  if (socket_ >= 0) close(socket_);
  socket_ = -1;
}

int Client::mark(CUdeviceptr ptr, std::size_t size) {
  if (!ptr || !size || ptr + size < ptr) return GMEM_DEDUP_INVALID;
  std::optional<pool::Block> block = pool_.find(ptr);
  if (!block || block->size == 0 || block->chunks == 0) return GMEM_DEDUP_NOT_POOLED;
  if (ptr + size > block->base + block->size) return GMEM_DEDUP_SPANS;
  std::lock_guard lock(mutex_);
  auto [it, fresh] = marked_.try_emplace(block->base);
  Marked& m = it->second;
  if (fresh) {
    m.size = block->size;
    m.device = block->device;
    m.context = block->context;
    count_.store(marked_.size(), std::memory_order_relaxed);
  }
  if (!add_interval(m.marks, ptr - block->base, ptr - block->base + size, m.size) || m.offered) return GMEM_DEDUP_OK;
  return offer(block->base, m);
}

int Client::offer(CUdeviceptr base, Marked& m) {
  // Work queued before the mark has written the content.
  if (CUresult status = driver_.cuCtxSynchronize()) return driver_error(status);
  uint64_t hash = 0;
  if (CUresult status = hasher_.hash(base, m.size, &hash)) return driver_error(status);
  if (test_hash_) hash = *test_hash_;
  std::vector<pool::VmmPool::ChunkView> chunks;
  int device = -1;
  if (CUresult status = pool_.whole_range_chunks(base, &chunks, &m.range_size, &device)) return driver_error(status);
  if (chunks.size() > wire::max_chunks) return GMEM_DEDUP_NOT_POOLED;
  wire::Message offer;
  offer.type = wire::Type::offer;
  offer.key.size = m.size;
  offer.key.range_size = m.range_size;
  offer.key.hash = hash;
  CUuuid uuid{};
  if (CUresult status = driver_.cuDeviceGetUuid_v2(&uuid, device)) return driver_error(status);
  std::memcpy(offer.key.uuid, uuid.bytes, sizeof offer.key.uuid);
  offer.chunk_count = static_cast<uint32_t>(chunks.size());
  std::vector<int> fds;
  CUresult status = CUDA_SUCCESS;
  for (std::size_t i = 0; i < chunks.size() && status == CUDA_SUCCESS; ++i) {
    offer.chunk_sizes[i] = chunks[i].size;
    int fd = -1;
    status = vmm::export_fd(driver_, chunks[i].handle, &fd);
    if (status == CUDA_SUCCESS) fds.push_back(fd);
  }
  if (status != CUDA_SUCCESS) {
    wire::close_all(fds);
    return driver_error(status);
  }
  if (!connected()) {
    wire::close_all(fds);
    return GMEM_DEDUP_NO_BROKER;
  }
  // From here on other processes may map this memory: the allocation itself
  // maps it read-only, through handles imported from its own fds (its own
  // handles go back; the memory stays, held by those).
  std::vector<vmm::Chunk> own;
  for (std::size_t i = 0; i < fds.size() && status == CUDA_SUCCESS; ++i) {
    vmm::Chunk c;
    status = vmm::Chunk::import(driver_, fds[i], chunks[i].size, &c);
    own.push_back(std::move(c));
  }
  if (status == CUDA_SUCCESS) status = pool_.adopt_shared(base, std::move(own), true);
  if (status != CUDA_SUCCESS) {
    wire::close_all(fds);
    return driver_error(status);
  }
  const bool sent = wire::send(socket_, offer, fds);
  wire::close_all(fds);
  m.offered = true;  // read-only from now on, whatever the broker says
  for (bool joined = false; sent;) {
    wire::Message reply;
    std::vector<int> received;
    if (!wire::receive(socket_, &reply, &received, reply_timeout_ms)) break;
    if (reply.type == wire::Type::kept || reply.type == wire::Type::joined) {
      wire::close_all(received);
      m.entry = reply.token;
      publish(m, +1);
      return GMEM_DEDUP_OK;
    }
    if (reply.type != wire::Type::candidate) {
      wire::close_all(received);
      break;
    }
    int result = consider(base, m, reply, received, &joined);
    wire::close_all(received);
    m.joined = joined;  // mapped on the candidate from here on, whatever the broker answers
    wire::Message verdict;
    verdict.type = wire::Type::verdict;
    verdict.token = reply.token;
    verdict.equal = joined;
    if (!wire::send(socket_, verdict)) break;
    if (result != GMEM_DEDUP_OK)
      log_message(LogLevel::warn, "dedup: comparing with a candidate failed (%d); not merged", result);
  }
  // The broker went away mid-offer: the allocation stays on its own memory,
  // read-only, known to nobody.
  disconnect();
  m.entry = 0;
  publish(m, +1);
  return m.joined ? GMEM_DEDUP_OK : GMEM_DEDUP_NO_BROKER;
}

int Client::consider(CUdeviceptr base, Marked& m, const wire::Message& candidate, std::vector<int>& fds,
                     bool* joined) {
  *joined = false;
  std::size_t total = 0;
  std::vector<vmm::Chunk> theirs;
  CUresult status = CUDA_SUCCESS;
  for (std::size_t i = 0; i < fds.size() && status == CUDA_SUCCESS; ++i) {
    total += candidate.chunk_sizes[i];
    vmm::Chunk c;
    status = vmm::Chunk::import(driver_, fds[i], candidate.chunk_sizes[i], &c);
    theirs.push_back(std::move(c));
  }
  if (status != CUDA_SUCCESS) return driver_error(status);
  if (total != m.range_size || !(candidate.key.size == m.size)) return GMEM_DEDUP_OK;  // not comparable
  if (test_crash_) _exit(86);
  // The bytes, never the hash alone, decide.
  vmm::Reservation staging;
  status = vmm::Reservation::reserve(driver_, total, &staging);
  std::size_t mapped = 0;
  for (std::size_t i = 0; i < theirs.size() && status == CUDA_SUCCESS; mapped += theirs[i++].size()) {
    status = staging.map(mapped, theirs[i], m.device, true);
  }
  bool equal = false;
  if (status == CUDA_SUCCESS) status = hasher_.same_bytes(staging.base(), base, m.size, &equal);
  if (mapped) staging.unmap(0, mapped);
  if (status != CUDA_SUCCESS) return driver_error(status);
  if (!equal) return GMEM_DEDUP_OK;
  if (CUresult adopted = pool_.adopt_shared(base, std::move(theirs))) return driver_error(adopted);
  *joined = true;
  return GMEM_DEDUP_OK;
}

int Client::unshare(CUdeviceptr base, Marked& m, bool copy, bool sync) {
  if (!m.offered) return GMEM_DEDUP_OK;
  // No kernel may still read the range while it is remapped.
  if (sync) {
    if (CUresult status = driver_.cuCtxSynchronize()) return driver_error(status);
  }
  if (CUresult status = pool_.make_private(base, copy)) return driver_error(status);
  publish(m, -1);
  if (m.entry && socket_ >= 0 && socket_pid_ == getpid()) {
    wire::Message release;
    release.type = wire::Type::release;
    release.token = m.entry;
    if (!wire::send(socket_, release)) disconnect();
  }
  m.offered = m.joined = false;
  m.entry = 0;
  return GMEM_DEDUP_OK;
}

int Client::unmark(CUdeviceptr ptr) {
  if (!ptr) return GMEM_DEDUP_INVALID;
  std::optional<pool::Block> block = pool_.find(ptr);
  if (!block || block->size == 0) return GMEM_DEDUP_NOT_POOLED;
  std::lock_guard lock(mutex_);
  auto it = marked_.find(block->base);
  if (it == marked_.end()) return GMEM_DEDUP_NOT_MARKED;
  if (int result = unshare(block->base, it->second, true, true)) return result;
  marked_.erase(it);
  count_.store(marked_.size(), std::memory_order_relaxed);
  return GMEM_DEDUP_OK;
}

int Client::query(CUdeviceptr ptr, int* state) {
  if (!ptr || !state) return GMEM_DEDUP_INVALID;
  std::optional<pool::Block> block = pool_.find(ptr);
  if (!block || block->size == 0) return GMEM_DEDUP_NOT_POOLED;
  std::lock_guard lock(mutex_);
  auto it = marked_.find(block->base);
  *state = it == marked_.end() || !it->second.offered ? GMEM_DEDUP_PRIVATE
           : it->second.joined                        ? GMEM_DEDUP_SHARED
                                                      : GMEM_DEDUP_MARKED;
  return GMEM_DEDUP_OK;
}

CUresult Client::before_free(CUdeviceptr ptr) {
  if (count_.load(std::memory_order_relaxed) == 0) return CUDA_SUCCESS;
  std::lock_guard lock(mutex_);
  auto it = marked_.find(ptr);
  if (it == marked_.end()) return CUDA_SUCCESS;
  // The freed range must not stay on shared memory in the pool's cache: it
  // gets memory of its own first (no copy), or the free fails and it stays.
  if (unshare(ptr, it->second, false, true) != GMEM_DEDUP_OK) {
    log_message(LogLevel::error,
                "dedup: the free of %#llx fails: it maps shared memory, and private memory to put in its place "
                "could not be had (CUresult %d); it stays allocated and read-only",
                static_cast<unsigned long long>(ptr), last_error);
    return last_error == CUDA_SUCCESS ? CUDA_ERROR_OUT_OF_MEMORY : static_cast<CUresult>(last_error);
  }
  marked_.erase(it);
  count_.store(marked_.size(), std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

void Client::before_context_destroyed(CUcontext context) {
  if (count_.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard lock(mutex_);
  for (auto it = marked_.begin(); it != marked_.end();) {
    if (it->second.context != context) {
      ++it;
      continue;
    }
    unshare(it->first, it->second, false, false);  // the context's work is over
    it = marked_.erase(it);
  }
  count_.store(marked_.size(), std::memory_order_relaxed);
}

}  // namespace gmem::dedup
