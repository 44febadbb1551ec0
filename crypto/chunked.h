// C2SP chunked encryption, Cobblestone-256 (HKDF-SHA-512 + AES-256-GCM, 16 KiB chunks, key
// commitment), used for model files. Spec: shared/specs/chunked-encryption.md.
// Encryptor and decryptor are streaming, not thread-safe, one owner at a time.
// The decryptor releases only authenticated chunks; its errors are sticky.
// Errors: InvalidArgument for a key, salt or nonce of the wrong size (before any crypto);
// DataLoss for a header that does not match the key and context, a chunk that does not
// authenticate, or a truncated message; FailedPrecondition for a call after Finish; OutOfRange
// past 2^38 chunks.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"

namespace cloister::crypto {

inline constexpr size_t kChunkedKeySize = 32;
inline constexpr size_t kChunkedSaltSize = 24;
inline constexpr size_t kChunkedHeaderSize = 56;
inline constexpr size_t kChunkedPlainChunkSize = 16384;
inline constexpr size_t kChunkedCipherChunkSize = 16400;

// Size of the ciphertext for a plaintext of `plaintext_size` bytes (header included).
uint64_t ChunkedCiphertextSize(uint64_t plaintext_size);

class ChunkedEncryptor {
 public:
  // InvalidArgument unless the key is exactly 32 bytes. `salt_for_test` (24 bytes) replaces
  // the random salt in known-answer tests only.
  static absl::StatusOr<std::unique_ptr<ChunkedEncryptor>> Create(ByteSpan key, ByteSpan context,
                                                                  ByteSpan salt_for_test = {});
  ~ChunkedEncryptor();
  // Appends ciphertext to `out` (the header on the first call, then each full chunk).
  absl::Status Update(ByteSpan plaintext, Bytes& out);
  // Seals the final short (possibly empty) chunk; Update/Finish fail afterwards.
  absl::Status Finish(Bytes& out);

 private:
  ChunkedEncryptor() = default;
  struct State;
  std::unique_ptr<State> state_;
};

class ChunkedDecryptor {
 public:
  static absl::StatusOr<std::unique_ptr<ChunkedDecryptor>> Create(ByteSpan key, ByteSpan context);
  // Raw mode (no header): caller supplies the AEAD key (32) and base nonce (12).
  static absl::StatusOr<std::unique_ptr<ChunkedDecryptor>> CreateRaw(ByteSpan aead_key,
                                                                     ByteSpan base_nonce);
  ~ChunkedDecryptor();
  // Consumes ciphertext; appends plaintext of every chunk that authenticated to `out`.
  // A chunk is only released once it is known whether it is full or final, so a chunk of
  // 16400 bytes is released at once and a short one only at Finish. Errors are sticky.
  absl::Status Update(ByteSpan ciphertext, std::vector<uint8_t>& out);
  // Checks that the message ended with a valid short final chunk; releases its plaintext.
  absl::Status Finish(std::vector<uint8_t>& out);

 private:
  ChunkedDecryptor() = default;
  struct State;
  std::unique_ptr<State> state_;
};

// One-shot helpers.
absl::StatusOr<Bytes> ChunkedEncrypt(ByteSpan key, ByteSpan context, ByteSpan plaintext);
absl::StatusOr<Bytes> ChunkedDecrypt(ByteSpan key, ByteSpan context, ByteSpan ciphertext);

// For the known-answer tests: the per-message AEAD key and base nonce derived from the key,
// salt and context (spec section 3).
absl::StatusOr<std::pair<SecretBytes, Bytes>> ChunkedDeriveForTest(ByteSpan key, ByteSpan salt,
                                                                   ByteSpan context);

}  // namespace cloister::crypto
