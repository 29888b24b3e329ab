// The evictor's choice of what to move and its batches of moves (pool/evictor.h).
#include "pool/evictor.h"

#include <algorithm>

#include "pool/clock.h"

namespace gmem::pool {

Evictor::Evictor(VmmPool& vmm, AccessTable& table, const vmm::Driver& driver, Settings settings)
    : vmm_(vmm), table_(table), driver_(driver), settings_(std::move(settings)) {}

Evictor::Work Evictor::work() const {
  std::lock_guard lock(mutex_);
  return work_;
}

void Evictor::look() {
  if (settings_.capturing && settings_.capturing()) return;
  for (int device : vmm_.devices()) look(device, devices_[device]);
  {
    std::lock_guard lock(mutex_);
    ++looks_;
  }
  looked_.notify_all();
}

void Evictor::make_room(int device, std::size_t size) {
  if (vmm_.device_room(device) >= size) return;
  const int64_t start = now_ns();
  const int64_t deadline = start + std::chrono::nanoseconds(settings_.wait).count();
  std::unique_lock lock(mutex_);
  std::size_t& wanted = wanted_[device];
  wanted = std::max(wanted, size);
  stuck_[device] = false;
  const uint64_t last_look = looks_ + settings_.wait_looks;
  while (!stuck_[device] && looks_ < last_look && now_ns() < deadline) {
    looked_.wait_for(lock, period);
    lock.unlock();
    const bool room = vmm_.device_room(device) >= size;
    lock.lock();
    if (room) break;
  }
  wanted = 0;
  ++work_.waits;
  work_.wait_ns += uint64_t(now_ns() - start);
}

bool Evictor::wait_moves() {
  std::unique_lock lock(mutex_);
  if (!moving_) return false;
  ++work_.retries;
  moved_.wait_for(lock, settings_.wait, [&] { return !moving_; });
  return true;
}

void Evictor::look(int device, DeviceState& state) {
  const std::vector<VmmPool::Live> lives = vmm_.live_ranges(device);
  if (lives.empty()) return;
  std::unordered_map<CUdeviceptr, Seen> seen;
  for (const VmmPool::Live& l : lives) {
    const AccessRecord* record = table_.find(l.base);
    const uint64_t launches = record ? record->launched() : 0;
    auto before = state.seen.find(l.base);
    Seen now{l.last_use, launches};
    if (before != state.seen.end() && before->second.handed == l.last_use) {
      const Seen& was = before->second;
      now.idle = was.launches == launches ? was.idle + 1 : 0;
      now.evicted = was.evicted && l.spilled > 0;
      now.evicted_at = was.evicted_at;
      now.evicted_launches = was.evicted_launches;
      now.returned = was.returned && was.launches == launches;
    }
    seen[l.base] = now;
  }
  state.seen = std::move(seen);
  std::erase_if(state.ended, [&](const auto& e) {
    auto it = state.seen.find(e.first);
    return it == state.seen.end() || !it->second.evicted;
  });

  if (driver_.cuCtxPushCurrent_v2(lives.front().context) != CUDA_SUCCESS) return;
  const std::size_t room = vmm_.device_room(device);
  std::size_t& total = totals_[device];
  if (!total && driver_.cuDeviceTotalMem_v2(&total, device) != CUDA_SUCCESS) total = 0;
  CUcontext popped = nullptr;
  driver_.cuCtxPopCurrent_v2(&popped);
  const auto high = std::size_t(double(total) * settings_.high_room);
  std::size_t wanted;
  {
    std::lock_guard lock(mutex_);
    wanted = wanted_[device];
  }
  const std::size_t low = std::max(std::size_t(double(total) * settings_.low_room), wanted);
  const std::size_t enough = wanted + high;

  // Back, the last evicted first. Once a launch has used an evicted range
  // where it lies (the program has reached it: a backward pass uses what its
  // forward pass made in reverse), those evicted before it come back next, as
  // far as `ahead` and the room go; until then, as long as `high` stays free
  // beside them and no request waits for room.
  std::vector<const VmmPool::Live*> evicted;
  uint64_t reached = 0;
  for (const VmmPool::Live& l : lives) {
    const Seen& s = state.seen[l.base];
    if (!s.evicted) continue;
    evicted.push_back(&l);
    if (s.launches != s.evicted_launches) reached = std::max(reached, s.evicted_at);
  }
  auto next = [&](const VmmPool::Live* l) {
    const Seen& s = state.seen[l->base];
    return s.evicted_at < reached && s.launches == s.evicted_launches;
  };
  std::sort(evicted.begin(), evicted.end(), [&](const auto* a, const auto* b) {
    return std::pair(next(a), state.seen[a->base].evicted_at) > std::pair(next(b), state.seen[b->base].evicted_at);
  });
  std::vector<CUdeviceptr> back;
  std::size_t taking = 0;
  const auto ahead = std::size_t(double(total) * settings_.ahead);
  for (const VmmPool::Live* l : evicted) {
    if (next(l) ? taking + l->spilled > ahead || room < taking + l->spilled : wanted || room < taking + l->spilled + high) {
      break;
    }
    back.push_back(l->base);
    taking += l->spilled;
  }
  if (!back.empty()) {
    for (CUdeviceptr base : move(state, lives.front().context, back, false)) {
      Seen& s = state.seen[base];
      s.evicted = false;
      s.returned = true;
    }
    return;
  }
  if (room >= low) return;
  // Off the device, the oldest idle first, until `high` is free.
  std::vector<const VmmPool::Live*> idle;
  for (const VmmPool::Live& l : lives) {
    const Seen& s = state.seen[l.base];
    if (l.spilled == 0 && s.idle >= settings_.idle_looks && !s.returned) idle.push_back(&l);
  }
  std::sort(idle.begin(), idle.end(), [](const auto* a, const auto* b) { return a->last_use < b->last_use; });
  std::vector<CUdeviceptr> off;
  std::size_t freed = 0;
  for (const VmmPool::Live* l : idle) {
    if (room + freed >= enough) break;
    off.push_back(l->base);
    freed += l->size;
  }
  if (wanted) {
    // Even all it could move, once idle, would not make the room: the request spills.
    std::size_t movable = 0;
    for (const VmmPool::Live& l : lives) movable += l.spilled == 0 && !state.seen[l.base].returned ? l.size : 0;
    std::lock_guard lock(mutex_);
    stuck_[device] = room + movable < wanted;
  }
  for (CUdeviceptr base : move(state, lives.front().context, off, true)) {
    Seen& s = state.seen[base];
    s.evicted = true;
    s.evicted_at = ++state.evictions;
    s.evicted_launches = s.launches;
  }
}

CUstream Evictor::stream_of(CUcontext context) {
  CUstream& stream = streams_[context];
  if (!stream && driver_.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) stream = nullptr;
  return stream;
}

std::vector<CUdeviceptr> Evictor::move(DeviceState& state, CUcontext context, const std::vector<CUdeviceptr>& bases,
                                       bool to_host) {
  // Current while the moves are planned too: the device's free memory
  // (cuMemGetInfo) bounds the chunks a move to the device may make.
  if (driver_.cuCtxPushCurrent_v2(context) != CUDA_SUCCESS) return {};
  {
    std::lock_guard lock(mutex_);
    moving_ = true;  // from the first chunk a plan makes
  }
  std::vector<VmmPool::Move> moves;
  std::vector<AccessRecord*> records;
  for (CUdeviceptr base : bases) {
    VmmPool::Move m;
    if (!vmm_.plan_move(base, to_host, &m)) continue;
    AccessRecord* record = table_.find(base);
    if (!record || m.context != context) {
      vmm_.finish_move(m, false);
      continue;
    }
    moves.push_back(std::move(m));
    records.push_back(record);
  }
  auto pop = [&] {
    CUcontext popped = nullptr;
    driver_.cuCtxPopCurrent_v2(&popped);
    std::lock_guard lock(mutex_);
    moving_ = false;
    moved_.notify_all();
  };
  if (moves.empty()) {
    pop();
    return {};
  }
  Submissions& gate = *settings_.submissions;
  auto capturing = [&] { return settings_.capturing && settings_.capturing(); };
  const int64_t start = now_ns();
  // Marked from a point no submitting call straddles: from then on a launch
  // that references a range touches it (to the host) or waits for it (to the
  // device), and any other call changes `entries`.
  uint64_t entries = 0;
  bool quiet = !to_host;  // no launch or other call since each range was evicted
  const bool watching = gate.begin_moves([&] {
    entries = gate.entries();
    for (std::size_t i = 0; i < moves.size(); ++i) {
      AccessRecord& r = *records[i];
      to_host ? table_.set_watched(r, true) : table_.set_moving(r, true);
      auto ended = state.ended.find(moves[i].base);
      quiet = quiet && ended != state.ended.end() && ended->second.launched == r.launched() &&
              ended->second.entries == entries;
    }
  });
  if (watching) gate.end_moves();
  // Work submitted before that point completes; the program's goes on
  // meanwhile (not while a capture runs: a sync would break it). Ranges
  // untouched since their eviction ended have no such work.
  const bool synced =
      watching && !capturing() && (quiet || driver_.cuCtxSynchronize() == CUDA_SUCCESS);
  const int64_t synced_at = now_ns();
  const CUstream stream = synced ? stream_of(context) : nullptr;
  std::vector<CUdeviceptr> out;
  std::vector<Block> blocks;
  uint64_t cancelled = 0, resynced = 0;
  for (std::size_t i = 0; i < moves.size(); ++i) {
    VmmPool::Move& m = moves[i];
    AccessRecord& record = *records[i];
    bool closed = false;
    // Once the gate is closed to all but launches, and a launch that
    // references the range waits: a range touched since it was watched stays
    // where it is; where another call was submitted since, the device is
    // synchronized (it may have written the range) before the remap.
    auto before_remap = [&] {
      closed = gate.begin_moves([&] { table_.set_moving(record, true); });
      if (!closed || record.touched() || capturing()) return VmmPool::Check::cancel;
      if (gate.entries() == entries) return VmmPool::Check::go;
      ++resynced;
      if (driver_.cuCtxSynchronize() != CUDA_SUCCESS) return VmmPool::Check::cancel;
      entries = gate.entries();
      return VmmPool::Check::copy_again;
    };
    const CUresult status = stream ? vmm_.carry_out(m, stream, before_remap) : CUDA_ERROR_NOT_READY;
    if (status == CUDA_SUCCESS && to_host) {
      state.ended[m.base] = {record.launched(), gate.entries()};  // the gate still closed
    } else if (status == CUDA_SUCCESS) {
      state.ended.erase(m.base);
    }
    table_.set_moving(record, false);
    table_.set_watched(record, false);
    if (closed) gate.end_moves();
    const bool done = status == CUDA_SUCCESS;
    cancelled += stream && status == CUDA_ERROR_NOT_READY;
    vmm_.finish_move(m, done);
    if (!done) continue;
    out.push_back(m.base);
    if (std::optional<Block> block = vmm_.find(m.base); block && block->size) blocks.push_back(*block);
  }
  pop();
  if (!blocks.empty() && settings_.moved) settings_.moved(blocks);
  std::lock_guard lock(mutex_);
  if (out.size() == moves.size()) {
    ++work_.rounds;
  } else {
    ++work_.abandoned;
  }
  (to_host ? work_.evictions : work_.prefetches) += out.size();
  work_.cancelled += cancelled;
  work_.unsynced += quiet && synced;
  work_.resynced += resynced;
  work_.sync_ns += uint64_t(synced_at - start);
  work_.move_ns += uint64_t(now_ns() - synced_at);
  return out;
}

}  // namespace gmem::pool
