// The top view: a reader thread keeps the latest two WatchStats messages (two,
// for the allocation rate); the screen thread redraws when one arrives and
// polls the keyboard in between.
#include "rpc/top.h"

#include <ncurses.h>

#include <chrono>
#include <cinttypes>
#include <map>
#include <mutex>
#include <thread>

#include "rpc/format.h"

namespace gmem::rpc {
namespace {

struct Feed {
  std::mutex mutex;
  v1::GetStatsResponse latest, previous;
  bool fresh = false, ended = false;
  grpc::Status status;
};

// Allocations per second of (pid, device) between two samples.
double allocation_rate(const v1::GetStatsResponse& now, const v1::GetStatsResponse& before, int32_t pid,
                       const v1::DeviceStats& device) {
  double seconds = static_cast<double>(now.sampled_unix_ns() - before.sampled_unix_ns()) / 1e9;
  if (before.sampled_unix_ns() == 0 || seconds <= 0) return 0;
  for (const v1::ProcessStats& p : before.processes()) {
    if (p.process().pid() != pid) continue;
    for (const v1::DeviceStats& d : p.devices()) {
      if (d.device() == device.device() && d.allocations() <= device.allocations()) {
        return static_cast<double>(device.allocations() - d.allocations()) / seconds;
      }
    }
  }
  return 0;
}

void draw(const Client& client, const v1::GetStatsResponse& now, const v1::GetStatsResponse& before, int interval_ms) {
  erase();
  int rows = LINES;
  mvprintw(0, 0, "gmem top - %s - %d processes - every %d ms - q quits", client.target().c_str(),
           now.processes_size(), interval_ms);
  attron(A_REVERSE);
  mvprintw(2, 0, "%8s %3s %10s %10s %10s %10s %10s %5s %8s %8s  %-s", "PID", "DEV", "ON DEVICE", "ON PEER", "ON HOST",
           "RESERVED", "IN USE", "FRAG", "STITCHED", "ALLOC/S", "COMMAND");
  attroff(A_REVERSE);
  std::map<int, uint64_t> device_total, peer_total, host_total;
  int row = 3;
  for (const v1::ProcessStats& p : now.processes()) {
    for (const v1::DeviceStats& d : p.devices()) {
      device_total[d.device()] += d.device_bytes();
      peer_total[d.device()] += d.peer_bytes();
      host_total[d.device()] += d.host_bytes();
      if (row >= rows - 2) continue;
      mvprintw(row++, 0, "%8d %3d %10s %10s %10s %10s %10s %4.0f%% %8" PRIu64 " %8.0f  %-.60s", p.process().pid(),
               d.device(), human_bytes(d.device_bytes()).c_str(), human_bytes(d.peer_bytes()).c_str(),
               human_bytes(d.host_bytes()).c_str(), human_bytes(d.reserved_bytes()).c_str(),
               human_bytes(d.in_use_bytes()).c_str(), 100 * d.fragmentation(), d.stitched_ranges(),
               allocation_rate(now, before, p.process().pid(), d), p.process().command().c_str());
    }
  }
  std::string totals = "totals:";
  for (const auto& [device, bytes] : device_total) {
    totals += " dev" + std::to_string(device) + " " + human_bytes(bytes) + " on device, " +
              human_bytes(peer_total[device]) + " on peer, " + human_bytes(host_total[device]) + " on host;";
  }
  mvprintw(1, 0, "%s", totals.c_str());
  refresh();
}

}  // namespace

int run_top(Client& client, int interval_ms) {
  // Fail before taking over the terminal if nobody answers.
  if (!client.answers(3)) {
    v1::HealthRequest request;
    v1::HealthResponse response;
    return client.report(client.stub().Health(client.context().get(), request, &response));
  }
  Feed feed;
  grpc::ClientContext context;
  std::thread reader([&] {
    v1::WatchStatsRequest request;
    request.set_interval_ms(interval_ms);
    auto stream = client.stub().WatchStats(&context, request);
    v1::GetStatsResponse message;
    while (stream->Read(&message)) {
      std::lock_guard lock(feed.mutex);
      feed.previous.Swap(&feed.latest);
      feed.latest = message;
      feed.fresh = true;
    }
    grpc::Status status = stream->Finish();
    std::lock_guard lock(feed.mutex);
    feed.status = status;
    feed.ended = true;
  });

  initscr();
  cbreak();
  noecho();
  curs_set(0);
  timeout(100);
  for (;;) {
    int key = getch();
    if (key == 'q' || key == 'Q') break;
    std::lock_guard lock(feed.mutex);
    if (feed.ended) break;
    if (feed.fresh || key == KEY_RESIZE) {
      draw(client, feed.latest, feed.previous, interval_ms);
      feed.fresh = false;
    }
  }
  endwin();
  context.TryCancel();
  reader.join();
  if (feed.status.error_code() == grpc::StatusCode::CANCELLED) return exit_ok;
  return client.report(feed.status);
}

}  // namespace gmem::rpc
