// The emulator's driver-wide calls: state, initialisation, the common checks
// (which also trace), error names and strings.
#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <cstring>
#include <string>

#include "emu.h"

namespace emu {

State& state() {
  static State* s = new State;  // never destroyed: calls may come during exit
  return *s;
}

void trace(const char* function) {
  static const bool on = [] {
    const char* v = std::getenv("GMEM_EMU_TRACE");
    return v && *v && *v != '0';
  }();
  if (on) std::fprintf(stderr, "gmem-emu: %s\n", function);
}

CUresult init_check(const char* caller) {
  trace(caller);
  return state().initialised ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult device_check(CUdevice device, const char* caller) {
  if (CUresult r = init_check(caller)) return r;
  return device >= 0 && static_cast<std::size_t>(device) < state().devices.size() ? CUDA_SUCCESS
                                                                                  : CUDA_ERROR_INVALID_DEVICE;
}

CUresult context_check(const char* caller) {
  if (CUresult r = init_check(caller)) return r;
  Context* c = current_context();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (c->alive) return CUDA_SUCCESS;
  return c->primary ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

namespace {

// A size with an optional K/M/G suffix; a bad value warns and keeps the default.
std::size_t parse_size(const char* name, const std::string& text, std::size_t fallback) {
  if (text.empty()) return fallback;
  char* end = nullptr;
  unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  int shift = 0;
  switch (*end) {
    case 'G': case 'g': shift = 30; ++end; break;
    case 'M': case 'm': shift = 20; ++end; break;
    case 'K': case 'k': shift = 10; ++end; break;
    default: break;
  }
  if (end == text.c_str() || *end || value == 0) {
    std::fprintf(stderr, "gmem-emu: %s=%s is not a size (bytes, K/M/G suffix); using %zu\n", name, text.c_str(),
                 fallback);
    return fallback;
  }
  return static_cast<std::size_t>(value) << shift;
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// GMEM_EMU_DEVICE_MEMORY: one size for every device, or a comma-separated
// size per device (the last one repeats).
std::vector<std::size_t> device_memory(std::size_t devices) {
  std::vector<std::size_t> sizes;
  std::string list = env("GMEM_EMU_DEVICE_MEMORY");
  for (std::size_t start = 0; start <= list.size() && !list.empty();) {
    std::size_t comma = std::min(list.find(',', start), list.size());
    sizes.push_back(parse_size("GMEM_EMU_DEVICE_MEMORY", list.substr(start, comma - start), std::size_t{4} << 30));
    start = comma + 1;
  }
  if (sizes.empty()) sizes.push_back(std::size_t{4} << 30);
  sizes.resize(std::max(devices, sizes.size()), sizes.back());
  return sizes;
}

}  // namespace
}  // namespace emu

using namespace emu;

EMU_API CUresult cuInit(unsigned int flags) {
  trace(__func__);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (s.initialised) return CUDA_SUCCESS;
  const char* count = std::getenv("GMEM_EMU_DEVICES");
  int devices = count && *count ? std::atoi(count) : 1;
  if (devices <= 0) return CUDA_ERROR_NO_DEVICE;
  const std::vector<std::size_t> memory = device_memory(static_cast<std::size_t>(devices));
  const char* hold = std::getenv("GMEM_EMU_HOLD_EVENTS");
  s.hold_events = hold && std::strcmp(hold, "1") == 0;
  s.peer_access = env("GMEM_EMU_P2P") != "0";
  const std::string nodes = env("GMEM_EMU_NUMA_NODES");
  s.numa_nodes = nodes.empty() ? 1 : std::atoi(nodes.c_str());
  s.host_total = parse_size("GMEM_EMU_HOST_MEMORY", env("GMEM_EMU_HOST_MEMORY"), SIZE_MAX);
  s.pin_ms = std::atoi(env("GMEM_EMU_PIN_MS").c_str());
  s.sync_ms = std::atoi(env("GMEM_EMU_SYNC_MS").c_str());
  s.late_copies = env("GMEM_EMU_LATE_COPIES") == "1";
  s.device_chunk_max = parse_size("GMEM_EMU_DEVICE_CHUNK_MAX", env("GMEM_EMU_DEVICE_CHUNK_MAX"), SIZE_MAX);
  s.devices.resize(static_cast<std::size_t>(devices));
  for (std::size_t i = 0; i < s.devices.size(); ++i) {
    Device& d = s.devices[i];
    d.total = memory[i];
    d.primary.device = d.pool.device = static_cast<int>(i);
    d.current_pool = &d.pool;
  }
  s.initialised = true;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDriverGetVersion(int* version) {
  trace(__func__);
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = 13000;
  return CUDA_SUCCESS;
}

namespace {

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

constexpr ErrorText errors[] = {
#define EMU_ERROR(code, text) {code, #code, text},
#include "emu_errors.inc"
#undef EMU_ERROR
};

// The documented answer for an unknown code: CUDA_ERROR_INVALID_VALUE and NULL.
CUresult error_text(CUresult error, const char** out, bool name) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorText& e : errors) {
    if (e.code == error) {
      *out = name ? e.name : e.text;
      return CUDA_SUCCESS;
    }
  }
  *out = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

EMU_API CUresult cuGetErrorName(CUresult error, const char** name) {
  trace(__func__);
  return error_text(error, name, true);
}

EMU_API CUresult cuGetErrorString(CUresult error, const char** text) {
  trace(__func__);
  return error_text(error, text, false);
}

// The driver's private tables (cudart asks for them) have no emulation.
EMU_API CUresult cuGetExportTable(const void** table, const CUuuid*) {
  trace(__func__);
  if (table) *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}
