// Whether eviction is feasible during a spilled training step: copying a live
// tensor's device memory to host chunks on a side stream and remapping its
// addresses onto them (and back, a prefetch). Measures what that takes:
// (1) the copy engines' bandwidth between a device range (1 GiB chunks) and a
// host range (256 MiB pinned NUMA chunks), one direction alone and both at
// once; (2) what cuMemMap, cuMemSetAccess and cuMemUnmap of one chunk cost
// idle, while copies stream both ways on two other streams, and while a kernel
// on every SM streams reads of pinned host memory (bench-vmm-busy measured
// 85 ms to give access to a 256 MiB host chunk then, 3.5 ms idle), or of
// device memory (alone, and beside the copies: what an evictor would meet
// while a spilled job's kernels run on the device), and whether
// one cuMemSetAccess (or cuMemUnmap) over 8 host chunks mapped back to back
// costs less than 8 calls; host chunks at CU_MEM_LOCATION_TYPE_HOST_NUMA (as
// the pool makes them) and, where the driver makes them, _HOST; (3) whether
// remapping on one thread stalls the launches of another: each cuLaunchKernel
// call of a 1 us kernel, in bursts of 256 (the queue never fills), alone and
// while a second thread maps, gives access to and unmaps a host chunk in a loop.
// Call figures are the median of 5 repetitions; the work that keeps the GPU
// busy is topped up between repetitions, never during one.
//   bench-evict [SHIM REAL]   (the suite's two arguments; unused: it runs on the driver it is linked to)
// Prints BENCH evict_copy_{dtoh,htod,both_dtoh,both_htod,both_total} (GB/s);
// evict_{map,set_access,unmap}_<chunk>_us_{idle,copying,streaming,computing,
// copying_computing} (computing: kernels on every SM reading device memory), <chunk>
// one of device_1GiB, host_numa_256MiB, host_plain_256MiB (the last where
// _HOST chunks are made); for the host chunks, the same with the chunk
// mapped and given access at another address all along,
// evict_{map,set_access,unmap}_<host>_256MiB_mapped_elsewhere_us_<c>; evict_{map,set_access,unmap}_<host>_8x256MiB_us_<c>
// (8 calls, summed) and evict_{set_access,unmap}_<host>_8x256MiB_once_us_<c>
// (one call over 2 GiB), <c> idle, copying or copying_computing;
// evict_remap_<host>_256MiB_<T>_threads_gbps_<c> (T threads at once each
// mapping, giving access to and unmapping a chunk of its own: host bytes
// given access per second over all, T = 1, 2, 4, 8); evict_launch_{p50,p99,max}_us_
// {alone,vmm} and evict_launch_over_100us_{alone,vmm} (how many calls took
// longer), evict_launch_vmm_cycles and evict_launch_vmm_cycle_us (the other
// thread's cycles during the timed launches, and its median cycle).
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "driver_call.h"
#include "kernels.h"

