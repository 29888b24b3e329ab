// The gmemd test fixture: a gmemd on a temporary socket and stats directory
// (swept every 0.2 s, at most 64 watchers, metrics on a free port), and the
// helpers that drive gmemctl against it and read its JSON.
#pragma once

#include <google/protobuf/util/json_util.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "processes.h"
#include "rpc/gmem.grpc.pb.h"

namespace gmem::test {

namespace fs = std::filesystem;
namespace v1 = gmem::v1;
using namespace std::chrono_literals;

inline const std::string gmemd = GMEMD_PATH, gmemctl = GMEMCTL_PATH, publisher = FAKE_PUBLISHER_PATH;

template <typename Message>
Message parse(const std::string& json) {
  Message message;
  auto status = google::protobuf::util::JsonStringToMessage(json, &message);
  EXPECT_TRUE(status.ok()) << json;
  return message;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Waits up to `limit` for `done` to hold.
template <typename Condition>
bool eventually(Condition done, std::chrono::milliseconds limit = 10s) {
  for (auto end = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < end;) {
    if (done()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return done();
}

// The Health answer of the gmemd on `socket` (as one gmemctl run started,
// for the test to stop it); false where none answers.
inline bool health_of(const std::string& socket, v1::HealthResponse* health) {
  grpc::ClientContext context;
  auto stub = v1::Gmem::NewStub(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  return stub->Health(&context, {}, health).ok();
}

class Gmemd : public testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/gmem-gmemd-XXXXXX";
    root_ = mkdtemp(path);
    chmod(root_.c_str(), 0755);  // tests that switch uid reach their own subfolders
    stats_ = root_ + "/stats";
    fs::create_directory(stats_);
    socket_ = root_ + "/gmemd.sock";
    log_ = root_ + "/gmemd.log";
    daemon_ = start_daemon(socket_, stats_, log_, {});
  }
  void TearDown() override {
    if (daemon_) {
      EXPECT_EQ(daemon_->stop(SIGTERM), 0) << slurp(log_);
      EXPECT_FALSE(fs::exists(socket_)) << "gmemd leaves no socket behind";
    }
    fs::remove_all(root_);
  }

  static std::unique_ptr<Background> start_daemon(const std::string& socket, const std::string& stats,
                                                  const std::string& log, std::vector<std::string> extra,
                                                  std::vector<std::string> prefix = {}) {
    std::vector<std::string> argv = prefix;
    argv.insert(argv.end(), {gmemd, "--socket", socket, "--stats-dir", stats, "--sweep-interval", "0.2",
                             "--metrics", "127.0.0.1:0", "--max-watchers", "64"});
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto daemon = std::make_unique<Background>(argv, log);
    bool up = eventually([&] { return slurp(log).find("gmemd: serving") != std::string::npos; });
    EXPECT_TRUE(up) << slurp(log);
    return daemon;
  }

  std::unique_ptr<v1::Gmem::Stub> stub() {
    return v1::Gmem::NewStub(grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
  }
  Finished ctl(std::vector<std::string> args, std::vector<std::string> prefix = {}) {
    std::vector<std::string> argv = prefix;
    argv.insert(argv.end(), {gmemctl, "--socket", socket_});
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv);
  }
  std::unique_ptr<Background> publish(int devices, int allocations) {
    auto p = std::make_unique<Background>(
        std::vector<std::string>{publisher, stats_, std::to_string(devices), std::to_string(allocations)});
    EXPECT_EQ(p->read_line(), "ready " + std::to_string(p->pid()));
    return p;
  }
  std::string pid_of(const Background& b) { return std::to_string(b.pid()); }
  // GET /metrics from the gmemd whose log is `log` (it names the port): the
  // whole reply, or a failure recorded and "".
  static std::string scrape(const std::string& log) {
    std::smatch port;
    const std::string said = slurp(log);
    if (!std::regex_search(said, port, std::regex("metrics on port (\\d+)"))) {
      ADD_FAILURE() << "no metrics port in: " << said;
      return "";
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(std::stoi(port[1])));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string reply;
    const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) reply.append(buffer, static_cast<size_t>(n));
    }
    close(fd);
    EXPECT_EQ(reply.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << reply;
    return reply;
  }

  std::string root_, stats_, socket_, log_;
  std::unique_ptr<Background> daemon_;
};

}  // namespace gmem::test
