// The emulated CUDA driver: shared state of the test fixture. Device memory is
// host memory mapped into one reserved range; VMM physical memory is a memfd, so
// mappings alias as on a GPU and handles cross processes as POSIX fds. Work on
// streams runs at once, in order.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#define EMU_API extern "C" [[gnu::visibility("default")]]
// The per-thread-default-stream entry points behave like the plain ones here.
#define EMU_ALIAS(name, target) \
  extern "C" decltype(target) name __attribute__((alias(#target), visibility("default")));

namespace emu {

constexpr std::size_t granularity = 2 << 20;
constexpr std::size_t page = 4096;

struct Context {
  int device = 0;
  bool alive = true;  // a primary context: active (retained and not reset)
  bool primary = false;
};

// A device's stream-ordered pool. Its memory is bookkeeping over ordinary
// allocations: reserved bytes beyond those in use are kept, as the driver keeps
// them, until a synchronisation trims the pool to its release threshold.
struct MemPool {
  int device = 0;
  cuuint64_t release_threshold = 0;
  cuuint64_t reserved = 0, reserved_high = 0;
  cuuint64_t used = 0, used_high = 0;
  int reuse[3] = {1, 1, 1};  // follow event dependencies, opportunistic, internal dependencies
};

enum class Kind { device, managed, host };

struct Allocation {
  std::size_t size = 0;
  std::size_t footprint = 0;  // address space taken in the device range; 0: host heap
  int device = 0;
  Context* context = nullptr;
  Kind kind = Kind::device;
  MemPool* pool = nullptr;  // stream-ordered allocations
  unsigned long long id = 0;
  // Legacy CUDA IPC (ipc.cpp): exported, its pages are this memfd's, shared
  // with the importers; opened, the exporter's pid and buffer id, with the
  // references of cuIpcOpenMemHandle calls not yet closed.
  int ipc_fd = -1;
  int ipc_from = 0;
  unsigned long long ipc_id = 0;
  int ipc_references = 0;
};

struct Physical {
  int fd = -1;
  std::size_t size = 0;
  CUmemLocation location{};
  CUmemAllocationHandleType handle_types = CU_MEM_HANDLE_TYPE_NONE;
  bool charged = false;  // counts against its location: a device, or pinned host memory
  int references = 1;    // the handle, plus one per mapping and retain
};

struct Mapping {
  std::size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
};

struct Stream {
  Context* context = nullptr;
  unsigned flags = 0;
  int priority = 0;
  cuuint64_t capture = 0;    // the capture under way on it; 0: none
  CUgraph graph = nullptr;   // what that capture records into
  bool global = false;       // that capture's mode is CU_STREAM_CAPTURE_MODE_GLOBAL
  bool invalidated = false;  // that capture met a call it does not allow
  // GMEM_EMU_LATE_COPIES=1: its copies, enqueued and not yet run (run_late).
  std::vector<std::function<void()>> late = {};
};

struct Event {
  unsigned flags = 0;
  bool recorded = false;
  std::chrono::steady_clock::time_point when{};
  CUstream stream = nullptr;  // held: recorded on it, not complete until it is synchronized
  uint64_t order = 0;         // held: events recorded before on the same stream have lower ones
  CUstream on = nullptr;      // the stream it was last recorded on
};

struct Device {
  std::size_t total = 0;
  std::size_t used = 0;
  Context primary{0, false, true};
  int primary_references = 0;
  unsigned primary_flags = 0;
  MemPool pool;
  MemPool* current_pool = nullptr;
};

struct State {
  std::mutex mutex;
  bool initialised = false;
  std::vector<Device> devices;  // sized once by cuInit: pointers into it stay valid
  std::map<CUdeviceptr, Allocation> allocations;  // by start address
  std::map<CUmemGenericAllocationHandle, Physical> physical;
  std::map<CUdeviceptr, Mapping> mappings;  // by start address
  std::map<CUdeviceptr, std::size_t> reservations;
  std::set<Context*> contexts;  // created ones; destroyed ones stay, dead
  std::set<Stream*> streams;
  std::set<Event*> events;
  // GMEM_EMU_HOLD_EVENTS=1: a recorded event stays incomplete (as if the GPU
  // were busy) until its stream, the context or the event is synchronized.
  bool hold_events = false;
  uint64_t events_recorded = 0;
  // The GPU's clock, which events record (cuEventElapsedTime): each kernel
  // launched takes a microsecond per block of its grid, and nothing else
  // takes time, so that a test says how long its kernels run.
  std::chrono::nanoseconds gpu_time{0};
  // GMEM_EMU_P2P=0: no device can map another's memory (default: every pair
  // can, with native atomics, as over NVLink).
  bool peer_access = true;
  // GMEM_EMU_NUMA_NODES (default 1; 0: the system has no NUMA): device i is
  // closest to node i % nodes.
  int numa_nodes = 1;
  // Pinned host memory (CU_MEM_LOCATION_TYPE_HOST/HOST_NUMA chunks):
  // GMEM_EMU_HOST_MEMORY (default: no limit); beyond it cuMemCreate is out of memory.
  std::size_t host_total = SIZE_MAX;
  std::size_t host_used = 0;
  // GMEM_EMU_PIN_MS (default 0): each pinned host chunk takes this long to
  // make, as pinning gigabytes takes an H100's host whole seconds.
  int pin_ms = 0;
  // GMEM_EMU_SYNC_MS (default 0): cuCtxSynchronize and cuStreamSynchronize
  // take this long first, as on a device with a deep queue of work (others go
  // on meanwhile); what was queued took effect when it was submitted.
  int sync_ms = 0;
  // GMEM_EMU_LATE_COPIES=1: a copy on a stream the program created runs only
  // once that stream, an event recorded on it or the context is synchronized
  // (or queried), as a GPU may run it that late. Where its memory is no longer
  // mapped then, the context faults: `fault` (CUDA_ERROR_ILLEGAL_ADDRESS) is
  // what every synchronization returns from then on.
  bool late_copies = false;
  CUresult fault = CUDA_SUCCESS;
  // GMEM_EMU_DEVICE_CHUNK_MAX (default: no limit): a larger device chunk is
  // out of memory, as on an H100 that refuses one chunk of all its free memory.
  std::size_t device_chunk_max = SIZE_MAX;
  CUmemGenericAllocationHandle next_handle = 0x1000;
  unsigned long long next_buffer_id = 1;
};

State& state();

// The work queued on `stream` completes (held events complete, late copies
// run); under the state mutex. all_streams: every stream's.
inline const CUstream all_streams = reinterpret_cast<CUstream>(~std::uintptr_t{0});
void complete_events(CUstream stream);
// The late copies (GMEM_EMU_LATE_COPIES) of `stream` run; under the state
// mutex. all_streams: every stream's.
void run_late(CUstream stream);
// A synchronization's wait for the device's queue: GMEM_EMU_SYNC_MS, with no
// lock held (others go on meanwhile).
void wait_for_queue();

// The calling thread's context stack; its top is the current context.
std::vector<Context*>& context_stack();
Context* current_context();

// Common checks, each also the trace point of the exported function calling it
// (GMEM_EMU_TRACE=1): CUDA_SUCCESS when the driver is initialised, the device
// exists, a live context is current.
void trace(const char* function);
CUresult init_check(const char* caller = __builtin_FUNCTION());
CUresult device_check(CUdevice device, const char* caller = __builtin_FUNCTION());
CUresult context_check(const char* caller = __builtin_FUNCTION());

// The entry of `ranges` (start address -> something with a size) that holds
// `ptr`, or end().
template <typename Map>
typename Map::iterator find_containing(Map& ranges, CUdeviceptr ptr) {
  auto it = ranges.upper_bound(ptr);
  if (it == ranges.begin()) return ranges.end();
  --it;
  return ptr < it->first + it->second.size ? it : ranges.end();
}

// The allocation containing `ptr` (interior pointers too), or end().
std::map<CUdeviceptr, Allocation>::iterator find_allocation(CUdeviceptr ptr);
// The VMM mapping containing `ptr`, or end().
std::map<CUdeviceptr, Mapping>::iterator find_mapping(CUdeviceptr ptr);
// True if [ptr, ptr + bytes) is device memory the caller may read (or write).
bool accessible(CUdeviceptr ptr, std::size_t bytes, bool write);

// Device memory bookkeeping; false when the device is out of memory.
bool charge(int device, std::size_t bytes);
void refund(int device, std::size_t bytes);

// Address space in the device range: 2 MiB aligned from 2 MiB up, page aligned
// below; readable and writable once taken, inaccessible again once given back.
void* take_device_range(std::size_t size, std::size_t* footprint);
void give_device_range(void* start, std::size_t footprint);
// True if `ptr` lies in device address space: the device range or a VMM reservation.
bool device_address(CUdeviceptr ptr);

// Frees every allocation of a context being destroyed.
void drop_context(Context* context);
// Frees one allocation (its memory and its charge); the iterator dies.
void drop_allocation(std::map<CUdeviceptr, Allocation>::iterator it);
// An exported or opened allocation's pages private again (before they go back).
void unshare_ipc_pages(const Allocation& a, CUdeviceptr start);

// Stream-ordered pools.
MemPool* find_pool(CUmemoryPool pool);
CUresult pool_allocate(MemPool* pool, CUdeviceptr* dptr, std::size_t size);
// Releases what every pool holds beyond its release threshold (at synchronisation).
void trim_pools();

// Stream and event handles as the driver checks them (0 and the two special
// streams are valid); the caller holds the state mutex.
bool valid_stream(CUstream stream);
// A stream created by cuStreamCreate*: only those capture into graphs here.
bool capturable(CUstream stream);

}  // namespace emu
