// BlobStore: where cloisterd keeps tenants' encrypted models at rest. The host never sees a
// model's plaintext or its key: it stores the ciphertext streamed by the SDK, the model key
// wrapped by the enclave's sealing key, and a small metadata record, so that a restarted enclave
// with the same measurement can reload every model without the tenant.
//
// An upload is staged in a BlobUpload and becomes visible (listed, reloaded on restart) only
// when Commit() succeeds, which the server does only after the enclave accepted the model.
// Dropping an uncommitted BlobUpload removes everything it wrote.
//
// Threading: BlobStore methods are thread-safe. A BlobUpload has one owner at a time and is not
// thread-safe. Implementations: FileBlobStore (file_blob_store.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace cloister::host {

// The largest wrapped model key the store accepts (the enclave's are well under 1 KiB).
inline constexpr uint64_t kMaxWrappedKeySize = 64 << 10;

// What the host knows about one stored model.
struct StoredModel {
  std::string tenant_id;
  std::string handle;
  uint64_t ciphertext_size = 0;
  std::string ciphertext_sha256;  // lowercase hex, computed by the host while receiving
  absl::Time stored_at;
};

class BlobUpload {
 public:
  virtual ~BlobUpload() = default;

  // Appends ciphertext. Internal on a write error (the upload is then unusable).
  virtual absl::Status Append(absl::string_view data) = 0;
  // Bytes appended so far.
  virtual uint64_t size() const = 0;
  // The whole ciphertext appended so far, read back from where it was staged.
  virtual absl::StatusOr<std::string> ReadAll() = 0;
  // Stores the staged ciphertext with the enclave's wrapped model key and the metadata, replacing
  // any model stored under the same tenant and handle. On error nothing of this upload remains.
  virtual absl::Status Commit(absl::string_view wrapped_model_key) = 0;
};

class BlobStore {
 public:
  virtual ~BlobStore() = default;

  // Starts staging a model for `tenant_id` (a valid tenant id) and `handle` (a valid handle).
  virtual absl::StatusOr<std::unique_ptr<BlobUpload>> BeginUpload(absl::string_view tenant_id,
                                                                  absl::string_view handle) = 0;
  // Every complete stored model, sorted by tenant then handle. Incomplete or unreadable entries
  // are skipped with a log line.
  virtual absl::StatusOr<std::vector<StoredModel>> List() = 0;
  // The stored ciphertext and wrapped key; NotFound if the model is not stored.
  virtual absl::StatusOr<std::string> ReadCiphertext(absl::string_view tenant_id,
                                                     absl::string_view handle) = 0;
  virtual absl::StatusOr<std::string> ReadWrappedKey(absl::string_view tenant_id,
                                                     absl::string_view handle) = 0;
  // Removes a stored model (metadata first, so a crash midway leaves nothing listed). OK if the
  // model is not stored.
  virtual absl::Status Delete(absl::string_view tenant_id, absl::string_view handle) = 0;
};

}  // namespace cloister::host
