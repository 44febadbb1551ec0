// The enclave side of the host <-> enclave boundary: reads frames from the host's socket,
// parses each once into a HostToEnclave (this is the only code that touches host bytes),
// runs it on a small pool of threads so a long batch does not hold up other calls, and
// writes each reply as one frame with the call's id.
//
// Thread-safe: Serve() owns the socket; replies are written under a mutex.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cloister/boundary/v1/boundary.pb.h"

namespace cloister::enclave {

// Takes each call by value (the handler may open sealed requests in place in it).
using CallHandler = std::function<boundary::v1::EnclaveToHost(boundary::v1::HostToEnclave)>;

// Parses one frame from the host. InvalidArgument for bytes that are not a HostToEnclave.
absl::StatusOr<boundary::v1::HostToEnclave> ParseHostFrame(absl::string_view frame);

// Serves calls on `fd` until the host closes it (returns OK) or the socket fails.
absl::Status ServeBoundary(int fd, const CallHandler& handler, int threads);

}  // namespace cloister::enclave
