#include "sdk/model_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "proto/model_package.h"

namespace cloister::sdk {
namespace {

constexpr std::string_view kNeeds =
    "a checkpoint folder holds config.json, tokenizer.json and model.safetensors (or its shards "
    "with model.safetensors.index.json)";

std::string JoinPath(const std::string& dir, const std::string& name) {
  return !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool IsSafetensors(const std::string& name) {
  return name.size() >= 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0;
}

// Reads the regular file `path` (opened without following a link) whole.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  char extra;
  if (done != data.size() || ::read(fd, &extra, 1) != 0) {
    return absl::AbortedError(absl::StrCat(path, " changed size while it was being read"));
  }
  return data;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ListModelDir(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> listing(::opendir(dir.c_str()), ::closedir);
  if (listing == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read model folder ", dir, ": ", std::strerror(errno)));
  }
  std::map<std::string, std::string> files;
  bool has_weights = false;
  while (dirent* entry = ::readdir(listing.get())) {
    std::string name = entry->d_name;
    if (!package::IsAllowedMemberName(name)) continue;
    std::string path = JoinPath(dir, name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (S_ISLNK(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path,
                       " is a symbolic link: copy the file itself into the folder (links are not "
                       "followed)"));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
    }
    has_weights = has_weights || IsSafetensors(name);
    files.emplace(std::move(name), std::move(path));
  }
  for (std::string_view required : {package::kConfig, package::kTokenizer}) {
    if (!files.contains(std::string(required))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model folder ", dir, " has no ", std::string(required), " (", std::string(kNeeds), ")"));
    }
  }
  if (!has_weights) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model folder ", dir, " has no safetensors weights (", std::string(kNeeds), ")"));
  }
  return files;
}

absl::StatusOr<Bytes> PackModelDir(const std::string& dir, uint64_t max_size) {
  ASSIGN_OR_RETURN(auto files, ListModelDir(dir));
  uint64_t total = 0;
  for (const auto& [name, path] : files) {
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
  }
  if (total > max_size) {
    return absl::InvalidArgumentError(absl::StrCat("model folder ", dir, " holds ", total,
                                                   " bytes of checkpoint files, over the limit of ",
                                                   max_size));
  }
  // The files' plaintext is wiped once packed, like the buffer of a file upload.
  std::map<std::string, std::string> contents;
  struct Wiper {
    std::map<std::string, std::string>& contents;
    ~Wiper() {
      for (auto& [name, data] : contents) SecureWipe(data.data(), data.size());
    }
  } wiper{contents};
  for (const auto& [name, path] : files) {
    ASSIGN_OR_RETURN(contents[name], ReadRegularFile(path));
  }
  package::PackageMembers members;
  for (const auto& [name, data] : contents) members.emplace(name, AsBytes(data));
  absl::StatusOr<Bytes> packed = package::PackModel(members);
  if (!packed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model folder ", dir, ": ", packed.status().message()));
  }
  if (packed->size() > max_size) {
    return absl::InvalidArgumentError(absl::StrCat("model folder ", dir, " packs to ",
                                                   packed->size(), " bytes, over the limit of ",
                                                   max_size));
  }
  return packed;
}

}  // namespace cloister::sdk
