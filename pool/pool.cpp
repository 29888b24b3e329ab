// Pool: the shim's allocation interface; routes each call to the VMM pool or
// the driver, keeps the registry and the published figures (pool/pool.h).
// Pointer and memory queries are in pool_queries.cpp.
#include "pool/pool.h"

#include <cstring>

namespace gmem::pool {

namespace {

// Marks a per-thread default stream's identity (stream_identity).
constexpr StreamId per_thread_bit = StreamId{1} << 63;

// The stream of identity `stream` (not 0), as the driver names it on the thread it is of.
CUstream stream_handle(StreamId stream) {
  return stream & per_thread_bit ? CU_STREAM_PER_THREAD : reinterpret_cast<CUstream>(stream);
}

}  // namespace

Allocation Pool::describe(uint64_t key, std::size_t size, Kind kind, CUstream stream) const {
  Allocation a;
  a.key = key;
  a.size = size;
  a.kind = kind;
  a.stream = stream;
  // Accounting only: a failure leaves the fields unknown, never fails the call.
  driver_.cuCtxGetCurrent(&a.context);
  CUdevice device = -1;
  if (driver_.cuCtxGetDevice(&device) == CUDA_SUCCESS) a.device = device;
  if (publisher_ && device >= 0 && device < GMEM_STATS_MAX_DEVICES) publish_uuid(device);
  return a;
}

// Readers tell devices apart by uuid (ordinals depend on CUDA_VISIBLE_DEVICES):
// published once per device, at its first allocation.
void Pool::publish_uuid(int device) const {
  const uint32_t bit = 1u << device;
  if (uuids_published_.load(std::memory_order_relaxed) & bit) return;
  if (uuids_published_.fetch_or(bit, std::memory_order_relaxed) & bit) return;
  CUuuid uuid{};
  if (driver_.cuDeviceGetUuid_v2(&uuid, device) != CUDA_SUCCESS) return;
  uint8_t bytes[16];
  std::memcpy(bytes, uuid.bytes, sizeof bytes);
  publisher_->set_uuid(device, bytes);
}

// Frees through `free_call` and keeps the registry in step with the driver: the
// entry leaves the map before the driver frees (so the address may be reused at
// once by another thread) and comes back if the driver refuses.
template <typename FreeCall>
CUresult Pool::free_tracked(Registry& registry, uint64_t key, FreeCall&& free_call) {
  std::optional<Allocation> held = registry.take(key);
  if (held && held->pooled && held->references == 1) {  // before its range goes
    uses_.freed(key, held->size);
    if (trace_) trace_->freed(key);
  }
  if (held && held->references > 1) {
    Allocation rest = *held;
    --rest.references;
    registry.put_back(rest);
  }
  CUresult status = free_call();
  if (held) {
    if (status != CUDA_SUCCESS) {
      if (held->references > 1) registry.take(key);
      registry.put_back(*held);
    } else if (held->references == 1) {
      registry.count_free(*held);
    }
  }
  return status;
}

CUresult Pool::alloc_pooled(CUdeviceptr* dptr, Allocation a, StreamId stream, SpillVeto* veto) {
  if (!a.context) {
    // No current context: answer as the driver does (not initialised, or none).
    CUresult status = driver_.cuCtxGetCurrent(&a.context);
    return status != CUDA_SUCCESS ? status : CUDA_ERROR_INVALID_CONTEXT;
  }
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  Block block;
  const Uses::Request use = uses_.request(a.device, a.size);
  // Only what the plan (placing by use) leaves to the device waits for room there.
  const std::size_t on_device = a.size > use.off_device ? a.size - use.off_device : 0;
  bool evicting = false;
  if (evictor_ && a.size >= Uses::min_size && !quiet() && tiers_->spilled(a.device)) {
    mover_->spilled(now_ns());  // a request short of room keeps the mover's thread evicting
    if (on_device) evicting = evictor_->make_room(a.device, on_device);
  }
  const Work before = trace_ ? vmm_->work(a.device) : Work{};
  const StreamOrder::Figures events_before = trace_ ? vmm_->events() : StreamOrder::Figures{};
  // Whether the GPU ran out of work while the pool made a range: the time
  // was then the step's, not hidden behind queued kernels. Never while a
  // stream capture runs: querying a stream would invalidate it.
  auto busy = [&] { return driver_.cuStreamQuery(stream_handle(stream)) == CUDA_ERROR_NOT_READY; };
  const bool busy_before = trace_ && !quiet() && busy();
  const uint64_t moves_ended = evictor_ ? evictor_->moves_ended() : 0;
  CUresult status =
      vmm_->alloc(&block, a.size, a.device, a.context, stream, quiet(), use.off_device, use.device_first, evicting);
  // A batch of the evictor's moves holds the memory its ranges leave and the
  // memory they go to until it ends; then the first is free again (also where
  // it ended while this request was tried).
  if (status == CUDA_ERROR_OUT_OF_MEMORY && evictor_ && evictor_->wait_moves(moves_ended)) {
    status =
        vmm_->alloc(&block, a.size, a.device, a.context, stream, quiet(), use.off_device, use.device_first, evicting);
  }
  if (evicting) evictor_->served(a.device, on_device);
  if (status != CUDA_SUCCESS) return status;
  if (trace_ && access_ && access_->counting()) trace_->counting();
  if (tiers_->spilled(a.device)) {
    if (trace_ && !trace_->device_full_said()) {
      const Split held = tiers_->held(a.device);
      trace_->device_full(vmm_->figures(a.device).reserved - held.host - held.peer);
    }
    const Split spilled = tiers_->split(block.base, block.size);
    // Whether a request would spill is known once it is served: a refused
    // one's memory goes back to the cache, where its device part serves next.
    if (veto && (spilled.host || spilled.peer) && !quiet() && veto->refuse(a.size)) {
      vmm_->refuse(block.base);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a.host_bytes = spilled.host;
    a.peer_bytes = spilled.peer;
  }
  a.key = *dptr = block.base;
  const std::size_t asked = vmm_->figures(a.device).asked;
  const bool spilling = tiers_->spilled(a.device);
  // A step the trials time ends once the device has caught up to it: the
  // program's thread runs ahead of the device by more or less from step to
  // step (it waits for frees in some), so its clock alone times steps short
  // or long (the GCN capped at 31G on an H100, timed so: 4.0-7.3 s where the
  // job's steps took 5.2-5.8 s; docs/results.md, fiftieth session).
  if (use.kind && !quiet() && uses_.ends_step(block.base, use, asked, spilling)) {
    if (stream) {
      driver_.cuStreamSynchronize(stream_handle(stream));
    } else {
      driver_.cuCtxSynchronize();
    }
  }
  if (use.kind && clock_) settle_timed();
  if (use.kind && uses_.served(block.base, use, asked, spilling, now_ns(), vmm_->work(a.device))) {
    uses_.peak(a.device, vmm_->device_room(a.device));
  }
  a.pooled = true;
  a.physical = block.physical;
  a.chunks = block.chunks;
  allocations_.insert(a);
  if (trace_) {
    const Work after = vmm_->work(a.device);
    const StreamOrder::Figures events = vmm_->events();
    const bool made_range = after.misses > before.misses;
    const uint64_t waits = events.waits - events_before.waits;
    const TraceRecorder::Made made{after.maps - before.maps,
                                   after.map_ns - before.map_ns,
                                   a.host_bytes,
                                   (made_range || waits) && busy_before && !busy(),
                                   made_range ? vmm_->last_missed(a.device) : Recall::Missed{},
                                   waits,
                                   events.wait_ns - events_before.wait_ns,
                                   made_range};
    const bool said = made_range || waits || a.host_bytes;
    trace_->allocated(block.base, a.size, stream, use.off_device, said ? &made : nullptr);
  }
  return CUDA_SUCCESS;
}

void Pool::placement_moved(const std::vector<Block>& blocks) {
  for (const Block& b : blocks) {
    const Split now = tiers_->split(b.base, b.size);
    allocations_.replace_placement(b.base, now.host, now.peer, b.chunks);
  }
}

void Pool::unpark(CUdeviceptr ptr, std::size_t bytes) {
  if (!vmm_ || !access_) return;
  access_->for_each_record(ptr, bytes, [&](const AccessRecord& r) {
    if (r.parked() && !(evictor_ && evictor_->bring_back(r.base(), r))) {
      vmm_->unpark(r.base());
      if (trace_) trace_->evictor(r.base(), "unparked");
    }
    return true;
  });
}

std::size_t Pool::bring_in(const std::vector<const AccessRecord*>& spilled, bool slow) {
  if (bring_in_ == BringIn::off || spilled.empty() || quiet()) return 0;
  const std::optional<Block> first = vmm_->find(spilled.front()->base());
  if (!first || !first->context) return 0;
  if (bring_in_ == BringIn::tried && !slow && !uses_.brings_in(first->device)) return 0;
  if (evictor_ && uses_.evicts(first->device)) return 0;
  std::size_t room = vmm_->device_room(first->device);
  std::vector<CUdeviceptr> bases;
  for (const AccessRecord* r : spilled) {
    const std::size_t host = r->host_bytes();
    if (r->device() != first->device || host > room) continue;
    room -= host;
    bases.push_back(r->base());
  }
  return mover_->bring_in(bases, first->context);
}

void Pool::timed(LaunchTiming& timing, CUfunction f, uint64_t use, const std::vector<RangeReference>& refs) {
  LaunchClock::Ran ran{.function = f, .use = use, .charges = uses_.charges(refs)};
  for (const RangeReference& r : refs) ran.host += r.host;
  timing.done(std::move(ran));
  settle_timed();
}

void Pool::settle_timed() {
  for (const LaunchClock::Ran& ran : clock_->ran()) {
    uses_.ran(ran.charges, ran.us);
    if (trace_ && ran.use != LaunchClock::no_use) trace_->ran(ran.use, ran.us, ran.host);
    if (slow_below_ && ran.function && ran.host >= bring_in_least) {
      std::lock_guard lock(slow_mutex_);
      if (double(ran.host) < slow_below_ * ran.us) {
        slow_.insert(ran.function);
      } else {
        slow_.erase(ran.function);
      }
    }
  }
}

bool Pool::slow_launch(CUfunction f) {
  if (!slow_below_ || !clock_) return false;
  settle_timed();
  std::lock_guard lock(slow_mutex_);
  return slow_.contains(f);
}

CUresult Pool::alloc(CUdeviceptr* dptr, std::size_t size) {
  if (vmm_) return alloc_pooled(dptr, describe(0, size, Kind::device, nullptr), 0, spill_veto_);
  CUresult status = driver_.cuMemAlloc_v2(dptr, size);
  if (status == CUDA_SUCCESS) allocations_.insert(describe(*dptr, size, Kind::device, nullptr));
  return status;
}

// What the driver serves itself may fail for memory the pool caches: the pool
// gives its cache back and the call is tried once more.
template <typename Call>
CUresult Pool::with_cache_given_back(Call&& call) {
  CUresult status = call();
  if (status == CUDA_ERROR_OUT_OF_MEMORY && vmm_ && vmm_->give_back_cache(quiet())) status = call();
  return status;
}

CUresult Pool::alloc_pitch(CUdeviceptr* dptr, std::size_t* pitch, std::size_t width, std::size_t height,
                           unsigned element_size) {
  CUresult status =
      with_cache_given_back([&] { return driver_.cuMemAllocPitch_v2(dptr, pitch, width, height, element_size); });
  if (status == CUDA_SUCCESS) allocations_.insert(describe(*dptr, *pitch * height, Kind::pitched, nullptr));
  return status;
}

CUresult Pool::alloc_managed(CUdeviceptr* dptr, std::size_t size, unsigned flags) {
  CUresult status = with_cache_given_back([&] { return driver_.cuMemAllocManaged(dptr, size, flags); });
  if (status == CUDA_SUCCESS) allocations_.insert(describe(*dptr, size, Kind::managed, nullptr));
  return status;
}

namespace {

// Tells streams apart for stream-ordered reuse. The legacy default stream is
// one stream; each thread's per-thread default stream is its own.
StreamId stream_identity(CUstream stream, DefaultStream default_stream) {
  thread_local const char this_thread = 0;
  if (stream == CU_STREAM_PER_THREAD || (!stream && default_stream == DefaultStream::per_thread)) {
    return reinterpret_cast<StreamId>(&this_thread) | per_thread_bit;
  }
  return stream ? reinterpret_cast<StreamId>(stream) : reinterpret_cast<StreamId>(CU_STREAM_LEGACY);
}

// The stream handle that means the caller's stream to any driver entry point.
CUstream explicit_stream(CUstream stream, DefaultStream default_stream) {
  return !stream && default_stream == DefaultStream::per_thread ? CU_STREAM_PER_THREAD : stream;
}

}  // namespace

bool Pool::capturing(CUstream stream, DefaultStream default_stream) const {
  if (captures_.load(std::memory_order_relaxed) == 0) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  auto query = default_stream == DefaultStream::per_thread ? driver_.cuStreamIsCapturing_ptsz
                                                           : driver_.cuStreamIsCapturing;
  // A stream the driver cannot describe is left to the driver as well.
  return query(stream, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void Pool::capture_ended() {
  int seen = captures_.load(std::memory_order_relaxed);
  while (seen > 0 && !captures_.compare_exchange_weak(seen, seen - 1, std::memory_order_relaxed)) {
  }
}

CUresult Pool::alloc_async(CUdeviceptr* dptr, std::size_t size, CUmemoryPool mempool, CUstream stream,
                           DefaultStream default_stream) {
  // The pool serves the default memory pool's requests; an explicit pool (its
  // own properties, IPC), graph captures and the driver's own answer to 0
  // bytes are the driver's.
  if (vmm_ && !mempool && size && !capturing(stream, default_stream)) {
    return alloc_pooled(dptr, describe(0, size, Kind::async, stream), stream_identity(stream, default_stream));
  }
  const bool per_thread = default_stream == DefaultStream::per_thread;
  CUresult status = with_cache_given_back([&] {
    if (mempool) {
      return (per_thread ? driver_.cuMemAllocFromPoolAsync_ptsz : driver_.cuMemAllocFromPoolAsync)(dptr, size,
                                                                                                  mempool, stream);
    }
    return (per_thread ? driver_.cuMemAllocAsync_ptsz : driver_.cuMemAllocAsync)(dptr, size, stream);
  });
  if (status == CUDA_SUCCESS) allocations_.insert(describe(*dptr, size, Kind::async, stream));
  return status;
}

CUresult Pool::before_free(CUdeviceptr ptr) {
  for (FreeObserver* observer : free_observers_) {
    if (CUresult refused = observer->before_free(ptr)) return refused;
  }
  return CUDA_SUCCESS;
}

CUresult Pool::free(CUdeviceptr dptr) {
  return free_tracked(allocations_, dptr, [&] {
    if (vmm_) {
      if (CUresult refused = before_free(dptr)) return refused;
      if (std::optional<CUresult> status = vmm_->free(dptr)) return *status;
    }
    return driver_.cuMemFree_v2(dptr);
  });
}

CUresult Pool::free_async(CUdeviceptr dptr, CUstream stream, DefaultStream default_stream) {
  return free_tracked(allocations_, dptr, [&] {
    if (vmm_) {
      if (CUresult refused = before_free(dptr)) return refused;
      OrderedFree order{explicit_stream(stream, default_stream), stream_identity(stream, default_stream)};
      if (std::optional<CUresult> status = vmm_->free_async(dptr, order, capturing(stream, default_stream), quiet())) {
        return *status;
      }
    }
    auto free_call = default_stream == DefaultStream::per_thread ? driver_.cuMemFreeAsync_ptsz
                                                                 : driver_.cuMemFreeAsync;
    return free_call(dptr, stream);
  });
}

CUresult Pool::create(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp* prop,
                      unsigned long long flags) {
  CUresult status = with_cache_given_back([&] { return driver_.cuMemCreate(handle, size, prop, flags); });
  if (status == CUDA_SUCCESS) {
    Allocation a = describe(*handle, size, Kind::physical, nullptr);
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) a.device = prop->location.id;
    handles_.insert(a);
  }
  return status;
}

CUresult Pool::release(CUmemGenericAllocationHandle handle) {
  return free_tracked(handles_, handle, [&] { return driver_.cuMemRelease(handle); });
}

CUresult Pool::retain_handle(CUmemGenericAllocationHandle* handle, void* address) {
  // Pool memory is cuMemAlloc memory to the program, which has no handle: the
  // pool's chunks are not the program's to export or unmap.
  if (find_block(reinterpret_cast<CUdeviceptr>(address))) return CUDA_ERROR_INVALID_VALUE;
  CUresult status = driver_.cuMemRetainAllocationHandle(handle, address);
  if (status == CUDA_SUCCESS) handles_.retain(*handle);
  return status;
}

CUresult Pool::map(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle,
                   unsigned long long flags) {
  return driver_.cuMemMap(ptr, size, offset, handle, flags);
}

CUresult Pool::unmap(CUdeviceptr ptr, std::size_t size) { return driver_.cuMemUnmap(ptr, size); }

std::optional<int> Pool::default_mempool_device(CUmemoryPool mempool) const {
  CUdevice device = 0;
  CUmemoryPool default_pool = nullptr;
  if (!vmm_ || driver_.cuCtxGetDevice(&device) != CUDA_SUCCESS) return std::nullopt;
  if (driver_.cuDeviceGetDefaultMemPool(&default_pool, device) != CUDA_SUCCESS || default_pool != mempool) {
    return std::nullopt;
  }
  return device;
}

// The figures of the default pool are the driver's own (graph captures still
// use it) plus gmem's pool.
CUresult Pool::mempool_attribute(CUmemoryPool mempool, CUmemPool_attribute attribute, void* value) {
  CUresult status = driver_.cuMemPoolGetAttribute(mempool, attribute, value);
  std::optional<int> device = default_mempool_device(mempool);
  if (status != CUDA_SUCCESS || !device) return status;
  const VmmPool::Figures ours = vmm_->figures(*device);
  auto* figure = static_cast<cuuint64_t*>(value);
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *figure += ours.reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *figure += ours.reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *figure += ours.used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *figure += ours.used_high; break;
    default: break;
  }
  return status;
}

CUresult Pool::set_mempool_attribute(CUmemoryPool mempool, CUmemPool_attribute attribute,
                                                    void* value) {
  CUresult status = driver_.cuMemPoolSetAttribute(mempool, attribute, value);
  std::optional<int> device = default_mempool_device(mempool);
  if (status == CUDA_SUCCESS && device) {
    // Resetting a high-water mark (the only value allowed is 0) resets ours too.
    if (attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) vmm_->reset_high(*device, VmmPool::High::reserved);
    if (attribute == CU_MEMPOOL_ATTR_USED_MEM_HIGH) vmm_->reset_high(*device, VmmPool::High::used);
  }
  return status;
}

CUresult Pool::trim_mempool(CUmemoryPool mempool, std::size_t keep) {
  CUresult status = driver_.cuMemPoolTrimTo(mempool, keep);
  if (std::optional<int> device = status == CUDA_SUCCESS ? default_mempool_device(mempool) : std::nullopt) {
    vmm_->trim(*device, keep);
  }
  return status;
}

void Pool::primary_context_retained(CUdevice device, CUcontext context) {
  std::lock_guard lock(primary_mutex_);
  primary_contexts_[device] = context;
}

void Pool::primary_context_released(CUdevice device) {
  unsigned flags = 0;
  int active = 1;
  if (driver_.cuDevicePrimaryCtxGetState(device, &flags, &active) != CUDA_SUCCESS || active) return;
  CUcontext context = nullptr;
  {
    std::lock_guard lock(primary_mutex_);
    auto it = primary_contexts_.find(device);
    if (it == primary_contexts_.end()) return;
    context = it->second;
    primary_contexts_.erase(it);
  }
  context_destroyed(context);
}

void Pool::context_destroyed(CUcontext context) {
  allocations_.purge_context(context);
  if (elsewhere_) elsewhere_->context_destroyed(context);
  if (vmm_) {
    for (FreeObserver* observer : free_observers_) observer->before_context_destroyed(context);
  }
  if (vmm_) vmm_->forget_context(context);
}

}  // namespace gmem::pool
