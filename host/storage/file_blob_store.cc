#include "host/storage/file_blob_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "crypto/random.h"
#include "host/common/ids.h"
#include "host/common/std_string_view.h"
#include "proto/frame.h"
#include "yaml-cpp/yaml.h"

namespace cloister::host {
namespace {

constexpr char kTempMarker[] = ".tmp";

std::string ErrnoMessage(absl::string_view what, const std::string& path, int err) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(err));
}

absl::Status RemoveIfPresent(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
  return absl::InternalError(ErrnoMessage("cannot remove", path, errno));
}

absl::Status SyncFolder(const std::string& folder) {
  int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(ErrnoMessage("cannot open", folder, errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return absl::InternalError(ErrnoMessage("cannot sync", folder, err));
  return absl::OkStatus();
}

std::string MetaText(const StoredModel& model) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "format" << YAML::Value << 1;
  out << YAML::Key << "tenant" << YAML::Value << model.tenant_id;
  out << YAML::Key << "handle" << YAML::Value << model.handle;
  out << YAML::Key << "ciphertext_size" << YAML::Value << model.ciphertext_size;
  out << YAML::Key << "ciphertext_sha256" << YAML::Value << model.ciphertext_sha256;
  out << YAML::Key << "stored_at" << YAML::Value
      << absl::FormatTime(absl::RFC3339_sec, model.stored_at, absl::UTCTimeZone());
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

absl::StatusOr<StoredModel> ParseMeta(const std::string& path, const std::string& text) {
  StoredModel model;
  try {
    YAML::Node root = YAML::Load(text);
    if (!root.IsMap()) return absl::DataLossError(absl::StrCat(path, ": not a YAML map"));
    for (const char* field :
         {"format", "tenant", "handle", "ciphertext_size", "ciphertext_sha256", "stored_at"}) {
      if (!root[field] || !root[field].IsScalar()) {
        return absl::DataLossError(absl::StrCat(path, ": missing field ", field));
      }
    }
    if (root["format"].Scalar() != "1") {
      return absl::DataLossError(
          absl::StrCat(path, ": unsupported format ", root["format"].Scalar()));
    }
    model.tenant_id = root["tenant"].Scalar();
    model.handle = root["handle"].Scalar();
    model.ciphertext_sha256 = root["ciphertext_sha256"].Scalar();
    if (!absl::SimpleAtoi(root["ciphertext_size"].Scalar(), &model.ciphertext_size)) {
      return absl::DataLossError(absl::StrCat(path, ": ciphertext_size is not a number"));
    }
    std::string error;
    if (!absl::ParseTime(absl::RFC3339_full, root["stored_at"].Scalar(), &model.stored_at,
                         &error)) {
      return absl::DataLossError(absl::StrCat(path, ": stored_at: ", error));
    }
  } catch (const YAML::Exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": ", e.what()));
  }
  return model;
}

class FileBlobUpload : public BlobUpload {
 public:
  FileBlobUpload(std::string folder, std::string stem, std::string temp_path, int fd,
                 StoredModel model)
      : folder_(std::move(folder)),
        stem_(std::move(stem)),
        temp_path_(std::move(temp_path)),
        fd_(fd),
        model_(std::move(model)),
        hasher_(crypto::HashAlg::kSha256) {}

