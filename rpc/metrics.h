// --metrics: the same figures as GetStats in Prometheus text format, served
// over plain HTTP by a deliberately tiny server (one connection at a time,
// GET /metrics only) so that gmemd needs no web framework.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "rpc/accept_loop.h"
#include "rpc/catalog.h"

namespace gmem::rpc {

// Prometheus exposition text (format 0.0.4) for what `viewer` sees.
std::string prometheus_text(Catalog& catalog, const Viewer& viewer);
// The same for gmemd's host pool (--host-pool): bytes pinned and lent, and
// the jobs holding some.
std::string host_pool_text(std::size_t pinned, std::size_t lent, std::size_t borrowers);

class MetricsServer {
 public:
  // `address` is HOST:PORT (PORT 0 picks a free one; see port()).
  static std::unique_ptr<MetricsServer> bind(const std::string& address, std::string* problem);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  void start(std::function<std::string()> render);
  void stop();

 private:
  MetricsServer() = default;
  void answer(int client);

  int port_ = 0;
  std::function<std::string()> render_;
  AcceptLoop loop_;
};

// Splits HOST:PORT ([v6]:PORT too); false if it does not parse.
bool split_host_port(const std::string& address, std::string* host, std::string* port);

}  // namespace gmem::rpc
