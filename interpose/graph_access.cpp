// The references of captures, graphs and executable graphs, in maps under one
// lock: captures and instantiations are rare, a graph launch costs a lookup.
#include "interpose/graph_access.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "interpose/driver_table.h"

namespace gmem::graph_access {
namespace {

using Bases = std::vector<CUdeviceptr>;

struct Maps {
  std::mutex mutex;
  std::unordered_map<uint64_t, Bases> captures;
  std::unordered_map<CUgraph, Bases> graphs;
  std::unordered_map<CUgraphExec, Bases> execs;
};

Maps& maps() {
  static Maps* instance = new Maps;  // never destroyed: graph launches may run during exit
  return *instance;
}

void merge(Bases& into, const Bases& from) {
  for (CUdeviceptr b : from) {
    if (std::find(into.begin(), into.end(), b) == into.end()) into.push_back(b);
  }
}

}  // namespace

uint64_t capture_of(CUstream stream, bool per_thread) {
  using Query = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*);
  auto query = reinterpret_cast<Query>(
      gmem_real_table[per_thread ? fn_cuStreamGetCaptureInfo_ptsz : fn_cuStreamGetCaptureInfo]);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  if (query(stream, &status, &id) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_ACTIVE) return 0;
  return id;
}

void captured(uint64_t capture, const Bases& bases) {
  Maps& m = maps();
  std::lock_guard lock(m.mutex);
  merge(m.captures[capture], bases);
}

void capture_ended(uint64_t capture, CUgraph graph) {
  Maps& m = maps();
  std::lock_guard lock(m.mutex);
  auto it = m.captures.find(capture);
  if (it == m.captures.end()) return;
  if (graph) merge(m.graphs[graph], it->second);  // a capture into an existing graph adds to it
  m.captures.erase(it);
}

void instantiated(CUgraph graph, CUgraphExec exec) {
  Maps& m = maps();
  std::lock_guard lock(m.mutex);
  auto it = m.graphs.find(graph);
  if (it != m.graphs.end()) m.execs[exec] = it->second;
}

void launched(CUgraphExec exec, pool::AccessTable& table, pool::Pool& pool) {
  pool::LaunchReferences refs(table, nullptr, pool.trace());
  {
    Maps& m = maps();
    std::lock_guard lock(m.mutex);
    auto it = m.execs.find(exec);
    if (it == m.execs.end()) return;
    // Looked up again: what lies at each address now (a range may have moved or gone).
    for (CUdeviceptr base : it->second) refs.word(base);
  }
  refs.finish(pool.publisher());
}

void destroyed(CUgraph graph) {
  Maps& m = maps();
  std::lock_guard lock(m.mutex);
  m.graphs.erase(graph);
}

void destroyed(CUgraphExec exec) {
  Maps& m = maps();
  std::lock_guard lock(m.mutex);
  m.execs.erase(exec);
}

}  // namespace gmem::graph_access
