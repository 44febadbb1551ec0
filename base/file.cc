#include "base/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace cloister {

absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_size) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", st.st_size, " bytes, more than the limit of ", max_size));
  }
  std::string data;
  data.resize(st.st_size);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += n;
  }
  ::close(fd);
  data.resize(done);
  return data;
}

absl::Status WriteFileAtomic(const std::string& path, std::string_view data, int mode) {
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(err)));
    }
    done += n;
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot flush ", tmp, ": ", std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& path, int mode) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", path, ": ", ec.message()));
  ::chmod(path.c_str(), mode);
  return absl::OkStatus();
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace cloister
