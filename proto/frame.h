// Framing for the host <-> enclave boundary: each frame is a 4-byte little-endian length
// followed by that many bytes (one serialized boundary message). Used by the host's
// EnclaveClient and the enclave's boundary; both sides refuse frames over kMaxFrameSize.
// Thread-safe as far as the file descriptor is: callers serialize writes on one fd.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"

namespace cloister::boundary {

inline constexpr uint32_t kMaxFrameSize = 512u << 20;  // 512 MiB: the largest model upload

// Writes one frame; handles partial writes and EINTR. Unavailable if the peer is gone.
// Writes the 4-byte length and the payload with one gather write (no copy of the payload).
absl::Status WriteFrame(int fd, const std::string& payload);
// Writes `message` serialized as one frame without first copying it into one buffer: the small
// fields go through small buffers, and every bytes or string field too large for the current
// one (a sealed request, a model) is written straight from the message's own storage
// (protobuf's aliasing output), all with gather writes. Saves a copy and a zero-filled buffer of
// the message's size. The message must not change until this returns. InvalidArgument for a
// message over kMaxFrameSize (nothing written), Unavailable if the peer is gone.
absl::Status WriteMessageFrame(int fd, const google::protobuf::MessageLite& message);
// Reads one frame. OutOfRange("connection closed") on a clean end of stream between frames,
// DataLoss on a truncated frame, InvalidArgument for a frame over `max_size`.
absl::StatusOr<std::string> ReadFrame(int fd, uint32_t max_size = kMaxFrameSize);
// The same into `buffer`, which a reader keeps from frame to frame: the result views the
// frame's bytes at its start (valid until the next call). The buffer grows to the largest frame
// and is reused, so a stream of large frames costs no allocation, page faults or zeroing per
// frame; after a frame over kFrameBufferKeepLimit it is given back. Same errors as ReadFrame.
inline constexpr size_t kFrameBufferKeepLimit = size_t{16} << 20;
absl::StatusOr<absl::string_view> ReadFrameInto(int fd, std::string& buffer,
                                                uint32_t max_size = kMaxFrameSize);

}  // namespace cloister::boundary
