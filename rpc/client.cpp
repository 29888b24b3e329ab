// Channel set-up, error reporting and JSON output for gmemctl.
#include "rpc/client.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstdio>

namespace gmem::rpc {

Client::Client(const std::string& target) : target_(target) {
  std::string uri = target.find(':') != std::string::npos && target.rfind('/', 0) != 0 ? target : "unix:" + target;
  // gmemctl run starts gmemd and then waits for it: reconnect quickly, not
  // after gRPC's default backoff of a second and more. Not the minimum
  // backoff: gRPC also takes it as the time a connection attempt may take
  // (at least 0.1 s), and a busy gmemd can take longer to answer.
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 250);
  channel_ = grpc::CreateCustomChannel(uri, grpc::InsecureChannelCredentials(), arguments);
  stub_ = v1::Gmem::NewStub(channel_);
}

std::unique_ptr<grpc::ClientContext> Client::context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return context;
}

bool Client::answers(double seconds, bool wait_for_ready) {
  grpc::ClientContext context;
  context.set_wait_for_ready(wait_for_ready);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  v1::HealthRequest request;
  v1::HealthResponse response;
  return stub_->Health(&context, request, &response).ok();
}

int Client::report(const grpc::Status& status) const {
  switch (status.error_code()) {
    case grpc::StatusCode::OK: return exit_ok;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      fprintf(stderr,
              "gmemctl: no gmemd answers on %s (%s).\n"
              "  Start one:  gmemctl daemon &     (or: gmemd --socket %s &)\n"
              "  or run your job with `gmemctl run -- CMD`, which starts one.\n",
              target_.c_str(), status.error_message().c_str(), target_.c_str());
      return exit_no_daemon;
    case grpc::StatusCode::NOT_FOUND:
      fprintf(stderr, "gmemctl: %s (see `gmemctl ps`)\n", status.error_message().c_str());
      return exit_no_process;
    case grpc::StatusCode::PERMISSION_DENIED:
      fprintf(stderr, "gmemctl: refused: %s\n", status.error_message().c_str());
      return exit_refused;
    case grpc::StatusCode::INVALID_ARGUMENT:
      fprintf(stderr, "gmemctl: %s\n", status.error_message().c_str());
      return exit_usage;
    default:
      fprintf(stderr, "gmemctl: gmemd says: %s\n", status.error_message().c_str());
      return exit_failure;
  }
}

std::string to_json(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  options.always_print_enums_as_ints = false;
  std::string out;
  google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

}  // namespace gmem::rpc
