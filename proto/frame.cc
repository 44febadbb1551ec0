#include "proto/frame.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cloister::boundary {
namespace {

// Writes every byte of `parts` (consumed as it goes); retries partial writes and EINTR.
absl::Status WriteAll(int fd, iovec* parts, int count) {
  while (count > 0) {
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = static_cast<size_t>(count);
    ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = ::writev(fd, parts, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("boundary write failed: ", std::strerror(errno)));
    }
    size_t written = static_cast<size_t>(n);
    while (count > 0 && written >= parts->iov_len) {
      written -= parts->iov_len;
      ++parts;
      --count;
    }
    if (count > 0) {
      parts->iov_base = static_cast<char*>(parts->iov_base) + written;
      parts->iov_len -= written;
    }
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
  iovec parts[2] = {{header, sizeof(header)},
                    {const_cast<char*>(payload.data()), payload.size()}};
  return WriteAll(fd, parts, payload.empty() ? 1 : 2);
}

absl::StatusOr<absl::string_view> ReadFrameInto(int fd, std::string& buffer, uint32_t max_size) {
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
  // A buffer left over-large by a big frame (a model upload) is not kept for small ones.
  if (buffer.size() > kFrameBufferKeepLimit && size <= kFrameBufferKeepLimit) {
    std::string().swap(buffer);
  }
  if (buffer.size() < size) buffer.resize(size);
  got = ReadAll(fd, buffer.data(), size);
  if (!got.ok()) return got.status();
  if (*got < size) return absl::DataLossError("truncated boundary frame");
  return absl::string_view(buffer.data(), size);
}

absl::StatusOr<std::string> ReadFrame(int fd, uint32_t max_size) {
  std::string buffer;
  ASSIGN_OR_RETURN(absl::string_view frame, ReadFrameInto(fd, buffer, max_size));
  buffer.resize(frame.size());
  return buffer;
}

}  // namespace cloister::boundary
