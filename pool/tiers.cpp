// Tiers: where physical memory comes from (device, peer, pinned host),
// within each tier's budget, and what each holds (pool/tiers.h).
#include "pool/tiers.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>

namespace gmem::pool {

namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
std::size_t round_down(std::size_t n, std::size_t to) { return n / to * to; }

// A spilled chunk for `want` bytes: the tier's unit, or for less, the smallest
// power-of-two multiple of the granularity that holds `want`.
std::size_t in_units(std::size_t granularity, std::size_t unit, std::size_t want) {
  unit = std::max(granularity, round_down(unit, granularity));
  std::size_t size = granularity;
  while (size < want && size < unit) size *= 2;
  return std::min(size, unit);
}

}  // namespace


namespace {

// Every Tiers, for the exit and fork handlers of their preparers.
std::mutex running_mutex;
std::vector<Tiers*> running;

void stop_all_preparers() {
  std::lock_guard lock(running_mutex);
  for (Tiers* t : running) t->stop_preparer();
}

void lock_all_before_fork() {
  running_mutex.lock();
  for (Tiers* t : running) t->before_fork();
}
void unlock_all_in_parent() {
  for (Tiers* t : running) t->after_fork(false);
  running_mutex.unlock();
}
void unlock_all_in_child() {
  for (Tiers* t : running) t->after_fork(true);
  running_mutex.unlock();
}

}  // namespace

Tiers::Tiers(const vmm::Driver& driver, Budgets budgets, Publisher* publisher, std::size_t host_available)
    : driver_(driver), budgets_(budgets), publisher_(publisher), host_available_(host_available) {
  std::lock_guard lock(running_mutex);
  running.push_back(this);
}

Tiers::~Tiers() {
  std::lock_guard lock(running_mutex);
  std::erase(running, this);
}

bool Tiers::preparing() const {
  std::lock_guard lock(mutex_);
  return preparer_ != nullptr;
}

std::size_t Tiers::prepared_bytes() const {
  std::lock_guard lock(mutex_);
  return prepared_;
}

void Tiers::stop_preparer() {
  HostPreparer* preparer = nullptr;
  {
    std::lock_guard lock(mutex_);
    preparer = preparer_.get();
  }
  if (preparer) preparer->stop();  // it may need mutex_ to finish its chunk
}

// No thread of ours may hold the lock across fork: the child would find it
// held forever.
void Tiers::before_fork() { mutex_.lock(); }

void Tiers::after_fork(bool child) {
  // The child has no preparer thread; its object (and locks) are left alone.
  if (child) (void)preparer_.release();
  mutex_.unlock();
}

std::size_t Tiers::host_chunk_locked(int device, std::size_t want) {
  const std::size_t budget = host_budget_locked();
  return in_units(info(device).granularity, std::min(budgets_.host_chunk.of(budget), budget / 16), want);
}

std::size_t Tiers::host_chunk(int device, std::size_t want) {
  std::lock_guard lock(mutex_);
  return host_chunk_locked(device, want);
}

void Tiers::prepare_ahead(int device) {
  const std::size_t target = budgets_.host_prepare.share < 0 ? budgets_.host_prepare.bytes
                                                              : budgets_.host_prepare.of(host_budget_locked());
  DeviceInfo& d = info(device);
  vmm::Location where;
  if (!target || !d.topology.host_location(&where)) return;
  if (!preparer_) {
    // The thread works in the context of the allocation that found the device near full.
    CUcontext context = nullptr;
    driver_.cuCtxGetCurrent(&context);
    preparer_device_ = device;
    preparer_unit_ = host_chunk_locked(device, SIZE_MAX);
    preparer_ = std::make_unique<HostPreparer>(target, preparer_unit_, [this, where, context](vmm::Chunk* out) {
      CUcontext current = nullptr;
      if (driver_.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current != context) driver_.cuCtxSetCurrent(context);
      return prepare_host(where, preparer_unit_, out);
    });
    static std::once_flag handlers;
    std::call_once(handlers, [] {
      // Registered after cuInit, so they run before the driver's own exit handlers.
      std::atexit(stop_all_preparers);
      pthread_atfork(lock_all_before_fork, unlock_all_in_parent, unlock_all_in_child);
    });
  }
  preparer_->wake();
}

CUresult Tiers::prepare_host(vmm::Location where, std::size_t size, vmm::Chunk* out) {
  {
    // Half the room at most: what the program asks for now comes first.
    std::lock_guard lock(mutex_);
    if (size > host_room_locked() / 2) return CUDA_ERROR_OUT_OF_MEMORY;
    host_held_ += size;
  }
  CUresult status = pin_host(where, size, 0, out);
  std::lock_guard lock(mutex_);
  if (status != CUDA_SUCCESS) {
    host_held_ -= size;
    return status;
  }
  held_[out->handle()] = Held{-1, true, size};
  prepared_ += size;
  publish_prepared(preparer_device_);
  return CUDA_SUCCESS;
}

