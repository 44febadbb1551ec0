#include "sdk/model_dir.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "proto/checkpoint_dir.h"
#include "proto/model_package.h"

namespace cloister::sdk {

absl::StatusOr<std::map<std::string, std::string>> ListModelDir(const std::string& dir) {
  return package::ListCheckpointDir(dir);
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
    ASSIGN_OR_RETURN(contents[name], package::ReadCheckpointFile(path, max_size));
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
