// Kernel and graph launches. Each passes the submission gate
// (interpose/gate.h) as the generated trampolines of the other submitting
// calls do; with pool:vmm and track_access, once the driver has taken the
// launch, every aligned 8-byte word of its parameters is looked up in the
// pool's ranges (pool/access.h): what each launch touches, known without a
// fault. The parameter layout comes from cuFuncGetParamInfo
// (cuKernelGetParamInfo for a library's CUkernel), once per function; the
// `extra` form carries its parameter buffer whole. Tensor maps passed by
// value (interpose/tensor_maps.h) add the addresses they describe. A launch on a capturing
// stream is kept for its graph and counted at the graph's launches
// (interpose/graph_access.h).
#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "interpose/driver_table.h"
#include "interpose/gate.h"
#include "interpose/graph_access.h"
#include "interpose/runtime.h"
#include "interpose/tensor_maps.h"
#include "pool/access.h"
#include "pool/launch_timing.h"
#include "pool/trace_recorder.h"

extern "C" {
// Declared by cuda.h only for the driver's own build.
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shared, CUstream stream, void** params, void** extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params, void** extra);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                        unsigned by, unsigned bz, unsigned shared, CUstream stream, void** params);
CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream);
}

namespace {

// A kernel's parameters as the aligned 8-byte words of the parameter space:
// for each, the parameter holding it and the word's offset in that parameter.
struct Layout {
  uint32_t generation = 0;
  std::vector<std::pair<uint32_t, uint32_t>> words;
  // Where a tensor map may lie: each 64-byte-aligned window of 128 bytes.
  std::vector<std::pair<uint32_t, uint32_t>> maps;
};

// Layouts by function handle: an open-addressed table of atomics, read without
// a lock, filled under one. Layouts are kept for the process's life. A module
// or library unloaded starts a new generation (its handles may name other
// kernels later): older layouts are asked again at their next launch.
class Layouts {
 public:
  const Layout* find(CUfunction f) {
    const auto key = reinterpret_cast<uintptr_t>(f);
    const uint32_t generation = generation_.load(std::memory_order_acquire);
    for (std::size_t i = index(key), probes = 0; probes < capacity; i = (i + 1) & (capacity - 1), ++probes) {
      const uintptr_t k = slots_[i].key.load(std::memory_order_acquire);
      if (k == key) {
        const Layout* layout = slots_[i].layout.load(std::memory_order_acquire);
        if (layout->generation == generation) return layout;
        break;
      }
      if (k == 0) break;
    }
    return query(f, generation);
  }
  void new_generation() { generation_.fetch_add(1, std::memory_order_acq_rel); }

 private:
  static constexpr std::size_t capacity = 1 << 14;  // distinct kernels; 3/4 of it are cached
  struct Slot {
    std::atomic<uintptr_t> key{0};
    std::atomic<const Layout*> layout{nullptr};
  };
  static std::size_t index(uintptr_t key) { return (key * 0x9e3779b97f4a7c15ull) >> (64 - 14); }

  // Under the lock: the driver's answer, cached. Null where no slot is left
  // (the launch is not counted: a missed reference costs only speed).
  const Layout* query(CUfunction f, uint32_t generation) {
    std::lock_guard lock(mutex_);
    const auto key = reinterpret_cast<uintptr_t>(f);
    std::size_t i = index(key);
    while (slots_[i].key.load(std::memory_order_relaxed) != key && slots_[i].key.load(std::memory_order_relaxed)) {
      i = (i + 1) & (capacity - 1);
    }
    const bool fresh = slots_[i].key.load(std::memory_order_relaxed) == 0;
    if (fresh && used_ >= capacity / 4 * 3) return nullptr;
    Layout& layout = storage_.emplace_back(ask_driver(f));
    layout.generation = generation;
    slots_[i].layout.store(&layout, std::memory_order_release);
    if (fresh) {
      ++used_;
      slots_[i].key.store(key, std::memory_order_release);  // after its layout: a reader finding it finds both
    }
    return &layout;
  }

