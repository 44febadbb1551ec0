// Starting cloisterd's gRPC server: one listening address, the callback service, message size
// limits that fit a sealed call and an upload chunk. Plaintext transport for now (tenant data
// is sealed end to end regardless); TLS settings arrive with the operator config schema.
// Thread-safe: a free function; the returned server is grpc::Server (thread-safe).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"

namespace cloister::host {

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port (the real one when the address asked for port 0)
};

// Listens on `listen` (HOST:PORT) and serves `service`, which must outlive the server.
// Unavailable if the address cannot be bound.
absl::StatusOr<RunningServer> StartGrpcServer(grpc::Service* service, const std::string& listen,
                                              int max_message_size);

}  // namespace cloister::host
