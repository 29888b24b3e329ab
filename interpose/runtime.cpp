#include "interpose/runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "dedup/wire.h"
#include "dedup/client.h"
#include "gmem/internal/log.h"
#include "interpose/driver_table.h"
#include "interpose/gate.h"
#include "interpose/tensor_maps.h"
#include "interpose/torch_retry.h"
#include "ipc/exporter.h"
#include "ipc/host_lease.h"
#include "ipc/host_pool.h"
#include "ipc/importer.h"
#include "pool/report.h"

namespace gmem {

namespace {

Runtime* the_runtime = nullptr;
std::once_flag once;

// What the table holds when there is no real driver: every call fails as on a
// machine without one (cuInit: no device; everything else: not initialised).
CUresult no_driver() { return CUDA_ERROR_NOT_INITIALIZED; }
CUresult no_driver_init() { return CUDA_ERROR_NO_DEVICE; }
// A function this driver does not have (an older driver than the toolkit).
CUresult missing_function() { return CUDA_ERROR_NOT_FOUND; }

// At exit the stats file goes (readers learn the process is gone); a forked
// child stops writing into its parent's.
void remove_stats_file() { the_runtime->pool->publisher()->remove_file(); }
void detach_stats_in_child() { the_runtime->pool->publisher()->detach_after_fork(); }

std::unique_ptr<pool::Publisher> open_stats(const Config& config) {
  if (!config.stats) return nullptr;
  std::string error;
  auto publisher = pool::Publisher::create(config.stats_dir, getenv("GMEM_CONF"), &error);
  if (!publisher) {
    log_message(LogLevel::warn,
                "%s: the job runs, but gmemd cannot show it (set stats_dir in GMEM_CONF to a writable directory, "
                "or stats:0)",
                error.c_str());
  }
  return publisher;
}

pool::Budgets budgets(const Config& config) {
  pool::Budgets b;
  b.device = config.device_budget;
  b.device_reserve = config.device_reserve;
  b.peer = config.peer_budget;
  b.peer_reserve = config.peer_reserve;
  b.host = config.host_budget;
  b.host_prepare = config.host_prepare;
  b.host_chunk = config.host_chunk;
  b.mem_info = config.mem_info;
  return b;
}

// With evict: what a copy, set or stream memory operation may touch. One that
// may touch a range the evictor moves, moved or parked counts for its batches
// (pool::Submissions::entries); one that may touch parked memory has it
// mapped (or brought back) first.
gate::Found look_at_references(const gate::Reference* refs, int count, bool act) {
  pool::Pool* pool = the_runtime ? the_runtime->pool : nullptr;
  const pool::AccessTable* table = pool ? pool->access() : nullptr;
  if (!table) return {false, true};
  const bool any_parked = table->any_parked();
  gate::Found found;
  for (int i = 0; i < count; ++i) {
    const gate::Reference& ref = refs[i];
    if (gate::is_unknown(ref)) {
      found = {found.work || any_parked, true};
      if (act && any_parked) pool->unpark_all();
      continue;
    }
    table->for_each_record(ref.ptr, ref.bytes, [&](const pool::AccessRecord& r) {
      found.moves = found.moves || r.watched() || r.moving() || r.parked() || r.host_bytes() || r.peer_bytes();
      found.work = found.work || r.parked();
      return true;
    });
    if (act && any_parked) pool->unpark(ref.ptr, ref.bytes);
  }
  return found;
}

// With evict: a copy to the device from host memory (gate.h's upload check).
// Each aligned 8-byte word of it that is an address in a pool range is a
// pointer the program keeps in device memory, which no launch's parameters
// will show: the range is pointed (pool/access.h), so the evictor leaves it
// on the device; one moving or parked needs work first: waited for, then
// mapped back at its addresses. Pointed while the copy counts in flight, a
// range is either pointed before a batch to the host closes the gate (the
// batch sees it touched) or found parked once it opens. (A kernel that
// reached a range so while it moved faulted on an H100:
// tests/e2e/pointer_table.c, docs/results.md, sixty-fourth session.)
bool look_at_upload(const void* host, std::size_t bytes, bool act) {
  pool::Pool* pool = the_runtime ? the_runtime->pool : nullptr;
  pool::AccessTable* table = pool ? pool->access() : nullptr;
  if (!table || !host) return false;
  bool work = false;
  const auto* bytes_at = static_cast<const unsigned char*>(host);
  for (std::size_t at = (8 - reinterpret_cast<uintptr_t>(host) % 8) % 8; at + 8 <= bytes; at += 8) {
    CUdeviceptr word;
    std::memcpy(&word, bytes_at + at, sizeof word);
    pool::AccessRecord* record = table->find(word);
    if (!record) continue;
    record->point();
    work = work || record->moving() || record->parked();
    if (!act) continue;
    if (record->moving()) table->wait_unmoved(*record);
    if (record->parked()) pool->unpark(word, 1);
  }
  return work;
}

// With evict: whether a unified copy's source is host memory the process may
// read, for the upload check: not a pool range (device or host chunks, at
// addresses only the device reads), and either unknown to the driver
// (pageable memory) or pinned host memory at the same address. Managed
// memory and any other device memory are left alone.
bool host_source(CUdeviceptr src) {
  pool::Pool* pool = the_runtime ? the_runtime->pool : nullptr;
  pool::AccessTable* table = pool ? pool->access() : nullptr;
  if (!table || table->find(src)) return false;
  unsigned type = 0;
  void* host = nullptr;
  int managed = 0;
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                      CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* data[] = {&type, &host, &managed};
  if (pool->driver().cuPointerGetAttributes(3, attributes, data, src) != CUDA_SUCCESS || managed) return false;
  return type == 0 || (type == CU_MEMORYTYPE_HOST && host == reinterpret_cast<void*>(src));
}

void print_report() {
  if (the_runtime && the_runtime->pool) {
    std::string text = pool::format_report(the_runtime->pool->stats(), getpid(), the_runtime->pool->vmm(),
                                            the_runtime->pool->mover(), &the_runtime->pool->uses(),
                                            the_runtime->pool->evictor());
    if (the_runtime->host_lease) text += the_runtime->host_lease->report();
    if (const tensor_maps::Figures maps = tensor_maps::figures(); maps.encoded) {
      text += "gmem: report tensor-maps encoded=" + std::to_string(maps.encoded) +
              " address_word=" + std::to_string(maps.address_word) + "\n";
    }
    fputs(text.c_str(), stderr);
  }
}

[[noreturn]] void stop_on_bad_config(const std::string& error) {
  fprintf(stderr,
          "gmem: GMEM_CONF: %s\n"
          "gmem: the job is stopped rather than run with a setting gmem could not read; "
          "fix GMEM_CONF or unset it.\n",
          error.c_str());
  std::_Exit(GMEM_EXIT_BAD_CONFIG);
}

// Dedup needs the VMM pool; it opens its socket at the first offer.
void start_dedup(Runtime& rt) {
  if (!rt.pool->vmm()) {
    log_message(LogLevel::warn, "dedup:1 needs pool:vmm (only the VMM pool's memory can be shared); dedup is off");
    return;
  }
  std::string socket = rt.config.dedup_socket.path.empty() ? dedup::wire::default_socket_path()
                                                            : rt.config.dedup_socket.path;
  rt.dedup = new dedup::Client(rt.pool->driver(), *rt.pool->vmm(), rt.pool->publisher(), socket);
  rt.pool->observe_frees(rt.dedup);
}

// The VMM pool's host tier borrows from gmemd's host pool before it pins.
void start_host_lease(Runtime& rt) {
  std::string socket = rt.config.host_pool_socket.path.empty() ? ipc::host_pool::default_socket_path()
                                                                : rt.config.host_pool_socket.path;
  rt.host_lease = new ipc::HostLease(rt.pool->driver(), socket);
  ipc::HostLease* lease = rt.host_lease;
  rt.pool->tiers()->lease_host(
      {[lease](vmm::Location where, std::size_t size, vmm::Chunk* out, vmm::ChunkObserver* observer) {
         return lease->take(where, size, out, observer);
       },
       [lease](std::size_t size) { return lease->lendable(size); },
       [lease](CUmemGenericAllocationHandle handle) { lease->give_back(handle); },
       [lease](std::size_t size) { lease->missed(size); }});
}

// The VMM pool's requests go to an allocation trace; a file that cannot be
// written is said, and the job runs without it. Launched kernels are named
// there by the driver: a function's name, or a library kernel's (cuLaunchKernel
// takes either); those over host memory are timed on the GPU.
void start_trace(Runtime& rt) {
  std::string error;
  std::unique_ptr<pool::TraceRecorder> trace = pool::TraceRecorder::open(rt.config.trace.path, &error);
  if (!trace) {
    log_message(LogLevel::error, "trace: %s; no allocation trace is written", error.c_str());
    return;
  }
  trace->name_kernels([](const void* function) {
    using Name = CUresult (*)(const char**, const void*);
    const char* name = nullptr;
    for (const unsigned fn : {gmem::fn_cuFuncGetName, gmem::fn_cuKernelGetName}) {
      if (reinterpret_cast<Name>(gmem_real_table[fn])(&name, function) == CUDA_SUCCESS && name) return std::string(name);
    }
    return std::string();
  });
  rt.pool->record_trace(std::move(trace));
}

// plan_file: the plan's verdicts and figures of an earlier run of the job
// are taken back before its first request (pool/uses.h), and this run's are
// written at exit, by the process that read them (not a forked child), where
// its trials reached a verdict.
pid_t plan_owner = 0;
std::string plan_path;  // the file, once start_plan has chosen it

// plan_file:auto: $XDG_CACHE_HOME/gmem/plans (else ~/.cache/gmem/plans), made
// where missing, and in it a file named for a hash (FNV-1a) of what tells the
// job from others: its command line, its working directory, GMEM_CONF (other
// budgets, other verdicts), RANK (each process of a torchrun job its own
// device's) and the machine's GPU models as the NVIDIA driver lists them
// (another GPU, other verdicts: a plan read back is kept, never tried again,
// so one made on an H200 would hold on an H100 sharing the home directory).
// Empty, said, where there is no such directory.
std::string auto_plan_path() {
  const char* cache = getenv("XDG_CACHE_HOME");
  const char* home = getenv("HOME");
  std::filesystem::path dir;
  if (cache && *cache == '/') {
    dir = cache;
  } else if (home && *home == '/') {
    dir = std::filesystem::path(home) / ".cache";
  } else {
    log_message(LogLevel::warn, "plan_file:auto needs HOME or XDG_CACHE_HOME; this run reads and writes no plan");
    return {};
  }
  dir /= "gmem/plans";
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    log_message(LogLevel::warn, "plan_file:auto cannot make %s (%s); this run reads and writes no plan",
                dir.c_str(), error.message().c_str());
    return {};
  }
  std::ostringstream job;
  job << std::ifstream("/proc/self/cmdline", std::ios::binary).rdbuf() << '\0'
      << std::filesystem::current_path(error).string() << '\0';
  for (const char* name : {"GMEM_CONF", "RANK"}) {
    const char* value = getenv(name);
    job << name << '=' << (value ? value : "") << '\0';
  }
  std::vector<std::string> models;  // "Model: NVIDIA H100 80GB HBM3", one per GPU
  for (const auto& gpu : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", error)) {
    std::ifstream information(gpu.path() / "information");
    for (std::string line; std::getline(information, line);) {
      if (line.starts_with("Model:")) models.push_back(line);
    }
  }
  std::sort(models.begin(), models.end());
  for (const std::string& model : models) job << model << '\0';
  uint64_t hash = 0xcbf29ce484222325;
  for (const unsigned char c : job.str()) hash = (hash ^ c) * 0x100000001b3;
  char name[32];
  snprintf(name, sizeof name, "%016llx.plan", static_cast<unsigned long long>(hash));
  return dir / name;
}

void save_plan() {
  if (getpid() != plan_owner) return;
  const std::string text = the_runtime->pool->uses().remembered();
  if (text.empty()) return;  // no verdict: the file stays as it was
  const std::string& path = plan_path;
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  std::ofstream out(temporary, std::ios::trunc);
  out << text;
  out.close();
  if (!out || rename(temporary.c_str(), path.c_str()) != 0) {
    log_message(LogLevel::warn, "plan_file: cannot write %s (%s); the next run starts without this run's plan",
                path.c_str(), strerror(errno));
    unlink(temporary.c_str());
  }
}

void start_plan(Runtime& rt) {
  if (!rt.config.track_access || !rt.config.place_by_use) {
    log_message(LogLevel::warn, "plan_file needs track_access:1 and place_by_use:1; %s is neither read nor written",
                rt.config.plan_file.automatic ? "auto's file" : rt.config.plan_file.path.c_str());
    return;
  }
  plan_path = rt.config.plan_file.automatic ? auto_plan_path() : rt.config.plan_file.path;
  const std::string& path = plan_path;
  if (path.empty()) return;
  if (rt.config.plan_file.automatic) log_message(LogLevel::info, "plan_file:auto: %s", path.c_str());
  if (std::ifstream in(path); in) {
    std::ostringstream text;
    text << in.rdbuf();
    if (rt.pool->uses().remember(text.str())) {
      log_message(LogLevel::info, "plan_file: placing as %s says, from the start", path.c_str());
    } else {
      log_message(LogLevel::warn, "plan_file: %s is not a plan gmem wrote; the job starts without it, and it is "
                  "written anew at exit", path.c_str());
    }
  }
  plan_owner = getpid();
  atexit(save_plan);
}

// Any process under gmem opens gmem's handles; one with the VMM pool exports
// its memory with them (told of frees after dedup, which may refuse one).
void start_ipc(Runtime& rt) {
  rt.ipc_importer = new ipc::Importer(rt.pool->driver());
  rt.pool->describe_elsewhere(rt.ipc_importer);
  if (rt.pool->vmm()) {
    rt.ipc_exporter = new ipc::Exporter(rt.pool->driver(), *rt.pool->vmm());
    rt.pool->observe_frees(rt.ipc_exporter);
  }
}

void initialise() {
  auto* rt = new Runtime;
  ConfigResult parsed = parse_config(getenv("GMEM_CONF"));
  if (!parsed.error.empty()) stop_on_bad_config(parsed.error);
  rt->config = parsed.config;
  set_log_level(rt->config.log_level);

  rt->real = open_real_driver();
  if (!rt->real.handle) {
    std::string tried;
    for (const auto& t : rt->real.tried) tried += "\n  " + t;
    log_message(LogLevel::error,
                "no real CUDA driver (libcuda.so.1) found, so every CUDA call fails as on a machine without "
                "one. Install the NVIDIA driver, or set GMEM_REAL_LIBCUDA to its libcuda.so.1. Looked at:%s",
                tried.c_str());
    for (unsigned i = 0; i < function_count; ++i) gmem_real_table[i] = reinterpret_cast<void*>(&no_driver);
    gmem_real_table[fn_cuInit] = reinterpret_cast<void*>(&no_driver_init);
  } else {
    log_message(LogLevel::debug, "real driver: %s", rt->real.path.c_str());
    for (unsigned i = 0; i < function_count; ++i) {
      void* fn = dlsym(rt->real.handle, function_names[i]);
      gmem_real_table[i] = fn ? fn : reinterpret_cast<void*>(&missing_function);
    }
    if (!rt->config.disable) {
      const bool use_vmm = rt->config.pool == config_type::source::vmm;
      // Spilled memory moves back only with the gate on, before any call
      // that submits work could run ungated.
      static gate::Submissions submissions;
      const bool moving = use_vmm && rt->config.migrate_after_ms.count() > 0;
      if (moving) gate::turn_on();
      rt->pool = new pool::Pool(vmm::Driver::from([&](const char* name) { return dlsym(rt->real.handle, name); }),
                                use_vmm, open_stats(rt->config), rt->config.pool_headroom / 100, budgets(rt->config),
                                rt->config.migrate_after_ms, moving ? &submissions : nullptr, rt->config.track_access,
                                rt->config.place_by_use, rt->config.track_from / 100, rt->config.evict,
                                rt->config.bring_in, rt->config.evict_park, rt->config.move_back);
      rt->pool->bring_in_slow(rt->config.slow_launch.value);
      if (rt->config.pack_step) rt->pool->uses().pack_steps();
      if (use_vmm) {
        rt->pool->vmm()->recall_by_step(rt->config.recall_steps);
        rt->pool->vmm()->keep_host_ranges(rt->config.keep_host_ranges);
        rt->pool->vmm()->check_mappings(rt->config.check_mappings);
        if (rt->config.check_moves) {
          // Moves back read through dedup's hash kernel (the SMs) and a copy to the host.
          static dedup::DeviceHasher hasher(rt->pool->driver());
          rt->pool->vmm()->check_moves(
              {[](CUdeviceptr ptr, std::size_t size, uint64_t* hash) {
                 dedup::DeviceHasher::Path path = dedup::DeviceHasher::Path::cpu;
                 return hasher.hash(ptr, size, hash, &path) == CUDA_SUCCESS && path == dedup::DeviceHasher::Path::gpu;
               },
               [](CUdeviceptr ptr, std::size_t size, uint64_t* hash) {
                 return hasher.hash_on_host(ptr, size, hash) == CUDA_SUCCESS;
               }});
        }
      }
      if (use_vmm && rt->config.torch_retry) {
        static TorchRetry torch_retry;
        rt->pool->veto_spills(&torch_retry);
      }
      if (moving && rt->config.evict != pool::Evict::off) {
        gate::set_reference_check(look_at_references);
        gate::set_upload_check(look_at_upload, host_source);
        gate::check_references(true);
      }
      if (use_vmm && rt->config.host_pool) start_host_lease(*rt);
      if (use_vmm && !rt->config.trace.path.empty()) start_trace(*rt);
      if (use_vmm && (rt->config.plan_file.automatic || !rt->config.plan_file.path.empty())) start_plan(*rt);
      if (rt->config.dedup) start_dedup(*rt);
      start_ipc(*rt);
    }
  }
  the_runtime = rt;
  if (rt->config.report) atexit(print_report);
  if (rt->pool && rt->pool->publisher()) {
    atexit(remove_stats_file);
    pthread_atfork(nullptr, nullptr, detach_stats_in_child);
  }
}

}  // namespace

const Runtime& runtime() {
  std::call_once(once, initialise);
  return *the_runtime;
}

}  // namespace gmem

extern "C" void gmem_resolve_driver() { gmem::runtime(); }
