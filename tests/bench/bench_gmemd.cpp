// gmemd's own cost: 100 processes publishing stats (fake publishers), watched
// by one WatchStats stream of all of them at 10 Hz; prints the CPU gmemd used
// as a percentage of one core. Usage: bench-gmemd GMEMD FAKE_PUBLISHER [SECONDS]
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "../rpc/processes.h"
#include "rpc/gmem.grpc.pb.h"

namespace {

// utime + stime of a process (all its threads), in clock ticks.
uint64_t cpu_ticks(pid_t pid) { return gmem::test::proc_stat_field(pid, 14) + gmem::test::proc_stat_field(pid, 15); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: bench-gmemd GMEMD FAKE_PUBLISHER [SECONDS]\n");
    return 2;
  }
  const int processes = 100;
  // Ticks are 10 ms: 10 s resolve 0.1% of a core.
  const double seconds = argc > 3 ? std::atof(argv[3]) : 10.0;
  char path[] = "/tmp/gmem-bench-XXXXXX";
  std::string dir = mkdtemp(path), socket = dir + "/gmemd.sock";
  std::vector<std::unique_ptr<gmem::test::Background>> publishers;
  for (int i = 0; i < processes; ++i) {
    publishers.push_back(std::make_unique<gmem::test::Background>(
        std::vector<std::string>{argv[2], dir, "2", "16"}));
    publishers.back()->read_line();
  }
  gmem::test::Background gmemd({argv[1], "--socket", socket, "--stats-dir", dir});
  auto stub = gmem::v1::Gmem::NewStub(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  gmem::v1::WatchStatsRequest request;
  request.set_interval_ms(100);
  // wait_for_ready: gmemd may still be binding its socket.
  context.set_wait_for_ready(true);
  auto stream = stub->WatchStats(&context, request);
  gmem::v1::GetStatsResponse message;
  // Warm up: the first messages carry the scan and the first mapping of every file.
  for (int i = 0; i < 5; ++i) {
    if (!stream->Read(&message)) {
      fprintf(stderr, "bench-gmemd: the watch ended: %s\n", stream->Finish().error_message().c_str());
      return 1;
    }
  }
  if (message.processes_size() != processes) {
    fprintf(stderr, "bench-gmemd: gmemd sees %d processes, not %d\n", message.processes_size(), processes);
    return 1;
  }
  uint64_t ticks_before = cpu_ticks(gmemd.pid());
  auto start = std::chrono::steady_clock::now();
  int messages = 0;
  while (std::chrono::steady_clock::now() - start < std::chrono::duration<double>(seconds) && stream->Read(&message)) {
    ++messages;
  }
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t ticks = cpu_ticks(gmemd.pid()) - ticks_before;
  context.TryCancel();
  stream->Finish();
  double percent = 100.0 * static_cast<double>(ticks) / static_cast<double>(sysconf(_SC_CLK_TCK)) / elapsed;
  printf("BENCH gmemd_watch_100_processes_10Hz_cpu %.2f %%core\n", percent);
  printf("BENCH gmemd_watch_100_processes_10Hz_messages %.1f per_s\n", messages / elapsed);
  publishers.clear();
  gmemd.stop(SIGTERM);
  std::filesystem::remove_all(dir);
  return 0;
}