  // The layout the driver gives: by the function's API, or by the kernel's for
  // a CUkernel passed as a CUfunction (cuLaunchKernel takes either). Past the
  // last parameter the driver answers CUDA_ERROR_INVALID_VALUE; a kernel
  // neither API knows gets no words.
  static Layout ask_driver(CUfunction f) {
    using Query = CUresult (*)(void*, size_t, size_t*, size_t*);
    auto by_function = reinterpret_cast<Query>(gmem_real_table[gmem::fn_cuFuncGetParamInfo]);
    auto by_kernel = reinterpret_cast<Query>(gmem_real_table[gmem::fn_cuKernelGetParamInfo]);
    Layout layout;
    std::size_t offset = 0, size = 0;
    Query ask = by_function;
    if (ask(f, 0, &offset, &size) != CUDA_SUCCESS) {
      ask = by_kernel;
      if (ask(f, 0, &offset, &size) != CUDA_SUCCESS) return layout;
    }
    for (uint32_t param = 0; param < max_params; ++param) {
      if (param && ask(f, param, &offset, &size) != CUDA_SUCCESS) break;
      for (std::size_t word = (offset + 7) / 8 * 8; word + 8 <= offset + size; word += 8) {
        layout.words.emplace_back(param, uint32_t(word - offset));
      }
      constexpr std::size_t map = sizeof(CUtensorMap), align = 64;
      for (std::size_t at = (offset + align - 1) / align * align; at + map <= offset + size; at += align) {
        layout.maps.emplace_back(param, uint32_t(at - offset));
      }
    }
    return layout;
  }
  static constexpr uint32_t max_params = 1 << 15;  // the parameter space is at most 32 KiB

  std::unique_ptr<Slot[]> slots_ = std::make_unique<Slot[]>(capacity);
  std::atomic<uint32_t> generation_{0};
  std::mutex mutex_;
  std::deque<Layout> storage_;  // stable addresses
  std::size_t used_ = 0;
};

Layouts& layouts() {
  static Layouts* instance = new Layouts;  // never destroyed: launches may run during exit
  return *instance;
}

uint64_t load_word(const void* at) {
  uint64_t value;
  std::memcpy(&value, at, sizeof value);  // a parameter's copy need not be 8-byte aligned
  return value;
}

// The `extra` form: CU_LAUNCH_PARAM_BUFFER_POINTER and _SIZE give the
// parameter space itself.
template <typename Visit>
void visit_buffer(void** extra, Visit&& visit) {
  const char* buffer = nullptr;
  std::size_t size = 0;
  for (int i = 0; i < 64 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = static_cast<const char*>(extra[i + 1]);
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1]) size = *static_cast<const std::size_t*>(extra[i + 1]);
  }
  if (!buffer) return;
  for (std::size_t word = 0; word + 8 <= size; word += 8) visit(load_word(buffer + word));
  for (std::size_t at = 0; gmem::tensor_maps::any() && at + sizeof(CUtensorMap) <= size; at += 64) {
    if (CUdeviceptr address = gmem::tensor_maps::find(buffer + at)) visit(address);
  }
}

// Every aligned 8-byte word of a launch's parameters.
template <typename Visit>
void visit_words(CUfunction f, void** params, void** extra, Visit&& visit) {
  if (params) {
    const Layout* layout = layouts().find(f);
    if (!layout) return;
    for (auto [param, offset] : layout->words) visit(load_word(static_cast<const char*>(params[param]) + offset));
    for (std::size_t i = 0; gmem::tensor_maps::any() && i < layout->maps.size(); ++i) {
      const auto [param, offset] = layout->maps[i];
      if (CUdeviceptr address = gmem::tensor_maps::find(static_cast<const char*>(params[param]) + offset)) visit(address);
    }
  } else if (extra) {
    visit_buffer(extra, visit);
  }
}