CUresult Tiers::pin_host(vmm::Location where, std::size_t size, std::size_t smallest, vmm::Chunk* out) {
  for (std::size_t borrowed = size; lease_.take; borrowed /= 2) {
    if (lease_.take(where, borrowed, out, this)) return CUDA_SUCCESS;
    if (!smallest || borrowed / 2 < smallest || (borrowed / 2) % smallest) break;
  }
  const CUresult status = vmm::Chunk::create(driver_, where, size, out, this);
  if (status == CUDA_SUCCESS && lease_.missed) lease_.missed(size);
  return status;
}

void Tiers::publish_prepared(int device) {
  if (publisher_) publisher_->set(device, GMEM_STAT_host_prepared_bytes, prepared_);
}

Tiers::DeviceInfo& Tiers::info(int device) {
  DeviceInfo& d = devices_[device];
  if (d.known) return d;
  d.known = true;
  vmm::topology(driver_, device, &d.topology);
  if (driver_.cuDeviceTotalMem_v2(&d.total, device) != CUDA_SUCCESS) d.total = 0;
  // Host and peer chunks are made in the host's granularity, at least the device's.
  std::size_t host = 0;
  vmm::granularity(driver_, device, &d.granularity);
  vmm::Location where;
  if (d.topology.host_location(&where) && vmm::granularity(driver_, where, &host) == CUDA_SUCCESS) {
    d.granularity = std::max(d.granularity, host);
  }
  if (!d.granularity) d.granularity = std::size_t{2} << 20;
  return d;
}

std::size_t Tiers::host_budget_locked() {
  if (!host_budget_known_) {
    host_budget_known_ = true;
    if (!host_available_) host_available_ = vmm::host_available_memory();
    // What gmemd pinned for jobs is no longer in MemAvailable, but it is theirs.
    if (lease_.lendable && budgets_.host_chunk.share < 0) host_available_ += lease_.lendable(budgets_.host_chunk.bytes);
    host_budget_ = budgets_.host.of(host_available_);
  }
  return host_budget_;
}

std::size_t Tiers::host_budget() {
  std::lock_guard lock(mutex_);
  return host_budget_locked();
}

std::size_t Tiers::host_held() const {
  std::lock_guard lock(mutex_);
  return host_held_;
}

Split Tiers::held(int device) const {
  std::lock_guard lock(mutex_);
  auto it = devices_.find(device);
  return it == devices_.end() ? Split{} : it->second.spilled;
}

std::size_t Tiers::peer_room(int peer) {
  DeviceInfo& p = info(peer);
  if (!p.context && driver_.cuDevicePrimaryCtxRetain(&p.context, peer) != CUDA_SUCCESS) {
    p.context = nullptr;
    return 0;
  }
  std::size_t free = 0, total = 0;
  if (vmm::memory_info(driver_, p.context, &free, &total) != CUDA_SUCCESS) return 0;
  const std::size_t reserve = budgets_.peer_reserve.of(total);
  const std::size_t budget = budgets_.peer.of(total);
  const std::size_t above_reserve = free > reserve ? free - reserve : 0;
  const std::size_t within_budget = budget > p.peer_held ? budget - p.peer_held : 0;
  return std::min(above_reserve, within_budget);
}

std::size_t Tiers::on_device(int device, std::size_t pool_bytes) {
  const DeviceInfo& d = info(device);
  const std::size_t spilled = d.spilled.peer + d.spilled.host;
  return pool_bytes > spilled ? pool_bytes - spilled : 0;
}

std::size_t Tiers::device_room(int device, std::size_t pool_bytes) {
  const std::size_t held = on_device(device, pool_bytes);
  const std::size_t budget = budgets_.device.of(info(device).total);
  return budget > held ? budget - held : 0;
}

bool Tiers::device_may_hold(int device, std::size_t pool_bytes, std::size_t size) {
  std::lock_guard lock(mutex_);
  const std::size_t room = device_room(device, pool_bytes);
  // Near full: the next chunks may have to come from the host.
  const std::size_t budget = budgets_.device.of(info(device).total);
  if (preparer_ || room < size + budget / 10) prepare_ahead(device);
  // Once the device spills, its last memory (device_reserve) stays the driver's.
  if (spilled(device)) return size <= device_free_locked(device, pool_bytes);
  return size <= room;
}