namespace {

const char* const program = "bench-evict";
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;
constexpr int repetitions = 5;
constexpr int launch_burst = 256;
constexpr int launch_bursts = 79;  // ~20000 launches

bool ok(CUresult status, const char* call) { return gmem::bench::call_ok(program, status, call); }

template <typename Call>
double micros(Call&& call, const char* name, bool* good) {
  return gmem::bench::call_us(program, std::forward<Call>(call), name, good);
}

using gmem::bench::ms_since;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

void bench(const std::string& name, double value, const char* unit, int decimals = 1) {
  std::printf("BENCH evict_%s %.*f %s\n", name.c_str(), decimals, value, unit);
  std::fflush(stdout);
}

// Chunks of one kind and one reservation for all of them back to back,
// aligned to their granularity.
struct Chunks {
  std::size_t chunk = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
  CUdeviceptr va = 0;
  std::size_t bytes() const { return handles.size() * chunk; }
};

// Makes `count` chunks; on failure returns the driver's answer with the call
// in *call, having given back what it made (a caller may skip a kind the
// driver does not make).
CUresult make_chunks(const CUmemAllocationProp& prop, std::size_t chunk, std::size_t count, Chunks* c,
                     const char** call) {
  std::size_t granularity = 0;
  CUresult status = cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  *call = "cuMemGetAllocationGranularity";
  if (status == CUDA_SUCCESS && (granularity == 0 || chunk % granularity != 0)) status = CUDA_ERROR_INVALID_VALUE;
  c->chunk = chunk;
  while (status == CUDA_SUCCESS && c->handles.size() < count) {
    CUmemGenericAllocationHandle handle = 0;
    status = cuMemCreate(&handle, chunk, &prop, 0);
    *call = "cuMemCreate";
    if (status == CUDA_SUCCESS) c->handles.push_back(handle);
  }
  if (status == CUDA_SUCCESS) {
    status = cuMemAddressReserve(&c->va, c->bytes(), granularity, 0, 0);
    *call = "cuMemAddressReserve";
  }
  if (status != CUDA_SUCCESS) {
    for (CUmemGenericAllocationHandle handle : c->handles) cuMemRelease(handle);
    *c = Chunks{};
  }
  return status;
}

CUmemAccessDesc device_access(CUdevice device) {
  return {{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
}

bool map_all(const Chunks& c, CUdevice device) {
  for (std::size_t i = 0; i < c.handles.size(); ++i) {
    if (!ok(cuMemMap(c.va + i * c.chunk, c.chunk, 0, c.handles[i], 0), "cuMemMap")) {
      if (i) cuMemUnmap(c.va, i * c.chunk);
      return false;
    }
  }
  const CUmemAccessDesc access = device_access(device);
  if (!ok(cuMemSetAccess(c.va, c.bytes(), &access, 1), "cuMemSetAccess")) {
    cuMemUnmap(c.va, c.bytes());
    return false;
  }
  return true;
}

bool free_chunks(Chunks* c, bool mapped) {
  bool good = true;
  if (mapped) good &= ok(cuMemUnmap(c->va, c->bytes()), "cuMemUnmap");
  if (c->va) good &= ok(cuMemAddressFree(c->va, c->bytes()), "cuMemAddressFree");
  for (CUmemGenericAllocationHandle handle : c->handles) good &= ok(cuMemRelease(handle), "cuMemRelease");
  *c = Chunks{};
  return good;
}

// Work queued on streams (one lane each) that keeps an engine busy while calls
// are timed. It is topped up between repetitions, not by a thread of its own,
// so no other driver call runs beside the timed ones.
class Backlog {
 public:
  // enqueue(lane) queues one item, which runs about item_ms, on that lane's stream.
  Backlog(const std::vector<CUstream>& streams, std::function<CUresult(std::size_t)> enqueue, double item_ms)
      : enqueue_(std::move(enqueue)), item_ms_(std::max(item_ms, 1.0)) {
    for (CUstream stream : streams) lanes_.push_back({stream, {}});
  }
  Backlog(const Backlog&) = delete;
  Backlog& operator=(const Backlog&) = delete;
  ~Backlog() {
    for (CUevent event : spare_) cuEventDestroy(event);
  }

  // Queues items until every lane has about `ms` of them left.
  bool top_up(double ms) {
    bool good = true;
    for (std::size_t i = 0; good && i < lanes_.size(); ++i) {
      Lane& lane = lanes_[i];
      while (good && !lane.pending.empty()) {
        const CUresult status = cuEventQuery(lane.pending.front());
        if (status == CUDA_ERROR_NOT_READY) break;
        good = ok(status, "cuEventQuery");
        spare_.push_back(lane.pending.front());
        lane.pending.pop_front();
      }
      while (good && double(lane.pending.size()) * item_ms_ < ms) {
        CUevent event = nullptr;
        if (spare_.empty()) {
          good = ok(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        } else {
          event = spare_.back();
          spare_.pop_back();
        }
        if (!good) break;
        lane.pending.push_back(event);
        good = ok(enqueue_(i), "enqueueing work") && ok(cuEventRecord(event, lane.stream), "cuEventRecord");
      }
    }
    return good;
  }

  // Whether every lane still has work queued (clears *good where a query failed).
  bool busy(bool* good) {
    bool all = true;
    for (const Lane& lane : lanes_) {
      if (lane.pending.empty()) return false;
      const CUresult status = cuEventQuery(lane.pending.back());
      if (status != CUDA_ERROR_NOT_READY) {
        *good &= ok(status, "cuEventQuery");
        all = false;
      }
    }
    return all;
  }

  // Waits for every item; destroys the events (so none outlives the context).
  bool drain() {
    bool good = true;
    for (Lane& lane : lanes_) {
      good &= ok(cuStreamSynchronize(lane.stream), "cuStreamSynchronize");
      spare_.insert(spare_.end(), lane.pending.begin(), lane.pending.end());
      lane.pending.clear();
    }
    for (CUevent event : spare_) good &= ok(cuEventDestroy(event), "cuEventDestroy");
    spare_.clear();
    return good;
  }

 private:
  struct Lane {
    CUstream stream;
    std::deque<CUevent> pending;  // one event after each item queued
  };
  std::function<CUresult(std::size_t)> enqueue_;
  double item_ms_;
  std::vector<Lane> lanes_;
  std::vector<CUevent> spare_;
};

// A condition the calls are timed in: idle (no load), or under a backlog.
struct Condition {
  const char* name;
  Backlog* load;
};

// Runs `body` (one repetition; false where a call failed) `repetitions`
// times, the load topped up before each to twice the longest repetition so
// far (1 s at least). Warns where the load ran out before a repetition ended:
// that repetition was not timed under load.
bool repeat(const std::string& what, const Condition& condition, const std::function<bool()>& body) {
  bool good = true;
  double longest_ms = 0;
  int dry = 0;
  for (int i = 0; good && i < repetitions; ++i) {
    if (condition.load) {
      good &= condition.load->top_up(std::max(1000.0, 2 * longest_ms));
      if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // it runs
    }
    if (!good) break;
    const auto start = std::chrono::steady_clock::now();
    good &= body();
    longest_ms = std::max(longest_ms, ms_since(start));
    if (condition.load && !condition.load->busy(&good)) ++dry;
  }
  if (condition.load) good &= condition.load->drain();
  if (dry) {
    std::fprintf(stderr, "%s: %s %s: the load ran out before the calls ended in %d of %d repetitions\n", program,
                 what.c_str(), condition.name, dry, repetitions);
  }
  return good;
}

struct Kind {
  std::string tier;  // device, host_numa, host_plain
  std::string chunk_name;
  CUmemAllocationProp prop;
  std::size_t chunk;
  std::size_t count;  // 8 for the host's back-to-back test
  bool optional;      // skipped where the driver does not make it
};

// Map, set access and unmap of the first chunk, in `condition`. With
// `elsewhere`, the chunk stays mapped, with access, at a second address all
// along (as a staging mapping the pool's copies use could): whether the
// driver's cost of giving access is per mapping or per physical chunk.
bool time_one_chunk(const Kind& k, const Chunks& c, CUdevice device, const Condition& condition,
                    bool elsewhere = false) {
  std::vector<double> map, set_access, unmap;
  const CUmemAccessDesc access = device_access(device);
  const std::string what = k.tier + "_" + k.chunk_name + (elsewhere ? "_mapped_elsewhere" : "");
  CUdeviceptr staging = 0;
  if (elsewhere && (!ok(cuMemAddressReserve(&staging, c.chunk, c.chunk, 0, 0), "cuMemAddressReserve") ||
                    !ok(cuMemMap(staging, c.chunk, 0, c.handles[0], 0), "cuMemMap") ||
                    !ok(cuMemSetAccess(staging, c.chunk, &access, 1), "cuMemSetAccess"))) {
    return false;
  }
  const bool good = repeat(what, condition, [&] {
    bool mapped = true, accessible = true, unmapped = true;
    const double m = micros([&] { return cuMemMap(c.va, c.chunk, 0, c.handles[0], 0); }, "cuMemMap", &mapped);
    if (!mapped) return false;
    const double s = micros([&] { return cuMemSetAccess(c.va, c.chunk, &access, 1); }, "cuMemSetAccess", &accessible);
    const double u = micros([&] { return cuMemUnmap(c.va, c.chunk); }, "cuMemUnmap", &unmapped);
    map.push_back(m);
    set_access.push_back(s);
    unmap.push_back(u);
    return accessible && unmapped;
  });
  if (staging) {
    cuMemUnmap(staging, c.chunk);
    cuMemAddressFree(staging, c.chunk);
  }
  const std::string suffix = "_us_" + std::string(condition.name);
  bench("map_" + what + suffix, median(map), "us");
  bench("set_access_" + what + suffix, median(set_access), "us");
  bench("unmap_" + what + suffix, median(unmap), "us");
  return good;
}

// Every chunk mapped back to back, then access given and the mappings undone
// by one call over the whole range (`once`) or one call a chunk.
bool time_back_to_back(const Kind& k, const Chunks& c, CUdevice device, const Condition& condition) {
  std::vector<double> map, set_access[2], unmap[2];
  const CUmemAccessDesc access = device_access(device);
  const std::string what = k.tier + "_" + std::to_string(c.handles.size()) + "x" + k.chunk_name;
  bool good = true;
  for (const std::size_t once : {0, 1}) {
    good &= repeat(what + (once ? "_once" : ""), condition, [&] {
      bool fine = true;
      double m = 0, s = 0, u = 0;
      for (std::size_t i = 0; i < c.handles.size(); ++i) {
        m += micros([&] { return cuMemMap(c.va + i * c.chunk, c.chunk, 0, c.handles[i], 0); }, "cuMemMap", &fine);
        if (!fine) {
          if (i) cuMemUnmap(c.va, i * c.chunk);
          return false;
        }
      }
      if (once) {
        s = micros([&] { return cuMemSetAccess(c.va, c.bytes(), &access, 1); }, "cuMemSetAccess", &fine);
        u = micros([&] { return cuMemUnmap(c.va, c.bytes()); }, "cuMemUnmap", &fine);
      } else {
        for (std::size_t i = 0; i < c.handles.size(); ++i) {
          s += micros([&] { return cuMemSetAccess(c.va + i * c.chunk, c.chunk, &access, 1); }, "cuMemSetAccess", &fine);
        }
        for (std::size_t i = 0; i < c.handles.size(); ++i) {
          u += micros([&] { return cuMemUnmap(c.va + i * c.chunk, c.chunk); }, "cuMemUnmap", &fine);
        }
      }
      map.push_back(m);
      set_access[once].push_back(s);
      unmap[once].push_back(u);
      return fine;
    });
  }
  const std::string suffix = "_us_" + std::string(condition.name);
  bench("map_" + what + suffix, median(map), "us");
  bench("set_access_" + what + suffix, median(set_access[0]), "us");
  bench("set_access_" + what + "_once" + suffix, median(set_access[1]), "us");
  bench("unmap_" + what + suffix, median(unmap[0]), "us");
  bench("unmap_" + what + "_once" + suffix, median(unmap[1]), "us");
  return good;
}

// Whether remapping spreads over threads: each of `threads` threads maps its
// own chunk of `c` (in its own part of c's range), gives the device access
// and unmaps it, `rounds` times; all at once. The figure is the bytes given
// access per second of wall time, over all threads.
bool time_parallel(const Kind& k, const Chunks& c, std::size_t threads, CUcontext context, CUdevice device,
                   const Condition& condition) {
  constexpr int rounds = 4;
  std::vector<double> rates;
  const CUmemAccessDesc access = device_access(device);
  const std::string what = k.tier + "_" + k.chunk_name + "_" + std::to_string(threads) + "_threads";
  const bool good = repeat(what, condition, [&] {
    std::atomic<bool> fine{true};
    std::vector<std::thread> workers;
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const CUdeviceptr at = c.va + t * c.chunk;
        bool mine = ok(cuCtxSetCurrent(context), "cuCtxSetCurrent");
        for (int r = 0; mine && r < rounds; ++r) {
          mine = ok(cuMemMap(at, c.chunk, 0, c.handles[t], 0), "cuMemMap");
          if (!mine) break;
          mine = ok(cuMemSetAccess(at, c.chunk, &access, 1), "cuMemSetAccess");
          mine &= ok(cuMemUnmap(at, c.chunk), "cuMemUnmap");
        }
        if (!mine) fine = false;
      });
    }
    for (std::thread& w : workers) w.join();
    rates.push_back(double(threads * rounds * c.chunk) / 1e9 / (ms_since(start) / 1e3));
    return fine.load();
  });
  bench("remap_" + what + "_gbps_" + condition.name, median(rates), "GB/s", 2);
  return good;
}

// One copy, queued on its own stream.
struct Copy {
  CUdeviceptr dst;
  CUdeviceptr src;
  std::size_t bytes;
  CUstream stream;
  CUresult enqueue() const { return cuMemcpyAsync(dst, src, bytes, stream); }
};

struct Rates {
  double dtoh = 0, htod = 0, both_dtoh = 0, both_htod = 0, both_total = 0;
};

// Each direction alone, then both at once (the second stream waits for an
// event on the first so they start together); medians, in GB/s.
bool measure_copies(const Copy (&copies)[2], Rates* rates) {
  CUevent start = nullptr, end[2] = {};
  bool good = ok(cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate") &&
              ok(cuEventCreate(&end[0], CU_EVENT_DEFAULT), "cuEventCreate") &&
              ok(cuEventCreate(&end[1], CU_EVENT_DEFAULT), "cuEventCreate");
  auto elapsed_ms = [&](CUevent to) {
    float ms = 0;
    good &= ok(cuEventElapsedTime(&ms, start, to), "cuEventElapsedTime");
    return double(ms);
  };
  auto gbps = [](std::size_t bytes, double ms) { return ms > 0 ? double(bytes) / (ms * 1e-3) / 1e9 : 0.0; };
  for (const Copy& copy : copies) {  // the first copy of a range may set things up
    good = good && ok(copy.enqueue(), "cuMemcpyAsync") && ok(cuStreamSynchronize(copy.stream), "cuStreamSynchronize");
  }
  std::vector<double> alone[2], both[2], total;
  for (int r = 0; good && r < repetitions; ++r) {
    for (int d = 0; good && d < 2; ++d) {
      good = ok(cuEventRecord(start, copies[d].stream), "cuEventRecord") && ok(copies[d].enqueue(), "cuMemcpyAsync") &&
             ok(cuEventRecord(end[d], copies[d].stream), "cuEventRecord") &&
             ok(cuStreamSynchronize(copies[d].stream), "cuStreamSynchronize");
      if (good) alone[d].push_back(gbps(copies[d].bytes, elapsed_ms(end[d])));
    }
    good = good && ok(cuEventRecord(start, copies[0].stream), "cuEventRecord") &&
           ok(cuStreamWaitEvent(copies[1].stream, start, 0), "cuStreamWaitEvent");
    for (int d = 0; good && d < 2; ++d) {
      good = ok(copies[d].enqueue(), "cuMemcpyAsync") && ok(cuEventRecord(end[d], copies[d].stream), "cuEventRecord");
    }
    for (int d = 0; good && d < 2; ++d) good = ok(cuStreamSynchronize(copies[d].stream), "cuStreamSynchronize");
    if (good) {
      const double ms[2] = {elapsed_ms(end[0]), elapsed_ms(end[1])};
      both[0].push_back(gbps(copies[0].bytes, ms[0]));
      both[1].push_back(gbps(copies[1].bytes, ms[1]));
      total.push_back(gbps(copies[0].bytes + copies[1].bytes, std::max(ms[0], ms[1])));
    }
  }
  for (CUevent event : {start, end[0], end[1]}) {
    if (event) good &= ok(cuEventDestroy(event), "cuEventDestroy");
  }
  *rates = {median(alone[0]), median(alone[1]), median(both[0]), median(both[1]), median(total)};
  return good;
}

// Each launch call of the spin kernel (1 us), in us: `bursts` of 256, the
// stream synchronised between them (untimed) so the launch queue never fills.
bool time_launches(CUfunction spin, CUstream stream, int bursts, std::vector<double>* us) {
  unsigned long long ns = 1000;
  void* params[] = {&ns};
  bool good = true;
  for (int b = 0; good && b < bursts; ++b) {
    for (int i = 0; good && i < launch_burst; ++i) {
      us->push_back(micros([&] { return cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr); },
                           "cuLaunchKernel", &good));
    }
    good = good && ok(cuStreamSynchronize(stream), "cuStreamSynchronize");
  }
  return good;
}

void print_launches(std::vector<double> us, const char* condition) {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  const std::string suffix = std::string("_us_") + condition;
  bench("launch_p50" + suffix, us[us.size() / 2], "us");
  bench("launch_p99" + suffix, us[std::min(us.size() - 1, us.size() * 99 / 100)], "us");
  bench("launch_max" + suffix, us.back(), "us");
  // A remap that stalls launches shows in a few calls: too few for the p99 where the other thread cycles rarely.
  const auto slow = std::count_if(us.begin(), us.end(), [](double t) { return t > 100; });
  bench(std::string("launch_over_100us_") + condition, double(slow), "launches", 0);
}

// Launch calls alone, then while another thread maps, gives access to and
// unmaps `c`'s chunk in a loop.
bool launches_beside_vmm(CUcontext context, CUdevice device, CUfunction spin, CUstream stream, const Chunks& c) {
  std::vector<double> warm, alone, beside;
  bool good = time_launches(spin, stream, 2, &warm) && time_launches(spin, stream, launch_bursts, &alone);
  print_launches(alone, "alone");
  if (!good) return false;
  std::atomic<bool> stop{false}, done{false};
  std::atomic<long> cycles{0};
  bool vmm_good = true;  // the other thread's
  std::vector<double> cycle_ms;
  std::thread vmm([&] {
    const CUmemAccessDesc access = device_access(device);
    vmm_good = ok(cuCtxSetCurrent(context), "cuCtxSetCurrent");
    while (vmm_good && !stop.load()) {
      const auto start = std::chrono::steady_clock::now();
      const bool mapped = ok(cuMemMap(c.va, c.chunk, 0, c.handles[0], 0), "cuMemMap");
      const bool accessible = mapped && ok(cuMemSetAccess(c.va, c.chunk, &access, 1), "cuMemSetAccess");
      const bool unmapped = mapped && ok(cuMemUnmap(c.va, c.chunk), "cuMemUnmap");
      vmm_good = accessible && unmapped;
      if (vmm_good) {
        cycle_ms.push_back(ms_since(start));
        cycles.fetch_add(1);
      }
    }
    done.store(true);
  });
  while (cycles.load() == 0 && !done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const long before = cycles.load();
  good = time_launches(spin, stream, launch_bursts, &beside);
  const long during = cycles.load() - before;
  stop.store(true);
  vmm.join();
  print_launches(beside, "vmm");
  bench("launch_vmm_cycles", double(during), "cycles", 0);
  bench("launch_vmm_cycle_us", median(cycle_ms) * 1e3, "us");
  return good && vmm_good;
}

}  // namespace

int main() {
  gmem::bench::Gpu gpu;
  CUstream work = nullptr, dtoh = nullptr, htod = nullptr;
  if (!gmem::bench::open_gpu(program, &gpu) || !ok(cuStreamCreate(&work, CU_STREAM_NON_BLOCKING), "cuStreamCreate") ||
      !ok(cuStreamCreate(&dtoh, CU_STREAM_NON_BLOCKING), "cuStreamCreate") ||
      !ok(cuStreamCreate(&htod, CU_STREAM_NON_BLOCKING), "cuStreamCreate")) {
    return 1;
  }
  const auto& [device, context, module, spin, stream_read, sms] = gpu;
  using gmem::bench::pinned_at;
  const CUmemAllocationProp on_device = pinned_at(gmem::bench::on_device(device)),
                            on_numa = pinned_at(gmem::bench::host_numa_of(device)),
                            on_host = pinned_at({CU_MEM_LOCATION_TYPE_HOST, 0});

  // What the copies move: 4 GiB of device memory and 4 GiB of pinned host
  // memory, each mapped whole; device to host copies the first halves, host
  // to device the second.
  Chunks device_range, host_range;
  const char* call = nullptr;
  if (!ok(make_chunks(on_device, GiB, 4, &device_range, &call), call)) return 1;
  if (!ok(make_chunks(on_numa, 256 * MiB, 16, &host_range, &call), call)) return 1;
  if (!map_all(device_range, device) || !map_all(host_range, device)) return 1;
  bool good = true;
  unsigned type = 0;
  if (ok(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, host_range.va), "cuPointerGetAttribute")) {
    std::fprintf(stderr, "%s: the driver takes the host range for %s memory\n", program,
                 type == CU_MEMORYTYPE_HOST ? "host" : type == CU_MEMORYTYPE_DEVICE ? "device" : "other");
  } else {
    good = false;
  }
  const std::size_t half = 2 * GiB;
  const Copy copies[2] = {{host_range.va, device_range.va, half, dtoh},
                          {device_range.va + half, host_range.va + half, half, htod}};
  Rates rates;
  good &= measure_copies(copies, &rates);
  bench("copy_dtoh", rates.dtoh, "GB/s");
  bench("copy_htod", rates.htod, "GB/s");
  bench("copy_both_dtoh", rates.both_dtoh, "GB/s");
  bench("copy_both_htod", rates.both_htod, "GB/s");
  bench("copy_both_total", rates.both_total, "GB/s");

