#include "host/server/grpc_server.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace cloister::host {

absl::StatusOr<RunningServer> StartGrpcServer(
    grpc::Service* service, const std::string& listen, int max_message_size,
    std::shared_ptr<grpc::ServerCredentials> credentials,
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors) {
  grpc::ServerBuilder builder;
  RunningServer running;
  builder.AddListeningPort(
      listen, credentials != nullptr ? credentials : grpc::InsecureServerCredentials(),
      &running.port);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(max_message_size);
  builder.SetMaxSendMessageSize(max_message_size);
  if (!interceptors.empty()) builder.experimental().SetInterceptorCreators(std::move(interceptors));
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (address in use or not available?)"));
  }
  return running;
}

}  // namespace cloister::host
