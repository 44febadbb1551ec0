#include "proto/checkpoint_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "nlohmann/json.hpp"
#include "proto/model_package.h"

namespace cloister::package {
namespace {

constexpr char kNeeds[] =
    "a checkpoint folder holds config.json, tokenizer.json and model.safetensors (or its shards "
    "with model.safetensors.index.json)";

std::string JoinPath(const std::string& dir, std::string_view name) {
  return !dir.empty() && dir.back() == '/' ? absl::StrCat(dir, std::string(name))
                                           : absl::StrCat(dir, "/", std::string(name));
}

std::string LinkRefused(const std::string& path) {
  return absl::StrCat(path,
                      " is a symbolic link: copy the file itself into the folder (links are not "
                      "followed)");
}

// model.safetensors or a shard name.
bool IsWeightsName(std::string_view name) {
  return IsAllowedMemberName(name) && name.ends_with(".safetensors");
}

// The shards `index_path` names (the values of its "weight_map"), each once.
absl::StatusOr<std::set<std::string>> ShardsOfIndex(const std::string& index_path) {
  ASSIGN_OR_RETURN(std::string text, ReadCheckpointFile(index_path, kMaxSafetensorsIndexSize));
  nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, " is not valid JSON"));
  }
  if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, " has no \"weight_map\" object (tensor name -> shard file)"));
  }
  std::set<std::string> shards;
  for (const auto& [tensor, file] : root["weight_map"].items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": the weight_map entry of '",
                                                     absl::CHexEscape(tensor),
                                                     "' is not a file name"));
    }
    const std::string& shard = file.get_ref<const std::string&>();
    if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, " names a shard outside the folder: ", absl::CHexEscape(shard)));
    }
    if (!IsWeightsName(shard) || shard == kSafetensors) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, " names '", absl::CHexEscape(shard),
                       "', which is not a shard name (model-NNNNN-of-MMMMM.safetensors)"));
    }
    shards.insert(shard);
  }
  return shards;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ListCheckpointDir(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> listing(::opendir(dir.c_str()), ::closedir);
  if (listing == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read model folder ", dir, ": ",
                                                   std::strerror(errno), " (", kNeeds, ")"));
  }
  std::map<std::string, std::string> files;
  bool has_weights = false;
  while (dirent* entry = ::readdir(listing.get())) {
    std::string name = entry->d_name;
    if (!IsAllowedMemberName(name)) continue;
    std::string path = JoinPath(dir, name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (S_ISLNK(st.st_mode)) return absl::InvalidArgumentError(LinkRefused(path));
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
    }
    has_weights = has_weights || IsWeightsName(name);
    files.emplace(std::move(name), std::move(path));
  }
  for (std::string_view required : {kConfig, kTokenizer}) {
    if (!files.contains(std::string(required))) {
      return absl::InvalidArgumentError(
          absl::StrCat("model folder ", dir, " has no ", std::string(required), " (", kNeeds, ")"));
    }
  }
  if (auto index = files.find(std::string(kSafetensorsIndex)); index != files.end()) {
    ASSIGN_OR_RETURN(std::set<std::string> shards, ShardsOfIndex(index->second));
    for (const std::string& shard : shards) {
      if (!files.contains(shard)) {
        return absl::InvalidArgumentError(absl::StrCat("model folder ", dir, " has no ", shard,
                                                       ", a shard ", std::string(kSafetensorsIndex),
                                                       " names"));
      }
    }
  }
  if (!has_weights) {
    return absl::InvalidArgumentError(
        absl::StrCat("model folder ", dir, " has no safetensors weights (", kNeeds, ")"));
  }
  return files;
}

absl::StatusOr<std::string> ReadCheckpointFile(const std::string& path, uint64_t max_size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ELOOP) return absl::InvalidArgumentError(LinkRefused(path));
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
  if (static_cast<uint64_t>(st.st_size) > max_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds ", st.st_size, " bytes, over the limit of ", max_size));
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

absl::StatusOr<Bytes> PackCheckpointDir(const std::string& dir, uint64_t max_size) {
  ASSIGN_OR_RETURN(auto files, ListCheckpointDir(dir));
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
    ASSIGN_OR_RETURN(contents[name], ReadCheckpointFile(path, max_size));
  }
  PackageMembers members;
  for (const auto& [name, data] : contents) members.emplace(name, AsBytes(data));
  absl::StatusOr<Bytes> packed = PackModel(members);
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

}  // namespace cloister::package
