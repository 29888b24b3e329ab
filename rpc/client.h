// gmemctl's side of the gmem.v1 API: one channel to gmemd's socket, calls
// with a deadline, and the mapping of gRPC errors to gmemctl's exit codes.
#pragma once

#include <grpcpp/channel.h>

#include <memory>
#include <string>

#include "rpc/gmem.grpc.pb.h"

namespace gmem::rpc {

// gmemctl's exit codes (README and --help list them).
enum ExitCode : int {
  exit_ok = 0,
  exit_failure = 1,      // gmemd answered with an error other than those below
  exit_usage = 2,        // the command line is wrong
  exit_no_daemon = 3,    // no gmemd answers on the socket
  exit_no_process = 4,   // no such process under gmem (or not visible to you)
  exit_refused = 5,      // gmemd refused you (another user's daemon)
};

class Client {
 public:
  // `target`: a socket path, or a gRPC target such as ipv4:127.0.0.1:PORT.
  explicit Client(const std::string& target);
  v1::Gmem::Stub& stub() { return *stub_; }
  const std::string& target() const { return target_; }
  // A context with the usual deadline for unary calls.
  std::unique_ptr<grpc::ClientContext> context() const;

  // Prints what went wrong (with what to do about it) and returns the exit code.
  int report(const grpc::Status& status) const;
  // Whether a gmemd answers Health within `seconds`; with `wait_for_ready`,
  // one that is starting up gets until then to come up.
  bool answers(double seconds, bool wait_for_ready = false);

 private:
  std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Gmem::Stub> stub_;
};

// A message as one line of JSON (proto3 JSON mapping, field names as in gmem.proto).
std::string to_json(const google::protobuf::Message& message);

}  // namespace gmem::rpc