// The ranges a launch references that `keep` keeps, each once, in the order
// its parameters name them.
template <typename Keep>
std::vector<const gmem::pool::AccessRecord*> references(const gmem::pool::AccessTable& table, CUfunction f,
                                                        void** params, void** extra, Keep&& keep) {
  std::vector<const gmem::pool::AccessRecord*> found;
  visit_words(f, params, extra, [&](uint64_t word) {
    const gmem::pool::AccessRecord* r = table.find(word);
    if (r && keep(*r) && std::find(found.begin(), found.end(), r) == found.end()) found.push_back(r);
  });
  return found;
}

// What a launch the driver took references: counted now, or, on a capturing
// stream, kept for the capture's graph.
void count(gmem::pool::Pool& pool, gmem::pool::AccessTable& table, CUfunction f, void** params, void** extra,
           CUstream stream, bool per_thread, gmem::pool::LaunchTiming* timing) {
  if (pool.capture_running()) {
    if (const uint64_t capture = gmem::graph_access::capture_of(stream, per_thread)) {
      std::vector<CUdeviceptr> bases;
      visit_words(f, params, extra, [&](uint64_t word) {
        if (const gmem::pool::AccessRecord* r = table.find(word)) bases.push_back(r->base());
      });
      if (!bases.empty()) gmem::graph_access::captured(capture, bases);
      return;
    }
  }
  if (!table.counting()) return;
  gmem::pool::LaunchReferences refs(table, f, pool.trace(), timing != nullptr);
  visit_words(f, params, extra, [&](uint64_t word) { refs.word(word); });
  const uint64_t use = refs.finish(pool.publisher());
  if (timing) pool.timed(*timing, f, use, refs.large());
}

// Whether a launch is timed (Pool::clock): where some of the large ranges it
// references lie in host memory (its words are not walked for it while no
// device spills). None is while a stream captures: the events of a timing,
// made and recorded, would join a capture on the launch's stream, and beside
// one in the global mode the pool queries no event.
bool timed(gmem::pool::Pool& pool, CUfunction f, void** params, void** extra) {
  const gmem::pool::AccessTable* table = pool.access();
  if (!pool.clock() || !pool.tiers()->any_spilled() || !table->counting() || pool.capture_running()) return false;
  return !references(*table, f, params, extra, [](const gmem::pool::AccessRecord& r) {
            return r.size() >= gmem::pool::large_range && r.host_bytes();
          }).empty();
}

// The first moving or parked range (pool/evictor.h) a launch references;
// null if none. The watched ranges it references before that are touched
// (their moves cancelled).
const gmem::pool::AccessRecord* moving_reference(const gmem::pool::AccessTable& table, CUfunction f, void** params,
                                                 void** extra) {
  const gmem::pool::AccessRecord* found = nullptr;
  visit_words(f, params, extra, [&](uint64_t word) {
    gmem::pool::AccessRecord* r = found ? nullptr : table.find(word);
    if (r && (r->moving() || r->parked())) {
      found = r;
    } else if (r && r->watched()) {
      r->touch();
    }
  });
  return found;
}

// With Pool::brings_in, or for a kernel Pool::slow_launch says is `slow`: the
// ranges a launch references that lie in host memory (Pool::bring_in_least
// bytes or more) come onto the device before it is submitted, each where the
// device has room for all of it. Returns the bytes brought in.
std::size_t bring_in(gmem::pool::Pool& pool, const gmem::pool::AccessTable& table, CUfunction f, void** params,
                     void** extra, bool slow) {
  const auto spilled = references(table, f, params, extra, [](const gmem::pool::AccessRecord& r) {
    return r.host_bytes() >= gmem::pool::Pool::bring_in_least;
  });
  return pool.bring_in(spilled, slow);
}

