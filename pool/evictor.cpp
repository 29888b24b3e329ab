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
  if (capturing()) return;
  for (int device : vmm_.devices()) look(device, devices_[device]);
  {
    std::lock_guard lock(mutex_);
    ++looks_;
    looked_ns_ = now_ns();
  }
  looked_.notify_all();
}

bool Evictor::make_room(int device, std::size_t size) {
  if (!evicting(device)) return false;
  {
    std::lock_guard lock(mutex_);
    claimed_[device] += size;  // until served()
  }
  if (vmm_.device_room(device) >= size) return true;
  const int64_t start = now_ns();
  const int64_t deadline = start + std::chrono::nanoseconds(settings_.wait).count();
  std::unique_lock lock(mutex_);
  std::multiset<std::size_t>& waiting = waiting_[device];
  const auto mine = waiting.insert(size);
  std::size_t& reach = reach_[device];
  reach = SIZE_MAX;
  const uint64_t last_look = looks_ + settings_.wait_looks;
  bool room = false;
  while (reach >= size && looks_ < last_look && now_ns() < deadline) {
    looked_.wait_for(lock, period);
    lock.unlock();
    room = vmm_.device_room(device) >= size;
    lock.lock();
    if (room) break;
  }
  waiting.erase(mine);
  const int64_t waited = now_ns() - start;
  const bool stuck = !room && reach < size;
  tell(0, "waited " + std::to_string(size) + " " + std::to_string(waited / 1000) + " " +
              (room ? "room" : stuck ? "stuck" : "expired"));
  ++work_.waits;
  work_.waits_stuck += stuck;
  work_.waits_expired += !room && !stuck;
  work_.wait_ns += uint64_t(waited);
  return true;
}

void Evictor::served(int device, std::size_t size) {
  std::lock_guard lock(mutex_);
  claimed_[device] -= size;
}

uint64_t Evictor::moves_ended() const {
  std::lock_guard lock(mutex_);
  return ended_;
}

bool Evictor::wait_moves(uint64_t since) {
  std::unique_lock lock(mutex_);
  if (!moving_ && ended_ == since) return false;
  ++work_.retries;
  moved_.wait_for(lock, settings_.wait, [&] { return !moving_; });
  return true;
}

bool Evictor::bring_back(CUdeviceptr base, const AccessRecord& record) {
  std::unique_lock lock(mutex_);
  if (!moving_ && now_ns() - looked_ns_ > std::chrono::nanoseconds(stopped).count()) return false;
  ++work_.urgent;
  const int64_t start = now_ns();
  urgent_.push_back(base);
  auto asked = [&] { return std::find(urgent_.begin(), urgent_.end(), base) != urgent_.end(); };
  moved_.wait_for(lock, std::chrono::seconds(1), [&] { return !record.parked() || !asked(); });
  if (auto it = std::find(urgent_.begin(), urgent_.end(), base); it != urgent_.end()) urgent_.erase(it);
  work_.urgent_back += !record.parked();
  work_.urgent_ns += uint64_t(now_ns() - start);
  tell(base, "urgent " + std::to_string((now_ns() - start) / 1000) + (record.parked() ? " no" : " back"));
  return !record.parked();
}

