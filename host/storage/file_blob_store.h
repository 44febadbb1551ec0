// FileBlobStore: the BlobStore on a local file system, one folder per tenant:
//
//   ROOT/<tenant>/<handle>.blob   the model ciphertext as the SDK sent it
//   ROOT/<tenant>/<handle>.key    the enclave's wrapped model key (opaque to the host)
//   ROOT/<tenant>/<handle>.meta   YAML: tenant, handle, ciphertext_size, ciphertext_sha256,
//   stored_at
//
// Uploads stream into ROOT/<tenant>/<handle>.blob.tmp-<random>; Commit renames the blob into
// place, then writes the key and finally the meta file (the commit marker) with
// WriteFileAtomic, and fsyncs the folder. Folders are 0700 and files 0600. Open() removes the
// temp files that a crash may have left behind.
// Threading and ownership: as BlobStore.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "host/storage/blob_store.h"

namespace cloister::host {

class FileBlobStore : public BlobStore {
 public:
  // Opens (creating it if needed) the store under `root_dir`.
  static absl::StatusOr<std::unique_ptr<FileBlobStore>> Open(std::string root_dir);

  absl::StatusOr<std::unique_ptr<BlobUpload>> BeginUpload(absl::string_view tenant_id,
                                                          absl::string_view handle) override;
  absl::StatusOr<std::vector<StoredModel>> List() override;
  absl::StatusOr<std::string> ReadCiphertext(absl::string_view tenant_id,
                                             absl::string_view handle) override;
  absl::StatusOr<std::string> ReadWrappedKey(absl::string_view tenant_id,
                                             absl::string_view handle) override;
  absl::Status Delete(absl::string_view tenant_id, absl::string_view handle) override;

  const std::string& root_dir() const { return root_dir_; }

 private:
  explicit FileBlobStore(std::string root_dir) : root_dir_(std::move(root_dir)) {}
  // ROOT/<tenant>/<handle> after checking both names.
  absl::StatusOr<std::string> PathStem(absl::string_view tenant_id, absl::string_view handle) const;

  const std::string root_dir_;
};

}  // namespace cloister::host
