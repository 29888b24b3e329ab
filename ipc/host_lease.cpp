#include "ipc/host_lease.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "gmem/internal/log.h"
#include "ipc/fd_passing.h"

namespace gmem::ipc {

namespace {

constexpr int lease_reply_timeout_ms = 2000;
// After an empty answer (or none), the next ask waits this long: gmemd may
// still be pinning, or another job may give units back.
constexpr auto ask_again_after = std::chrono::seconds(1);

}  // namespace

HostLease::HostLease(const vmm::Driver& driver, std::string socket, std::size_t batch)
    : driver_(driver), socket_path_(std::move(socket)), batch_(batch) {}

HostLease::~HostLease() {
  for (auto& [size, lent] : lent_) {
    for (const Lent& l : lent) close(l.fd);
  }
  if (socket_ >= 0) close(socket_);
}

bool HostLease::take(vmm::Location where, std::size_t size, vmm::Chunk* out, vmm::ChunkObserver* observer) {
  std::lock_guard lock(mutex_);
  // A forked child borrows nothing: what was lent is its parent's.
  if (off_ || (pid_ && pid_ != getpid()) || refused_.contains(size)) return false;
  if (!(fds_where_ == where) && holding_unimported()) return false;
  std::vector<Lent>& lent = lent_[size];
  if (lent.empty() && !ask(where, size)) return false;
  const Lent l = lent.back();
  lent.pop_back();
  const CUresult status = vmm::Chunk::import(driver_, l.fd, size, out, where, observer);
  close(l.fd);
  if (status != CUDA_SUCCESS) {
    log_message(LogLevel::warn, "host pool: importing a unit gmemd lent failed (%d); this job pins its own host memory",
                static_cast<int>(status));
    off_ = true;
    return false;
  }
  imported_[out->handle()] = l.unit;
  borrowed_.fetch_add(size, std::memory_order_relaxed);
  units_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void HostLease::give_back(CUmemGenericAllocationHandle handle) {
  std::lock_guard lock(mutex_);
  auto it = imported_.find(handle);
  if (it == imported_.end()) return;
  host_pool::Request r;
  r.op = host_pool::Op::give_back;
  r.count = 1;
  r.units[0] = it->second;
  imported_.erase(it);
  if (tell(r)) returned_.fetch_add(1, std::memory_order_relaxed);
}

void HostLease::missed(std::size_t size) {
  std::lock_guard lock(mutex_);
  if (off_ || refused_.contains(size)) return;
  host_pool::Request r;
  r.op = host_pool::Op::missed;
  r.count = 1;
  r.unit = size;
  tell(r);
}

bool HostLease::tell(const host_pool::Request& r) {
  // A forked child's units are its parent's; without the connection they
  // are gmemd's again already.
  if (socket_ < 0 || pid_ != getpid()) return false;
  if (!fds::send(socket_, &r, sizeof r, {})) {
    close(socket_);  // what it lent is gmemd's again
    socket_ = -1;
    return false;
  }
  return true;
}

bool HostLease::exchange(const host_pool::Request& r, host_pool::Grant* g, std::vector<int>* fds) {
  if (off_ || (pid_ && pid_ != getpid())) return false;  // never again, or the parent's connection
  if (socket_ < 0) {
    socket_ = fds::connect_to(socket_path_);
    if (socket_ < 0) {
      log_message(LogLevel::debug, "host pool: none answers on %s (%s); this job pins its own host memory",
                  socket_path_.c_str(), strerror(errno));
      return false;
    }
    pid_ = getpid();
  }
  if (!fds::send(socket_, &r, sizeof r, {}) || !fds::receive(socket_, g, sizeof *g, fds, lease_reply_timeout_ms) ||
      g->magic != host_pool::magic || g->version != host_pool::version || fds->size() != g->count) {
    fds::close_all(*fds);
    if (!imported_.empty() || holding_unimported()) {
      // gmemd is slow or answered nonsense while this job holds units it
      // lent (mapped, or lent and not yet imported): closing would hand them
      // to other jobs, which would then share their memory with this one.
      // The connection stays, for giving units back; a late answer stays
      // unread, and this job asks no more.
      log_message(LogLevel::warn,
                  "host pool on %s: no valid answer within %d ms; this job borrows no more and pins its own "
                  "host memory",
                  socket_path_.c_str(), lease_reply_timeout_ms);
      off_ = true;
      return false;
    }
    // None borrowed: a later ask connects anew (gmemd may have restarted).
    close(socket_);
    socket_ = -1;
    return false;
  }
  return true;
}

std::size_t HostLease::lendable(std::size_t size) {
  std::lock_guard lock(mutex_);
  host_pool::Request r;
  r.unit = size;
  host_pool::Grant g;
  std::vector<int> none;
  return exchange(r, &g, &none) && g.refusal == host_pool::Refusal::none ? g.free : 0;
}

bool HostLease::holding_unimported() const {
  return std::any_of(lent_.begin(), lent_.end(), [](const auto& entry) { return !entry.second.empty(); });
}

bool HostLease::ask(vmm::Location where, std::size_t size) {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_ask_[size]) return false;
  host_pool::Request r;
  r.kind = static_cast<uint8_t>(where.kind);
  r.location_id = where.id;
  r.count = static_cast<uint32_t>(batch_);
  r.unit = size;
  host_pool::Grant g;
  std::vector<int> received;
  if (!exchange(r, &g, &received)) {
    next_ask_[size] = now + ask_again_after;
    return false;
  }
  if (g.refusal == host_pool::Refusal::other_location) {
    log_message(LogLevel::info,
                "host pool on %s: gmemd pins on another NUMA node than this job's device (%d); it pins its own",
                socket_path_.c_str(), static_cast<int>(where.id));
    off_ = true;
    return false;
  }
  if (!pool_unit_) {
    pool_unit_ = g.unit;
    log_message(LogLevel::info,
                "host pool on %s lends units of %llu MiB (and smaller chunks, if it pinned some); host chunks of "
                "sizes it does not lend are pinned by this job (its unit is host_chunk)",
                socket_path_.c_str(), static_cast<unsigned long long>(g.unit >> 20));
  }
  if (g.refusal == host_pool::Refusal::other_unit) {
    refused_.insert(size);
    return false;
  }
  if (received.empty()) {
    next_ask_[size] = now + ask_again_after;
    return false;
  }
  std::vector<Lent>& lent = lent_[size];
  for (std::size_t i = 0; i < received.size(); ++i) lent.push_back({received[i], g.units[i]});
  fds_where_ = where;
  return true;
}

std::string HostLease::report() const {
  const std::size_t units = units_.load(std::memory_order_relaxed);
  if (units == 0) return {};
  return "gmem: report host-pool borrowed=" + std::to_string(borrowed_bytes()) + " units=" + std::to_string(units) +
         " returned=" + std::to_string(returned_.load(std::memory_order_relaxed)) + "\n";
}

}  // namespace gmem::ipc
