// Replays an allocation trace (tests/traces/README.md) through the driver API,
// under the gmem shim and, in the same process, straight to the real driver
// behind it; prints fragmentation (gmem's peak physical memory, from its stats
// file, over the trace's peak requested) and the cost of a call as BENCH lines.
// Every allocation is filled with its own pattern and checked at its free, so a
// pool that hands out memory of a live allocation fails the run.
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "real_driver.h"
#include "stats_file.h"
#include "trace.h"

namespace {

using gmem::trace::Trace;

constexpr const char* usage =
    "usage: replay-trace [--sync] [--rounds N] [--inject-alias] TRACE\n"
    "  Replays TRACE with cuMemAllocAsync/cuMemFreeAsync on its streams (--sync: cuMemAlloc/cuMemFree),\n"
    "  N rounds (default 3), each once straight to the real driver and once through the gmem shim,\n"
    "  which must be loaded (LD_PRELOAD) and publish stats (GMEM_CONF stats:1, stats_dir).\n"
    "  --inject-alias: fill one allocation through a live one's address, as a broken pool would;\n"
    "  the run must then fail (a test of the check itself).\n";

// The driver functions a replay calls: this program's own imports (the shim)
// or the real driver's, looked up in it.
struct Api {
  const char* through = "";  // for messages
  decltype(&cuMemAlloc_v2) alloc = nullptr;
  decltype(&cuMemFree_v2) free = nullptr;
  decltype(&cuMemAllocAsync) alloc_async = nullptr;
  decltype(&cuMemFreeAsync) free_async = nullptr;
  decltype(&cuMemsetD32_v2) fill = nullptr;
  decltype(&cuMemcpyDtoH_v2) copy_out = nullptr;
  decltype(&cuCtxSynchronize) synchronize = nullptr;
};

Api shim_api() {
  return {"through gmem", &cuMemAlloc_v2, &cuMemFree_v2, &cuMemAllocAsync, &cuMemFreeAsync, &cuMemsetD32_v2, &cuMemcpyDtoH_v2,
          &cuCtxSynchronize};
}

template <typename F>
bool resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (!*out) fprintf(stderr, "replay-trace: the real driver has no %s\n", name);
  return *out != nullptr;
}

std::optional<Api> real_api(void* lib) {
  Api a;
  a.through = "straight to the driver";
  bool ok = resolve(lib, "cuMemAlloc_v2", &a.alloc) & resolve(lib, "cuMemFree_v2", &a.free) &
            resolve(lib, "cuMemAllocAsync", &a.alloc_async) & resolve(lib, "cuMemFreeAsync", &a.free_async) &
            resolve(lib, "cuMemsetD32_v2", &a.fill) & resolve(lib, "cuMemcpyDtoH_v2", &a.copy_out) &
            resolve(lib, "cuCtxSynchronize", &a.synchronize);
  return ok ? std::optional<Api>(a) : std::nullopt;
}

std::string error_name(CUresult r) {
  const char* name = nullptr;
  return cuGetErrorName(r, &name) == CUDA_SUCCESS && name ? name : "error " + std::to_string(r);
}

// Allocations up to check_whole_max (the pool's small classes and more) are
// checked whole at their free. Larger ones are checked in a window every
// check_stride bytes: that meets every physical chunk (2 MiB or more) of a
// mapped or stitched range, and keeps the check of a trace that allocates
// tens of GB to a second on a GPU; a small block misplaced between two windows
// of a large one goes unseen.
constexpr std::uint64_t check_whole_max = 4 << 20, check_stride = 1 << 20, check_window = 4096;

class Checker {
 public:
  explicit Checker(const Api& api) : api_(api) {}

  CUresult fill(CUdeviceptr data, std::uint64_t bytes, std::uint32_t pattern) const {
    return api_.fill(data, pattern, bytes / 4);
  }

  // Empty if every checked word of [data, data + bytes) still holds `pattern`.
  std::string verify(CUdeviceptr data, std::uint64_t bytes, std::uint32_t pattern) {
    std::uint64_t end = bytes / 4 * 4;  // cuMemsetD32 filled whole words only
    if (end <= check_whole_max) return end ? verify_window(data, 0, end, pattern) : std::string();
    for (std::uint64_t at = 0; at < end; at += check_stride) {
      std::uint64_t window = std::min(check_window, end - at);
      if (std::string e = verify_window(data, at, window, pattern); !e.empty()) return e;
    }
    return verify_window(data, end - check_window, check_window, pattern);
  }