  // The loads: copies both ways (an item lasts what the slower direction took
  // with both running); 250 ms kernels on every SM reading the host range
  // (streaming) or the device range (computing: what an evictor meets during
  // a spilled step whose kernels run on device memory); and those device
  // reads beside the copies (copying_computing; its kernels last an item of
  // the copies).
  const double slower_gbps = std::min(rates.both_dtoh, rates.both_htod);
  const double copy_ms = slower_gbps > 0 ? double(half) / (slower_gbps * 1e9) * 1e3 : 50;
  Backlog copying({dtoh, htod}, [&](std::size_t lane) { return copies[lane].enqueue(); }, copy_ms);
  auto read = [&](const Chunks& range, unsigned long long ns) {
    CUdeviceptr base = range.va;
    unsigned long long words = range.bytes() / 8;
    void* params[] = {&base, &words, &ns};
    return cuLaunchKernel(stream_read, unsigned(sms) * 8, 1, 1, 256, 1, 1, 0, work, params, nullptr);
  };
  const unsigned long long read_ns = 250'000'000;
  Backlog streaming({work}, [&](std::size_t) { return read(host_range, read_ns); }, double(read_ns) / 1e6);
  Backlog computing({work}, [&](std::size_t) { return read(device_range, read_ns); }, double(read_ns) / 1e6);
  Backlog copying_computing(
      {dtoh, htod, work},
      [&](std::size_t lane) {
        return lane < 2 ? copies[lane].enqueue() : read(device_range, (unsigned long long)(copy_ms * 1e6));
      },
      copy_ms);
  const Condition idle{"idle", nullptr}, copying_condition{"copying", &copying},
      streaming_condition{"streaming", &streaming}, computing_condition{"computing", &computing},
      copying_computing_condition{"copying_computing", &copying_computing};

