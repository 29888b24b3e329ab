#include "accounting_driver.h"

#include <algorithm>
#include <vector>

namespace gmem::accounting {

Accounts accounts;
uint64_t lag = 0, now = 0;

namespace {

std::vector<uint64_t> due;  // by event: the call at which it completes
thread_local int current_device = 0;  // whose memory cuMemGetInfo tells: a context stack is per thread, as in CUDA

CUcontext context_of(int device) { return reinterpret_cast<CUcontext>(0xc0 + device); }
std::size_t& used_of(bool host, bool peer) { return host ? accounts.host_used : peer ? accounts.peer_used : accounts.used; }

CUresult create(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp* prop,
                unsigned long long) {
  if (size == 0 || size % granularity) return CUDA_ERROR_INVALID_VALUE;
  const bool host = prop && prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE;
  const bool peer = !host && prop && prop->location.id == 1;
  if (peer && accounts.peer_used + size > accounts.peer_total) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!host && !peer && accounts.used + size > accounts.total) return CUDA_ERROR_OUT_OF_MEMORY;
  used_of(host, peer) += size;
  ++accounts.creates;
  accounts.host_creates += host;
  *handle = accounts.next_handle++;
  accounts.chunks[*handle] = {size, host, peer};
  if (accounts.cell) accounts.content[*handle].assign(size / accounts.cell, 0);
  return CUDA_SUCCESS;
}
CUresult release(CUmemGenericAllocationHandle handle) {
  if (auto held = accounts.retained.find(handle); held != accounts.retained.end()) {
    if (--held->second == 0) accounts.retained.erase(held);
    return CUDA_SUCCESS;
  }
  auto it = accounts.chunks.find(handle);
  if (it == accounts.chunks.end()) return CUDA_ERROR_INVALID_VALUE;
  used_of(it->second.host, it->second.peer) -= it->second.size;
  accounts.chunks.erase(it);
  accounts.content.erase(handle);
  ++accounts.releases;
  return CUDA_SUCCESS;
}
CUresult retain(CUmemGenericAllocationHandle* handle, void* address) {
  std::vector<Backing> behind;
  if (!backing(reinterpret_cast<CUdeviceptr>(address), 1, &behind)) return CUDA_ERROR_INVALID_VALUE;
  *handle = behind[0].handle;
  ++accounts.retained[*handle];
  return CUDA_SUCCESS;
}
CUresult reserve(CUdeviceptr* ptr, std::size_t size, std::size_t, CUdeviceptr, unsigned long long) {
  *ptr = accounts.next_address;
  accounts.next_address += (size + granularity - 1) / granularity * granularity + granularity;
  return CUDA_SUCCESS;
}
CUresult address_free(CUdeviceptr, std::size_t) { return CUDA_SUCCESS; }
CUresult map(CUdeviceptr ptr, std::size_t size, std::size_t, CUmemGenericAllocationHandle handle, unsigned long long) {
  auto& mappings = accounts.mappings;
  auto next = mappings.lower_bound(ptr);
  const bool overlaps = (next != mappings.end() && next->first < ptr + size) ||
                        (next != mappings.begin() && std::prev(next)->first + std::prev(next)->second.size > ptr);
  if (size == 0 || overlaps) return CUDA_ERROR_INVALID_VALUE;
  mappings.emplace_hint(next, ptr, Accounts::Mapping{size, handle});
  ++accounts.maps;
  auto it = accounts.chunks.find(handle);
  if (it != accounts.chunks.end() && it->second.host) {
    ++accounts.host_maps;
    accounts.host_mapped += size;
  }
  return CUDA_SUCCESS;
}
CUresult unmap(CUdeviceptr ptr, std::size_t size) {
  auto& mappings = accounts.mappings;
  auto first = mappings.lower_bound(ptr), last = first;
  for (; last != mappings.end() && last->first < ptr + size; ++last) {
    if (last->first + last->second.size > ptr + size) return CUDA_ERROR_INVALID_VALUE;
  }
  if (first != mappings.begin() && std::prev(first)->first + std::prev(first)->second.size > ptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  mappings.erase(first, last);
  ++accounts.unmaps;
  return CUDA_SUCCESS;
}
CUresult set_access(CUdeviceptr, std::size_t, const CUmemAccessDesc*, std::size_t) { return CUDA_SUCCESS; }
CUresult get_granularity(std::size_t* out, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  *out = granularity;
  return CUDA_SUCCESS;
}
CUresult total_mem(std::size_t* out, CUdevice device) {
  return *out = device == 1 ? accounts.peer_total : accounts.total, CUDA_SUCCESS;
}
CUresult get_info(std::size_t* free, std::size_t* total) {
  const bool peer = current_device == 1;
  if (free) *free = peer ? accounts.peer_total - accounts.peer_used : accounts.total - accounts.used;
  if (total) *total = peer ? accounts.peer_total : accounts.total;
  return CUDA_SUCCESS;
}
CUresult event_create(CUevent* event, unsigned) {
  due.push_back(0);  // never recorded: complete
  ++accounts.events;
  *event = reinterpret_cast<CUevent>(due.size());
  return CUDA_SUCCESS;
}
uint64_t& due_at(CUevent e) { return due[reinterpret_cast<std::size_t>(e) - 1]; }
CUresult event_record(CUevent e, CUstream) { return due_at(e) = now + lag, CUDA_SUCCESS; }
CUresult event_query(CUevent e) { return now >= due_at(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY; }
CUresult event_synchronize(CUevent e) {
  ++accounts.event_syncs;
  return due_at(e) = 0, CUDA_SUCCESS;
}
CUresult synchronize() {
  ++accounts.syncs;
  for (uint64_t& at : due) at = std::min(at, now);
  return CUDA_SUCCESS;
}
// Visits the cells behind [ptr, ptr + size) in address order, a run of one
// chunk's at a time; false where some address is not mapped or the range
// does not fall on cells.
template <typename Visit>
bool for_cells(CUdeviceptr ptr, std::size_t size, Visit&& visit) {
  std::vector<Backing> behind;
  const std::size_t cell = accounts.cell;
  if (!cell || ptr % cell || size % cell || !backing(ptr, size, &behind)) return false;
  for (const Backing& b : behind) {
    uint64_t* first = accounts.content[b.handle].data() + b.offset / cell;
    visit(first, first + b.size / cell);
  }
  return true;
}

// Copies are counted (a move's: VmmPool::copy), and carry contents where cells are kept.
CUresult copy(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream) {
  accounts.copied += bytes;
  if (!accounts.cell) return CUDA_SUCCESS;
  std::vector<uint64_t> from;
  if (!for_cells(src, bytes, [&](const uint64_t* first, const uint64_t* last) { from.insert(from.end(), first, last); })) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto next = from.cbegin();
  const bool done = for_cells(dst, bytes, [&](uint64_t* first, uint64_t* last) {
    std::copy(next, next + (last - first), first);
    next += last - first;
  });
  return done ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult copy_now(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) { return copy(dst, src, bytes, nullptr); }
CUresult stream_synchronize(CUstream) { return synchronize(); }
CUresult stream_create(CUstream* stream, unsigned) { return *stream = reinterpret_cast<CUstream>(1), CUDA_SUCCESS; }
CUresult get_current(CUcontext* c) { return *c = context_of(0), CUDA_SUCCESS; }
CUresult set_current(CUcontext) { return CUDA_SUCCESS; }
CUresult device_count(int* count) { return *count = accounts.peer_total ? 2 : 1, CUDA_SUCCESS; }
CUresult can_access_peer(int* can, CUdevice, CUdevice) { return *can = 1, CUDA_SUCCESS; }
CUresult p2p_attribute(int* value, CUdevice_P2PAttribute, CUdevice, CUdevice) { return *value = 0, CUDA_SUCCESS; }
CUresult primary_context(CUcontext* c, CUdevice device) { return *c = context_of(device), CUDA_SUCCESS; }
CUresult push_current(CUcontext c) {
  current_device = c == context_of(1);
  return CUDA_SUCCESS;
}
CUresult pop_current(CUcontext* c) {
  *c = context_of(current_device);
  current_device = 0;
  return CUDA_SUCCESS;
}
CUresult attribute(int* value, CUdevice_attribute attribute, CUdevice) {
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: return *value = 0, CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return *value = 1, CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

Moment moment() { return {now, accounts.syncs + accounts.event_syncs}; }
bool reached(const Moment& m) { return now >= m.at + lag || m.syncs != accounts.syncs + accounts.event_syncs; }

void FreesInFlight::freed(CUdeviceptr base, std::size_t bytes, std::vector<Backing> behind, uint64_t stream) {
  pending_.push_back({base, bytes, std::move(behind), stream, moment()});
}

const std::vector<FreesInFlight::Freed>& FreesInFlight::pending() {
  std::erase_if(pending_, [](const Freed& f) { return reached(f.when); });
  return pending_;
}

std::vector<const FreesInFlight::Freed*> FreesInFlight::remapped() {
  std::vector<const Freed*> out;
  for (const Freed& f : pending()) {
    std::vector<Backing> at;
    backing(f.base, f.bytes, &at);
    if (at != f.behind) out.push_back(&f);
  }
  return out;
}

void reset(std::size_t total, std::size_t peer_total) {
  accounts = Accounts();
  accounts.total = total;
  accounts.peer_total = peer_total;
  due.clear();
  now = 0;
}

bool backing(CUdeviceptr ptr, std::size_t size, std::vector<Backing>* out) {
  const auto& mappings = accounts.mappings;
  auto it = mappings.upper_bound(ptr);
  if (it == mappings.begin()) return false;
  --it;
  for (CUdeviceptr at = ptr; at < ptr + size; ++it) {
    if (it == mappings.end() || it->first > at || it->first + it->second.size <= at) return false;
    const std::size_t offset = at - it->first, part = std::min<std::size_t>(it->second.size - offset, ptr + size - at);
    out->push_back({it->second.handle, offset, part});
    at += part;
  }
  return true;
}

namespace {
// What `write` puts in the cell `index` cells from its `ptr`.
uint64_t cell_value(uint64_t value, uint64_t index) { return value << 32 | index; }
}  // namespace

bool write(CUdeviceptr ptr, std::size_t size, uint64_t value) {
  uint64_t index = 0;
  return for_cells(ptr, size, [&](uint64_t* first, uint64_t* last) {
    for (; first != last; ++first) *first = cell_value(value, index++);
  });
}

bool holds(CUdeviceptr ptr, std::size_t size, uint64_t value) {
  bool same = true;
  uint64_t index = 0;
  return for_cells(ptr, size,
                   [&](const uint64_t* first, const uint64_t* last) {
                     for (; first != last && same; ++first) same = *first == cell_value(value, index++);
                   }) &&
         same;
}

bool digest(CUdeviceptr ptr, std::size_t size, uint64_t* hash) {
  *hash = 14695981039346656037ull;
  return for_cells(ptr, size, [&](const uint64_t* first, const uint64_t* last) {
    for (; first != last; ++first) *hash = (*hash ^ *first) * 1099511628211ull;
  });
}

vmm::Driver driver() {
  vmm::Driver d;
  d.cuMemCreate = create;
  d.cuMemRelease = release;
  d.cuMemRetainAllocationHandle = retain;
  d.cuMemAddressReserve = reserve;
  d.cuMemAddressFree = address_free;
  d.cuMemMap = map;
  d.cuMemUnmap = unmap;
  d.cuMemSetAccess = set_access;
  d.cuMemGetAllocationGranularity = get_granularity;
  d.cuDeviceTotalMem_v2 = total_mem;
  d.cuMemGetInfo_v2 = get_info;
  d.cuEventCreate = event_create;
  d.cuEventRecord = event_record;
  d.cuEventQuery = event_query;
  d.cuEventSynchronize = event_synchronize;
  d.cuCtxSynchronize = synchronize;
  d.cuMemcpyDtoDAsync_v2 = copy;
  d.cuMemcpyDtoD_v2 = copy_now;
  d.cuStreamSynchronize = stream_synchronize;
  d.cuStreamCreate = stream_create;
  d.cuCtxGetCurrent = get_current;
  d.cuCtxSetCurrent = set_current;
  d.cuDeviceGetCount = device_count;
  d.cuDeviceGetAttribute = attribute;
  d.cuDeviceCanAccessPeer = can_access_peer;
  d.cuDeviceGetP2PAttribute = p2p_attribute;
  d.cuDevicePrimaryCtxRetain = primary_context;
  d.cuCtxPushCurrent_v2 = push_current;
  d.cuCtxPopCurrent_v2 = pop_current;
  return d;
}

}  // namespace gmem::accounting