// A submitting `call`, gated; `counted` once the driver took it, with the
// access table, where launches are tracked, before the call leaves the gate
// (once the gate found no call in flight, every launch before is counted:
// pool/evictor.h). A kernel launch (`launch`) passes the gate while ranges
// move, and waits for the moving range `moving` finds among its references,
// or has the parked one mapped first; any other call (a graph's) waits for
// all moves to end, and has every parked range mapped first. Outside the
// gate: the move may need it open. Inside it, nothing is parked anew (only a
// batch to the host parks, while no call but launches is in flight, and a
// launch only once mark_more found none in flight).
template <typename Moving, typename Call, typename Counted>
CUresult submit(bool launch, Moving&& moving, Call&& call, Counted&& counted) {
  gmem::pool::Pool* pool = gmem::active_pool();  // resolves the driver on the first call
  gmem::pool::AccessTable* table = pool ? pool->access() : nullptr;
  while (true) {
    const gmem::pool::AccessRecord* wait_for = nullptr;
    bool parked = false;
    {
      gmem::gate::Pass pass(launch);
      if (launch && table && table->any_marked()) wait_for = moving(*table);
      parked = !launch && table && table->any_parked();
      if (!wait_for && !parked) {
        const CUresult status = call();
        if (status == CUDA_SUCCESS && table) counted(*pool, *table);
        return status;
      }
    }
    if (parked) {
      pool->unpark_all();
    } else if (wait_for->moving()) {
      table->wait_unmoved(*wait_for);
    } else {
      pool->unpark(wait_for->base(), 1);
    }
  }
}

template <typename Call>
CUresult launch(CUfunction f, void** params, void** extra, CUstream stream, bool per_thread, Call&& call) {
  gmem::pool::Pool* pool = gmem::active_pool();
  bool over_host = pool && pool->access() && timed(*pool, f, params, extra);
  const bool slow = over_host && pool->slow_launch(f);
  if (pool && (slow || pool->brings_in()) && pool->access()->counting() &&
      bring_in(*pool, *pool->access(), f, params, extra, slow)) {
    over_host = timed(*pool, f, params, extra);  // what came in is not timed
  }
  std::optional<gmem::pool::LaunchTiming> timing;
  if (over_host) timing.emplace(*pool->clock());
  // The events go on the stream the launch went to (the thread's own default one, for a _ptsz call's 0).
  const CUstream on = per_thread && !stream ? CU_STREAM_PER_THREAD : stream;
  return submit(
      true, [&](const gmem::pool::AccessTable& table) { return moving_reference(table, f, params, extra); },
      [&] { return timing ? timing->around(on, call) : call(); },
      [&](gmem::pool::Pool& pool, gmem::pool::AccessTable& table) {
        count(pool, table, f, params, extra, stream, per_thread, timing ? &*timing : nullptr);
      });
}

// A graph's kernels are not all known (nodes added by hand): its launch waits
// for every move to end.
template <typename Call>
CUresult launch_graph(CUgraphExec exec, Call&& call) {
  return submit(
      false, [](const gmem::pool::AccessTable&) { return nullptr; }, call,
      [&](gmem::pool::Pool& pool, gmem::pool::AccessTable& table) {
        if (table.counting()) gmem::graph_access::launched(exec, table, pool);
      });
}

template <typename Call>
CUresult unload(Call&& call) {
  gmem::pool::Pool* pool = gmem::active_pool();
  const bool tracking = pool && pool->access();
  // Before and after: a handle the unload frees may be reused at once.
  if (tracking) layouts().new_generation();
  CUresult status = call();
  if (tracking) layouts().new_generation();
  return status;
}

}  // namespace

GMEM_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shared, CUstream stream, void** params, void** extra) {
  return launch(f, params, extra, stream, false,
                [&] { return GMEM_REAL(cuLaunchKernel)(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra); });
}

