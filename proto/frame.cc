#include "proto/frame.h"

#include <limits.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"

namespace cloister::boundary {
namespace {

// Writes every byte of `parts` (consumed as it goes), at most IOV_MAX of them per call;
// retries partial writes and EINTR.
absl::Status WriteAll(int fd, iovec* parts, int count) {
  while (count > 0) {
    const int batch = std::min(count, IOV_MAX);
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = static_cast<size_t>(batch);
    ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = ::writev(fd, parts, batch);
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

// The 4-byte little-endian length that starts a frame of `size` bytes; InvalidArgument over
// kMaxFrameSize.
using FrameHeader = std::array<char, 4>;
absl::StatusOr<FrameHeader> HeaderFor(size_t size) {
  if (size > kMaxFrameSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("boundary frame of ", size, " bytes exceeds ", kMaxFrameSize));
  }
  return FrameHeader{static_cast<char>(size), static_cast<char>(size >> 8),
                     static_cast<char>(size >> 16), static_cast<char>(size >> 24)};
}

// A serialization collected as pieces for one gather write: buffers of its own for the small
// fields, and the message's own storage for fields the output stream aliases.
class PiecesOutputStream final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  bool Next(void** data, int* size) override {
    blocks_.push_back(std::make_unique<char[]>(kBlockSize));
    last_block_ = pieces_.size();
    pieces_.push_back({blocks_.back().get(), kBlockSize});
    *data = blocks_.back().get();
    *size = static_cast<int>(kBlockSize);
    byte_count_ += kBlockSize;
    return true;
  }
  void BackUp(int count) override {
    pieces_[last_block_].iov_len -= static_cast<size_t>(count);
    byte_count_ -= count;
  }
  int64_t ByteCount() const override { return byte_count_; }
  bool AllowsAliasing() const override { return true; }
  bool WriteAliasedRaw(const void* data, int size) override {
    pieces_.push_back({const_cast<void*>(data), static_cast<size_t>(size)});
    byte_count_ += size;
    return true;
  }

  std::vector<iovec>& pieces() { return pieces_; }

 private:
  static constexpr size_t kBlockSize = 4096;
  std::vector<std::unique_ptr<char[]>> blocks_;
  std::vector<iovec> pieces_;
  size_t last_block_ = 0;
  int64_t byte_count_ = 0;
};

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
  ASSIGN_OR_RETURN(FrameHeader header, HeaderFor(payload.size()));
  iovec parts[2] = {{header.data(), header.size()},
                    {const_cast<char*>(payload.data()), payload.size()}};
  return WriteAll(fd, parts, payload.empty() ? 1 : 2);
}

absl::Status WriteMessageFrame(int fd, const google::protobuf::MessageLite& message) {
  const size_t size = message.ByteSizeLong();
  ASSIGN_OR_RETURN(FrameHeader header, HeaderFor(size));
  PiecesOutputStream pieces;
  pieces.pieces().push_back({header.data(), header.size()});
  {
    google::protobuf::io::CodedOutputStream coded(&pieces);
    coded.EnableAliasing(true);
    // ByteSizeLong above cached every sub-message's size for this serialization.
    message.SerializeWithCachedSizes(&coded);
    if (coded.HadError() || static_cast<size_t>(coded.ByteCount()) != size) {
      return absl::InternalError("boundary message changed while it was being serialized");
    }
  }  // the stream hands back the unused end of its last buffer here
  std::vector<iovec>& parts = pieces.pieces();
  return WriteAll(fd, parts.data(), static_cast<int>(parts.size()));
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
