#include "ipc/host_pool.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>

#include "vmm/topology.h"

namespace gmem::ipc::host_pool {

namespace {

std::string gib(std::size_t bytes) {
  char text[32];
  snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  return text;
}

// What the pool pins, in order: units, with the sets of smaller chunks (one
// of each power of two of `granularity` below the unit, the largest first)
// spread among them, so that a job started while it pins finds both.
std::vector<std::size_t> plan_chunks(std::size_t bytes, std::size_t unit, double small_share,
                                     std::size_t granularity) {
  std::vector<std::size_t> set;
  for (std::size_t size = granularity; size < unit; size *= 2) set.insert(set.begin(), size);
  std::size_t set_bytes = 0;
  for (std::size_t size : set) set_bytes += size;
  std::size_t sets = set_bytes ? static_cast<std::size_t>(static_cast<double>(bytes) * small_share) / set_bytes : 0;
  const std::size_t units = (bytes - std::min(bytes, sets * set_bytes)) / unit;
  // After each unit, the sets that keep their share of what is pinned so far
  // (all of them by the last unit); none at all without a unit.
  std::vector<std::size_t> plan;
  for (std::size_t i = 1, placed = 0; i <= units; ++i) {
    plan.push_back(unit);
    for (; placed * units < i * sets; ++placed) plan.insert(plan.end(), set.begin(), set.end());
  }
  return plan;
}

}  // namespace

std::unique_ptr<Server> Server::start(const vmm::Driver& driver, Settings settings, std::string* problem) {
  vmm::Topology topology;
  vmm::Location where;
  if (vmm::topology(driver, settings.device, &topology) != CUDA_SUCCESS || !topology.host_location(&where)) {
    *problem = "device " + std::to_string(settings.device) + " has no host memory its driver can map (VMM)";
    return nullptr;
  }
  std::size_t granularity = 0;
  if (vmm::granularity(driver, where, &granularity) != CUDA_SUCCESS || granularity == 0 || settings.unit == 0 ||
      settings.unit % granularity != 0) {
    *problem = "the unit (" + std::to_string(settings.unit) + " bytes) must be a multiple of the host's granularity (" +
               std::to_string(granularity) + " bytes)";
    return nullptr;
  }
  std::vector<std::size_t> plan = plan_chunks(settings.bytes, settings.unit, settings.small_share, granularity);
  if (plan.empty()) {
    *problem = "the pool must hold at least one unit (" + std::to_string(settings.unit) + " bytes)";
    return nullptr;
  }
  settings.bytes = 0;
  for (std::size_t size : plan) settings.bytes += size;
  settings.threads = std::max(1u, settings.threads);
  int listen_fd = fds::listen_at(settings.socket, "host pool", problem);
  if (listen_fd < 0) return nullptr;
  return std::unique_ptr<Server>(
      new Server(driver, std::move(settings), where, std::move(plan), listen_fd, eventfd(0, EFD_CLOEXEC)));
}

Server::Server(const vmm::Driver& driver, Settings settings, vmm::Location where, std::vector<std::size_t> plan,
               int listen_fd, int stop_fd)
    : driver_(driver),
      settings_(std::move(settings)),
      where_(where),
      plan_(std::move(plan)),
      listen_(listen_fd),
      stop_(stop_fd) {
  for (std::size_t size : plan_) free_[size];  // the sizes it lends
  if (settings_.say) {
    const std::size_t small = settings_.bytes - settings_.unit * std::count(plan_.begin(), plan_.end(), settings_.unit);
    std::string sets;
    if (free_.size() > 1) {
      sets = " (" + gib(small) + " of it in sets of smaller chunks, " + std::to_string(free_.begin()->first >> 20) +
             " to " + std::to_string(std::prev(free_.end(), 2)->first >> 20) + " MiB)";
    }
    settings_.say("host pool: pinning " + gib(settings_.bytes) + " in units of " + std::to_string(settings_.unit >> 20) +
                  " MiB" + sets + " on " +
                  (where_.kind == vmm::Location::Kind::host_numa ? "NUMA node " + std::to_string(where_.id)
                                                                 : std::string("the host")) +
                  " with " + std::to_string(settings_.threads) + " threads; lending on " + settings_.socket);
  }
  for (unsigned t = 0; t < settings_.threads; ++t) pinners_.emplace_back([this] { pin(); });
  server_ = std::thread([this] { serve(); });
}

Server::~Server() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = write(stop_, &one, sizeof one);
  server_.join();
  for (std::thread& t : pinners_) t.join();
  for (auto& [fd, units] : lent_) close(fd);
  close(listen_);
  close(stop_);
  unlink(settings_.socket.c_str());
}

