#include "attest/measurement.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "crypto/hash.h"

namespace cloister::attest {

absl::StatusOr<Bytes> MeasureFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string message =
        absl::StrCat("cannot open ", path, " to measure it: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  crypto::Hasher hasher(crypto::HashAlg::kSha384);
  Bytes buffer(1 << 16);
  while (true) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    hasher.Update(ByteSpan(buffer.data(), static_cast<size_t>(n)));
  }
  ::close(fd);
  return hasher.Finish();
}

}  // namespace cloister::attest
