// Request handling: authorisation, argument checks (every bad argument is a
// gRPC error, never a crash or a silent default), and the paced watch streams.
#include "rpc/service.h"

#include <grpcpp/alarm.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "rpc/convert.h"

namespace gmem::rpc {
namespace {

constexpr int64_t min_interval_ms = 10, max_interval_ms = 3'600'000, default_interval_ms = 1000;

grpc::Status status_of(const ProcessInfo& info) {
  switch (info.state) {
    case FileState::ok: return grpc::Status::OK;
    case FileState::unknown_version: return {grpc::StatusCode::FAILED_PRECONDITION, info.problem};
    case FileState::invalid:
      return {grpc::StatusCode::DATA_LOSS, "stats of pid " + std::to_string(info.pid) + " unreadable: " + info.problem};
    case FileState::starting:
      return {grpc::StatusCode::UNAVAILABLE, "pid " + std::to_string(info.pid) + " is still creating its stats"};
  }
  return {grpc::StatusCode::INTERNAL, "unknown state"};
}

grpc::Status not_found(pid_t pid, const Viewer& viewer) {
  return {grpc::StatusCode::NOT_FOUND,
          "no process " + std::to_string(pid) + " under gmem visible to uid " + std::to_string(viewer.uid)};
}

grpc::Status check_pid(int32_t pid, bool required) {
  if (pid < 0 || (required && pid == 0)) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "pid must be " + std::string(required ? "> 0" : ">= 0") + ", got " +
                                                    std::to_string(pid)};
  }
  return grpc::Status::OK;
}

}  // namespace

std::optional<uid_t> peer_uid(const std::string& peer) {
  if (peer.rfind("fd:", 0) != 0) return std::nullopt;
  char* end = nullptr;
  long fd = std::strtol(peer.c_str() + 3, &end, 10);
  if (*end != '\0' || fd < 0) return std::nullopt;
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return std::nullopt;
  return cred.uid;
}

Service::Service(Catalog& catalog, ServiceOptions options) : catalog_(catalog), options_(options) {}

grpc::Status Service::authorize(grpc::CallbackServerContext* context, Viewer* viewer) const {
  std::string peer = context->peer();
  if (auto uid = peer_uid(peer)) {
    if (options_.daemon_uid != 0 && *uid != 0 && *uid != options_.daemon_uid) {
      return {grpc::StatusCode::PERMISSION_DENIED,
              "this gmemd runs as uid " + std::to_string(options_.daemon_uid) + " and serves only that user; " +
                  "start your own with `gmemctl daemon`"};
    }
    viewer->uid = *uid;
    return grpc::Status::OK;
  }
  // TCP (--listen): no credentials to check; the caller sees what gmemd's own uid sees.
  if (peer.rfind("ipv4:", 0) == 0 || peer.rfind("ipv6:", 0) == 0) {
    viewer->uid = options_.daemon_uid;
    return grpc::Status::OK;
  }
  return {grpc::StatusCode::PERMISSION_DENIED, "cannot tell who is calling (" + peer + ")"};
}

template <typename Handler>
grpc::ServerUnaryReactor* Service::unary(grpc::CallbackServerContext* context, Handler handler) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Viewer viewer;
  grpc::Status status = authorize(context, &viewer);
  if (status.ok()) {
    try {
      status = handler(viewer);
    } catch (const std::exception& e) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, e.what());
    }
  }
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* Service::ListProcesses(grpc::CallbackServerContext* context, const v1::ListProcessesRequest*,
                                                 v1::ListProcessesResponse* response) {
  return unary(context, [&](const Viewer& viewer) {
    for (const ProcessInfo& info : catalog_.processes(viewer)) to_proto(info, response->add_processes());
    return grpc::Status::OK;
  });
}

