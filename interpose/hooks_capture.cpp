// Stream capture, watched so the pool knows when a graph is being captured:
// allocations on a capturing stream then go to the driver, into the graph.
// Every entry point that begins or ends a capture is here. Each passes the
// submission gate (interpose/gate.h) with the pool's count of captures, so
// that the mover, with the gate closed, knows whether a capture runs.
#include "interpose/driver_table.h"
#include "interpose/gate.h"
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
}

namespace {

using BeginCaptureV1 = CUresult (*)(CUstream);

CUresult began(CUresult status) {
  if (auto* pool = active_pool(); pool && status == CUDA_SUCCESS) pool->capture_began();
  return status;
}

// A capture ends with the call whatever it returns, unless there was none.
CUresult ended(CUresult status) {
  if (auto* pool = active_pool(); pool && status != CUDA_ERROR_ILLEGAL_STATE) pool->capture_ended();
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
  return ended(GMEM_REAL(cuStreamEndCapture)(stream, graph));
}

GMEM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  gmem::gate::Pass pass;
  return ended(GMEM_REAL_AS(cuStreamEndCapture_ptsz, cuStreamEndCapture)(stream, graph));
}
