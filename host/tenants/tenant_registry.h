// TenantRegistry: who may use cloisterd's queues. Each tenant has an id and the SHA-256 of its
// API token; a request is admitted when SHA-256(presented token) equals the stored hash,
// compared in constant time (PROTOCOL.md section 1). The token grants nothing inside the
// enclave: it is for admission and accounting only.
//
// Threading: Authenticate() reads an immutable snapshot and is safe from any thread without
// blocking writers; Replace() builds a new snapshot and swaps it in atomically.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/bytes.h"

namespace cloister::host {

struct TenantCredential {
  std::string tenant_id;
  Bytes token_sha256;  // 32 bytes; empty: the tenant has no token (mutual TLS only)
};

// The development tenant created when no tenants are configured.
inline constexpr char kDevTenantId[] = "demo";

class TenantRegistry {
 public:
  // InvalidArgument for a bad tenant id, a hash that is neither empty nor 32 bytes or a
  // duplicate id.
  static absl::StatusOr<std::unique_ptr<TenantRegistry>> Create(
      std::vector<TenantCredential> tenants);

  // Replaces the whole tenant set; on error the current set stays.
  absl::Status Replace(std::vector<TenantCredential> tenants);

  // OK if `tenant_id` is known and SHA-256(`token`) matches its hash; otherwise
  // UNAUTHENTICATED "unknown tenant or wrong API token" (the same for both, on purpose).
  absl::Status Authenticate(absl::string_view tenant_id, absl::string_view token) const;

  size_t tenant_count() const;

 private:
  using Snapshot = absl::flat_hash_map<std::string, Bytes>;
  explicit TenantRegistry(std::shared_ptr<const Snapshot> snapshot);
  static absl::StatusOr<std::shared_ptr<const Snapshot>> Build(
      std::vector<TenantCredential> tenants);

  std::atomic<std::shared_ptr<const Snapshot>> snapshot_;
};

// SHA-256 of a token, as stored in the registry and in configs (hex there).
Bytes TokenHash(absl::string_view token);

// The development tenant's token: read from `token_path` if it exists (64 hex characters, file
// mode without group/other bits), otherwise 32 random bytes, hex-encoded, written there with
// mode 0600. Errors name the file.
absl::StatusOr<std::string> LoadOrCreateDevToken(const std::string& token_path);

}  // namespace cloister::host