 private:
  std::string verify_window(CUdeviceptr data, std::uint64_t from, std::uint64_t bytes, std::uint32_t pattern) {
    words_.resize(bytes / 4);
    if (CUresult r = api_.copy_out(words_.data(), data + from, bytes)) return "cuMemcpyDtoH: " + error_name(r);
    for (std::size_t i = 0; i < words_.size(); ++i) {
      if (words_[i] != pattern) {
        char text[160];
        snprintf(text, sizeof text, "overwritten at offset %llu: found %08x, wrote %08x",
                 static_cast<unsigned long long>(from + 4 * i), words_[i], pattern);
        return text;
      }
    }
    return {};
  }

  const Api& api_;
  std::vector<std::uint32_t> words_;
};

struct Options {
  bool sync = false;
  bool inject_alias = false;
  int rounds = 3;
  std::string path;
};

// One pass over the trace through `api`. Returns the mean time of an alloc or
// free call in ns (only the calls are timed, not the fills and checks), or
// nullopt after printing what went wrong.
std::optional<double> replay(const Api& api, const Trace& t, const Options& o, const std::vector<CUstream>& streams) {
  struct Live {
    CUdeviceptr ptr = 0;   // what the allocator returned, 0 if the id is not live
    CUdeviceptr data = 0;  // where its pattern lives (ptr, but for --inject-alias)
    std::uint64_t bytes = 0;
    std::uint32_t pattern = 0;
    CUstream stream = nullptr;
  };
  std::vector<Live> live(t.ids);
  Checker checker(api);
  bool injected = !o.inject_alias;
  std::uint32_t serial = 0;
  double ns = 0;
  using clock = std::chrono::steady_clock;
  auto fail = [&](std::size_t i, const std::string& what) {
    const auto& e = t.events[i];
    fprintf(stderr, "replay-trace: %s, %s: event %zu (%c %u): %s\n", o.path.c_str(), api.through, i,
            e.alloc ? 'a' : 'f', e.id, what.c_str());
    return std::nullopt;
  };
  // Frees one live allocation after checking its pattern; timed if `timed`.
  auto release = [&](Live& l, bool timed) -> std::string {
    if (std::string bad = checker.verify(l.data, l.bytes, l.pattern); !bad.empty()) {
      return "the allocation's memory was " + bad + ": another live allocation shares it";
    }
    auto start = clock::now();
    CUresult r = o.sync ? api.free(l.ptr) : api.free_async(l.ptr, l.stream);
    if (timed) ns += std::chrono::duration<double, std::nano>(clock::now() - start).count();
    l = Live{};
    return r ? std::string(o.sync ? "cuMemFree: " : "cuMemFreeAsync: ") + error_name(r) : std::string();
  };

  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto& e = t.events[i];
    Live& l = live[e.id];
    if (!e.alloc) {
      if (std::string bad = release(l, true); !bad.empty()) return fail(i, bad);
      continue;
    }
    l.bytes = e.bytes;
    l.stream = streams[e.stream];
    l.pattern = 0x9E3779B1u * ++serial;  // odd multiplier: distinct for 2^32 allocations
    auto start = clock::now();
    CUresult r = o.sync ? api.alloc(&l.ptr, e.bytes) : api.alloc_async(&l.ptr, e.bytes, l.stream);
    ns += std::chrono::duration<double, std::nano>(clock::now() - start).count();
    if (r) {
      l = Live{};
      return fail(i, std::string(o.sync ? "cuMemAlloc(" : "cuMemAllocAsync(") + std::to_string(e.bytes) +
                         "): " + error_name(r));
    }
    l.data = l.ptr;
    if (!injected) {
      // As a broken pool would: this allocation's memory is inside a live one's.
      auto victim = std::find_if(live.begin(), live.end(), [&](const Live& v) {
        return &v != &l && v.ptr && v.bytes >= e.bytes && v.bytes >= 8;
      });
      if (victim != live.end()) {
        l.data = victim->data;
        injected = true;
      }
    }
    if (CUresult f = checker.fill(l.data, l.bytes, l.pattern)) return fail(i, "cuMemsetD32: " + error_name(f));
  }
  // Allocations live when the trace was recorded are freed outside the figures.
  for (Live& l : live) {
    if (!l.ptr) continue;
    if (std::string bad = release(l, false); !bad.empty()) return fail(t.events.size() - 1, "at the end: " + bad);
  }
  if (CUresult r = api.synchronize()) return fail(t.events.size() - 1, "cuCtxSynchronize: " + error_name(r));
  if (!injected) return fail(0, "--inject-alias: no allocation was ever live alongside a larger one");
  return t.events.empty() ? 0.0 : ns / static_cast<double>(t.events.size());
}

