// Stream-ordered frees: fences, pending frees and when freed memory is
// reusable on which stream (pool/stream_order.h).
#include "pool/stream_order.h"

namespace gmem::pool {

Fence* StreamOrder::take_fence(CUcontext context) {
  auto& spare = spare_[context];
  if (!spare.empty()) {
    Fence* fence = spare.back();
    spare.pop_back();
    return fence;
  }
  CUevent event = nullptr;
  if (driver_.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return nullptr;
  return &fences_.emplace_back(Fence{event, context, 0});
}

CUresult StreamOrder::record(OrderedFree order, Pending* out) {
  CUcontext context = nullptr;
  driver_.cuCtxGetCurrent(&context);
  Pending pending{order.id, take_fence(context), false};
  if (!pending.fence) return CUDA_ERROR_OUT_OF_MEMORY;
  ++pending.fence->users;
  pending.fence->recorded = ++records_;
  CUresult status = driver_.cuEventRecord(pending.fence->event, order.stream);
  if (status != CUDA_SUCCESS) {
    settle(pending);
    return status;
  }
  *out = pending;
  return CUDA_SUCCESS;
}

void StreamOrder::share(Pending& to, const Pending& from) {
  settle(to);
  to = from;
  if (to.fence) ++to.fence->users;
}

void StreamOrder::settle(Pending& pending) {
  if (pending.fence && --pending.fence->users == 0) spare_[pending.fence->context].push_back(pending.fence);
  pending = Pending{};
}

void StreamOrder::settle_if_of(Pending& pending, CUcontext context) {
  if (pending.fence && pending.fence->context == context) settle(pending);
}

bool StreamOrder::ready(Pending& pending, StreamId stream) {
  if (pending.never) return false;
  if (!pending.fence) return true;
  // On the stream of the free, stream order already puts the new work after it.
  if (stream && pending.stream == stream) return true;
  if (quiet_) return false;
  ++figures_.queries;
  if (driver_.cuEventQuery(pending.fence->event) != CUDA_SUCCESS) return false;
  settle(pending);
  return true;
}

bool StreamOrder::reusable(Pending& pending, StreamId stream, bool wait) {
  if (ready(pending, stream)) return true;
  if (!wait || quiet_ || pending.never) return false;
  ++figures_.waits;
  CUresult status;
  {
    Timer timer(figures_.wait_ns);
    status = driver_.cuEventSynchronize(pending.fence->event);
  }
  if (status != CUDA_SUCCESS) return false;
  settle(pending);
  return true;
}

}  // namespace gmem::pool