  ~FileBlobUpload() override {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_path_.c_str());
  }

  absl::Status Append(absl::string_view data) override {
    if (fd_ < 0) return absl::FailedPreconditionError("upload is no longer open");
    const char* next = data.data();
    size_t left = data.size();
    while (left > 0) {
      ssize_t n = ::write(fd_, next, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int err = n < 0 ? errno : EIO;
        ::close(fd_);
        fd_ = -1;
        return absl::InternalError(ErrnoMessage("cannot write", temp_path_, err));
      }
      next += n;
      left -= n;
    }
    hasher_.Update(AsBytes(ToStd(data)));
    size_ += data.size();
    return absl::OkStatus();
  }

  uint64_t size() const override { return size_; }

  absl::StatusOr<std::string> ReadAll() override {
    if (fd_ < 0) return absl::FailedPreconditionError("upload is no longer open");
    ASSIGN_OR_RETURN(std::string data, ReadFile(temp_path_, size_));
    if (data.size() != size_) {
      return absl::DataLossError(absl::StrCat("staged model ", temp_path_, " holds ", data.size(),
                                              " bytes, expected ", size_));
    }
    return data;
  }

  absl::Status Commit(absl::string_view wrapped_model_key) override {
    if (fd_ < 0) return absl::FailedPreconditionError("upload is no longer open");
    if (wrapped_model_key.empty() || wrapped_model_key.size() > kMaxWrappedKeySize) {
      return absl::InvalidArgumentError(
          absl::StrCat("wrapped model key of ", wrapped_model_key.size(), " bytes"));
    }
    int rc = ::fsync(fd_);
    int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (rc != 0) return absl::InternalError(ErrnoMessage("cannot sync", temp_path_, err));

    model_.ciphertext_size = size_;
    model_.ciphertext_sha256 = HexEncode(hasher_.Finish());
    model_.stored_at = absl::Now();
    std::string blob_path = stem_ + ".blob";
    std::string key_path = stem_ + ".key";
    std::string meta_path = stem_ + ".meta";
    // The meta file is the commit marker: drop any old one first so that a crash in the middle
    // of replacing a model leaves nothing listed rather than a mismatched pair.
    RETURN_IF_ERROR(RemoveIfPresent(meta_path));
    absl::Status status;
    if (::rename(temp_path_.c_str(), blob_path.c_str()) != 0) {
      status = absl::InternalError(ErrnoMessage("cannot rename into place", temp_path_, errno));
    }
    if (status.ok()) status = WriteFileAtomic(key_path, ToStd(wrapped_model_key), 0600);
    if (status.ok()) status = WriteFileAtomic(meta_path, MetaText(model_), 0600);
    if (status.ok()) status = SyncFolder(folder_);
    if (!status.ok()) {
      ::unlink(temp_path_.c_str());
      ::unlink(meta_path.c_str());
      ::unlink(key_path.c_str());
      ::unlink(blob_path.c_str());
      return status;
    }
    committed_ = true;
    return absl::OkStatus();
  }

 private:
  const std::string folder_;
  const std::string stem_;
  const std::string temp_path_;
  int fd_;
  StoredModel model_;
  crypto::Hasher hasher_;
  uint64_t size_ = 0;
  bool committed_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FileBlobStore>> FileBlobStore::Open(std::string root_dir) {
  RETURN_IF_ERROR(MakeDirs(root_dir, 0700));
  std::error_code ec;
  for (const auto& tenant_dir : std::filesystem::directory_iterator(root_dir, ec)) {
    if (!tenant_dir.is_directory()) continue;
    std::error_code inner_ec;
    for (const auto& entry : std::filesystem::directory_iterator(tenant_dir.path(), inner_ec)) {
      std::string name = entry.path().filename().string();
      if (absl::StrContains(name, kTempMarker)) {
        Log(LogLevel::kInfo, "removed_stale_upload", {{"path", entry.path().string()}});
        std::filesystem::remove(entry.path(), inner_ec);
      }
    }
  }
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot list ", root_dir, ": ", ec.message()));
  }
  return std::unique_ptr<FileBlobStore>(new FileBlobStore(std::move(root_dir)));
}

absl::StatusOr<std::string> FileBlobStore::PathStem(absl::string_view tenant_id,
                                                    absl::string_view handle) const {
  RETURN_IF_ERROR(CheckTenantId(tenant_id));
  RETURN_IF_ERROR(CheckModelHandle(handle));
  return absl::StrCat(root_dir_, "/", tenant_id, "/", handle);
}

absl::StatusOr<std::unique_ptr<BlobUpload>> FileBlobStore::BeginUpload(absl::string_view tenant_id,
                                                                       absl::string_view handle) {
  ASSIGN_OR_RETURN(std::string stem, PathStem(tenant_id, handle));
  std::string folder = absl::StrCat(root_dir_, "/", tenant_id);
  RETURN_IF_ERROR(MakeDirs(folder, 0700));
  std::string temp_path =
      absl::StrCat(stem, ".blob", kTempMarker, "-", HexEncode(crypto::RandomBytes(8)));
  int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(ErrnoMessage("cannot create", temp_path, errno));
  StoredModel model;
  model.tenant_id = std::string(tenant_id);
  model.handle = std::string(handle);
  return std::make_unique<FileBlobUpload>(std::move(folder), std::move(stem), std::move(temp_path),
                                          fd, std::move(model));
}