void Server::pin() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  for (;;) {
    std::vector<vmm::Chunk> unpin;
    std::size_t size = 0;
    bool lacked = false;
    work_.wait(lock, [&] { return stopping_ || failed_ || (size = next_to_pin(&unpin, &lacked)) != 0; });
    if (stopping_ || failed_) return;  // (nothing was taken for this round)
    lock.unlock();
    std::size_t unpinned = 0;
    for (const vmm::Chunk& c : unpin) unpinned += c.size();
    const std::size_t replaced = unpin.size();
    unpin.clear();  // their bytes make the room first
    vmm::Chunk chunk;
    const CUresult status = vmm::Chunk::create(driver_, where_, size, &chunk);
    lock.lock();
    pinning_ -= size;
    if (status != CUDA_SUCCESS) {
      if (!failed_ && settings_.say) {
        const char* name = nullptr;
        if (driver_.cuGetErrorName) driver_.cuGetErrorName(status, &name);
        settings_.say("host pool: pinning stopped at " + gib(pinned_) + ": cuMemCreate failed (" +
                      (name ? name : std::to_string(status)) + ")");
      }
      failed_ = true;
      return;
    }
    std::deque<std::size_t>& free = free_[size];
    if (lacked && settings_.say) {
      settings_.say("host pool: a chunk of " + std::to_string(size >> 20) + " MiB, which a job lacked, pinned in place of " +
                    std::to_string(replaced) + " free (" + std::to_string(unpinned >> 20) +
                    " MiB) of sizes no job lacked; " + std::to_string(free.size() + 1) + " of its size free now");
    }
    free.push_back(units_.size());
    units_.push_back(std::move(chunk));
    pinned_ += size;
    if (!lacked && ++planned_ == plan_.size() && settings_.say) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      settings_.say("host pool: " + gib(pinned_) + " pinned in " + std::to_string(seconds) + " s");
    }
  }
}

std::size_t Server::next_to_pin(std::vector<vmm::Chunk>* unpin, bool* lacked) {
  if (claimed_ < plan_.size()) {
    *lacked = false;
    pinning_ += plan_[claimed_];
    return plan_[claimed_++];
  }
  if (std::any_of(lent_.begin(), lent_.end(), [](const auto& held) { return !held.second.empty(); })) return 0;
  // The largest size lacked that free chunks of sizes none lacked make room for.
  for (auto want = lacked_.rbegin(); want != lacked_.rend(); ++want) {
    const std::size_t size = want->first;
    if (want->second == 0) continue;
    const std::size_t room = settings_.bytes - std::min(settings_.bytes, pinned_ + pinning_);
    std::size_t can = room;
    for (const auto& [s, free] : free_) can += lacked_.contains(s) ? 0 : s * free.size();
    if (can < size) continue;
    // Taken from the size with the most free bytes, one chunk at a time.
    for (std::size_t made = room; made < size;) {
      auto most = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (lacked_.contains(it->first) || it->second.empty()) continue;
        if (most == free_.end() || it->first * it->second.size() > most->first * most->second.size()) most = it;
      }
      const std::size_t index = most->second.back();
      most->second.pop_back();
      unpin->push_back(std::move(units_[index]));  // its slot stays empty: its number is never lent again
      pinned_ -= most->first;
      made += most->first;
    }
    --want->second;
    *lacked = true;
    pinning_ += size;
    return size;
  }
  return 0;
}

std::size_t Server::free_bytes() const {
  std::size_t bytes = 0;
  for (const auto& [size, free] : free_) bytes += size * free.size();
  return bytes;
}

