// The registry of live allocations: what each pointer is, by kind, with its
// size and stream, for frees and pointer queries (pool/registry.h).
#include "pool/registry.h"

namespace gmem::pool {

const char* kind_name(Kind kind) {
  switch (kind) {
#define GMEM_KIND_NAME(k, name, published) \
  case Kind::k:                 \
    return name;
    GMEM_ALLOCATION_KINDS(GMEM_KIND_NAME)
#undef GMEM_KIND_NAME
  }
  return "?";
}

uint64_t Stats::live_allocations() const {
  uint64_t live = 0;
  for (const auto& k : kinds) live += k.allocations - k.frees;
  return live;
}

namespace {

void raise_peak(std::atomic<uint64_t>& peak, uint64_t value) {
  uint64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

Registry::Shard& Registry::shard(uint64_t key) {
  return shards_[(key ^ (key >> 9) ^ (key >> 21)) % shard_count];
}

const Registry::Shard& Registry::shard(uint64_t key) const {
  return const_cast<Registry*>(this)->shard(key);
}

void Ledger::count_allocation(Allocation& a) {
  Counters& c = counters_[static_cast<std::size_t>(a.kind)];
  c.allocations.fetch_add(1, std::memory_order_relaxed);
  c.bytes.fetch_add(a.size, std::memory_order_relaxed);
  raise_peak(c.peak_bytes, c.live_bytes.fetch_add(a.size, std::memory_order_relaxed) + a.size);
  raise_peak(peak_bytes_, live_bytes_.fetch_add(a.size, std::memory_order_relaxed) + a.size);
  if (!publisher_) return;
  // What the pool serves is reserved as chunks; what the driver serves, as asked.
  publisher_->account(a.device, Publisher::Event::allocation, a.size, !a.pooled, a.host_bytes, a.peer_bytes);
  place(a);
}

// A program's own physical handles have no address to list. An allocation's
// tier is its slowest part's.
void Ledger::place(Allocation& a) {
  if (a.kind == Kind::physical) return;
  const uint8_t tier = a.host_bytes ? GMEM_TIER_HOST : a.peer_bytes ? GMEM_TIER_PEER : GMEM_TIER_DEVICE;
  a.placement = publisher_->place({0, a.key, a.size, a.pooled ? a.physical : a.size, a.device, tier,
                                   static_cast<uint8_t>(a.kind), a.chunks, a.host_bytes, a.peer_bytes});
}

void Ledger::count_move(Allocation& a, std::size_t host, std::size_t peer, uint16_t chunks) {
  const int64_t host_delta = int64_t(host) - int64_t(a.host_bytes), peer_delta = int64_t(peer) - int64_t(a.peer_bytes);
  a.host_bytes = host;
  a.peer_bytes = peer;
  a.chunks = chunks;
  if (!publisher_) return;
  publisher_->add(a.device, GMEM_STAT_device_bytes, -host_delta - peer_delta);
  publisher_->add(a.device, GMEM_STAT_host_bytes, host_delta);
  publisher_->add(a.device, GMEM_STAT_peer_bytes, peer_delta);
  publisher_->unplace(a.placement);
  place(a);
}

void Ledger::count_free(const Allocation& a) {
  Counters& c = counters_[static_cast<std::size_t>(a.kind)];
  c.frees.fetch_add(1, std::memory_order_relaxed);
  c.live_bytes.fetch_sub(a.size, std::memory_order_relaxed);
  live_bytes_.fetch_sub(a.size, std::memory_order_relaxed);
  if (!publisher_) return;
  publisher_->account(a.device, Publisher::Event::free, a.size, !a.pooled, a.host_bytes, a.peer_bytes);
  publisher_->unplace(a.placement);
}

void Registry::replace_placement(uint64_t key, std::size_t host, std::size_t peer, uint16_t chunks) {
  Shard& s = shard(key);
  std::lock_guard lock(s.mutex);
  auto it = s.map.find(key);
  if (it != s.map.end() && it->second.pooled) ledger_.count_move(it->second, host, peer, chunks);
}

void Registry::insert(Allocation allocation) {
  ledger_.count_allocation(allocation);
  std::optional<Allocation> stale;
  {
    Shard& s = shard(allocation.key);
    std::lock_guard lock(s.mutex);
    auto [it, inserted] = s.map.try_emplace(allocation.key, allocation);
    if (!inserted) {
      stale = it->second;
      it->second = allocation;
    }
  }
  if (stale) ledger_.count_free(*stale);
}

std::optional<Allocation> Registry::take(uint64_t key) {
  Shard& s = shard(key);
  std::lock_guard lock(s.mutex);
  auto it = s.map.find(key);
  if (it == s.map.end()) return std::nullopt;
  Allocation a = it->second;
  s.map.erase(it);
  return a;
}

void Registry::put_back(const Allocation& allocation) {
  Shard& s = shard(allocation.key);
  std::lock_guard lock(s.mutex);
  s.map.try_emplace(allocation.key, allocation);
}

bool Registry::retain(uint64_t key) {
  Shard& s = shard(key);
  std::lock_guard lock(s.mutex);
  auto it = s.map.find(key);
  if (it == s.map.end()) return false;
  ++it->second.references;
  return true;
}

std::optional<Allocation> Registry::find(uint64_t key) const {
  const Shard& s = shard(key);
  std::lock_guard lock(s.mutex);
  auto it = s.map.find(key);
  if (it == s.map.end()) return std::nullopt;
  return it->second;
}

void Registry::purge_context(CUcontext context) {
  for (Shard& s : shards_) {
    std::lock_guard lock(s.mutex);
    for (auto it = s.map.begin(); it != s.map.end();) {
      if (it->second.context == context) {
        ledger_.count_free(it->second);
        it = s.map.erase(it);
      } else {
        ++it;
      }
    }
  }
}

Stats Ledger::stats() const {
  Stats out;
  for (std::size_t i = 0; i < kind_count; ++i) {
    const Counters& c = counters_[i];
    out.kinds[i] = {c.allocations.load(std::memory_order_relaxed), c.frees.load(std::memory_order_relaxed),
                    c.bytes.load(std::memory_order_relaxed), c.live_bytes.load(std::memory_order_relaxed),
                    c.peak_bytes.load(std::memory_order_relaxed)};
  }
  out.live_bytes = live_bytes_.load(std::memory_order_relaxed);
  out.peak_bytes = peak_bytes_.load(std::memory_order_relaxed);
  return out;
}

}  // namespace gmem::pool