grpc::Status Service::fill_stats(const Viewer& viewer, pid_t pid, v1::GetStatsResponse* response) {
  if (grpc::Status bad = check_pid(pid, false); !bad.ok()) return bad;
  response->set_sampled_unix_ns(unix_now_ns());
  std::vector<ProcessSnapshot> snapshots = catalog_.stats(viewer, pid);
  if (pid != 0 && snapshots.empty()) return not_found(pid, viewer);
  for (const ProcessSnapshot& snap : snapshots) {
    if (pid != 0) {
      if (grpc::Status bad = status_of(snap.info); !bad.ok()) return bad;
    } else if (snap.info.state != FileState::ok) {
      continue;  // changed while read; it shows in ListProcesses
    }
    to_proto(snap, response->add_processes());
  }
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* Service::GetStats(grpc::CallbackServerContext* context, const v1::GetStatsRequest* request,
                                            v1::GetStatsResponse* response) {
  return unary(context, [&](const Viewer& viewer) { return fill_stats(viewer, request->pid(), response); });
}

grpc::ServerUnaryReactor* Service::GetPlacement(grpc::CallbackServerContext* context,
                                                const v1::GetPlacementRequest* request,
                                                v1::GetPlacementResponse* response) {
  return unary(context, [&](const Viewer& viewer) {
    if (grpc::Status bad = check_pid(request->pid(), true); !bad.ok()) return bad;
    int device = -1;
    if (request->has_device()) {
      device = request->device();
      if (device < 0 || device >= GMEM_STATS_MAX_DEVICES) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "device must be 0 to " + std::to_string(GMEM_STATS_MAX_DEVICES - 1));
      }
    }
    auto snapshot = catalog_.placement(viewer, request->pid(), device);
    if (!snapshot) return not_found(request->pid(), viewer);
    if (grpc::Status bad = status_of(snapshot->info); !bad.ok()) return bad;
    to_proto(*snapshot, response);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* Service::Health(grpc::CallbackServerContext* context, const v1::HealthRequest*,
                                          v1::HealthResponse* response) {
  return unary(context, [&](const Viewer& viewer) {
    response->set_status(v1::HealthResponse::STATUS_SERVING);
    response->set_version(GMEM_VERSION);
    response->set_stats_version(GMEM_STATS_VERSION);
    response->set_stats_dir(catalog_.dir());
    response->set_processes(static_cast<uint32_t>(catalog_.processes(viewer).size()));
    response->set_uptime_seconds(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_).count()));
    response->set_watchers(static_cast<uint32_t>(watchers_.load()));
    response->set_caller_uid(viewer.uid);
    response->set_pid(getpid());
    return grpc::Status::OK;
  });
}

// One WatchStats stream: write, wait for the write, arm the alarm, repeat. Only
// OnCancel runs beside that chain; it raises a flag and cancels a pending alarm.
class Service::Watch final : public grpc::ServerWriteReactor<v1::GetStatsResponse> {
 public:
  Watch(Service& service, grpc::CallbackServerContext* context, const v1::WatchStatsRequest& request)
      : service_(service), pid_(request.pid()) {
    grpc::Status status = service.authorize(context, &viewer_);
    int64_t interval = request.interval_ms() == 0 ? default_interval_ms : request.interval_ms();
    if (status.ok() && (interval < min_interval_ms || interval > max_interval_ms)) {
      status = {grpc::StatusCode::INVALID_ARGUMENT, "interval_ms must be " + std::to_string(min_interval_ms) + " to " +
                                                        std::to_string(max_interval_ms) + ", got " +
                                                        std::to_string(request.interval_ms())};
    }
    if (status.ok()) status = check_pid(pid_, false);
    if (status.ok()) {
      if (service.watchers_.fetch_add(1) >= service.options_.max_watchers) {
        service.watchers_.fetch_sub(1);
        status = {grpc::StatusCode::RESOURCE_EXHAUSTED,
                  "gmemd serves at most " + std::to_string(service.options_.max_watchers) + " watchers at once"};
      } else {
        counted_ = true;
      }
    }
    if (!status.ok()) {
      Finish(status);
      return;
    }
    interval_ = std::chrono::milliseconds(interval);
    next_ = std::chrono::system_clock::now();
    Tick();
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock lock(mutex_);
    if (!ok || cancelled_) {
      lock.unlock();
      Finish(grpc::Status::CANCELLED);
      return;
    }
    // Paced from the schedule, not from when the write finished: no drift.
    next_ += interval_;
    auto now = std::chrono::system_clock::now();
    if (next_ < now) next_ = now;
    armed_ = true;
    alarm_.Set(next_, [this](bool fired) { OnAlarm(fired); });
  }

  void OnCancel() override {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    if (armed_) alarm_.Cancel();
  }

  void OnDone() override {
    if (counted_) service_.watchers_.fetch_sub(1);
    delete this;
  }

 private:
  void OnAlarm(bool fired) {
    bool stop;
    {
      std::lock_guard lock(mutex_);
      armed_ = false;
      stop = !fired || cancelled_;
    }
    if (stop) {
      Finish(grpc::Status::CANCELLED);
    } else {
      Tick();
    }
  }

  void Tick() {
    response_.Clear();
    grpc::Status status;
    try {
      status = service_.fill_stats(viewer_, pid_, &response_);
    } catch (const std::exception& e) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, e.what());
    }
    if (status.ok()) {
      StartWrite(&response_);
    } else {
      Finish(status);
    }
  }

  Service& service_;
  Viewer viewer_;
  pid_t pid_;
  bool counted_ = false;
  std::chrono::milliseconds interval_{default_interval_ms};
  std::chrono::system_clock::time_point next_;
  v1::GetStatsResponse response_;
  std::mutex mutex_;
  bool cancelled_ = false, armed_ = false;
  grpc::Alarm alarm_;
};

grpc::ServerWriteReactor<v1::GetStatsResponse>* Service::WatchStats(grpc::CallbackServerContext* context,
                                                                    const v1::WatchStatsRequest* request) {
  return new Watch(*this, context, *request);
}

}  // namespace gmem::rpc