Server::Figures Server::figures() const {
  std::lock_guard lock(mutex_);
  Figures f;
  f.pinned = pinned_;
  f.lent = pinned_ - free_bytes();
  for (const auto& [fd, units] : lent_) f.borrowers += units.empty() ? 0 : 1;
  return f;
}

void Server::serve() {
  for (;;) {
    std::vector<pollfd> polled{{stop_, POLLIN, 0}, {listen_, POLLIN, 0}};
    {
      std::lock_guard lock(mutex_);
      for (const auto& [fd, units] : lent_) polled.push_back({fd, POLLIN, 0});
    }
    if (poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (polled[0].revents) return;
    if (polled[1].revents & POLLIN) accept_one();
    for (std::size_t i = 2; i < polled.size(); ++i) {
      if (!polled[i].revents) continue;
      Request r;
      std::vector<int> received;
      const bool read = (polled[i].revents & POLLIN) && fds::receive(polled[i].fd, &r, sizeof r, &received, 0);
      const bool kept = read && received.empty() && answer(polled[i].fd, r);
      fds::close_all(received);
      if (!kept) drop(polled[i].fd);
    }
  }
}

void Server::accept_one() {
  int fd = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return;
  ucred peer{};
  socklen_t len = sizeof peer;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != geteuid()) {
    close(fd);  // another user: refused (a unit keeps the bytes its last job left)
    return;
  }
  std::lock_guard lock(mutex_);
  lent_[fd];
}

bool Server::answer(int fd, const Request& r) {
  if (r.magic != magic || r.version != version) return false;
  if (r.op == Op::give_back) {
    std::lock_guard lock(mutex_);
    std::vector<std::size_t>& held = lent_[fd];
    for (uint32_t i = 0; i < std::min<uint32_t>(r.count, fds::max_per_message); ++i) {
      auto it = std::find(held.begin(), held.end(), std::size_t{r.units[i]});
      if (it == held.end()) continue;  // not lent to this job: nothing to give back
      held.erase(it);
      free_[units_[r.units[i]].size()].push_back(r.units[i]);
    }
    work_.notify_all();  // room for a size lacked, maybe
    return true;
  }
  if (r.op == Op::missed) {
    // Not while the pool is still being pinned: the size would be there soon.
    // (A size it does not pin was refused.)
    std::lock_guard lock(mutex_);
    if (planned_ == plan_.size() && free_.contains(r.unit)) lacked_[r.unit] += r.count;
    work_.notify_all();
    return true;
  }
  if (r.op != Op::lend) return false;
  Grant g;
  g.unit = settings_.unit;
  std::vector<int> exported;
  {
    std::lock_guard lock(mutex_);
    std::vector<std::size_t>& held = lent_[fd];
    auto free = free_.find(r.unit);
    if (free == free_.end()) {
      g.refusal = Refusal::other_unit;
    } else if (r.count == 0) {
      // How much is free, only.
    } else if (r.kind != static_cast<uint8_t>(where_.kind) || r.location_id != where_.id) {
      g.refusal = Refusal::other_location;
    } else {
      // The oldest first: the lent ones return at the back.
      std::deque<std::size_t>& chunks = free->second;
      const std::size_t n = std::min<std::size_t>({r.count, chunks.size(), fds::max_per_message});
      for (std::size_t i = 0; i < n; ++i) {
        int unit_fd = -1;
        if (units_[chunks.front()].export_fd(&unit_fd) != CUDA_SUCCESS) break;
        g.units[exported.size()] = static_cast<uint32_t>(chunks.front());
        exported.push_back(unit_fd);
        held.push_back(chunks.front());
        chunks.pop_front();
      }
    }
    if (g.refusal == Refusal::none) g.free = free_bytes();
  }
  g.count = static_cast<uint32_t>(exported.size());
  const bool sent = fds::send(fd, &g, sizeof g, exported);
  fds::close_all(exported);
  return sent;  // a grant that did not arrive: the connection goes, and its units come back
}

void Server::drop(int fd) {
  std::lock_guard lock(mutex_);
  auto it = lent_.find(fd);
  if (it == lent_.end()) return;
  for (std::size_t unit : it->second) free_[units_[unit].size()].push_back(unit);
  lent_.erase(it);
  close(fd);
  work_.notify_all();
}

}  // namespace gmem::ipc::host_pool
