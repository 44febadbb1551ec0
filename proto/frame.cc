#include "proto/frame.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace cloister::boundary {
namespace {

absl::Status WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("boundary write failed: ", std::strerror(errno)));
    }
    data += n;
    size -= n;
  }
  return absl::OkStatus();
}

// Returns bytes read (< size only at end of stream).
absl::StatusOr<size_t> ReadAll(int fd, char* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, data + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("boundary read failed: ", std::strerror(errno)));
    }
    if (n == 0) break;
    done += n;
  }
  return done;
}

}  // namespace

absl::Status WriteFrame(int fd, const std::string& payload) {
  if (payload.size() > kMaxFrameSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("boundary frame of ", payload.size(), " bytes exceeds ", kMaxFrameSize));
  }
  uint32_t size = static_cast<uint32_t>(payload.size());
  char header[4] = {static_cast<char>(size), static_cast<char>(size >> 8),
                    static_cast<char>(size >> 16), static_cast<char>(size >> 24)};
  std::string frame;
  frame.reserve(4 + payload.size());
  frame.append(header, 4);
  frame.append(payload);
  return WriteAll(fd, frame.data(), frame.size());
}

absl::StatusOr<std::string> ReadFrame(int fd, uint32_t max_size) {
  unsigned char header[4];
  auto got = ReadAll(fd, reinterpret_cast<char*>(header), 4);
  if (!got.ok()) return got.status();
  if (*got == 0) return absl::OutOfRangeError("connection closed");
  if (*got < 4) return absl::DataLossError("truncated boundary frame header");
  uint32_t size = header[0] | header[1] << 8 | header[2] << 16 | uint32_t{header[3]} << 24;
  if (size > max_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("boundary frame of ", size, " bytes exceeds the limit of ", max_size));
  }
  std::string payload(size, '\0');
  got = ReadAll(fd, payload.data(), size);
  if (!got.ok()) return got.status();
  if (*got < size) return absl::DataLossError("truncated boundary frame");
  return payload;
}

}  // namespace cloister::boundary
