// The enclave side of the host <-> enclave boundary: reads frames from the host's socket,
// parses each once into a HostToEnclave (this is the only code that touches host bytes),
// runs it on a small pool of threads so a long batch does not hold up other calls, and
// writes each reply as one frame with the call's id. A call answered by a stream (GenerateCall)
// returns no reply from the handler: its frames go out later through the FrameSink the handler
// was given, from whatever thread makes them.
//
// Thread-safe: Serve() owns the socket; frames are written under a mutex.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cloister/boundary/v1/boundary.pb.h"

namespace cloister::enclave {

// Where a streamed call writes its frames. Thread-safe; frames written after the boundary
// closed are dropped (the host that would read them is gone).
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  virtual void Write(const boundary::v1::EnclaveToHost& frame) = 0;
};

// Takes each call by value (the handler may open sealed requests in place in it). Returns the
// call's reply, or nothing when the call's frames go out through `sink` (which the handler may
// keep for as long as it likes).
using CallHandler = std::function<std::optional<boundary::v1::EnclaveToHost>(
    boundary::v1::HostToEnclave, const std::shared_ptr<FrameSink>& sink)>;

// Parses one frame from the host. InvalidArgument for bytes that are not a HostToEnclave.
absl::StatusOr<boundary::v1::HostToEnclave> ParseHostFrame(absl::string_view frame);

// Serves calls on `fd` until the host closes it (returns OK) or the socket fails.
absl::Status ServeBoundary(int fd, const CallHandler& handler, int threads);

}  // namespace cloister::enclave
