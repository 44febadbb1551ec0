// Starting cloisterd's gRPC server: one listening address, the callback service, message size
// limits that fit a sealed call and an upload chunk, and the transport credentials (plaintext by
// default; TLS from host/config/tenant_tls.h).
// Thread-safe: a free function; the returned server is grpc::Server (thread-safe).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/support/server_interceptor.h"

namespace cloister::host {

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port (the real one when the address asked for port 0)
};

// Listens on `listen` (HOST:PORT) and serves `service`, which must outlive the server.
// `credentials` nullptr: plaintext. Unavailable if the address cannot be bound (or the
// credentials cannot be used). `interceptors` see every call (the request metrics).
absl::StatusOr<RunningServer> StartGrpcServer(
    grpc::Service* service, const std::string& listen, int max_message_size,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr,
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors = {});

}  // namespace cloister::host
