// The access table's storage (add, remove, recycled records) and the counting
// of one launch's references.
#include "pool/access.h"

namespace gmem::pool {

AccessRecord::Figures AccessRecord::figures() const {
  return {launches_.load(std::memory_order_relaxed), bytes_.load(std::memory_order_relaxed)};
}

AccessRecord::Figures AccessRecord::take() {
  return {launches_.exchange(0, std::memory_order_relaxed), bytes_.exchange(0, std::memory_order_relaxed)};
}

void AccessRecord::placed(int64_t host_delta, int64_t peer_delta) {
  if (host_delta) host_.fetch_add(host_delta, std::memory_order_relaxed);
  if (peer_delta) peer_.fetch_add(peer_delta, std::memory_order_relaxed);
}

AccessTable::AccessTable() : top_(new std::atomic<Leaf*>[std::size_t(1) << top_bits]()) {}

AccessTable::~AccessTable() = default;

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
    record = &storage_.emplace_back();
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
  record->take();
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

namespace {

// Per thread: for each record id, the mark of the last launch that counted it;
// each launch takes a new mark, so nothing is cleared between launches.
struct Marks {
  std::vector<uint32_t> of_record;
  uint32_t last = 0;
};
thread_local Marks marks;

}  // namespace

LaunchReferences::LaunchReferences(const AccessTable& table) : table_(table) {
  if (++marks.last == 0) {  // wrapped: old marks could equal new ones
    std::fill(marks.of_record.begin(), marks.of_record.end(), 0);
    marks.last = 1;
  }
  mark_ = marks.last;
  if (marks.of_record.size() < table.records()) marks.of_record.resize(table.records() + 64);
  marks_ = marks.of_record.data();
}

void LaunchReferences::reference(AccessRecord& record) {
  const uint32_t id = record.id_;
  if (id >= marks.of_record.size()) {  // made since the launch began
    marks.of_record.resize(table_.records() + 64);
    marks_ = marks.of_record.data();
  }
  if (marks_[id] == mark_) return;
  marks_[id] = mark_;
  ++ranges_;
  record.launches_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t host = record.host_bytes(), peer = record.peer_bytes();
  if (host + peer) record.bytes_.fetch_add(host + peer, std::memory_order_relaxed);
  const int device = record.device();
  if (device < 0 || device >= GMEM_STATS_MAX_DEVICES) return;
  const uint32_t bit = 1u << device;
  if (!(devices_ & bit)) {
    devices_ |= bit;
    host_[device] = peer_[device] = 0;
  }
  host_[device] += host;
  peer_[device] += peer;
}

void LaunchReferences::finish(Publisher* publisher) {
  if (!publisher) return;
  for (uint32_t left = devices_; left; left &= left - 1) {
    const int d = __builtin_ctz(left);
    publisher->add(d, GMEM_STAT_access_launches, 1);
    if (host_[d]) publisher->add(d, GMEM_STAT_host_access_bytes, int64_t(host_[d]));
    if (peer_[d]) publisher->add(d, GMEM_STAT_peer_access_bytes, int64_t(peer_[d]));
  }
}

}  // namespace gmem::pool
