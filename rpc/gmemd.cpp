// gmemd: serves the stats that processes under gmem publish in shared memory,
// over gRPC on a unix socket (and optionally TCP and Prometheus HTTP), and
// sweeps the stats files of processes that died without removing them.
#include <dlfcn.h>
#include <grpcpp/server_builder.h>
#include <gmem/stats.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "dedup/broker.h"
#include "dedup/wire.h"
#include "interpose/real_driver.h"
#include "ipc/host_pool.h"
#include "rpc/catalog.h"
#include "rpc/host_pool_size.h"
#include "rpc/listener.h"
#include "rpc/metrics.h"
#include "rpc/paths.h"
#include "rpc/service.h"
#include "vmm/topology.h"

namespace {

constexpr int exit_usage = 2;

// The host pool needs the real driver, loaded only then: gmemd needs no GPU otherwise.
std::unique_ptr<gmem::ipc::host_pool::Server> start_host_pool(gmem::ipc::host_pool::Server::Settings settings,
                                                               std::string* problem) {
  static const gmem::RealDriver real = gmem::open_real_driver();
  if (!real.handle) {
    *problem = "--host-pool needs the CUDA driver (libcuda.so.1) and found none; set GMEM_REAL_LIBCUDA to it";
    return nullptr;
  }
  auto init = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(real.handle, "cuInit"));
  CUresult status = init ? init(0) : CUDA_ERROR_NOT_FOUND;
  if (status != CUDA_SUCCESS) {
    *problem = "--host-pool: cuInit failed (CUresult " + std::to_string(status) + ") in " + real.path;
    return nullptr;
  }
  static const gmem::vmm::Driver driver =
      gmem::vmm::Driver::from([](const char* name) { return dlsym(real.handle, name); });
  return gmem::ipc::host_pool::Server::start(driver, std::move(settings), problem);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gmem::rpc;
  CLI::App app{"gmemd: serves live gmem stats over gRPC (gmem.v1.Gmem) for gmemctl and other clients"};
  app.footer(
      "Examples:\n"
      "  gmemd                                  per-user daemon on $XDG_RUNTIME_DIR/gmem/gmemd.sock\n"
      "  gmemd --metrics 127.0.0.1:9464         also serve Prometheus text on /metrics\n"
      "  gmemd --socket /tmp/g.sock --stats-dir /tmp/stats\n"
      "  gmemd --dedup                          also broker dedup (GMEM_CONF dedup:1) on the default socket\n"
      "  gmemd --host-pool 96G                  pin 96 GiB of host memory now and lend it to jobs that spill\n"
      "Stops cleanly on SIGTERM or SIGINT.");
  std::string stats_dir = "/dev/shm", socket_path = default_socket_path(), listen_address, metrics_address;
  double sweep_seconds = 2.0;
  size_t max_watchers = 1024;
  app.add_option("--stats-dir", stats_dir, "directory of the gmem.<pid> stats files (GMEM_CONF stats_dir)")
      ->capture_default_str();
  app.add_option("--socket", socket_path, "unix socket to serve on")->capture_default_str();
  app.add_option("--listen", listen_address,
                 "also serve gRPC on HOST:PORT (off by default; no credentials there: callers see what gmemd's uid sees)");
  app.add_option("--metrics", metrics_address, "serve Prometheus text on http://HOST:PORT/metrics (off by default)");
  bool dedup = false;
  std::string dedup_socket;
  app.add_flag("--dedup", dedup, "also serve the dedup broker (docs/dedup.md) on " + gmem::dedup::wire::default_socket_path());
  app.add_option("--dedup-socket", dedup_socket, "serve the dedup broker on this unix socket (GMEM_CONF dedup_socket)");
  bool dedup_any_namespace = false;
  app.add_flag("--dedup-any-namespace", dedup_any_namespace,
               "let processes of one uid share memory across user and pid namespaces (containers); off: only within one");
  gmem::ipc::host_pool::Server::Settings pool;
  pool.socket = gmem::ipc::host_pool::default_socket_path();
  std::string host_pool_size;
  app.add_option("--host-pool", host_pool_size,
                 "pin this much host memory (96G, or a share of the memory available now: 70%) ahead of any job, in "
                 "units, and lend it to jobs under gmem that spill (GMEM_CONF host_pool:1, the default): their first "
                 "spilled step does not wait for pinning. No more than the memory available. Needs the CUDA driver. "
                 "Off by default")
      ->check(gmem::rpc::host_pool_size());
  app.add_option("--host-pool-unit", pool.unit, "the size of each unit lent; a job borrows units of its host_chunk, and chunks of --host-pool-small's sizes")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--host-pool-small", pool.small_share,
                 "share of the pool pinned in sets of chunks smaller than the unit (one of each power of two of the "
                 "host's granularity below it), lent for the tails of spilled tensors that whole units do not cover; "
                 "0: units only. Sizes jobs lack are then pinned in place of free chunks of sizes none lacked")
      ->check(CLI::Range(0.0, 0.5))
      ->capture_default_str();
  app.add_option("--host-pool-socket", pool.socket, "lend on this unix socket (GMEM_CONF host_pool_socket)")
      ->capture_default_str();
  app.add_option("--host-pool-threads", pool.threads, "threads pinning at once")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--sweep-interval", sweep_seconds, "seconds between sweeps of dead processes' files")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  app.add_option("--max-watchers", max_watchers, "WatchStats streams served at once")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : exit_usage;
  }
  if (!host_pool_size.empty()) {
    std::string too_much;
    pool.bytes = gmem::rpc::host_pool_bytes(host_pool_size, gmem::vmm::host_available_memory(), &too_much);
    if (!too_much.empty()) {
      fprintf(stderr, "gmemd: %s\n", too_much.c_str());
      return 1;
    }
  }

  // Signals are taken synchronously by the main thread: block them before any
  // thread (gRPC's included) exists, so that every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Catalog catalog(stats_dir);
  std::string problem;
  if (!catalog.ok(&problem)) {
    fprintf(stderr, "gmemd: %s (choose one with --stats-dir)\n", problem.c_str());
    return 1;
  }
  auto listener = UnixListener::bind(socket_path, &problem);
  if (!listener) {
    fprintf(stderr, "gmemd: %s\n", problem.c_str());
    return 1;
  }
  Service service(catalog, {geteuid(), max_watchers});
  grpc::ServerBuilder builder;
  int tcp_port = 0;
  if (!listen_address.empty()) builder.AddListeningPort(listen_address, grpc::InsecureServerCredentials(), &tcp_port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || (!listen_address.empty() && tcp_port == 0)) {
    fprintf(stderr, "gmemd: cannot serve gRPC%s\n", listen_address.empty() ? "" : (" on " + listen_address).c_str());
    return 1;
  }
  std::unique_ptr<gmem::ipc::host_pool::Server> host_pool;
  if (pool.bytes) {
    pool.say = [](const std::string& line) { fprintf(stderr, "gmemd: %s\n", line.c_str()); };
    host_pool = start_host_pool(pool, &problem);
    if (!host_pool) {
      fprintf(stderr, "gmemd: %s\n", problem.c_str());
      server->Shutdown();
      return 1;
    }
  }
  std::unique_ptr<MetricsServer> metrics;
  if (!metrics_address.empty()) {
    metrics = MetricsServer::bind(metrics_address, &problem);
    if (!metrics) {
      fprintf(stderr, "gmemd: %s\n", problem.c_str());
      server->Shutdown();
      return 1;
    }
    Viewer everyone_gmemd_sees{geteuid()};
    metrics->start([&catalog, &host_pool, everyone_gmemd_sees] {
      std::string text = prometheus_text(catalog, everyone_gmemd_sees);
      if (host_pool) {
        const gmem::ipc::host_pool::Server::Figures f = host_pool->figures();
        text += host_pool_text(f.pinned, f.lent, f.borrowers);
      }
      return text;
    });
  }
  std::unique_ptr<gmem::dedup::Broker> broker;
  if (dedup || !dedup_socket.empty()) {
    if (dedup_socket.empty()) dedup_socket = gmem::dedup::wire::default_socket_path();
    broker = gmem::dedup::Broker::bind(dedup_socket, &problem, dedup_any_namespace);
    if (!broker) {
      fprintf(stderr, "gmemd: %s\n", problem.c_str());
      server->Shutdown();
      return 1;
    }
    broker->start();
  }
  listener->start(server.get());
  fprintf(stderr, "gmemd: serving unix:%s", socket_path.c_str());
  if (tcp_port) fprintf(stderr, ", %s (port %d)", listen_address.c_str(), tcp_port);
  if (metrics) fprintf(stderr, ", metrics on port %d", metrics->port());
  if (broker) fprintf(stderr, ", dedup broker on unix:%s", dedup_socket.c_str());
  fprintf(stderr, "; stats from %s\n", stats_dir.c_str());

  timespec sweep_every{static_cast<time_t>(sweep_seconds), static_cast<long>((sweep_seconds - static_cast<time_t>(sweep_seconds)) * 1e9)};
  int signal_number = 0;
  for (;;) {
    catalog.sweep();
    signal_number = sigtimedwait(&stop_signals, nullptr, &sweep_every);
    if (signal_number > 0) break;
  }
  fprintf(stderr, "gmemd: %s, stopping\n", strsignal(signal_number));
  listener->stop();
  if (broker) broker->stop();
  if (metrics) metrics->stop();
  host_pool.reset();  // after the metrics, which read it
  // Open watch streams end with CANCELLED after a short grace period.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server->Wait();
  return 0;
}