void Evictor::look(int device, DeviceState& state) {
  const std::vector<VmmPool::Live> lives = vmm_.live_ranges(device);
  state.why.clear();
  if (lives.empty()) return;
  std::unordered_map<CUdeviceptr, Seen> seen;
  const bool evicts = evicting(device);
  for (const VmmPool::Live& l : lives) {
    const AccessRecord* record = table_.find(l.base);
    const uint64_t launches = record ? record->launched() : 0;
    auto before = state.seen.find(l.base);
    Seen now{l.last_use, launches};
    now.pointed = record && record->pointed();
    if (before != state.seen.end() && before->second.handed == l.last_use) {
      const Seen& was = before->second;
      now.idle = was.launches == launches ? was.idle + 1 : 0;
      now.evicted = was.evicted && l.spilled > 0;
      now.evicted_at = was.evicted_at;
      now.evicted_launches = was.evicted_launches;
      now.returned = was.returned && was.launches == launches;
    }
    // While it evicts, a range off the device that it did not move there
    // (placed there when requested: by place_by_use, or short of room) comes
    // back as the evicted ones do, the oldest of them. Under evict:tried, the
    // LM's ranges spilled in the steps before the trial stayed on the host,
    // read in place, and it stepped 3.5-3.6 s against 2.9 s parked from the
    // start; 2.94-3.01 s with them brought back (docs/results.md).
    if (!now.evicted && evicts && l.spilled > 0) {
      now.evicted = true;
      now.evicted_launches = launches;
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
  std::size_t wanted, claimed;
  {
    std::lock_guard lock(mutex_);
    const std::multiset<std::size_t>& waiting = waiting_[device];
    wanted = waiting.empty() ? 0 : *waiting.rbegin();
    claimed = claimed_[device];
  }
  const std::size_t low = std::max(std::size_t(double(total) * settings_.low_room), wanted);
  const std::size_t enough = wanted + high;
  const auto least = std::size_t(double(total) * settings_.least);
  // What may go to the host once idle: on the device, large enough, not
  // brought back with no launch of it since, and not pointed to from device
  // memory (AccessRecord::pointed).
  auto may_go = [&](const VmmPool::Live& l) {
    const Seen& s = state.seen[l.base];
    return l.spilled == 0 && l.size >= least && !s.returned && !s.pointed;
  };

  // Back, the last evicted first. Once the program has reached an evicted
  // range (a launch used it where it lies, or a call waited for it to come
  // back: a backward pass uses what its forward pass made in reverse), those
  // evicted before it come back next, as far as `ahead` and the room go,
  // leaving the room requests claimed (make_room to served(): without that,
  // on the H100, the LM's forward pass reached a range evicted in it, and
  // what came back ahead took the room made for a 20 GB request, which
  // waited 0.9 s; sixty-first session); until then, as long as `high` stays
  // free beside them and no request has a claim. First what calls wait for
  // (bring_back), as far as the room goes; the rest is told no.
  std::vector<CUdeviceptr> back;
  std::size_t taking = 0;
  {
    std::lock_guard lock(mutex_);
    for (const VmmPool::Live& l : lives) {
      if (std::find(urgent_.begin(), urgent_.end(), l.base) == urgent_.end()) continue;
      if (room >= taking + l.spilled) {
        back.push_back(l.base);
        state.why[l.base] = "urgent";
        state.reached = std::max(state.reached, state.seen[l.base].evicted_at);
        taking += l.spilled;
      } else {
        std::erase(urgent_, l.base);
      }
    }
    moved_.notify_all();
  }
  std::vector<const VmmPool::Live*> evicted;
  for (const VmmPool::Live& l : lives) {
    const Seen& s = state.seen[l.base];
    if (!s.evicted) continue;
    evicted.push_back(&l);
    if (s.launches != s.evicted_launches) state.reached = std::max(state.reached, s.evicted_at);
  }
  auto next = [&](const VmmPool::Live* l) {
    const Seen& s = state.seen[l->base];
    return s.evicted_at < state.reached && s.launches == s.evicted_launches;
  };
  std::sort(evicted.begin(), evicted.end(), [&](const auto* a, const auto* b) {
    return std::pair(next(a), state.seen[a->base].evicted_at) > std::pair(next(b), state.seen[b->base].evicted_at);
  });
  const auto ahead = std::size_t(double(total) * settings_.ahead);
  const auto batch = std::size_t(double(total) * settings_.batch);
  for (const VmmPool::Live* l : evicted) {
    if (std::find(back.begin(), back.end(), l->base) != back.end()) continue;
    if (next(l) ? taking + l->spilled > ahead || room < taking + l->spilled + claimed
                : claimed || room < taking + l->spilled + high) {
      break;
    }
    if (!back.empty() && taking + l->spilled > batch) break;
    back.push_back(l->base);
    state.why[l->base] = next(l) ? "ahead" : "room";
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
  if (room >= low || !evicts) return;
  // Off the device, the oldest idle first, until `high` is free.
  std::vector<const VmmPool::Live*> idle;
  for (const VmmPool::Live& l : lives) {
    if (may_go(l) && state.seen[l.base].idle >= settings_.idle_looks) idle.push_back(&l);
  }
  std::sort(idle.begin(), idle.end(), [](const auto* a, const auto* b) { return a->last_use < b->last_use; });
  std::vector<CUdeviceptr> off;
  std::size_t freed = 0;
  for (const VmmPool::Live* l : idle) {
    if (room + freed >= enough) break;
    off.push_back(l->base);
    state.why[l->base] = "idle";
    freed += l->size;
  }
  if (wanted) {
    // A request that even all it could move, once idle, would not make room
    // for spills; smaller ones go on waiting.
    std::size_t movable = 0;
    for (const VmmPool::Live& l : lives) movable += may_go(l) ? l.size : 0;
    std::lock_guard lock(mutex_);
    reach_[device] = room + movable;
  }
  for (CUdeviceptr base : move(state, lives.front().context, off, true)) {
    Seen& s = state.seen[base];
    s.evicted = true;
    s.evicted_at = ++state.evictions;
    s.evicted_launches = s.launches;
  }
}

Evictor::Lane* Evictor::lane_of(CUcontext context, std::size_t events) {
  Lane& lane = lanes_[context];
  if (!lane.stream && driver_.cuStreamCreate(&lane.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    lane.stream = nullptr;
    return nullptr;
  }
  while (lane.events.size() < events) {
    CUevent event = nullptr;
    if (driver_.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return nullptr;
    lane.events.push_back(event);
  }
  return &lane;
}

// A batch of moves under way, one way.
struct Evictor::Batch {
  DeviceState& state;
  bool to_host = false;
  std::vector<VmmPool::Move> moves = {};
  std::vector<AccessRecord*> records = {};
  std::vector<CUresult> status = {};  // each move's so far
  Lane* lane = nullptr;
  uint64_t entries = 0;  // Submissions::entries when the ranges were marked (or synchronized since)
  std::vector<CUdeviceptr> out = {};  // the ranges moved
  std::vector<Block> blocks = {};     // their allocations
  uint64_t cancelled = 0, resynced = 0, copy_wait_ns = 0, driver_ns = 0;
  std::size_t bytes = 0;  // of the ranges moved
};

std::vector<CUdeviceptr> Evictor::move(DeviceState& state, CUcontext context, const std::vector<CUdeviceptr>& bases,
                                       bool to_host) {
  // Current while the moves are planned too: the device's free memory
  // (cuMemGetInfo) bounds the chunks a move to the device may make.
  if (driver_.cuCtxPushCurrent_v2(context) != CUDA_SUCCESS) return {};
  {
    std::lock_guard lock(mutex_);
    moving_ = true;  // from the first chunk a plan makes
  }
  Batch batch{state, to_host};
  const int64_t planned_from = now_ns();
  for (CUdeviceptr base : bases) {
    VmmPool::Move m;
    if (!vmm_.plan_move(base, to_host, &m)) continue;
    AccessRecord* record = table_.find(base);
    if (!record || m.context != context) {
      vmm_.finish_move(m, false);
      continue;
    }
    batch.moves.push_back(std::move(m));
    batch.records.push_back(record);
  }
  const int64_t start = now_ns();
  auto pop = [&] {
    CUcontext popped = nullptr;
    driver_.cuCtxPopCurrent_v2(&popped);
    std::lock_guard lock(mutex_);
    work_.plan_ns += uint64_t(start - planned_from);
    moving_ = false;
    ++ended_;
    moved_.notify_all();
  };
  if (batch.moves.empty()) {
    pop();
    return {};
  }
  Submissions& gate = *settings_.submissions;
  // Marked from a point no submitting call straddles: from then on a launch
  // that references a range touches it (to the host) or waits for it (to the
  // device), and any other call changes `entries`.
  bool quiet = !to_host;  // no launch or other call since each range was evicted
  const bool watching = gate.begin_moves([&] {
    batch.entries = gate.entries();
    for (std::size_t i = 0; i < batch.moves.size(); ++i) {
      AccessRecord& r = *batch.records[i];
      to_host ? table_.set_watched(r, true) : table_.set_moving(r, true);
      auto ended = state.ended.find(batch.moves[i].base);
      quiet = quiet && ended != state.ended.end() && ended->second.launched == r.launched() &&
              ended->second.entries == batch.entries;
    }
  });
  if (watching) gate.end_moves();
  // Work submitted before that point completes; the program's goes on
  // meanwhile (not while a capture runs: a sync would break it). Ranges
  // untouched since their eviction ended have no such work.
  const bool synced = watching && !capturing() && (quiet || driver_.cuCtxSynchronize() == CUDA_SUCCESS);
  const int64_t synced_at = now_ns();
  batch.lane = synced ? lane_of(context, batch.moves.size()) : nullptr;
  batch.status.assign(batch.moves.size(), batch.lane ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
  for (std::size_t i = 0; i < batch.moves.size(); ++i) {
    if (batch.status[i] == CUDA_SUCCESS) batch.status[i] = vmm_.stage(batch.moves[i]);
  }
  to_host ? carry_to_host(batch) : carry_to_device(batch);
  const int64_t end = now_ns();
  // What the batch's time went to: choosing (and making) the chunks its
  // ranges go to, waiting for the device, moving them (of which waiting for
  // the copies), in microseconds.
  if (settings_.told) {
    tell(0, std::string("batch ") + (to_host ? "to-host " : "to-device ") + std::to_string(batch.out.size()) + " " +
              std::to_string(batch.bytes) + " " + std::to_string((start - planned_from) / 1000) + " " +
              std::to_string((synced_at - start) / 1000) + " " + std::to_string((end - synced_at) / 1000) + " " +
              std::to_string(batch.copy_wait_ns / 1000));
  }
  // Told before the batch ends: a request that waited for it (wait_moves)
  // finds the placements as they are.
  if (!batch.blocks.empty() && settings_.moved) settings_.moved(batch.blocks);
  pop();
  std::lock_guard lock(mutex_);
  if (batch.out.size() == batch.moves.size()) {
    ++work_.rounds;
  } else {
    ++work_.abandoned;
  }
  (to_host ? work_.evictions : work_.prefetches) += batch.out.size();
  work_.cancelled += batch.cancelled;
  work_.unsynced += quiet && synced;
  work_.resynced += batch.resynced;
  work_.sync_ns += uint64_t(synced_at - start);
  const uint64_t move_ns = uint64_t(end - synced_at);
  work_.move_ns += move_ns;
  work_.evict_ns += to_host ? move_ns : 0;
  work_.driver_ns += batch.driver_ns;
  work_.copy_wait_ns += batch.copy_wait_ns;
  return batch.out;
}

bool Evictor::capturing() const { return settings_.capturing && settings_.capturing(); }

void Evictor::copy(Batch& batch, std::size_t i) {
  CUresult& status = batch.status[i];
  if (status == CUDA_SUCCESS) status = vmm_.copy(batch.moves[i], batch.lane->stream);
  if (status == CUDA_SUCCESS) status = driver_.cuEventRecord(batch.lane->events[i], batch.lane->stream);
}

void Evictor::copied(Batch& batch, std::size_t i) {
  Timer timer(batch.copy_wait_ns);
  if (batch.status[i] == CUDA_SUCCESS) batch.status[i] = driver_.cuEventSynchronize(batch.lane->events[i]);
}

void Evictor::settle(Batch& batch, std::size_t i) {
  VmmPool::Move& m = batch.moves[i];
  AccessRecord& record = *batch.records[i];
  const bool done = batch.status[i] == CUDA_SUCCESS;
  if (done && batch.to_host) {
    batch.state.ended[m.base] = {record.launched(), settings_.submissions->entries()};  // the gate still closed
  } else if (done) {
    batch.state.ended.erase(m.base);
  }
  // The range as it ends up (parked, say) before a launch that waits for it goes on.
  vmm_.finish_move(m, done);
  table_.set_moving(record, false);
  table_.set_watched(record, false);
  batch.driver_ns += m.driver_ns;
  if (settings_.told) {
    auto why = batch.state.why.find(m.base);
    tell(m.base, std::string(done ? (batch.to_host ? "to-host " : "to-device ") : "not-moved ") +
                     std::to_string(m.bytes) + " " + (why == batch.state.why.end() ? "?" : why->second));
  }
  if (!done) return;
  batch.out.push_back(m.base);
  batch.bytes += m.bytes;
  if (std::optional<Block> block = vmm_.find(m.base); block && block->size) batch.blocks.push_back(*block);
}

void Evictor::carry_to_host(Batch& batch) {
  Submissions& gate = *settings_.submissions;
  const std::size_t n = batch.moves.size();
  std::vector<CUresult>& status = batch.status;
  // One closure of the gate to all but launches for the batch. Where another
  // call was submitted since the ranges were watched, the device is
  // synchronized (that call may write a range) before the remaps.
  const bool closed = batch.lane && gate.begin_moves([] {});
  bool go = closed && !capturing();
  if (go && gate.entries() != batch.entries) {
    ++batch.resynced;
    go = driver_.cuCtxSynchronize() == CUDA_SUCCESS;
  }
  for (std::size_t i = 0; i < n; ++i) {
    batch.cancelled += !go && status[i] == CUDA_SUCCESS;
    if (!go) status[i] = CUDA_ERROR_NOT_READY;
  }
  // Each range in turn is marked moving from a point no launch straddles (a
  // launch that references it from then on waits for it; one that touched it
  // since it was watched keeps it where it is, as does a copy that wrote its
  // address into device memory since it was chosen), remapped and its content
  // copied in; the range before it ends (its copy completed, or it goes back
  // to its device chunks) while this one copies.
  auto mark = [&](std::size_t i) {
    if (status[i] != CUDA_SUCCESS) return;
    AccessRecord& record = *batch.records[i];
    bool touched = true;
    if (gate.mark_more([&] {
          touched = record.touched() || record.pointed();
          if (!touched) table_.set_moving(record, true);
        }) && !touched) {
      return;
    }
    status[i] = CUDA_ERROR_NOT_READY;
    ++batch.cancelled;
  };
  // Parking, the range is copied out first and unmapped once its copy completed.
  const bool park = vmm_.parks();
  std::vector<bool> remapped(n);
  auto end = [&](std::size_t i) {
    copied(batch, i);
    if (park && status[i] == CUDA_SUCCESS) status[i] = vmm_.remap(batch.moves[i]);
    if (remapped[i] && status[i] != CUDA_SUCCESS) vmm_.remap(batch.moves[i], false);
    settle(batch, i);
  };
  for (std::size_t i = 0; i < n; ++i) {
    mark(i);
    if (!park && status[i] == CUDA_SUCCESS) remapped[i] = (status[i] = vmm_.remap(batch.moves[i])) == CUDA_SUCCESS;
    copy(batch, i);
    if (i) end(i - 1);
  }
  end(n - 1);
  if (closed) gate.end_moves();
}

void Evictor::carry_to_device(Batch& batch) {
  Submissions& gate = *settings_.submissions;
  const std::size_t n = batch.moves.size();
  CUresult* status = batch.status.data();
  // Every copy at once; each range is remapped once its own completed, while
  // the later ones copy. The gate closes to all but launches around each
  // remap. Where another call was submitted since the ranges were marked, the
  // device is synchronized (it may have written a range while it was copied)
  // and the ranges not yet remapped are copied again.
  for (std::size_t i = 0; i < n; ++i) copy(batch, i);
  for (std::size_t i = 0; i < n; ++i) {
    copied(batch, i);
    const bool closed = status[i] == CUDA_SUCCESS && gate.begin_moves([] {});
    if (status[i] == CUDA_SUCCESS && (!closed || capturing())) {
      status[i] = CUDA_ERROR_NOT_READY;
      ++batch.cancelled;
    }
    if (status[i] == CUDA_SUCCESS && gate.entries() != batch.entries) {
      ++batch.resynced;
      if ((status[i] = driver_.cuCtxSynchronize()) == CUDA_SUCCESS) {
        batch.entries = gate.entries();
        for (std::size_t j = i; j < n; ++j) copy(batch, j);
        copied(batch, i);
      }
    }
    if (status[i] == CUDA_SUCCESS) status[i] = vmm_.remap(batch.moves[i]);
    settle(batch, i);
    if (closed) gate.end_moves();
  }
}

}  // namespace gmem::pool
