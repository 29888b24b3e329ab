// The access table's storage (add, remove, recycled records, the threads'
// counts) and the counting of one launch's references.
#include "pool/access.h"

#include "pool/trace_recorder.h"

namespace gmem::pool {

AccessRecord::Figures AccessRecord::figures() const {
  std::lock_guard lock(table_->mutex_);
  return table_->sums(id_) - taken_;
}

uint64_t AccessRecord::launched() const {
  std::lock_guard lock(table_->mutex_);
  return table_->sums(id_).launches;
}

AccessRecord::Figures AccessRecord::take() {
  std::lock_guard lock(table_->mutex_);
  const Figures now = table_->sums(id_);
  const Figures out = now - taken_;
  taken_ = now;
  return out;
}

void AccessRecord::placed(int64_t host_delta, int64_t peer_delta) {
  if (host_delta) host_.fetch_add(host_delta, std::memory_order_relaxed);
  if (peer_delta) peer_.fetch_add(peer_delta, std::memory_order_relaxed);
}

namespace {

std::atomic<uint64_t> tables_made{0};

// The calling thread's counts of the table it last launched against.
struct ThreadCache {
  uint64_t table = 0;  // its serial
  AccessTable::ThreadCounts* counts = nullptr;
};
thread_local ThreadCache thread_cache;

}  // namespace

AccessTable::AccessTable(bool counting)
    : top_(new std::atomic<Leaf*>[std::size_t(1) << top_bits]()),
      serial_(tables_made.fetch_add(1) + 1),
      counting_(counting) {}

AccessTable::~AccessTable() = default;

AccessTable::ThreadCounts::~ThreadCounts() {
  for (auto& page : pages) delete[] page.load(std::memory_order_relaxed);
}

AccessTable::Counts* AccessTable::ThreadCounts::new_page(uint32_t id) {
  auto* counts = new Counts[std::size_t(1) << page_bits];
  pages[id >> page_bits].store(counts, std::memory_order_release);  // the pool may sum it from now on
  return counts;
}

AccessTable::ThreadCounts& AccessTable::thread_counts() {
  ThreadCache& cache = thread_cache;
  if (cache.table != serial_) {
    cache.counts = &add_thread_counts();
    cache.table = serial_;
  }
  return *cache.counts;
}

AccessTable::ThreadCounts& AccessTable::add_thread_counts() {
  std::lock_guard lock(mutex_);
  return *threads_.emplace_back(std::make_unique<ThreadCounts>());
}

AccessRecord::Figures AccessTable::sums(uint32_t id) const {
  AccessRecord::Figures out;
  for (const auto& thread : threads_) {
    const Counts* page = thread->pages[id >> page_bits].load(std::memory_order_acquire);
    if (!page) continue;
    const Counts& c = page[id & ((1u << page_bits) - 1)];
    out.launches += c.launches.load(std::memory_order_relaxed);
    out.bytes += c.bytes.load(std::memory_order_relaxed);
    out.passes += c.passes.load(std::memory_order_relaxed);
  }
  return out;
}

std::atomic<AccessRecord*>* AccessTable::slot(uint64_t index, bool make) {
  std::atomic<Leaf*>& entry = top_[index >> leaf_bits];
  Leaf* leaf = entry.load(std::memory_order_acquire);
  if (!leaf) {
    if (!make) return nullptr;
    leaves_.push_back(std::make_unique<Leaf>());  // value-initialised: every slot null
    leaf = leaves_.back().get();
    entry.store(leaf, std::memory_order_release);
  }
  return &(*leaf)[index & (leaf_size - 1)];
}

AccessRecord* AccessTable::add(CUdeviceptr base, std::size_t size, int device, std::size_t host_bytes,
                               std::size_t peer_bytes) {
  if (base % slot_bytes || size % slot_bytes || size == 0 || (base + size - 1) >> address_bits) return nullptr;
  std::lock_guard lock(mutex_);
  AccessRecord* record;
  if (free_.empty()) {
    if (made_.load(std::memory_order_relaxed) == max_records) return nullptr;
    record = &storage_.emplace_back();
    record->table_ = this;
    record->id_ = made_.load(std::memory_order_relaxed);
    made_.store(record->id_ + 1, std::memory_order_release);
  } else {
    record = free_.back();
    free_.pop_back();
  }
  record->base_.store(base, std::memory_order_relaxed);
  record->size_.store(size, std::memory_order_relaxed);
  record->device_.store(device, std::memory_order_relaxed);
  record->host_.store(int64_t(host_bytes), std::memory_order_relaxed);
  record->peer_.store(int64_t(peer_bytes), std::memory_order_relaxed);
  record->pointed_.store(false, std::memory_order_relaxed);
  record->taken_ = sums(record->id_);  // what its last range's launches counted is not this one's
  // Published by the release stores: a reader that finds it sees it filled.
  for (uint64_t s = base >> slot_bits, end = (base + size) >> slot_bits; s < end; ++s) {
    slot(s, true)->store(record, std::memory_order_release);
  }
  return record;
}

void AccessTable::remove(CUdeviceptr base, std::size_t size) {
  std::lock_guard lock(mutex_);
  AccessRecord* record = nullptr;
  for (uint64_t s = base >> slot_bits, end = (base + size) >> slot_bits; s < end; ++s) {
    if (auto* entry = slot(s, false)) {
      AccessRecord* was = entry->exchange(nullptr, std::memory_order_acq_rel);
      if (was && was->base() == base) record = was;
    }
  }
  if (record) free_.push_back(record);
}

void AccessTable::set_moving(AccessRecord& record, bool moving) {
  std::lock_guard lock(moved_mutex_);
  if (record.moving_.exchange(moving) == moving) return;
  marked_.fetch_add(moving ? 1 : -1);
  if (!moving) moved_.notify_all();
}

void AccessTable::set_watched(AccessRecord& record, bool watched) {
  std::lock_guard lock(moved_mutex_);
  if (watched) record.touched_.store(false);
  if (record.watched_.exchange(watched) == watched) return;
  marked_.fetch_add(watched ? 1 : -1);
}

void AccessTable::set_parked(AccessRecord& record, bool parked) {
  std::lock_guard lock(moved_mutex_);
  if (record.parked_.exchange(parked) == parked) return;
  marked_.fetch_add(parked ? 1 : -1);
  parked_.fetch_add(parked ? 1 : -1);
}

void AccessTable::wait_unmoved(const AccessRecord& record) {
  std::unique_lock lock(moved_mutex_);
  moved_.wait(lock, [&] { return !record.moving(); });
}

// Each launch takes a new mark, so no mark is cleared between launches.
LaunchReferences::LaunchReferences(AccessTable& table, AccessTable::ThreadCounts& counts, const void* function,
                                   TraceRecorder* trace, bool timed)
    : table_(table), function_(function), trace_(trace), keep_large_(trace || timed), counts_(counts) {
  if (++counts_.mark == 0) {  // wrapped: old marks could equal new ones
    for (auto& page : counts_.pages) {
      if (AccessTable::Counts* counts = page.load(std::memory_order_relaxed)) {
        for (uint32_t i = 0; i < (1u << AccessTable::page_bits); ++i) counts[i].mark = 0;
      }
    }
    counts_.mark = 1;
  }
  mark_ = counts_.mark;
}

uint64_t LaunchReferences::finish(Publisher* publisher) {
  const uint64_t use = trace_ && !large_.empty() ? trace_->used(function_, large_) : LaunchClock::no_use;
  if (!publisher) return use;
  for (uint32_t left = devices_; left; left &= left - 1) {
    const int d = __builtin_ctz(left);
    publisher->add(d, GMEM_STAT_access_launches, 1);
    if (host_[d]) publisher->add(d, GMEM_STAT_host_access_bytes, int64_t(host_[d]));
    if (peer_[d]) publisher->add(d, GMEM_STAT_peer_access_bytes, int64_t(peer_[d]));
  }
  return use;
}

}  // namespace gmem::pool
