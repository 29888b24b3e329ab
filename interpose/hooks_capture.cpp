// Stream capture, watched so the pool knows when a graph is being captured:
// allocations on a capturing stream then go to the driver, into the graph.
// Every entry point that begins or ends a capture is here. Each passes the
// submission gate (interpose/gate.h) with the pool's count of captures, so
// that the mover, with the gate closed, knows whether a capture runs.
// Where launches are tracked (pool/access.h), what a capture's launches
// referenced goes with its graph to the executable graphs instantiated from
// it (interpose/graph_access.h); their launches are in hooks_launch.cpp.
#include "interpose/driver_table.h"
#include "interpose/gate.h"
#include "interpose/graph_access.h"
#include "interpose/runtime.h"

using gmem::active_pool;

extern "C" {
// Declared by cuda.h only for the driver's own build (or, for the CUDA 10.0
// cuStreamBeginCapture, not at all).
CUresult cuStreamBeginCapture_ptsz(CUstream stream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph, const CUgraphNode* dependencies,
                                          const CUgraphEdgeData* edges, size_t count, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS* params);
}

namespace {

using BeginCaptureV1 = CUresult (*)(CUstream);

CUresult began(CUresult status) {
  if (auto* pool = active_pool(); pool && status == CUDA_SUCCESS) pool->capture_began();
  return status;
}

// A capture ends with the call whatever it returns, unless there was none.
// `capture`: its id, where launches are tracked (else 0).
CUresult ended(CUresult status, uint64_t capture, CUgraph* graph) {
  if (auto* pool = active_pool(); pool && status != CUDA_ERROR_ILLEGAL_STATE) pool->capture_ended();
  if (capture) gmem::graph_access::capture_ended(capture, status == CUDA_SUCCESS && graph ? *graph : nullptr);
  return status;
}

bool tracking() {
  auto* pool = active_pool();
  return pool && pool->access();
}

uint64_t ending(CUstream stream, bool per_thread) {
  return tracking() ? gmem::graph_access::capture_of(stream, per_thread) : 0;
}

CUresult instantiated(CUresult status, CUgraph graph, CUgraphExec* exec) {
  if (status == CUDA_SUCCESS && exec && tracking()) gmem::graph_access::instantiated(graph, *exec);
  return status;
}

}  // namespace

#undef cuStreamBeginCapture
GMEM_EXPORT CUresult cuStreamBeginCapture(CUstream stream) {
  gmem::gate::Pass pass;
  return began(reinterpret_cast<BeginCaptureV1>(gmem_real_table[gmem::fn_cuStreamBeginCapture])(stream));
}

GMEM_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream) {
  gmem::gate::Pass pass;
  return began(reinterpret_cast<BeginCaptureV1>(gmem_real_table[gmem::fn_cuStreamBeginCapture_ptsz])(stream));
}

GMEM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  gmem::gate::Pass pass;
  return began(GMEM_REAL(cuStreamBeginCapture_v2)(stream, mode));
}

GMEM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  gmem::gate::Pass pass;
  return began(GMEM_REAL_AS(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture_v2)(stream, mode));
}

GMEM_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph, const CUgraphNode* dependencies,
                                                 const CUgraphEdgeData* edges, size_t count,
                                                 CUstreamCaptureMode mode) {
  gmem::gate::Pass pass;
  return began(GMEM_REAL(cuStreamBeginCaptureToGraph)(stream, graph, dependencies, edges, count, mode));
}

GMEM_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph, const CUgraphNode* dependencies,
                                                      const CUgraphEdgeData* edges, size_t count,
                                                      CUstreamCaptureMode mode) {
  gmem::gate::Pass pass;
  return began(GMEM_REAL_AS(cuStreamBeginCaptureToGraph_ptsz, cuStreamBeginCaptureToGraph)(stream, graph, dependencies,
                                                                                          edges, count, mode));
}

GMEM_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  gmem::gate::Pass pass;
  const uint64_t capture = ending(stream, false);
  return ended(GMEM_REAL(cuStreamEndCapture)(stream, graph), capture, graph);
}

GMEM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  gmem::gate::Pass pass;
  const uint64_t capture = ending(stream, true);
  return ended(GMEM_REAL_AS(cuStreamEndCapture_ptsz, cuStreamEndCapture)(stream, graph), capture, graph);
}

// The CUDA 10.0 and 11.0 ABIs (cuda.h names cuGraphInstantiate the newest).
#undef cuGraphInstantiate
using InstantiateV1 = CUresult (*)(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t);

GMEM_EXPORT CUresult cuGraphInstantiate(CUgraphExec* exec, CUgraph graph, CUgraphNode* error_node, char* log,
                                        size_t log_size) {
  auto real = reinterpret_cast<InstantiateV1>(gmem_real_table[gmem::fn_cuGraphInstantiate]);
  return instantiated(real(exec, graph, error_node, log, log_size), graph, exec);
}

GMEM_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph graph, CUgraphNode* error_node, char* log,
                                           size_t log_size) {
  auto real = reinterpret_cast<InstantiateV1>(gmem_real_table[gmem::fn_cuGraphInstantiate_v2]);
  return instantiated(real(exec, graph, error_node, log, log_size), graph, exec);
}

GMEM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  return instantiated(GMEM_REAL(cuGraphInstantiateWithFlags)(exec, graph, flags), graph, exec);
}

GMEM_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return instantiated(GMEM_REAL(cuGraphInstantiateWithParams)(exec, graph, params), graph, exec);
}

GMEM_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph,
                                                       CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return instantiated(
      GMEM_REAL_AS(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams)(exec, graph, params), graph,
      exec);
}

GMEM_EXPORT CUresult cuGraphDestroy(CUgraph graph) {
  CUresult status = GMEM_REAL(cuGraphDestroy)(graph);
  if (status == CUDA_SUCCESS && tracking()) gmem::graph_access::destroyed(graph);
  return status;
}

GMEM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
  CUresult status = GMEM_REAL(cuGraphExecDestroy)(exec);
  if (status == CUDA_SUCCESS && tracking()) gmem::graph_access::destroyed(exec);
  return status;
}
