// Modules, functions and launches of the emulator. A module is loaded from PTX
// text, of which only the kernels' signatures are read (`.entry name(.param
// .u64 a, .param .align 8 .b8 s[16], ...)`), so the same image serves a GPU and
// the emulator; cuFuncGetParamInfo answers their layout as the driver does.
// A launch checks its arguments as the driver does and runs nothing, but a
// pointer parameter into a VMM reservation where nothing is mapped with access
// faults the context, as the kernel's first load through it would on a GPU;
// so does a tensor map parameter over such memory. The emulator's tensor maps
// keep their address where no aligned word of theirs shows it (a tensor map
// is opaque: interpose/tensor_maps.h).
#include <cstring>
#include <string>
#include <vector>

#include "emu.h"

namespace emu {
namespace {

constexpr uint32_t tensor_map_magic = 0x50414d54;  // "TMAP"
constexpr uint64_t tensor_map_mask = 0xa5a5a5a5a5a5a5a5ull;

// The emulator's encoding: the magic, then the address masked at byte 4.
void encode_tensor_map(CUtensorMap* map, const void* address) {
  std::memset(map, 0, sizeof *map);
  const uint64_t masked = reinterpret_cast<uint64_t>(address) ^ tensor_map_mask;
  std::memcpy(reinterpret_cast<char*>(map), &tensor_map_magic, 4);
  std::memcpy(reinterpret_cast<char*>(map) + 4, &masked, 8);
}

// The address of the emulator's tensor map at `bytes`; 0 if none is there.
CUdeviceptr tensor_map_address(const char* bytes) {
  uint32_t magic;
  std::memcpy(&magic, bytes, 4);
  if (magic != tensor_map_magic) return 0;
  uint64_t masked;
  std::memcpy(&masked, bytes + 4, 8);
  return masked ^ tensor_map_mask;
}

// Whether a kernel reading `word` would fault: inside a VMM reservation, with
// nothing mapped there with access.
bool faults(CUdeviceptr word) {
  const auto& reservations = state().reservations;
  auto r = reservations.upper_bound(word);
  return r != reservations.begin() && word < std::prev(r)->first + std::prev(r)->second && !accessible(word, 1, false);
}

struct Function {
  std::string name;
  std::vector<std::pair<std::size_t, std::size_t>> params;  // offset, size
};

struct Module {
  std::vector<Function*> functions;
};

std::set<Module*> modules;      // under the state mutex
std::set<Function*> functions;  // of live modules

// The size and alignment of one `.param` declaration; false if not understood.
bool param_shape(const std::string& decl, std::size_t* size, std::size_t* align) {
  std::size_t element = 0;
  for (auto [type, bytes] : {std::pair{".u64", 8}, {".s64", 8}, {".b64", 8}, {".f64", 8}, {".u32", 4}, {".s32", 4},
                             {".b32", 4}, {".f32", 4}, {".u16", 2}, {".s16", 2}, {".b16", 2}, {".u8", 1},
                             {".s8", 1}, {".b8", 1}}) {
    if (decl.find(type) != std::string::npos) {
      element = std::size_t(bytes);
      break;
    }
  }
  if (!element) return false;
  std::size_t count = 1;
  if (auto bracket = decl.find('['); bracket != std::string::npos) count = std::stoul(decl.substr(bracket + 1));
  *align = element;
  if (auto at = decl.find(".align"); at != std::string::npos) *align = std::stoul(decl.substr(at + 6));
  *size = element * count;
  return *align && (*align & (*align - 1)) == 0;
}

// Every `.entry` of `ptx` with its parameter layout; false on a signature not understood.
bool parse(const std::string& ptx, std::vector<Function*>* out) {
  for (std::size_t at = ptx.find(".entry"); at != std::string::npos; at = ptx.find(".entry", at + 1)) {
    std::size_t open = ptx.find('(', at), close = ptx.find(')', at);
    if (open == std::string::npos || close == std::string::npos || close < open) return false;
    std::string name = ptx.substr(at + 6, open - at - 6);
    name.erase(0, name.find_first_not_of(" \t\n"));
    name.erase(name.find_last_not_of(" \t\n") + 1);
    auto* f = new Function{name, {}};
    out->push_back(f);
    std::size_t offset = 0;
    std::string list = ptx.substr(open + 1, close - open - 1);
    for (std::size_t p = list.find(".param"); p != std::string::npos; p = list.find(".param", p + 1)) {
      std::size_t size = 0, align = 0;
      if (!param_shape(list.substr(p, list.find(',', p) - p), &size, &align)) return false;
      offset = (offset + align - 1) / align * align;
      f->params.emplace_back(offset, size);
      offset += size;
    }
  }
  return !out->empty();
}

Function* find_function(CUfunction f) {
  auto* fn = reinterpret_cast<Function*>(f);
  return functions.count(fn) ? fn : nullptr;
}

CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                CUstream stream, void** params, void** extra, const char* caller) {
  if (CUresult r = context_check(caller)) return r;
  std::lock_guard lock(state().mutex);
  Function* fn = find_function(f);
  if (!fn) return CUDA_ERROR_INVALID_HANDLE;
  if (!valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (!gx || !gy || !gz || !bx || !by || !bz || uint64_t(bx) * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
  if (params && extra) return CUDA_ERROR_INVALID_VALUE;
  if (!fn->params.empty() && !params && !extra) return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; params && i < fn->params.size(); ++i) {
    CUdeviceptr word = 0;
    if (fn->params[i].second == sizeof word) std::memcpy(&word, params[i], sizeof word);
    if (fn->params[i].second == sizeof(CUtensorMap)) word = tensor_map_address(static_cast<const char*>(params[i]));
    if (word && faults(word)) state().fault = CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  state().gpu_time += std::chrono::microseconds(uint64_t(gx) * gy * gz);
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace emu

using namespace emu;

EMU_API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (CUresult r = context_check()) return r;
  if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
  auto* m = new Module;
  if (!parse(static_cast<const char*>(image), &m->functions)) {
    for (Function* f : m->functions) delete f;
    delete m;
    return CUDA_ERROR_INVALID_PTX;
  }
  std::lock_guard lock(state().mutex);
  modules.insert(m);
  functions.insert(m->functions.begin(), m->functions.end());
  *module = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  if (CUresult r = context_check()) return r;
  if (!function || !name) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  auto* m = reinterpret_cast<Module*>(module);
  if (!modules.count(m)) return CUDA_ERROR_INVALID_HANDLE;
  for (Function* f : m->functions) {
    if (f->name == name) {
      *function = reinterpret_cast<CUfunction>(f);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}

EMU_API CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType, cuuint32_t rank, void* address,
                                        const cuuint64_t*, const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                        CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                        CUtensorMapFloatOOBfill) {
  if (CUresult r = init_check()) return r;
  if (!map || !address || rank == 0 || rank > 5 || reinterpret_cast<uint64_t>(address) % 16) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  encode_tensor_map(map, address);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuTensorMapReplaceAddress(CUtensorMap* map, void* address) {
  if (CUresult r = init_check()) return r;
  if (!map || !address || reinterpret_cast<uint64_t>(address) % 16) return CUDA_ERROR_INVALID_VALUE;
  encode_tensor_map(map, address);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuModuleUnload(CUmodule module) {
  if (CUresult r = context_check()) return r;
  std::lock_guard lock(state().mutex);
  auto* m = reinterpret_cast<Module*>(module);
  if (!modules.erase(m)) return CUDA_ERROR_INVALID_HANDLE;
  for (Function* f : m->functions) {
    functions.erase(f);
    delete f;
  }
  delete m;
  return CUDA_SUCCESS;
}

// Past the last parameter: CUDA_ERROR_INVALID_VALUE, as driver 580 answers.
EMU_API CUresult cuFuncGetParamInfo(CUfunction function, size_t index, size_t* offset, size_t* size) {
  if (CUresult r = init_check()) return r;
  std::lock_guard lock(state().mutex);
  Function* f = find_function(function);
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (index >= f->params.size()) return CUDA_ERROR_INVALID_VALUE;
  if (offset) *offset = f->params[index].first;
  if (size) *size = f->params[index].second;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, unsigned shared, CUstream stream, void** params, void** extra) {
  (void)shared;
  return launch(f, gx, gy, gz, bx, by, bz, stream, params, extra, __func__);
}

EMU_API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                           unsigned by, unsigned bz, unsigned shared, CUstream stream,
                                           void** params) {
  (void)shared;
  return launch(f, gx, gy, gz, bx, by, bz, stream, params, nullptr, __func__);
}

EMU_API CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (!config) return CUDA_ERROR_INVALID_VALUE;
  return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                config->blockDimZ, config->hStream, params, extra, __func__);
}

EMU_ALIAS(cuLaunchKernel_ptsz, cuLaunchKernel)
EMU_ALIAS(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel)
EMU_ALIAS(cuLaunchKernelEx_ptsz, cuLaunchKernelEx)
