// Framing for the host <-> enclave boundary: each frame is a 4-byte little-endian length
// followed by that many bytes (one serialized boundary message). Used by the host's
// EnclaveClient and the enclave's boundary; both sides refuse frames over kMaxFrameSize.
// Thread-safe as far as the file descriptor is: callers serialize writes on one fd.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace cloister::boundary {

inline constexpr uint32_t kMaxFrameSize = 512u << 20;  // 512 MiB: the largest model upload

// Writes one frame; handles partial writes and EINTR. Unavailable if the peer is gone.
absl::Status WriteFrame(int fd, const std::string& payload);
// Reads one frame. OutOfRange("connection closed") on a clean end of stream between frames,
// DataLoss on a truncated frame, InvalidArgument for a frame over `max_size`.
absl::StatusOr<std::string> ReadFrame(int fd, uint32_t max_size = kMaxFrameSize);

}  // namespace cloister::boundary
