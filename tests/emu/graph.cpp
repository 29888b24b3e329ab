// Stream capture and graphs of the emulator: a created stream captures into a
// graph that records nothing (work still runs at once when launched); graphs
// instantiate into executable graphs that launch as nothing. Handles and
// states are checked as the driver checks them.
#include "emu.h"

namespace emu {
namespace {

struct Graph {};
struct Exec {};

std::set<Graph*> graphs;  // under the state mutex
std::set<Exec*> execs;
cuuint64_t captures_begun = 0;

CUresult begin(CUstream stream, CUgraph into, CUstreamCaptureMode mode, const char* caller) {
  if (CUresult r = context_check(caller)) return r;
  std::lock_guard lock(state().mutex);
  if (!valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (!capturable(stream)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  auto* s = reinterpret_cast<Stream*>(stream);
  if (s->capture) return CUDA_ERROR_ILLEGAL_STATE;
  if (into && !graphs.count(reinterpret_cast<Graph*>(into))) return CUDA_ERROR_INVALID_VALUE;
  Graph* g = into ? reinterpret_cast<Graph*>(into) : *graphs.insert(new Graph).first;
  s->capture = ++captures_begun;
  s->graph = reinterpret_cast<CUgraph>(g);
  s->global = mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
  return CUDA_SUCCESS;
}

CUresult instantiate(CUgraphExec* exec, CUgraph graph, const char* caller) {
  if (CUresult r = context_check(caller)) return r;
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  if (!graphs.count(reinterpret_cast<Graph*>(graph))) return CUDA_ERROR_INVALID_VALUE;
  *exec = reinterpret_cast<CUgraphExec>(*execs.insert(new Exec).first);
  return CUDA_SUCCESS;
}

template <typename T, typename Handle>
CUresult destroy(std::set<T*>& live, Handle handle) {
  std::lock_guard lock(state().mutex);
  auto* object = reinterpret_cast<T*>(handle);
  if (!live.erase(object)) return CUDA_ERROR_INVALID_VALUE;
  delete object;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace emu

using namespace emu;

EMU_API CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  return begin(stream, nullptr, mode, __func__);
}

EMU_API CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph, const CUgraphNode* deps,
                                             const CUgraphEdgeData* edges, size_t count, CUstreamCaptureMode mode) {
  (void)deps, (void)edges, (void)count;
  return begin(stream, graph, mode, __func__);
}

EMU_API CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  if (CUresult r = context_check()) return r;
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  if (!valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
  auto* s = capturable(stream) ? reinterpret_cast<Stream*>(stream) : nullptr;
  if (!s || !s->capture) return CUDA_ERROR_ILLEGAL_STATE;
  const bool invalidated = s->invalidated;
  *graph = invalidated ? nullptr : s->graph;
  s->capture = 0;
  s->graph = nullptr;
  s->invalidated = false;
  return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

EMU_API CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  return cuStreamGetCaptureInfo_v3(stream, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}

EMU_API CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  (void)flags;
  return instantiate(exec, graph, __func__);
}

EMU_API CUresult cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  if (params) params->result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
  return instantiate(exec, graph, __func__);
}

EMU_API CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  if (CUresult r = context_check()) return r;
  std::lock_guard lock(state().mutex);
  if (!execs.count(reinterpret_cast<Exec*>(exec)) || !valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}

EMU_API CUresult cuGraphExecDestroy(CUgraphExec exec) { return destroy(execs, exec); }

EMU_API CUresult cuGraphDestroy(CUgraph graph) { return destroy(graphs, graph); }

EMU_ALIAS(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture_v2)
EMU_ALIAS(cuStreamBeginCaptureToGraph_ptsz, cuStreamBeginCaptureToGraph)
EMU_ALIAS(cuStreamEndCapture_ptsz, cuStreamEndCapture)
EMU_ALIAS(cuStreamIsCapturing_ptsz, cuStreamIsCapturing)
EMU_ALIAS(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams)
EMU_ALIAS(cuGraphLaunch_ptsz, cuGraphLaunch)
