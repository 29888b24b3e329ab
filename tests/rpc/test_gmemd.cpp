// gmemd and gmemctl end to end: a gmemd on a temporary socket and stats
// directory, processes publishing stats, and every gmemctl command checked
// against what they published; dead processes swept, other users refused,
// hostile requests answered with errors while gmemd keeps serving.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "gmemd_fixture.h"
#include "stats_writer.h"

namespace {

using namespace gmem::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace v1 = gmem::v1;

TEST_F(Gmemd, PsStatsAndPlacementShowWhatProcessesPublished) {
  auto one = publish(1, 3), two = publish(2, 5);
  auto ps = ctl({"ps", "--json"});
  ASSERT_EQ(ps.status, 0) << ps.err;
  auto listed = parse<v1::ListProcessesResponse>(ps.out);
  ASSERT_EQ(listed.processes_size(), 2);
  for (const auto& p : listed.processes()) {
    EXPECT_EQ(p.state(), v1::STATS_STATE_OK);
    EXPECT_EQ(p.uid(), getuid());
    EXPECT_TRUE(p.pid() == one->pid() || p.pid() == two->pid());
    EXPECT_EQ(p.command(), "fake-publisher " + std::to_string(p.pid() == one->pid() ? 1 : 2));
  }

  auto stats = ctl({"stats", pid_of(*two), "--json"});
  ASSERT_EQ(stats.status, 0) << stats.err;
  auto figures = parse<v1::GetStatsResponse>(stats.out);
  ASSERT_EQ(figures.processes_size(), 1);
  const auto& devices = figures.processes(0).devices();
  ASSERT_EQ(devices.size(), 2);
  EXPECT_EQ(devices[1].reserved_bytes(), 2ull << 30);
  EXPECT_EQ(devices[1].in_use_bytes(), 1ull << 30);
  EXPECT_EQ(devices[1].allocations(), 5u);
  EXPECT_EQ(devices[1].moved_back_bytes(), 256u << 20);
  EXPECT_DOUBLE_EQ(devices[1].fragmentation(), 0.5);
  EXPECT_EQ(devices[1].uuid().substr(0, 2), "a1");

  auto all = parse<v1::GetStatsResponse>(ctl({"stats", "--json"}).out);
  EXPECT_EQ(all.processes_size(), 2);

  auto placement = ctl({"placement", pid_of(*two), "--device", "1", "--json"});
  ASSERT_EQ(placement.status, 0) << placement.err;
  auto ranges = parse<v1::GetPlacementResponse>(placement.out);
  ASSERT_EQ(ranges.allocations_size(), 5);
  for (const auto& a : ranges.allocations()) {
    EXPECT_EQ(a.device(), 1);
    EXPECT_EQ(a.size(), 1u << 20);
    EXPECT_EQ(a.physical(), 2u << 20);
  }
  EXPECT_EQ(ranges.allocations(0).chunks(), 2u);

  // The tables carry the same figures.
  auto table = ctl({"stats", pid_of(*two)});
  EXPECT_NE(table.out.find("2.0 GiB"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("50%"), std::string::npos) << table.out;
  // Devices 0 and 1 moved 1/8 of their 1 and 2 GiB back.
  EXPECT_NE(table.out.find("moved back to the device from the tiers: 384.0 MiB"), std::string::npos) << table.out;
  // Device 0 counts 1 MiB of host access per 10 ms: about 100 MiB/s between the two samples.
  std::smatch rate;
  ASSERT_TRUE(std::regex_search(table.out, rate, std::regex(pid_of(*two) + " launches referencing pool memory "
                                                          "[0-9]+/s; host access ([0-9.]+) MiB/s")))
      << table.out;
  EXPECT_GT(std::stod(rate[1]), 50.0) << table.out;
  EXPECT_LT(std::stod(rate[1]), 110.0) << table.out;
  EXPECT_NE(ctl({"placement", pid_of(*one), "--all"})
                .out.find("0x00007f0000000000     1.0 MiB     2.0 MiB   0 device alloc"),
            std::string::npos);
}

// A known placement under this test's own pid: a thousand 8 KiB slab blocks
// and two 1 MiB pitched ones on the device, three 64 MiB async ranges (one on
// the device, one with 16 MiB on the host, one with 24 MiB on a peer and 8 MiB
// on the host), and a 256 MiB range on device 1 with 192 MiB on the host.
TEST_F(Gmemd, PlacementSummarySaysWhereTheBytesLie) {
  StatsWriter job(stats_, getpid(), start_ticks_of(getpid()), 2048, "placement-job");
  const uint64_t kib = 1 << 10, mib = 1 << 20, base = 0x7f0000000000;
  for (uint64_t i = 0; i < 1000; ++i) {
    job.place({0, base + i * 8 * kib, 8 * kib, 8 * kib, 0, GMEM_TIER_DEVICE, GMEM_KIND_DEVICE, 0, 0, 0});
  }
  for (uint64_t i = 0; i < 2; ++i) {
    job.place({0, base + (16 + i) * mib, mib, mib, 0, GMEM_TIER_DEVICE, GMEM_KIND_PITCHED, 0, 0, 0});
  }
  job.place({0, base + 1024 * mib, 64 * mib, 64 * mib, 0, GMEM_TIER_DEVICE, GMEM_KIND_ASYNC, 1, 0, 0});
  job.place({0, base + 1280 * mib, 64 * mib, 64 * mib, 0, GMEM_TIER_HOST, GMEM_KIND_ASYNC, 3, 16 * mib, 0});
  job.place({0, base + 1536 * mib, 64 * mib, 64 * mib, 0, GMEM_TIER_HOST, GMEM_KIND_ASYNC, 2, 8 * mib, 24 * mib});
  job.place({0, base + 4096 * mib, 256 * mib, 256 * mib, 1, GMEM_TIER_HOST, GMEM_KIND_DEVICE, 4, 192 * mib, 0});
  const std::string pid = std::to_string(getpid());

  auto summary = ctl({"placement", pid, "--top", "3"});
  ASSERT_EQ(summary.status, 0) << summary.err;
  const std::string& out = summary.out;
  // 457.8 MiB in all: 24 MiB on a peer, 216 MiB on the host, the rest on the
  // device, where every allocation has some of its bytes.
  for (const char* line : {
           R"(^pid \d+ placement-job: 1006 live allocations, 457\.8 MiB requested, 457\.8 MiB physical$)",
           R"(^TIER +BYTES +SHARE +ALLOCS$)",
           R"(^device +217\.8 MiB +48% +1006$)",
           R"(^peer +24\.0 MiB +5% +1$)",
           R"(^host +216\.0 MiB +47% +3$)",
           // Kinds in the order of their values; <=1MiB counts the slab blocks
           // and the 1 MiB ones, STITCHED the ranges of more than one chunk.
           R"(^KIND +ALLOCS +BYTES +PHYSICAL +<=1MiB +STITCHED$)",
           R"(^alloc +1001 +263\.8 MiB +263\.8 MiB +1000 +1$)",
           R"(^pitch +2 +2\.0 MiB +2\.0 MiB +2 +0$)",
           R"(^async +3 +192\.0 MiB +192\.0 MiB +0 +2$)",
           R"(^the 3 largest of 1006 \(--all lists every one\):$)",
           // Largest first; of equal sizes, the lowest address.
           R"(^0x00007f0100000000 +256\.0 MiB +1 alloc +4 +64\.0 MiB +0 B +192\.0 MiB$)",
           R"(^0x00007f0040000000 +64\.0 MiB +0 async +1 +64\.0 MiB +0 B +0 B$)",
           R"(^0x00007f0050000000 +64\.0 MiB +0 async +3 +48\.0 MiB +0 B +16\.0 MiB$)"}) {
    EXPECT_TRUE(std::regex_search(out, std::regex(line, std::regex::multiline))) << line << "\n" << out;
  }
  EXPECT_EQ(out.find("0x00007f0060000000"), std::string::npos) << "only the 3 largest\n" << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 14) << out;
  EXPECT_NE(ctl({"placement", pid}).out.find("0x00007f0060000000    64.0 MiB   0 async        2    32.0 MiB    24.0 MiB"
                                             "     8.0 MiB\n"),
            std::string::npos)
      << "ten by default";

  // One device: its allocations alone.
  auto device1 = ctl({"placement", pid, "--device", "1"}).out;
  EXPECT_TRUE(std::regex_search(device1, std::regex(R"(^host +192\.0 MiB +75% +1$)", std::regex::multiline)))
      << device1;

  // --all: today's table, a row per allocation; --json: every allocation with its split.
  auto all = ctl({"placement", pid, "--all"});
  ASSERT_EQ(all.status, 0) << all.err;
  EXPECT_EQ(std::count(all.out.begin(), all.out.end(), '\n'), 1 + 1006) << all.out;
  EXPECT_NE(all.out.find("0x00007f0000000000     8.0 KiB     8.0 KiB   0 device alloc        0\n"), std::string::npos);
  auto json = parse<v1::GetPlacementResponse>(ctl({"placement", pid, "--json"}).out);
  ASSERT_EQ(json.allocations_size(), 1006);
  const auto& split = json.allocations(1004);  // by address: the third 64 MiB range
  EXPECT_EQ(split.host_bytes(), 8 * mib);
  EXPECT_EQ(split.peer_bytes(), 24 * mib);

  EXPECT_EQ(ctl({"placement", pid, "--all", "--top", "3"}).status, 2);
  auto help = ctl({"placement", "--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("allocation split between tiers counts in each"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--all"), std::string::npos);
}

TEST_F(Gmemd, KilledProcessDisappearsAfterTheNextSweep) {
  auto victim = publish(1, 1), survivor = publish(1, 1);
  std::string file = stats_ + "/gmem." + pid_of(*victim);
  ASSERT_TRUE(fs::exists(file));
  EXPECT_EQ(parse<v1::ListProcessesResponse>(ctl({"ps", "--json"}).out).processes_size(), 2);
  pid_t victim_pid = victim->pid();
  victim->stop(SIGKILL);
  EXPECT_TRUE(eventually([&] { return !fs::exists(file); }, 3s)) << "gmemd sweeps every 0.2 s";
  auto listed = parse<v1::ListProcessesResponse>(ctl({"ps", "--json"}).out);
  ASSERT_EQ(listed.processes_size(), 1);
  EXPECT_EQ(listed.processes(0).pid(), survivor->pid());
  EXPECT_EQ(ctl({"stats", std::to_string(victim_pid)}).status, 4);
}

TEST_F(Gmemd, ExitCodesSayWhatWentWrong) {
  auto unknown = ctl({"stats", "999999999"});
  EXPECT_EQ(unknown.status, 4) << unknown.err;
  EXPECT_NE(unknown.err.find("no process 999999999"), std::string::npos) << unknown.err;
  EXPECT_EQ(ctl({"placement", "999999999"}).status, 4);

  auto usage = ctl({"placement"});
  EXPECT_EQ(usage.status, 2) << usage.err;
  EXPECT_EQ(ctl({"frobnicate"}).status, 2);
  EXPECT_EQ(ctl({"stats", "-5"}).status, 2);

  for (const char* command : {"ps", "stats", "top"}) {
    auto nobody_home = run_command({gmemctl, "--socket", root_ + "/nobody.sock", command});
    EXPECT_EQ(nobody_home.status, 3) << command;
    EXPECT_NE(nobody_home.err.find("gmemctl daemon"), std::string::npos) << nobody_home.err;
  }

  auto help = ctl({"--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("Exit codes:"), std::string::npos);
  EXPECT_NE(help.out.find("gmemctl run -- python3 train.py"), std::string::npos);
}

// gmemd busy (here: stopped) for a second when gmemctl connects: gmemctl waits
// for its answer within the call's deadline, not gRPC's handshake minimum of
// 0.1 s, which a minimum reconnect backoff would set (and CI's loaded
// sanitizer runs once missed).
TEST_F(Gmemd, AGmemdSlowToAnswerIsWaitedFor) {
  ASSERT_EQ(kill(daemon_->pid(), SIGSTOP), 0);
  std::thread wake([&] {
    std::this_thread::sleep_for(1s);
    kill(daemon_->pid(), SIGCONT);
  });
  auto ps = ctl({"ps"});
  wake.join();
  EXPECT_EQ(ps.status, 0) << ps.err;
}

TEST_F(Gmemd, HostileRequestsGetErrorsAndGmemdKeepsServing) {
  auto s = stub();
  auto call = [&](auto method, const auto& request, auto* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 5s);
    return ((*s).*method)(&context, request, response).error_code();
  };
  v1::GetStatsRequest stats_request;
  v1::GetStatsResponse stats_response;
  stats_request.set_pid(-1);
  EXPECT_EQ(call(&v1::Gmem::Stub::GetStats, stats_request, &stats_response), grpc::StatusCode::INVALID_ARGUMENT);
  stats_request.set_pid(std::numeric_limits<int32_t>::max());
  EXPECT_EQ(call(&v1::Gmem::Stub::GetStats, stats_request, &stats_response), grpc::StatusCode::NOT_FOUND);

  v1::GetPlacementRequest placement_request;
  v1::GetPlacementResponse placement_response;
  EXPECT_EQ(call(&v1::Gmem::Stub::GetPlacement, placement_request, &placement_response),
            grpc::StatusCode::INVALID_ARGUMENT);  // pid 0: which process?
  placement_request.set_pid(getpid());
  placement_request.set_device(99);
  EXPECT_EQ(call(&v1::Gmem::Stub::GetPlacement, placement_request, &placement_response),
            grpc::StatusCode::INVALID_ARGUMENT);

  for (int64_t interval : {int64_t{-5}, int64_t{1}, int64_t{1} << 40, std::numeric_limits<int64_t>::min()}) {
    grpc::ClientContext context;
    v1::WatchStatsRequest request;
    request.set_interval_ms(interval);
    auto stream = s->WatchStats(&context, request);
    v1::GetStatsResponse message;
    EXPECT_FALSE(stream->Read(&message));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT) << interval;
  }

  // Garbage under this test's own pid, and a file of a layout from the future.
  std::ofstream(stats_ + "/gmem." + std::to_string(getpid())) << std::string(5000, 'x');
  auto child = publish(1, 1);
  {
    gmem::test::StatsWriter future(stats_, getppid(), gmem::test::start_ticks_of(getppid()));
    future.header().version = 99;
  }
  stats_request.set_pid(getpid());
  EXPECT_EQ(call(&v1::Gmem::Stub::GetStats, stats_request, &stats_response), grpc::StatusCode::DATA_LOSS);
  stats_request.set_pid(getppid());
  grpc::ClientContext context;
  auto status = s->GetStats(&context, stats_request, &stats_response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("version 99"), std::string::npos) << status.error_message();

  auto listed = parse<v1::ListProcessesResponse>(ctl({"ps", "--json"}).out);
  std::map<int, v1::StatsState> states;
  for (const auto& p : listed.processes()) states[p.pid()] = p.state();
  EXPECT_EQ(states[getpid()], v1::STATS_STATE_INVALID);
  EXPECT_EQ(states[getppid()], v1::STATS_STATE_UNKNOWN_VERSION);
  EXPECT_EQ(states[child->pid()], v1::STATS_STATE_OK);
  // The readable process is still served, in full and alone in "all".
  auto all = parse<v1::GetStatsResponse>(ctl({"stats", "--json"}).out);
  ASSERT_EQ(all.processes_size(), 1);
  EXPECT_EQ(all.processes(0).process().pid(), child->pid());
}

// Client side of many WatchStats streams at once, on gRPC's callback API.
class Watcher : public grpc::ClientReadReactor<v1::GetStatsResponse> {
 public:
  Watcher(v1::Gmem::Stub& stub, std::atomic<int>& done, int64_t interval_ms) : done_(done) {
    request_.set_interval_ms(interval_ms);
    stub.async()->WatchStats(&context_, &request_, this);
    StartRead(&message_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (ok) {
      messages_.fetch_add(1);
      StartRead(&message_);
    }
  }
  void OnDone(const grpc::Status& status) override {
    code_ = status.error_code();
    done_.fetch_add(1);
  }
  void cancel() { context_.TryCancel(); }
  int messages() const { return messages_.load(); }
  grpc::StatusCode code() const { return code_; }

 private:
  grpc::ClientContext context_;
  v1::WatchStatsRequest request_;
  v1::GetStatsResponse message_;
  std::atomic<int> messages_{0};
  std::atomic<int>& done_;
  grpc::StatusCode code_ = grpc::StatusCode::UNKNOWN;
};

TEST_F(Gmemd, TenThousandWatchersGetServedOrRefusedAndGmemdKeepsServing) {
  auto job = publish(1, 1);
  constexpr int watchers = 10000, limit = 64;  // the daemon runs with --max-watchers 64
  std::vector<std::unique_ptr<v1::Gmem::Stub>> stubs;
  for (int c = 0; c < 8; ++c) stubs.push_back(stub());
  std::atomic<int> done{0};
  std::vector<std::unique_ptr<Watcher>> all;
  for (int i = 0; i < watchers; ++i) all.push_back(std::make_unique<Watcher>(*stubs[i % 8], done, 100));
  ASSERT_TRUE(eventually([&] { return done.load() >= watchers - limit; }, 60s)) << done.load();
  int refused = 0, streaming = 0;
  for (const auto& w : all) {
    refused += w->code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  }
  EXPECT_EQ(refused, watchers - limit);
  EXPECT_TRUE(eventually([&] {
    streaming = 0;
    for (const auto& w : all) streaming += w->messages() >= 2;
    return streaming == limit;
  }));
  EXPECT_EQ(streaming, limit);

  // Still answering while they stream, and the slots come back when they go.
  auto health = ctl({"ps", "--json"});
  EXPECT_EQ(health.status, 0) << health.err;
  for (auto& w : all) w->cancel();
  ASSERT_TRUE(eventually([&] { return done.load() == watchers; }, 30s));
  v1::HealthResponse answer;
  EXPECT_TRUE(eventually([&] {
    grpc::ClientContext context;
    return stub()->Health(&context, {}, &answer).ok() && answer.watchers() == 0;
  }));
  std::atomic<int> one_done{0};
  Watcher again(*stubs[0], one_done, 50);
  EXPECT_TRUE(eventually([&] { return again.messages() >= 2; }));
  again.cancel();
  EXPECT_TRUE(eventually([&] { return one_done.load() == 1; }));
}

TEST_F(Gmemd, ClientsOfAnotherUidSeeNothingOfOthersOrAreRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "switching to another uid (setpriv) needs root";
  auto job = publish(1, 1);  // runs as root
  std::vector<std::string> as_nobody = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  // A root gmemd serves everyone, each their own processes.
  auto theirs = ctl({"ps", "--json"}, as_nobody);
  ASSERT_EQ(theirs.status, 0) << theirs.err;
  EXPECT_EQ(parse<v1::ListProcessesResponse>(theirs.out).processes_size(), 0);
  EXPECT_EQ(parse<v1::ListProcessesResponse>(ctl({"ps", "--json"}).out).processes_size(), 1);
  EXPECT_EQ(ctl({"stats", pid_of(*job)}, as_nobody).status, 4);
  EXPECT_EQ(ctl({"placement", pid_of(*job)}, as_nobody).status, 4);

  // A user's gmemd serves that user (and root) only.
  std::string user_dir = root_ + "/user";
  fs::create_directory(user_dir);
  chmod(user_dir.c_str(), 0777);
  std::string user_socket = user_dir + "/gmemd.sock";
  auto user_daemon = start_daemon(user_socket, user_dir, user_dir + "/log", {}, as_nobody);
  auto as = [&](std::vector<std::string> prefix) {
    prefix.insert(prefix.end(), {gmemctl, "--socket", user_socket, "ps"});
    return run_command(prefix);
  };
  auto stranger = as({"setpriv", "--reuid=65533", "--regid=65533", "--clear-groups"});
  EXPECT_EQ(stranger.status, 5) << stranger.err;
  EXPECT_NE(stranger.err.find("refused"), std::string::npos) << stranger.err;
  EXPECT_EQ(as(as_nobody).status, 0);
  EXPECT_EQ(as({}).status, 0);
  EXPECT_EQ(user_daemon->stop(SIGTERM), 0);
}

TEST_F(Gmemd, MetricsServePrometheusText) {
  auto job = publish(1, 2);
  const std::string reply = scrape(log_);
  std::string labels = "{pid=\"" + pid_of(*job) + "\",device=\"0\",command=\"fake-publisher 1\"}";
  EXPECT_NE(reply.find("gmem_in_use_bytes" + labels + " 536870912\n"), std::string::npos) << reply;
  EXPECT_NE(reply.find("gmem_fragmentation_ratio" + labels + " 0.5\n"), std::string::npos) << reply;
  EXPECT_EQ(reply.find("gmem_host_pool"), std::string::npos) << "no host pool, no figures of it: " << reply;
}

TEST_F(Gmemd, RunStartsADaemonWhenNoneAnswersAndReturnsTheJobsStatus) {
  std::string socket = root_ + "/run.sock", stats = root_ + "/run-stats";
  fs::create_directory(stats);
  auto job = run_command({gmemctl, "--socket", socket, "run", "--shim", GMEM_SHIM_PATH, "--stats-dir", stats, "--",
                          "sh", "-c", "echo \"$LD_PRELOAD|$GMEM_CONF\"; exit 7"});
  EXPECT_EQ(job.status, 7) << job.err;
  EXPECT_EQ(job.out, std::string(GMEM_SHIM_PATH) + "|stats_dir:" + stats + ",plan_file:auto\n");
  EXPECT_NE(job.err.find("started gmemd on " + socket), std::string::npos) << job.err;
  // The daemon it started stays for gmemctl top and friends; this one is ours to stop.
  v1::HealthResponse health;
  ASSERT_TRUE(health_of(socket, &health));
  EXPECT_EQ(health.stats_dir(), stats);
  // A second run finds it answering and starts no other.
  auto again = run_command({gmemctl, "--socket", socket, "run", "--shim", GMEM_SHIM_PATH, "--", "true"});
  EXPECT_EQ(again.status, 0);
  EXPECT_EQ(again.err.find("started gmemd"), std::string::npos) << again.err;
  kill(health.pid(), SIGTERM);
  EXPECT_TRUE(eventually([&] { return !fs::exists(socket); }));

  auto missing = run_command({gmemctl, "--socket", socket, "run", "--shim", "/nonexistent/libcuda.so.1", "--", "true"});
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.err.find("--shim"), std::string::npos);
}

TEST_F(Gmemd, RunAddsAnAutoPlanFileUnlessTheJobsConfNamesOne) {
  std::string socket = root_ + "/plan.sock";
  auto conf_of = [&](const std::string& conf) {
    auto job = run_command({gmemctl, "--socket", socket, "run", "--shim", GMEM_SHIM_PATH, "--conf", conf, "--", "sh",
                            "-c", "echo \"$GMEM_CONF\""});
    EXPECT_EQ(job.status, 0) << job.err;
    return job.out;
  };
  EXPECT_EQ(conf_of("report:1"), "report:1,plan_file:auto\n");
  EXPECT_EQ(conf_of("plan_file:/tmp/p.plan,report:1"), "plan_file:/tmp/p.plan,report:1\n");
  EXPECT_EQ(conf_of("report:1,plan_file:"), "report:1,plan_file:\n") << "plan_file: with no value keeps none";
  v1::HealthResponse health;
  ASSERT_TRUE(health_of(socket, &health));
  kill(health.pid(), SIGTERM);
  EXPECT_TRUE(eventually([&] { return !fs::exists(socket); }));
}

TEST_F(Gmemd, DaemonCommandAndTcpListenerServeTheSameFigures) {
  auto job = publish(1, 2);
  std::string socket = root_ + "/ctl.sock", log = root_ + "/ctl.log";
  // gmemctl daemon becomes gmemd, with --socket and what follows -- passed on.
  Background daemon({gmemctl, "--socket", socket, "daemon", "--", "--stats-dir", stats_, "--listen", "127.0.0.1:0"},
                    log);
  ASSERT_TRUE(eventually([&] { return slurp(log).find("gmemd: serving") != std::string::npos; })) << slurp(log);
  std::smatch port;
  std::string text = slurp(log);
  ASSERT_TRUE(std::regex_search(text, port, std::regex("127.0.0.1:0 \\(port (\\d+)\\)"))) << text;
  for (const std::string& target : {socket, "ipv4:127.0.0.1:" + port[1].str()}) {
    auto figures = run_command({gmemctl, "--socket", target, "stats", pid_of(*job), "--json"});
    ASSERT_EQ(figures.status, 0) << target << ": " << figures.err;
    EXPECT_EQ(parse<v1::GetStatsResponse>(figures.out).processes(0).devices(0).in_use_bytes(), 1u << 29) << target;
  }
  EXPECT_EQ(daemon.stop(SIGINT), 0);
  EXPECT_FALSE(fs::exists(socket));
}

TEST_F(Gmemd, TopShowsEveryProcessLiveUnderTmux) {
  if (run_command({"tmux", "-V"}).status != 0) GTEST_SKIP() << "tmux is not installed";
  auto busy = publish(2, 3), quiet = publish(1, 1);
  std::string session = "gmem-top-" + std::to_string(getpid());
  std::string tmux_socket = root_ + "/tmux";
  auto tmux = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"tmux", "-S", tmux_socket});
    return run_command(args);
  };
  ASSERT_EQ(tmux({"new-session", "-d", "-s", session, "-x", "160", "-y", "30",
                  gmemctl + " --socket " + socket_ + " top --interval 100"})
                .status,
            0);
  std::string screen;
  bool shown = eventually([&] {
    screen = tmux({"capture-pane", "-p", "-t", session}).out;
    return screen.find(pid_of(*busy)) != std::string::npos && screen.find(pid_of(*quiet)) != std::string::npos;
  });
  EXPECT_TRUE(shown) << screen;
  EXPECT_NE(screen.find("gmem top - " + socket_ + " - 2 processes"), std::string::npos) << screen;
  for (const char* column : {"ON DEVICE", "ON PEER", "ON HOST", "FRAG", "STITCHED", "ALLOC/S"}) {
    EXPECT_NE(screen.find(column), std::string::npos) << column << "\n" << screen;
  }
  // busy's device 1: 1 GiB of 2 GiB in use on the device; device 0 allocates ~100/s.
  std::regex device1(pid_of(*busy) + R"(\s+1\s+1\.0 GiB\s+0 B\s+0 B\s+2\.0 GiB\s+1\.0 GiB\s+50%\s+1\s+0\s+fake-publisher 2)");
  EXPECT_TRUE(std::regex_search(screen, device1)) << screen;
  std::regex device0_rate(pid_of(*busy) + R"(\s+0\s+512\.0 MiB.*50%\s+1\s+([1-9]\d*)\s+fake-publisher 2)");
  EXPECT_TRUE(eventually([&] {
    screen = tmux({"capture-pane", "-p", "-t", session}).out;
    return std::regex_search(screen, device0_rate);
  })) << screen;
  // It follows the processes: one gone is one row less.
  quiet->stop(SIGKILL);
  EXPECT_TRUE(eventually([&] {
    screen = tmux({"capture-pane", "-p", "-t", session}).out;
    return screen.find(" - 1 processes") != std::string::npos;
  })) << screen;
  tmux({"send-keys", "-t", session, "q"});
  EXPECT_TRUE(eventually([&] { return tmux({"has-session", "-t", session}).status != 0; })) << "q quits top";
  tmux({"kill-server"});
}

}  // namespace