// The real driver's default pool on the device, set as PyTorch sets it for
// backend:cudaMallocAsync (it keeps what is freed), so its reserved high-water
// mark is the figure to hold gmem's against.
class NativePool {
 public:
  static std::optional<NativePool> open(void* lib, CUdevice device) {
    NativePool p;
    decltype(&cuDeviceGetDefaultMemPool) get_default = nullptr;
    if (!resolve(lib, "cuDeviceGetDefaultMemPool", &get_default) ||
        !resolve(lib, "cuMemPoolGetAttribute", &p.get_) || !resolve(lib, "cuMemPoolSetAttribute", &p.set_) ||
        !resolve(lib, "cuMemPoolTrimTo", &p.trim_) || get_default(&p.pool_, device) ||
        p.get_(p.pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &p.threshold_)) {
      return std::nullopt;
    }
    return p;
  }

  // Empties the pool and restarts its high-water mark; keeps freed memory from now on.
  bool start() {
    cuuint64_t keep = UINT64_MAX, zero = 0;
    return !trim_(pool_, 0) && !set_(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero) &&
           !set_(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
  }

  // The reserved high-water mark since start(); gives the memory back.
  std::optional<std::uint64_t> finish() {
    cuuint64_t high = 0;
    bool ok = !get_(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high) &&
              !set_(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold_) && !trim_(pool_, 0);
    return ok ? std::optional<std::uint64_t>(high) : std::nullopt;
  }

 private:
  CUmemoryPool pool_ = nullptr;
  cuuint64_t threshold_ = 0;
  decltype(&cuMemPoolGetAttribute) get_ = nullptr;
  decltype(&cuMemPoolSetAttribute) set_ = nullptr;
  decltype(&cuMemPoolTrimTo) trim_ = nullptr;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::optional<Options> parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sync") {
      o.sync = true;
    } else if (a == "--inject-alias") {
      o.inject_alias = true;
    } else if (a == "--rounds" && i + 1 < argc && atoi(argv[i + 1]) > 0) {
      o.rounds = atoi(argv[++i]);
    } else if (a[0] != '-' && o.path.empty()) {
      o.path = a;
    } else {
      return std::nullopt;
    }
  }
  return o.path.empty() ? std::nullopt : std::optional<Options>(o);
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Options> o = parse_args(argc, argv);
  if (!o) {
    fputs(usage, stderr);
    return 2;
  }
  std::string error;
  std::optional<Trace> trace = gmem::trace::load(o->path, &error);
  if (!trace || trace->peak_requested == 0) {
    fprintf(stderr, "replay-trace: %s\n", trace ? (o->path + ": no allocations").c_str() : error.c_str());
    return 2;
  }
  std::optional<std::string> stats_dir = gmem::stats_file::directory_from_conf(getenv("GMEM_CONF"));
  if (!stats_dir) {
    fprintf(stderr, "replay-trace: GMEM_CONF turns gmem's stats off (stats:0); its figures are what this measures\n");
    return 2;
  }

  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "replay-trace: no CUDA device\n");
    return 77;
  }
  void* real = gmem::bench::open_real_driver("replay-trace");
  std::optional<Api> native = real ? real_api(real) : std::nullopt;
  if (!native) return 1;
  std::optional<NativePool> native_pool;
  if (!o->sync && !(native_pool = NativePool::open(real, dev))) {
    fprintf(stderr, "replay-trace: the real driver's default memory pool cannot be queried\n");
    return 1;
  }
  std::vector<CUstream> streams(trace->streams, nullptr);  // 0: the legacy default stream
  for (std::size_t s = 1; s < streams.size(); ++s) {
    if (CUresult r = cuStreamCreate(&streams[s], CU_STREAM_DEFAULT)) {
      fprintf(stderr, "replay-trace: cuStreamCreate: %s\n", error_name(r).c_str());
      return 1;
    }
  }

  // Rounds alternate between the driver and the shim, so that drift in the
  // driver's own cost falls on both.
  Api shim = shim_api();
  CUmemoryPool shim_pool = nullptr;
  if (CUresult r = cuDeviceGetDefaultMemPool(&shim_pool, dev)) {
    fprintf(stderr, "replay-trace: cuDeviceGetDefaultMemPool through gmem: %s\n", error_name(r).c_str());
    return 1;
  }
  std::vector<double> shim_ns, native_ns;
  std::uint64_t native_peak = 0;
  for (int round = 0; round < o->rounds; ++round) {
    if (native_pool && !native_pool->start()) {
      fprintf(stderr, "replay-trace: the real driver's default memory pool cannot be reset\n");
      return 1;
    }
    std::optional<double> ns = replay(*native, *trace, *o, streams);
    if (!ns) return 1;
    native_ns.push_back(*ns);
    if (native_pool) {
      std::optional<std::uint64_t> high = native_pool->finish();
      if (!high) {
        fprintf(stderr, "replay-trace: the real driver's default memory pool cannot be read\n");
        return 1;
      }
      native_peak = std::max(native_peak, *high);
    }
    if (!(ns = replay(shim, *trace, *o, streams))) return 1;
    shim_ns.push_back(*ns);
    // gmem gives back what it caches, as it does for torch's empty_cache(), so
    // the next round straight to the driver finds the device as this one did.
    if (CUresult r = cuMemPoolTrimTo(shim_pool, 0)) {
      fprintf(stderr, "replay-trace: cuMemPoolTrimTo through gmem: %s\n", error_name(r).c_str());
      return 1;
    }
  }
  for (std::size_t s = 1; s < streams.size(); ++s) cuStreamDestroy(streams[s]);

  // gmem's figures cover the whole process: every shim round, each of which
  // replays the same trace from an empty cache, so they have the peak of one.
  std::string stats = gmem::stats_file::path(*stats_dir, getpid());
  int device = 0;
  cuCtxGetDevice(&device);
  std::uint64_t figures[3] = {};  // peak reserved, peak in use, stitches
  const gmem_device_stat wanted[3] = {GMEM_STAT_peak_reserved_bytes, GMEM_STAT_peak_in_use_bytes, GMEM_STAT_stitches};
  for (int i = 0; i < 3; ++i) {
    std::optional<std::uint64_t> v = gmem::stats_file::read_device_stat(stats, device, wanted[i], &error);
    if (!v) {
      fprintf(stderr, "replay-trace: cannot read gmem's figures: %s\n", error.c_str());
      return 1;
    }
    figures[i] = *v;
  }
  const std::uint64_t peak_reserved = figures[0], peak_in_use = figures[1];
  std::string name = "trace_" + gmem::trace::name_of(o->path) + (o->sync ? "_sync" : "");
  const double requested = static_cast<double>(trace->peak_requested), MiB = 1 << 20;
  printf("replay-trace: %s: %zu events, %u stream(s), %d round(s) of %s; peak requested %.1f MiB, "
         "gmem's peak in use %.1f MiB, peak reserved %.1f MiB, stitches %llu\n",
         o->path.c_str(), trace->events.size(), trace->streams, o->rounds,
         o->sync ? "cuMemAlloc/cuMemFree" : "cuMemAllocAsync/cuMemFreeAsync", requested / MiB,
         static_cast<double>(peak_in_use) / MiB, static_cast<double>(peak_reserved) / MiB,
         static_cast<unsigned long long>(figures[2]));
  printf("BENCH %s_peak_requested %.1f MiB\n", name.c_str(), requested / MiB);
  printf("BENCH %s_peak_ratio %.4f ratio\n", name.c_str(), static_cast<double>(peak_reserved) / requested);
  if (native_pool) {
    printf("BENCH %s_peak_ratio_native %.4f ratio\n", name.c_str(), static_cast<double>(native_peak) / requested);
  }
  printf("BENCH %s_replay_ns_per_op %.1f ns\n", name.c_str(), median(shim_ns));
  printf("BENCH %s_replay_ns_per_op_native %.1f ns\n", name.c_str(), median(native_ns));
  // Nothing but the replay allocates through gmem here, so its accounting must
  // match the trace exactly; a figure built on wrong accounting is no figure.
  if (peak_in_use != trace->peak_requested || peak_reserved < trace->peak_requested) {
    fprintf(stderr, "replay-trace: gmem's figures disagree with the trace: peak in use %llu and peak reserved %llu "
            "bytes, for a peak requested of %llu\n", static_cast<unsigned long long>(peak_in_use),
            static_cast<unsigned long long>(peak_reserved), static_cast<unsigned long long>(trace->peak_requested));
    return 1;
  }
  cuDevicePrimaryCtxRelease_v2(dev);
  return 0;
}
