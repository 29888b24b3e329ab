// Contexts of the emulator: each thread's context stack, primary contexts
// (retained, released, reset) and created ones. A context that goes frees its
// allocations, so freeing one of them later gets the driver's error.
#include <algorithm>

#include "emu.h"

namespace emu {

std::vector<Context*>& context_stack() {
  thread_local std::vector<Context*> stack;
  return stack;
}

Context* current_context() {
  auto& stack = context_stack();
  return stack.empty() ? nullptr : stack.back();
}

void drop_context(Context* context) {
  State& s = state();
  for (auto it = s.allocations.begin(); it != s.allocations.end();) {
    auto next = std::next(it);
    if (it->second.context == context) drop_allocation(it);
    it = next;
  }
  context->alive = false;  // never deleted: a stale handle stays recognisable
}

namespace {

Device& device_of(CUdevice device) { return state().devices[static_cast<std::size_t>(device)]; }

// A handle the driver made and that is still usable.
bool known_context(Context* c) {
  State& s = state();
  if (s.contexts.count(c)) return true;
  return std::any_of(s.devices.begin(), s.devices.end(), [c](const Device& d) { return &d.primary == c; });
}

}  // namespace
}  // namespace emu

using namespace emu;

EMU_API CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  if (!context) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  Device& d = device_of(device);
  d.primary.alive = true;
  ++d.primary_references;
  *context = reinterpret_cast<CUcontext>(&d.primary);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  std::lock_guard lock(state().mutex);
  Device& d = device_of(device);
  if (d.primary_references == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--d.primary_references == 0) drop_context(&d.primary);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
  if (CUresult r = device_check(device)) return r;
  std::lock_guard lock(state().mutex);
  Device& d = device_of(device);
  if (d.primary.alive) drop_context(&d.primary);
  d.primary_references = 0;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags, int* active) {
  if (CUresult r = device_check(device)) return r;
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  const Device& d = device_of(device);
  *flags = d.primary_flags;
  *active = d.primary.alive && d.primary_references > 0;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice device, unsigned int flags) {
  if (CUresult r = device_check(device)) return r;
  if (flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  device_of(device).primary_flags = flags;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxCreate_v2(CUcontext* context, unsigned int flags, CUdevice device) {
  if (CUresult r = init_check()) return r;
  if (!context || (flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK))) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = device_check(device)) return r;
  auto* c = new Context{device, true, false};
  {
    std::lock_guard lock(state().mutex);
    state().contexts.insert(c);
  }
  context_stack().push_back(c);
  *context = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxCreate_v4(CUcontext* context, CUctxCreateParams* params, unsigned int flags, CUdevice device) {
  // Execution affinity and CIG parameters have no meaning here.
  if (params && (params->execAffinityParams || params->cigParams)) return CUDA_ERROR_NOT_SUPPORTED;
  return cuCtxCreate_v2(context, flags, device);
}

EMU_API CUresult cuCtxDestroy_v2(CUcontext context) {
  if (CUresult r = init_check()) return r;
  auto* c = reinterpret_cast<Context*>(context);
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  if (c->primary || !known_context(c) || !c->alive) return CUDA_ERROR_INVALID_CONTEXT;
  drop_context(c);
  auto& stack = context_stack();  // popped from the caller's stack, as documented
  stack.erase(std::remove(stack.begin(), stack.end(), c), stack.end());
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxSetCurrent(CUcontext context) {
  if (CUresult r = init_check()) return r;
  auto* c = reinterpret_cast<Context*>(context);
  auto& stack = context_stack();
  if (!c) {
    if (!stack.empty()) stack.pop_back();
    return CUDA_SUCCESS;
  }
  {
    std::lock_guard lock(state().mutex);
    if (!known_context(c)) return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (stack.empty()) {
    stack.push_back(c);
  } else {
    stack.back() = c;
  }
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxGetCurrent(CUcontext* context) {
  if (CUresult r = init_check()) return r;
  if (!context) return CUDA_ERROR_INVALID_VALUE;
  *context = reinterpret_cast<CUcontext>(current_context());
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxPushCurrent_v2(CUcontext context) {
  if (CUresult r = init_check()) return r;
  auto* c = reinterpret_cast<Context*>(context);
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard lock(state().mutex);
    if (!known_context(c)) return CUDA_ERROR_INVALID_CONTEXT;
  }
  context_stack().push_back(c);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxPopCurrent_v2(CUcontext* context) {
  if (CUresult r = init_check()) return r;
  auto& stack = context_stack();
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (context) *context = reinterpret_cast<CUcontext>(stack.back());
  stack.pop_back();
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxGetDevice(CUdevice* device) {
  if (CUresult r = context_check()) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  *device = current_context()->device;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  if (CUresult r = context_check()) return r;
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxSynchronize() {
  if (CUresult r = context_check()) return r;
  wait_for_queue();
  std::lock_guard lock(state().mutex);
  complete_events(all_streams);
  trim_pools();
  return state().fault;
}
