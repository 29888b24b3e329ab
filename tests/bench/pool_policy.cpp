// The VMM pool's placement policy alone, on allocation traces: the pool runs
// on a driver that only keeps accounts (no memory behind it), so a trace of
// tens of GB replays in a moment. Prints, per trace, peak physical / peak
// requested and the driver work the policy asked for (chunks made, mappings).
// The figures equal replay-trace's on the emulator, which moves real bytes.
//   pool-policy [--device-memory BYTES] [--max-ratio R] TRACE...
// With --max-ratio, a trace whose peak ratio exceeds R fails the run (the
// policy is deterministic: a regression guard, not a timing).
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "pool/vmm_pool.h"
#include "trace.h"

namespace {

constexpr std::size_t granularity = 2 << 20;

// The accounts of the driver the pool sees.
struct Accounts {
  std::size_t total = std::size_t{80} << 30;
  std::size_t used = 0;
  std::map<CUmemGenericAllocationHandle, std::size_t> chunks;
  CUmemGenericAllocationHandle next_handle = 1;
  CUdeviceptr next_address = CUdeviceptr{1} << 40;
  uint64_t creates = 0, maps = 0;
} accounts;

CUresult create(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp*,
                unsigned long long) {
  if (size == 0 || size % granularity) return CUDA_ERROR_INVALID_VALUE;
  if (accounts.used + size > accounts.total) return CUDA_ERROR_OUT_OF_MEMORY;
  accounts.used += size;
  ++accounts.creates;
  *handle = accounts.next_handle++;
  accounts.chunks[*handle] = size;
  return CUDA_SUCCESS;
}
CUresult release(CUmemGenericAllocationHandle handle) {
  auto it = accounts.chunks.find(handle);
  if (it == accounts.chunks.end()) return CUDA_ERROR_INVALID_VALUE;
  accounts.used -= it->second;
  accounts.chunks.erase(it);
  return CUDA_SUCCESS;
}
CUresult reserve(CUdeviceptr* ptr, std::size_t size, std::size_t, CUdeviceptr, unsigned long long) {
  *ptr = accounts.next_address;
  accounts.next_address += (size + granularity - 1) / granularity * granularity + granularity;
  return CUDA_SUCCESS;
}
CUresult address_free(CUdeviceptr, std::size_t) { return CUDA_SUCCESS; }
CUresult map(CUdeviceptr, std::size_t, std::size_t, CUmemGenericAllocationHandle, unsigned long long) {
  ++accounts.maps;
  return CUDA_SUCCESS;
}
CUresult unmap(CUdeviceptr, std::size_t) { return CUDA_SUCCESS; }
CUresult set_access(CUdeviceptr, std::size_t, const CUmemAccessDesc*, std::size_t) { return CUDA_SUCCESS; }
CUresult get_granularity(std::size_t* out, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  *out = granularity;
  return CUDA_SUCCESS;
}
CUresult total_mem(std::size_t* out, CUdevice) { return *out = accounts.total, CUDA_SUCCESS; }
CUresult get_info(std::size_t* free, std::size_t* total) {
  if (free) *free = accounts.total - accounts.used;
  if (total) *total = accounts.total;
  return CUDA_SUCCESS;
}
// Work completes as soon as it is queued: every event is complete.
CUresult event_create(CUevent* event, unsigned) {
  static char events;
  *event = reinterpret_cast<CUevent>(&events);
  return CUDA_SUCCESS;
}
CUresult event_record(CUevent, CUstream) { return CUDA_SUCCESS; }
CUresult event_query(CUevent) { return CUDA_SUCCESS; }
CUresult synchronize() { return CUDA_SUCCESS; }
CUresult get_current(CUcontext* c) { return *c = reinterpret_cast<CUcontext>(0xc0), CUDA_SUCCESS; }

gmem::vmm::Driver accounting_driver() {
  gmem::vmm::Driver d;
  d.cuMemCreate = create;
  d.cuMemRelease = release;
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
  d.cuCtxSynchronize = synchronize;
  d.cuCtxGetCurrent = get_current;
  return d;
}

double max_ratio = 0;

int replay(const std::string& path) {
  std::string error;
  std::optional<gmem::trace::Trace> trace = gmem::trace::load(path, &error);
  if (!trace) {
    fprintf(stderr, "pool-policy: %s\n", error.c_str());
    return 1;
  }
  accounts.creates = accounts.maps = 0;
  const gmem::vmm::Driver driver = accounting_driver();
  gmem::pool::VmmPool pool(driver, nullptr);
  std::vector<CUdeviceptr> live(trace->ids);
  for (std::size_t i = 0; i < trace->events.size(); ++i) {
    const gmem::trace::Event& e = trace->events[i];
    if (e.alloc) {
      gmem::pool::Block block;
      CUresult status = pool.alloc(&block, e.bytes, 0, nullptr, e.stream + 1, false);
      if (status != CUDA_SUCCESS) {
        fprintf(stderr, "pool-policy: %s: event %zu: %llu bytes: error %d\n", path.c_str(), i,
                static_cast<unsigned long long>(e.bytes), status);
        return 1;
      }
      live[e.id] = block.base;
    } else {
      pool.free_async(live[e.id], {nullptr, 1}, false, false);
    }
  }
  const std::string name = gmem::trace::name_of(path);
  const auto figures = pool.figures(0);
  const double ratio = double(figures.reserved_high) / double(trace->peak_requested);
  printf("BENCH trace_%s_policy_peak_ratio %.4f ratio\n", name.c_str(), ratio);
  printf("BENCH trace_%s_policy_chunks_made %llu count\n", name.c_str(),
         static_cast<unsigned long long>(accounts.creates));
  printf("BENCH trace_%s_policy_mappings_per_alloc %.3f count\n", name.c_str(),
         double(accounts.maps) / double(trace->events.size() / 2));
  if (max_ratio > 0 && ratio > max_ratio) {
    fprintf(stderr, "pool-policy: %s: peak ratio %.4f is above %.4f\n", path.c_str(), ratio, max_ratio);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int failed = 0, traces = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device-memory" && i + 1 < argc) {
      accounts.total = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--max-ratio" && i + 1 < argc) {
      max_ratio = std::strtod(argv[++i], nullptr);
    } else {
      failed |= replay(a);
      ++traces;
    }
  }
  if (!traces) {
    fprintf(stderr, "usage: pool-policy [--device-memory BYTES] [--max-ratio R] TRACE...\n");
    return 2;
  }
  return failed;
}