std::size_t Tiers::device_free_locked(int device, std::size_t pool_bytes) {
  std::size_t free = 0, total = 0;
  if (driver_.cuMemGetInfo_v2(&free, &total) != CUDA_SUCCESS) return 0;
  const std::size_t reserve = budgets_.device_reserve.of(info(device).total);
  return std::min(free - std::min(free, reserve), device_room(device, pool_bytes));
}

std::size_t Tiers::device_free(int device, std::size_t pool_bytes) {
  std::lock_guard lock(mutex_);
  return device_free_locked(device, pool_bytes);
}

std::size_t Tiers::device_held(int device, std::size_t pool_bytes) {
  std::lock_guard lock(mutex_);
  return on_device(device, pool_bytes);
}

CUresult Tiers::make(int device, std::size_t pool_bytes, std::size_t want, bool device_too, vmm::Chunk* out) {
  std::unique_lock lock(mutex_);
  DeviceInfo& d = info(device);
  const std::size_t granularity = d.granularity;
  want = round_up(want, granularity);
  // The device itself, for the part of `want` that still fits: the pool asked
  // for all of it at once, which the driver refused. Not all the memory the
  // driver calls free can be had in one chunk (an H100 with 65 GB free refused
  // a 65 GB chunk): halves are tried, and the rest of `want` asks again.
  if (std::size_t size = device_too ? std::min(want, round_down(device_free_locked(device, pool_bytes), granularity)) : 0) {
    lock.unlock();
    for (; size >= granularity; size = round_down(size / 2, granularity)) {
      if (vmm::Chunk::create(driver_, device, size, out) == CUDA_SUCCESS) return CUDA_SUCCESS;
    }
    lock.lock();
  }
  const std::vector<vmm::Peer> peers = d.topology.peers;
  for (const vmm::Peer& peer : peers) {
    const std::size_t room = round_down(peer_room(peer.device), granularity);
    if (room == 0) continue;
    // Peer chunks are units too, a 64th of the peer's memory: a freed one
    // serves any later spill whole (pool/stitcher.cpp), so one made for a
    // whole tensor would give a small request a range of the tensor's size.
    const std::size_t size = std::min(in_units(granularity, info(peer.device).total / 64, want), room);
    // Counted before the (slow) call, so that no other maker overshoots.
    info(peer.device).peer_held += size;
    lock.unlock();
    CUresult status = vmm::Chunk::create(driver_, vmm::Location::device(peer.device), size, out, this);
    lock.lock();
    info(peer.device).peer_held -= size;
    if (status == CUDA_SUCCESS) {
      hold(*out, device, false);
      info(peer.device).peer_held += size;
      return CUDA_SUCCESS;
    }
    // The peer's memory went to someone else meanwhile: the next tier.
  }
  vmm::Location where;
  if (!d.topology.host_location(&where)) return CUDA_ERROR_OUT_OF_MEMORY;
  prepare_ahead(device);
  // Host chunks are units, or for less, a power of two of the granularity:
  // a freed one serves a later spill of any size (pool/stitcher.h).
  std::size_t size = host_chunk_locked(device, want);
  if (preparer_ && size == preparer_unit_ && preparer_->take(out)) {
    prepared_ -= out->size();
    hold(*out, device, true);  // prepared for no device until now
    publish_prepared(preparer_device_);
    return CUDA_SUCCESS;
  }
  if (preparer_ && host_room_locked() < size) {
    // Prepared chunks give their room to this request.
    std::vector<vmm::Chunk> spare = preparer_->drain();
    lock.unlock();
    spare.clear();
    lock.lock();
  }
  size = std::min(size, round_down(host_room_locked(), granularity));
  if (size == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  host_held_ += size;
  // A smaller chunk borrowed beats one of the size pinned (on the job's
  // thread, about 200 ms a 256 MiB unit): the caller asks again for the rest.
  // That holds for units too: the GCN's first run on a gmemd just started
  // pinned 20 units itself (5.4 GB, 4 s) while 9.6 GB of gmemd's smaller
  // chunks stayed unlent (docs/results.md, fortieth session). gmemd is told
  // of a unit it lacked all the same, to pin units for the next job.
  const std::size_t unit = host_chunk_locked(device, SIZE_MAX);
  lock.unlock();
  CUresult status = pin_host(where, size, granularity, out);
  if (status == CUDA_SUCCESS && size == unit && out->size() < size && lease_.missed) lease_.missed(size);
  lock.lock();
  if (status != CUDA_SUCCESS) {
    host_held_ -= size;
    return status;
  }
  host_held_ -= size - out->size();
  hold(*out, device, true);
  return CUDA_SUCCESS;
}

void Tiers::hold(const vmm::Chunk& chunk, int device, bool host) {
  // (A prepared chunk is already in the host budget.)
  held_[chunk.handle()] = Held{device, host, chunk.size()};
  DeviceInfo& d = devices_[device];
  (host ? d.spilled.host : d.spilled.peer) += chunk.size();
  if (device >= 0 && device < 32) spilled_devices_.fetch_or(1u << device, std::memory_order_relaxed);
  publish(device);
}

void Tiers::publish(int device) {
  if (!publisher_) return;
  const Split& s = devices_[device].spilled;
  publisher_->set(device, GMEM_STAT_host_reserved_bytes, s.host);
  publisher_->set(device, GMEM_STAT_peer_reserved_bytes, s.peer);
}

void Tiers::released(const vmm::Chunk& chunk) {
  bool give_back = false;
  {
    std::lock_guard lock(mutex_);
    give_back = forget(chunk);
  }
  // A host chunk mapped nowhere goes back where it came from (gmemd's pool
  // lends it to the next job); outside the lock, as a lease is taken.
  if (give_back && lease_.give_back) lease_.give_back(chunk.handle());
}

bool Tiers::forget(const vmm::Chunk& chunk) {
  auto it = held_.find(chunk.handle());
  if (it == held_.end()) return false;
  const Held h = it->second;
  held_.erase(it);
  const bool mapped = std::erase_if(mapped_, [&](const auto& entry) { return entry.second.handle == chunk.handle(); });
  const bool give_back = h.host && !mapped;
  if (h.host) {
    host_held_ -= h.size;
  } else {
    devices_[chunk.location().id].peer_held -= h.size;
  }
  if (h.device < 0) {  // prepared, never used
    prepared_ -= h.size;
    publish_prepared(preparer_device_);
    return give_back;
  }
  DeviceInfo& d = devices_[h.device];
  (h.host ? d.spilled.host : d.spilled.peer) -= h.size;
  if (d.spilled.host + d.spilled.peer == 0 && h.device >= 0 && h.device < 32) {
    spilled_devices_.fetch_and(~(1u << h.device), std::memory_order_relaxed);
  }
  publish(h.device);
  return give_back;
}

void Tiers::mapped(const vmm::Chunk& chunk, CUdeviceptr at) {
  std::lock_guard lock(mutex_);
  auto it = held_.find(chunk.handle());
  if (it == held_.end()) return;
  mapped_[at] = Mapped{chunk.size(), chunk.handle(), it->second.host};
  placed(at, it->second.host, int64_t(chunk.size()));
}

// A range listed for the launch hooks changed where part of it lives (a move,
// a remap); ranges being made or unmapped are not listed yet, or any more.
void Tiers::placed(CUdeviceptr at, bool host, int64_t delta) {
  if (!access_) return;
  if (AccessRecord* record = access_->find(at)) record->placed(host ? delta : 0, host ? 0 : delta);
}

void Tiers::unmapped(CUmemGenericAllocationHandle handle, CUdeviceptr at) {
  std::lock_guard lock(mutex_);
  auto it = mapped_.find(at);
  if (it == mapped_.end() || it->second.handle != handle) return;
  placed(at, it->second.host, -int64_t(it->second.size));
  mapped_.erase(it);
}

bool Tiers::spilled(int device) const {
  if (device < 0 || device >= 32) return true;
  return spilled_devices_.load(std::memory_order_relaxed) & (1u << device);
}

Split Tiers::split(CUdeviceptr base, std::size_t size) const {
  Split out;
  std::lock_guard lock(mutex_);
  auto it = mapped_.upper_bound(base);
  if (it != mapped_.begin()) --it;
  for (; it != mapped_.end() && it->first < base + size; ++it) {
    const CUdeviceptr start = std::max(base, it->first);
    const CUdeviceptr end = std::min(base + size, it->first + it->second.size);
    if (end > start) (it->second.host ? out.host : out.peer) += end - start;
  }
  return out;
}

void Tiers::add_tier_memory(int device, std::size_t* free, std::size_t* total) {
  std::lock_guard lock(mutex_);
  DeviceInfo& d = info(device);
  std::size_t room = 0, capacity = 0;
  for (const vmm::Peer& peer : std::vector<vmm::Peer>(d.topology.peers)) {
    room += peer_room(peer.device);
    const DeviceInfo& p = info(peer.device);
    capacity += std::min(budgets_.peer.of(p.total), p.total - std::min(p.total, budgets_.peer_reserve.of(p.total)));
  }
  if (vmm::Location where; d.topology.host_location(&where)) {
    room += host_room_locked();
    capacity += host_budget_locked();
  }
  if (free) *free += room;
  if (total) *total += capacity;
}

}  // namespace gmem::pool
