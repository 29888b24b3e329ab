// gmemctl: the command line of the gmem stats plane. Reads from gmemd (ps,
// stats, placement, top), runs jobs under the shim (run), or becomes gmemd (daemon).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "rpc/client.h"
#include "rpc/format.h"
#include "rpc/host_pool_size.h"
#include "rpc/paths.h"
#include "rpc/placement_summary.h"
#include "rpc/run_job.h"
#include "rpc/top.h"

using namespace gmem::rpc;
namespace v1 = gmem::v1;

namespace {

const char* footer =
    "Examples:\n"
    "  gmemctl run -- python3 train.py       run a job under gmem (starts gmemd if none answers)\n"
    "  gmemctl run --host-pool 96G -- python3 train.py   the gmemd it starts pins 96 GiB for spills\n"
    "  gmemctl top                           live view of every job under gmem\n"
    "  gmemctl ps --json                     the processes, as JSON\n"
    "  gmemctl stats 4242                    one process's figures per device\n"
    "  gmemctl placement 4242 --device 0     where its memory on device 0 lies: tiers, kinds, largest\n"
    "  gmemctl daemon -- --metrics 127.0.0.1:9464   gmemd in the foreground, with Prometheus metrics\n"
    "\n"
    "Exit codes: 0 ok, 1 gmemd answered with an error, 2 usage error, 3 no gmemd answers,\n"
    "4 no such process under gmem, 5 refused by gmemd (another user's daemon);\n"
    "`run` returns the job's own exit status.";

const char* placement_footer =
    "Without --all: the live allocations summed by tier, bytes counted where they lie\n"
    "(device: the GPU's own memory; peer: another GPU's; host: pinned host memory; an\n"
    "allocation split between tiers counts in each), then by kind (alloc: cuMemAlloc,\n"
    "pitch: cuMemAllocPitch, managed: cuMemAllocManaged, async: cuMemAllocAsync) with\n"
    "<=1MiB (small allocations, which the pool carves from shared 2 MiB slabs) and\n"
    "STITCHED (ranges mapped from more than one physical chunk), then the largest\n"
    "allocations with their bytes on the device, a peer and the host.\n"
    "--all: one row per allocation instead; --json: the gmem.v1 message, every allocation.";

// Prints a message as JSON or as a table, or reports the error.
template <typename Message>
int show(const Client& client, const grpc::Status& status, const Message& message, bool json,
         std::string (*table)(const Message&)) {
  if (!status.ok()) return client.report(status);
  std::cout << (json ? to_json(message) + "\n" : table(message)) << std::flush;
  return exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gmemctl: see and steer GPU memory pooled by gmem"};
  app.footer(footer);
  app.require_subcommand(1);
  app.fallthrough();
  std::string socket = default_socket_path();
  app.add_option("--socket", socket, "gmemd's unix socket (or a gRPC target such as ipv4:127.0.0.1:PORT)")
      ->capture_default_str();

  bool json = false;
  auto* ps = app.add_subcommand("ps", "list the processes running under gmem");
  auto* stats = app.add_subcommand("stats", "per-device figures of one process (PID) or of all");
  int32_t pid = 0, device = -1;
  stats->add_option("PID", pid, "the process; all when left out")->check(CLI::PositiveNumber);
  int rate_ms = 500;
  stats->add_option("--rate-ms", rate_ms, "between the two samples that give host-access bytes per second")
      ->check(CLI::Range(10, 60000))
      ->capture_default_str();
  auto* placement =
      app.add_subcommand("placement", "where a process's live allocations lie: bytes by tier and kind, the largest");
  placement->footer(placement_footer);
  placement->add_option("PID", pid, "the process")->required()->check(CLI::PositiveNumber);
  placement->add_option("--device", device, "only this device's allocations")->check(CLI::NonNegativeNumber);
  bool every_row = false;
  std::size_t largest = 10;
  auto* all_flag = placement->add_flag("--all", every_row, "every allocation, one row each, instead of the summary");
  placement->add_option("--top", largest, "how many of the largest allocations the summary lists")
      ->capture_default_str()
      ->excludes(all_flag);
  for (CLI::App* read : {ps, stats, placement}) read->add_flag("--json", json, "print the gmem.v1 message as JSON");
  auto* top = app.add_subcommand("top", "live full-screen view: bytes on device/peer/host, fragmentation, rates");
  int interval_ms = 1000;
  top->add_option("--interval", interval_ms, "milliseconds between updates")
      ->check(CLI::Range(10, 3'600'000))
      ->capture_default_str();

  RunOptions run_options;
  auto* run = app.add_subcommand("run", "run CMD under gmem (LD_PRELOAD, GMEM_CONF); starts gmemd if none answers");
  run->add_option("--shim", run_options.shim, "the shim to preload (default: found next to gmemctl)");
  run->add_option("--conf", run_options.conf,
                  "GMEM_CONF for the job (default: the environment's), with plan_file:auto added unless it names "
                  "plan_file: a job run again takes back its last run's plan (plan_file: with no value for none)");
  run->add_option("--stats-dir", run_options.stats_dir, "where the job publishes stats (and gmemd reads them)");
  run->add_option("--host-pool", run_options.host_pool,
                  "if gmemctl starts gmemd, it also pins this much host memory (96G, or a share of the memory "
                  "available: 70%), in units of the job's host_chunk, and lends it to jobs that spill: pinning "
                  "overlaps the job's start, and what is pinned by its first spill is not pinned in its step. gmemd "
                  "keeps it pinned for later jobs until stopped")
      ->check(gmem::rpc::host_pool_size());
  run->add_option("CMD", run_options.command, "the job and its arguments (put -- before it)")->required();
  run->positionals_at_end();

  auto* daemon = app.add_subcommand("daemon", "run gmemd in the foreground (arguments after -- go to gmemd)");
  std::vector<std::string> daemon_arguments;
  daemon->add_option("GMEMD_ARGS", daemon_arguments, "gmemd's own options, after --");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? exit_ok : exit_usage;
  }

  if (*daemon) {
    std::vector<std::string> arguments = daemon_arguments;
    if (app.count("--socket")) arguments.insert(arguments.begin(), {"--socket", socket});
    return exec_daemon(arguments);
  }
  if (*run) {
    run_options.socket = socket;
    return run_job(run_options);
  }
  Client client(socket);
  if (*top) return run_top(client, interval_ms);
  if (*ps) {
    v1::ListProcessesResponse response;
    auto status = client.stub().ListProcesses(client.context().get(), {}, &response);
    return show(client, status, response, json, ps_table);
  }
  if (*stats) {
    v1::GetStatsRequest request;
    request.set_pid(pid);
    v1::GetStatsResponse response;
    auto status = client.stub().GetStats(client.context().get(), request, &response);
    if (json || !status.ok() || !tracks_access(response)) return show(client, status, response, json, stats_table);
    // Access rates need a second sample.
    std::this_thread::sleep_for(std::chrono::milliseconds(rate_ms));
    v1::GetStatsResponse later;
    status = client.stub().GetStats(client.context().get(), request, &later);
    if (!status.ok()) return client.report(status);
    std::cout << stats_table(later) << access_rates(later, response) << std::flush;
    return exit_ok;
  }
  v1::GetPlacementRequest request;
  request.set_pid(pid);
  if (device >= 0) request.set_device(device);
  v1::GetPlacementResponse response;
  auto status = client.stub().GetPlacement(client.context().get(), request, &response);
  if (!status.ok() || json || every_row) return show(client, status, response, json, placement_table);
  std::cout << placement_summary(response, largest) << std::flush;
  return exit_ok;
}