GMEM_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                         unsigned by, unsigned bz, unsigned shared, CUstream stream, void** params,
                                         void** extra) {
  return launch(f, params, extra, stream, true, [&] {
    return GMEM_REAL_AS(cuLaunchKernel_ptsz, cuLaunchKernel)(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
  });
}

GMEM_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  return launch(f, params, extra, config ? config->hStream : nullptr, false,
                [&] { return GMEM_REAL(cuLaunchKernelEx)(config, f, params, extra); });
}

GMEM_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  return launch(f, params, extra, config ? config->hStream : nullptr, true,
                [&] { return GMEM_REAL_AS(cuLaunchKernelEx_ptsz, cuLaunchKernelEx)(config, f, params, extra); });
}

GMEM_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shared, CUstream stream,
                                               void** params) {
  return launch(f, params, nullptr, stream, false, [&] {
    return GMEM_REAL(cuLaunchCooperativeKernel)(f, gx, gy, gz, bx, by, bz, shared, stream, params);
  });
}

GMEM_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                    unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                                    CUstream stream, void** params) {
  return launch(f, params, nullptr, stream, true, [&] {
    return GMEM_REAL_AS(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel)(f, gx, gy, gz, bx, by, bz, shared,
                                                                                   stream, params);
  });
}

GMEM_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  return launch_graph(exec, [&] { return GMEM_REAL(cuGraphLaunch)(exec, stream); });
}

GMEM_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  return launch_graph(exec, [&] { return GMEM_REAL_AS(cuGraphLaunch_ptsz, cuGraphLaunch)(exec, stream); });
}

// Tensor maps: the driver encodes them, and they are told with their address.
template <typename Call>
CUresult encode(CUtensorMap* map, void* address, Call&& call) {
  const CUresult status = call();
  if (status == CUDA_SUCCESS && map) gmem::tensor_maps::encoded(*map, address);
  return status;
}

GMEM_EXPORT CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                            const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                            const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                            CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                            CUtensorMapFloatOOBfill fill) {
  return encode(map, address, [&] {
    return GMEM_REAL(cuTensorMapEncodeTiled)(map, type, rank, address, dims, strides, box, element_strides, interleave,
                                             swizzle, l2, fill);
  });
}

GMEM_EXPORT CUresult cuTensorMapEncodeIm2col(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                             const cuuint64_t* dims, const cuuint64_t* strides, const int* lower,
                                             const int* upper, cuuint32_t channels, cuuint32_t pixels,
                                             const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                             CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                             CUtensorMapFloatOOBfill fill) {
  return encode(map, address, [&] {
    return GMEM_REAL(cuTensorMapEncodeIm2col)(map, type, rank, address, dims, strides, lower, upper, channels, pixels,
                                              element_strides, interleave, swizzle, l2, fill);
  });
}

GMEM_EXPORT CUresult cuTensorMapEncodeIm2colWide(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                                 void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                                                 int lower, int upper, cuuint32_t channels, cuuint32_t pixels,
                                                 const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                                 CUtensorMapIm2ColWideMode mode, CUtensorMapSwizzle swizzle,
                                                 CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill) {
  return encode(map, address, [&] {
    return GMEM_REAL(cuTensorMapEncodeIm2colWide)(map, type, rank, address, dims, strides, lower, upper, channels,
                                                  pixels, element_strides, interleave, mode, swizzle, l2, fill);
  });
}

GMEM_EXPORT CUresult cuTensorMapReplaceAddress(CUtensorMap* map, void* address) {
  return encode(map, address, [&] { return GMEM_REAL(cuTensorMapReplaceAddress)(map, address); });
}

GMEM_EXPORT CUresult cuModuleUnload(CUmodule module) {
  return unload([&] { return GMEM_REAL(cuModuleUnload)(module); });
}

GMEM_EXPORT CUresult cuLibraryUnload(CUlibrary library) {
  return unload([&] { return GMEM_REAL(cuLibraryUnload)(library); });
}
