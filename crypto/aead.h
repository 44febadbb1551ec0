// AEADs with 96-bit nonces and 128-bit tags appended to the ciphertext (RFC 5116 layout):
// AES-128-GCM and AES-256-GCM over OpenSSL, ChaCha20-Poly1305 (IETF) over libsodium.
// Any other nonce or tag size is refused by the API before any crypto runs.
// An Aead object holds its key; Seal/Open are const and safe to call from several threads.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"

namespace cloister::crypto {

enum class AeadAlg { kAes128Gcm, kAes256Gcm, kChaCha20Poly1305 };

inline constexpr size_t kAeadNonceSize = 12;
inline constexpr size_t kAeadTagSize = 16;
size_t AeadKeySize(AeadAlg alg);

class Aead {
 public:
  // InvalidArgument if the key size does not match the algorithm.
  static absl::StatusOr<std::unique_ptr<Aead>> Create(AeadAlg alg, ByteSpan key);
  virtual ~Aead() = default;

  // Returns ciphertext || tag.
  virtual absl::StatusOr<Bytes> Seal(ByteSpan nonce, ByteSpan aad, ByteSpan plaintext) const = 0;
  // Writes ciphertext || tag (plaintext.size() + 16 bytes) into `out`; no allocation.
  virtual absl::Status SealInto(ByteSpan nonce, ByteSpan aad, ByteSpan plaintext,
                                std::span<uint8_t> out) const = 0;
  // Returns the plaintext, or a DataLoss/InvalidArgument error when authentication fails
  // ("authentication failed") or the input is shorter than a tag.
  virtual absl::StatusOr<Bytes> Open(ByteSpan nonce, ByteSpan aad, ByteSpan ciphertext) const = 0;
  // Writes the plaintext (ciphertext.size() - 16 bytes) into `out`; on failure `out` is wiped.
  virtual absl::Status OpenInto(ByteSpan nonce, ByteSpan aad, ByteSpan ciphertext,
                                std::span<uint8_t> out) const = 0;
  virtual AeadAlg alg() const = 0;
};

}  // namespace cloister::crypto
