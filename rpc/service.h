// The gmem.v1.Gmem service on gRPC's callback API: who calls (the connection's
// SO_PEERCRED), what they may see (Catalog), and the WatchStats streams, each
// paced by its own alarm so that thousands of watchers cost no thread each.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>

#include "rpc/catalog.h"
#include "rpc/gmem.grpc.pb.h"

namespace gmem::rpc {

struct ServiceOptions {
  uid_t daemon_uid = 0;       // a non-root gmemd serves only its own uid (and root)
  size_t max_watchers = 1024; // WatchStats streams open at once, from all callers
};

class Service final : public v1::Gmem::CallbackService {
 public:
  Service(Catalog& catalog, ServiceOptions options);

  grpc::ServerUnaryReactor* ListProcesses(grpc::CallbackServerContext* context, const v1::ListProcessesRequest* request,
                                          v1::ListProcessesResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context, const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;
  grpc::ServerUnaryReactor* GetPlacement(grpc::CallbackServerContext* context, const v1::GetPlacementRequest* request,
                                         v1::GetPlacementResponse* response) override;
  grpc::ServerWriteReactor<v1::GetStatsResponse>* WatchStats(grpc::CallbackServerContext* context,
                                                             const v1::WatchStatsRequest* request) override;
  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* context, const v1::HealthRequest* request,
                                   v1::HealthResponse* response) override;

  size_t watchers() const { return watchers_.load(); }

 private:
  class Watch;
  grpc::Status authorize(grpc::CallbackServerContext* context, Viewer* viewer) const;
  grpc::Status fill_stats(const Viewer& viewer, pid_t pid, v1::GetStatsResponse* response);
  template <typename Handler>
  grpc::ServerUnaryReactor* unary(grpc::CallbackServerContext* context, Handler handler);

  Catalog& catalog_;
  ServiceOptions options_;
  std::atomic<size_t> watchers_{0};
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

// The uid at the other end of a connection that gmemd accepted itself and
// handed to gRPC (gRPC names such a peer "fd:N"); nothing for any other peer.
std::optional<uid_t> peer_uid(const std::string& peer);

}  // namespace gmem::rpc