  const Kind kinds[] = {{"device", "1GiB", on_device, GiB, 1, false},
                        {"host_numa", "256MiB", on_numa, 256 * MiB, 8, false},
                        {"host_plain", "256MiB", on_host, 256 * MiB, 8, true}};
  for (const Kind& k : kinds) {
    if (!good) break;
    Chunks c;
    const CUresult status = make_chunks(k.prop, k.chunk, k.count, &c, &call);
    if (status != CUDA_SUCCESS && k.optional) {
      const char* text = nullptr;
      cuGetErrorName(status, &text);
      std::fprintf(stderr, "%s: %s chunks: %s answers %s: skipped\n", program, k.tier.c_str(), call, text ? text : "?");
      continue;
    }
    if (!ok(status, call)) {
      good = false;
      break;
    }
    for (const Condition& condition :
         {idle, copying_condition, streaming_condition, computing_condition, copying_computing_condition}) {
      good = good && time_one_chunk(k, c, device, condition);
    }
    if (k.count > 1) {
      for (const Condition& condition : {idle, copying_condition, copying_computing_condition}) {
        good = good && time_one_chunk(k, c, device, condition, true);
        good = good && time_back_to_back(k, c, device, condition);
        for (const std::size_t threads : {std::size_t{1}, std::size_t{2}, std::size_t{4}, std::size_t{8}}) {
          good = good && time_parallel(k, c, threads, context, device, condition);
        }
      }
    }
    good &= free_chunks(&c, false);
  }

  if (good) {
    Chunks c;
    good = ok(make_chunks(on_numa, 256 * MiB, 1, &c, &call), call) &&
           launches_beside_vmm(context, device, spin, work, c);
    good &= free_chunks(&c, false);
  }

  good &= copying.drain() && streaming.drain() && computing.drain() && copying_computing.drain();
  good &= free_chunks(&host_range, true);
  good &= free_chunks(&device_range, true);
  for (CUstream stream : {work, dtoh, htod}) good &= ok(cuStreamDestroy(stream), "cuStreamDestroy");
  good &= ok(cuModuleUnload(module), "cuModuleUnload");
  good &= ok(cuDevicePrimaryCtxRelease(device), "cuDevicePrimaryCtxRelease");
  return good ? 0 : 1;
}
