// Streams and events of the emulator. Work runs when it is enqueued, so every
// stream is idle, stream order holds trivially, and an event completes when it
// is recorded, unless GMEM_EMU_HOLD_EVENTS=1 holds it until a synchronization
// (and GMEM_EMU_LATE_COPIES=1 holds copies on created streams: tests/emu/copy.cpp).
// Handles are checked, as the driver checks them.
#include <chrono>
#include <thread>

#include "emu.h"

namespace emu {

bool valid_stream(CUstream stream) {
  return !stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD ||
         state().streams.count(reinterpret_cast<Stream*>(stream));
}

void complete_events(CUstream stream) {
  run_late(stream);
  for (Event* e : state().events) {
    if (stream == all_streams || e->stream == (stream ? stream : CU_STREAM_LEGACY)) e->stream = nullptr;
  }
}

void wait_for_queue() {
  if (state().sync_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(state().sync_ms));
}

bool capturable(CUstream stream) {
  return stream && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD &&
         state().streams.count(reinterpret_cast<Stream*>(stream));
}

namespace {

Event* find_event(CUevent event) {
  auto* e = reinterpret_cast<Event*>(event);
  return state().events.count(e) ? e : nullptr;
}

// The checks of a call on an existing stream, under the state mutex.
CUresult stream_check(CUstream stream, const char* caller) {
  if (CUresult r = context_check(caller)) return r;
  return valid_stream(stream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

}  // namespace
}  // namespace emu

using namespace emu;

EMU_API CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  if (CUresult r = context_check()) return r;
  if (!stream || (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  // Priorities outside the device's range are clamped, as documented.
  auto* s = new Stream{current_context(), flags, priority < -5 ? -5 : priority > 0 ? 0 : priority};
  std::lock_guard lock(state().mutex);
  state().streams.insert(s);
  *stream = reinterpret_cast<CUstream>(s);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  return cuStreamCreateWithPriority(stream, flags, 0);
}

EMU_API CUresult cuStreamDestroy_v2(CUstream stream) {
  if (CUresult r = context_check()) return r;
  std::lock_guard lock(state().mutex);
  if (!stream || !state().streams.count(reinterpret_cast<Stream*>(stream))) return CUDA_ERROR_INVALID_HANDLE;
  run_late(stream);
  state().streams.erase(reinterpret_cast<Stream*>(stream));
  delete reinterpret_cast<Stream*>(stream);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuStreamSynchronize(CUstream stream) {
  wait_for_queue();
  std::lock_guard lock(state().mutex);
  if (CUresult r = stream_check(stream, __func__)) return r;
  complete_events(stream);
  trim_pools();
  return state().fault;
}

EMU_API CUresult cuStreamQuery(CUstream stream) {
  std::lock_guard lock(state().mutex);
  if (CUresult r = stream_check(stream, __func__)) return r;
  run_late(stream);
  // As the driver: no stream may be queried while a capture in the global
  // mode runs (nor the capturing one in any mode), and the capture is lost.
  CUresult status = CUDA_SUCCESS;
  for (Stream* s : state().streams) {
    if (s->capture && (s->global || s == reinterpret_cast<Stream*>(stream))) {
      s->invalidated = true;
      status = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  }
  return status;
}

EMU_API CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  std::lock_guard lock(state().mutex);
  if (CUresult r = stream_check(stream, __func__)) return r;
  Event* e = find_event(event);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  run_late(e->on);
  return flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

// A capture records nothing but its graph (tests/emu/graph.cpp).
EMU_API CUresult cuStreamGetCaptureInfo_v3(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id,
                                           CUgraph* graph, const CUgraphNode** deps, const CUgraphEdgeData** edges,
                                           size_t* count) {
  std::lock_guard lock(state().mutex);
  if (CUresult r = stream_check(stream, __func__)) return r;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  const Stream* s = capturable(stream) ? reinterpret_cast<Stream*>(stream) : nullptr;
  *status = s && s->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  if (id) *id = s ? s->capture : 0;
  if (graph) *graph = s ? s->graph : nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (count) *count = 0;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuStreamGetCaptureInfo_v2(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id,
                                           CUgraph* graph, const CUgraphNode** deps, size_t* count) {
  return cuStreamGetCaptureInfo_v3(stream, status, id, graph, deps, nullptr, count);
}

// cuda.h names the newest ABI cuStreamGetCaptureInfo; this is the CUDA 10.1 one.
#undef cuStreamGetCaptureInfo
EMU_API CUresult cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id) {
  return cuStreamGetCaptureInfo_v3(stream, status, id, nullptr, nullptr, nullptr, nullptr);
}

EMU_ALIAS(cuStreamSynchronize_ptsz, cuStreamSynchronize)
EMU_ALIAS(cuStreamQuery_ptsz, cuStreamQuery)
EMU_ALIAS(cuStreamWaitEvent_ptsz, cuStreamWaitEvent)
EMU_ALIAS(cuStreamGetCaptureInfo_ptsz, cuStreamGetCaptureInfo)
EMU_ALIAS(cuStreamGetCaptureInfo_v2_ptsz, cuStreamGetCaptureInfo_v2)
EMU_ALIAS(cuStreamGetCaptureInfo_v3_ptsz, cuStreamGetCaptureInfo_v3)

EMU_API CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  if (CUresult r = context_check()) return r;
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (!event || (flags & ~known)) return CUDA_ERROR_INVALID_VALUE;
  // An interprocess event must not time (cuda.h).
  if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)) return CUDA_ERROR_INVALID_VALUE;
  auto* e = new Event{flags};
  std::lock_guard lock(state().mutex);
  state().events.insert(e);
  *event = reinterpret_cast<CUevent>(e);
  return CUDA_SUCCESS;
}

EMU_API CUresult cuEventDestroy_v2(CUevent event) {
  if (CUresult r = context_check()) return r;
  std::lock_guard lock(state().mutex);
  Event* e = find_event(event);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  state().events.erase(e);
  delete e;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int) {
  std::lock_guard lock(state().mutex);
  if (CUresult r = stream_check(stream, __func__)) return r;
  Event* e = find_event(event);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  e->recorded = true;
  e->when = std::chrono::steady_clock::time_point(state().gpu_time);
  e->stream = state().hold_events ? (stream ? stream : CU_STREAM_LEGACY) : nullptr;
  e->order = ++state().events_recorded;
  e->on = stream;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuEventRecord(CUevent event, CUstream stream) { return cuEventRecordWithFlags(event, stream, 0); }

// An event never recorded counts as complete (cuda.h).
EMU_API CUresult cuEventQuery(CUevent event) {
  if (CUresult r = context_check()) return r;
  std::lock_guard lock(state().mutex);
  Event* e = find_event(event);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  run_late(e->on);
  return e->stream ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

EMU_API CUresult cuEventSynchronize(CUevent event) {
  if (CUresult r = context_check()) return r;
  std::lock_guard lock(state().mutex);
  Event* e = find_event(event);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  // Stream order: what was recorded before it on its stream has completed too.
  for (Event* other : state().events) {
    if (other != e && e->stream && other->stream == e->stream && other->order < e->order) other->stream = nullptr;
  }
  e->stream = nullptr;
  run_late(e->on);
  trim_pools();
  return state().fault;
}

EMU_API CUresult cuEventElapsedTime_v2(float* milliseconds, CUevent start, CUevent end) {
  if (CUresult r = context_check()) return r;
  if (!milliseconds) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  Event* a = find_event(start);
  Event* b = find_event(end);
  // Unknown, untimed or never recorded: CUDA_ERROR_INVALID_HANDLE (cuda.h).
  if (!a || !b || !a->recorded || !b->recorded || ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *milliseconds = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return CUDA_SUCCESS;
}

#undef cuEventElapsedTime  // cuda.h's name for _v2; the 2.0 ABI is the same
EMU_ALIAS(cuEventElapsedTime, cuEventElapsedTime_v2)
EMU_ALIAS(cuEventRecord_ptsz, cuEventRecord)
EMU_ALIAS(cuEventRecordWithFlags_ptsz, cuEventRecordWithFlags)