absl::StatusOr<std::vector<StoredModel>> FileBlobStore::List() {
  std::vector<StoredModel> models;
  std::error_code ec;
  for (const auto& tenant_dir : std::filesystem::directory_iterator(root_dir_, ec)) {
    std::string tenant_id = tenant_dir.path().filename().string();
    if (!tenant_dir.is_directory() || !IsValidTenantId(tenant_id)) continue;
    std::error_code inner_ec;
    for (const auto& entry : std::filesystem::directory_iterator(tenant_dir.path(), inner_ec)) {
      std::string name = entry.path().filename().string();
      if (!absl::EndsWith(name, ".meta")) continue;
      std::string handle = name.substr(0, name.size() - 5);
      std::string meta_path = entry.path().string();
      auto skip = [&](const std::string& why) {
        Log(LogLevel::kWarning, "stored_model_skipped",
            {{"tenant", tenant_id}, {"handle", handle}, {"reason", why}});
      };
      if (!IsValidModelHandle(handle)) {
        skip("file name is not a model handle");
        continue;
      }
      absl::StatusOr<std::string> text = ReadFile(meta_path, 64 << 10);
      if (!text.ok()) {
        skip(text.status().ToString());
        continue;
      }
      absl::StatusOr<StoredModel> model = ParseMeta(meta_path, *text);
      if (!model.ok()) {
        skip(model.status().ToString());
        continue;
      }
      if (model->tenant_id != tenant_id || model->handle != handle) {
        skip("metadata names a different tenant or handle");
        continue;
      }
      std::string stem = absl::StrCat(root_dir_, "/", tenant_id, "/", handle);
      struct stat blob_stat;
      if (::stat((stem + ".blob").c_str(), &blob_stat) != 0) {
        skip("ciphertext file is missing");
        continue;
      }
      if (static_cast<uint64_t>(blob_stat.st_size) != model->ciphertext_size) {
        skip(absl::StrCat("ciphertext file holds ", blob_stat.st_size, " bytes, metadata says ",
                          model->ciphertext_size));
        continue;
      }
      if (!FileExists(stem + ".key")) {
        skip("wrapped key file is missing");
        continue;
      }
      models.push_back(*std::move(model));
    }
    if (inner_ec) {
      return absl::InternalError(
          absl::StrCat("cannot list ", tenant_dir.path().string(), ": ", inner_ec.message()));
    }
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", root_dir_, ": ", ec.message()));
  std::sort(models.begin(), models.end(), [](const StoredModel& a, const StoredModel& b) {
    return std::tie(a.tenant_id, a.handle) < std::tie(b.tenant_id, b.handle);
  });
  return models;
}

absl::StatusOr<std::string> FileBlobStore::ReadCiphertext(absl::string_view tenant_id,
                                                          absl::string_view handle) {
  ASSIGN_OR_RETURN(std::string stem, PathStem(tenant_id, handle));
  return ReadFile(stem + ".blob", boundary::kMaxFrameSize);
}

absl::StatusOr<std::string> FileBlobStore::ReadWrappedKey(absl::string_view tenant_id,
                                                          absl::string_view handle) {
  ASSIGN_OR_RETURN(std::string stem, PathStem(tenant_id, handle));
  return ReadFile(stem + ".key", kMaxWrappedKeySize);
}

absl::Status FileBlobStore::Delete(absl::string_view tenant_id, absl::string_view handle) {
  ASSIGN_OR_RETURN(std::string stem, PathStem(tenant_id, handle));
  RETURN_IF_ERROR(RemoveIfPresent(stem + ".meta"));
  RETURN_IF_ERROR(RemoveIfPresent(stem + ".key"));
  RETURN_IF_ERROR(RemoveIfPresent(stem + ".blob"));
  std::string folder = absl::StrCat(root_dir_, "/", tenant_id);
  if (FileExists(folder)) RETURN_IF_ERROR(SyncFolder(folder));
  return absl::OkStatus();
}

}  // namespace cloister::host
