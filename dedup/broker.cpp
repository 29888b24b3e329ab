#include "dedup/broker.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "ipc/fd_passing.h"

namespace gmem::dedup {

namespace {

ino_t namespace_of(pid_t pid, const char* which) {
  struct stat st {};
  std::string path = "/proc/" + std::to_string(pid) + "/ns/" + which;
  return stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

}  // namespace

std::unique_ptr<Broker> Broker::bind(const std::string& path, std::string* problem, bool any_namespace) {
  // Root serves every user (each in its own group); a user's broker only them.
  int fd = fds::listen_at(path, "dedup broker", problem);
  if (fd < 0) return nullptr;
  int stop = eventfd(0, EFD_CLOEXEC);
  return std::unique_ptr<Broker>(new Broker(fd, stop, path, any_namespace));
}

Broker::~Broker() {
  stop();
  for (auto& [fd, c] : connections_) {
    if (c.offer) wire::close_all(c.offer->fds);
    close(fd);
  }
  for (auto& [id, e] : entries_) wire::close_all(e.fds);
  close(listen_);
  close(stop_);
  unlink(path_.c_str());
}

void Broker::start() { thread_ = std::thread([this] { serve(); }); }

void Broker::stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = write(stop_, &one, sizeof one);
  thread_.join();
}

void Broker::serve() {
  for (;;) {
    std::vector<pollfd> fds{{stop_, POLLIN, 0}, {listen_, POLLIN, 0}};
    for (auto& [fd, c] : connections_) fds.push_back({fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) accept_one();
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const int fd = fds[i].fd;
      auto it = connections_.find(fd);
      if (it == connections_.end()) continue;
      wire::Message m;
      std::vector<int> received;
      if (!(fds[i].revents & POLLIN) || !wire::receive(fd, &m, &received, 0) || !handle(fd, it->second, m, received)) {
        wire::close_all(received);
        drop(fd);
      }
    }
  }
}

void Broker::accept_one() {
  int fd = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return;
  ucred peer{};
  socklen_t len = sizeof peer;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || (geteuid() != 0 && peer.uid != geteuid())) {
    close(fd);  // another user: refused
    return;
  }
  Group group{peer.uid, 0, 0};
  if (!any_namespace_) {
    group.user_ns = namespace_of(peer.pid, "user");
    group.pid_ns = namespace_of(peer.pid, "pid");
  }
  connections_[fd] = Connection{group, {}};
}

bool Broker::handle(int fd, Connection& c, wire::Message& m, std::vector<int>& fds) {
  switch (m.type) {
    case wire::Type::offer: {
      if (c.offer || m.chunk_count == 0) return false;  // one offer at a time
      uint64_t total = 0;
      for (unsigned i = 0; i < m.chunk_count; ++i) total += m.chunk_sizes[i];
      if (total != m.key.range_size || m.key.size > m.key.range_size || m.key.size == 0) return false;
      c.offer = std::make_unique<Offer>(Offer{m, std::move(fds), {}, 0});
      fds.clear();
      return advance(fd, c);
    }
    case wire::Type::verdict: {
      if (!c.offer || c.offer->comparing != m.token) return false;
      auto e = entries_.find(m.token);
      if (e != entries_.end()) --e->second.comparing;
      c.offer->comparing = 0;
      if (m.equal) {
        if (e == entries_.end()) return false;  // cannot happen: an entry being compared stays
        ++e->second.holders[fd];
        wire::close_all(c.offer->fds);  // the offered copy is no longer mapped by anyone
        c.offer.reset();
        wire::Message joined;
        joined.type = wire::Type::joined;
        joined.token = m.token;
        return wire::send(fd, joined);
      }
      forget_if_unused(m.token);
      return advance(fd, c);
    }
    case wire::Type::release:
      if (!fds.empty() || entries_.find(m.token) == entries_.end()) return false;
      unhold(m.token, fd, 1);
      return true;
    default:
      return false;
  }
}

bool Broker::advance(int fd, Connection& c) {
  Offer& offer = *c.offer;
  auto [first, last] = index_.equal_range({c.group, offer.message.key});
  for (auto it = first; it != last; ++it) {
    if (std::find(offer.tried.begin(), offer.tried.end(), it->second) != offer.tried.end()) continue;
    Entry& e = entries_.at(it->second);
    wire::Message candidate;
    candidate.type = wire::Type::candidate;
    candidate.token = it->second;
    candidate.key = e.key;
    candidate.chunk_count = static_cast<uint32_t>(e.fds.size());
    std::copy(e.sizes.begin(), e.sizes.end(), candidate.chunk_sizes);
    offer.tried.push_back(it->second);
    offer.comparing = it->second;
    ++e.comparing;
    return wire::send(fd, candidate, e.fds);
  }
  // Nothing (left) to compare with: the offer becomes an entry that this
  // connection holds.
  const uint64_t id = next_entry_++;
  Entry& e = entries_[id];
  e.group = c.group;
  e.key = offer.message.key;
  e.fds = std::move(offer.fds);
  e.sizes.assign(offer.message.chunk_sizes, offer.message.chunk_sizes + offer.message.chunk_count);
  e.holders[fd] = 1;
  index_.emplace(std::make_tuple(c.group, e.key), id);
  c.offer.reset();
  wire::Message kept;
  kept.type = wire::Type::kept;
  kept.token = id;
  return wire::send(fd, kept);
}

void Broker::unhold(uint64_t entry, int fd, int count) {
  auto e = entries_.find(entry);
  if (e == entries_.end()) return;
  auto h = e->second.holders.find(fd);
  if (h == e->second.holders.end()) return;
  if ((h->second -= count) <= 0) e->second.holders.erase(h);
  forget_if_unused(entry);
}

void Broker::forget_if_unused(uint64_t entry) {
  auto e = entries_.find(entry);
  if (e == entries_.end() || !e->second.holders.empty() || e->second.comparing > 0) return;
  auto [first, last] = index_.equal_range({e->second.group, e->second.key});
  for (auto it = first; it != last; ++it) {
    if (it->second == entry) {
      index_.erase(it);
      break;
    }
  }
  wire::close_all(e->second.fds);
  entries_.erase(e);
}

void Broker::drop(int fd) {
  auto c = connections_.find(fd);
  if (c == connections_.end()) return;
  if (c->second.offer) {
    wire::close_all(c->second.offer->fds);
    if (uint64_t comparing = c->second.offer->comparing) {
      auto e = entries_.find(comparing);
      if (e != entries_.end()) --e->second.comparing;
      forget_if_unused(comparing);
    }
  }
  std::vector<uint64_t> held;
  for (auto& [id, e] : entries_) {
    if (e.holders.count(fd)) held.push_back(id);
  }
  for (uint64_t id : held) unhold(id, fd, INT32_MAX);
  connections_.erase(c);
  close(fd);
}

}  // namespace gmem::dedup
