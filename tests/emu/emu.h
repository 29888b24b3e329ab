// The emulated CUDA driver: shared state of the test fixture. Device memory is
// host memory; VMM physical memory is a memfd, so mappings alias as on a GPU and
// handles cross processes as POSIX fds. Work on streams runs at once, in order.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

#define EMU_API extern "C" [[gnu::visibility("default")]]
// The per-thread-default-stream entry points behave like the plain ones here.
#define EMU_ALIAS(name, target) \
  extern "C" decltype(target) name __attribute__((alias(#target), visibility("default")));

namespace emu {

constexpr std::size_t granularity = 2 << 20;

struct Context {
  int device = 0;
  bool alive = true;
  bool primary = false;
};

enum class Kind { device, managed, host, mapped };

struct Allocation {
  std::size_t size = 0;
  std::size_t reserved = 0;  // bytes mapped for it; 0: it came from the heap
  int device = 0;
  Context* context = nullptr;
  Kind kind = Kind::device;
};

struct Physical {
  int fd = -1;
  std::size_t size = 0;
  CUmemLocation location{};
  int references = 1;  // the handle, plus one per mapping
};

struct Mapping {
  std::size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
};

struct Device {
  std::size_t total = 0;
  std::size_t used = 0;
  Context* primary = nullptr;
  int primary_references = 0;
  unsigned primary_flags = 0;
};

struct State {
  std::mutex mutex;
  bool initialised = false;
  std::vector<Device> devices;
  std::map<CUdeviceptr, Allocation> allocations;  // by start address
  std::map<CUmemGenericAllocationHandle, Physical> physical;
  std::map<CUdeviceptr, Mapping> mappings;       // by start address
  std::map<CUdeviceptr, std::size_t> reservations;
  CUmemGenericAllocationHandle next_handle = 0x1000;
};

State& state();
Context*& current_context();

// Common checks: CUDA_SUCCESS when the driver is initialised (and, for
// context_check, a live context is current).
CUresult init_check();
CUresult context_check();

// The allocation containing `ptr` (interior pointers too), or end().
std::map<CUdeviceptr, Allocation>::iterator find_allocation(CUdeviceptr ptr);

// Device memory bookkeeping; false when the device is out of memory.
bool charge(int device, std::size_t bytes);
void refund(int device, std::size_t bytes);

// Frees every allocation of a context being destroyed.
void drop_context(Context* context);

}  // namespace emu
