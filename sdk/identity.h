// The tenant identity key: an Ed25519 key pair that the tenant holds and that owns the
// tenant's models inside the enclave (DESIGN.md section 1). `cloister keygen` creates one;
// every session signs its handshake transcript with it.
//
// File format (text, three lines, mode 0600):
//   CLOISTER ED25519 PRIVATE KEY
//   <64 hex digits: the 32-byte seed>
//   public: <64 hex digits: the public key>
// Loading checks the header, both hex lines, that the public key matches the seed, and that
// the file is not readable or writable by group or others.
// Thread-safe: a TenantIdentity is immutable after construction; Sign is const and reentrant.
// Move-only, because it owns the secret seed.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"

namespace cloister::sdk {

inline constexpr std::string_view kIdentityKeyHeader = "CLOISTER ED25519 PRIVATE KEY";

class TenantIdentity {
 public:
  // A fresh random key.
  static TenantIdentity Generate();
  // From a 32-byte seed; InvalidArgument for a wrong size.
  static absl::StatusOr<TenantIdentity> FromSeed(ByteSpan seed);
  // Parses the text of a key file; `file_name` only names it in error messages.
  // InvalidArgument with a one-line reason for any deviation from the format.
  static absl::StatusOr<TenantIdentity> Parse(std::string_view text, std::string_view file_name);
  // Reads `path`: NotFound if missing, FailedPrecondition if group or others can access it
  // (the message says how to fix it), InvalidArgument if malformed.
  static absl::StatusOr<TenantIdentity> Load(const std::string& path);

  TenantIdentity(TenantIdentity&&) = default;
  TenantIdentity& operator=(TenantIdentity&&) = default;

  // The file contents described above.
  std::string Format() const;
  // Creates `path` with mode 0600 and writes the key, refusing to replace an existing file
  // (AlreadyExists). A partially written file is removed.
  absl::Status Save(const std::string& path) const;

  const Bytes& public_key() const { return public_key_; }
  std::string public_key_hex() const { return HexEncode(public_key_); }
  // Ed25519 signature over `message`.
  absl::StatusOr<Bytes> Sign(ByteSpan message) const;

 private:
  TenantIdentity(SecretBytes seed, Bytes public_key)
      : seed_(std::move(seed)), public_key_(std::move(public_key)) {}
  SecretBytes seed_;
  Bytes public_key_;
};

}  // namespace cloister::sdk
