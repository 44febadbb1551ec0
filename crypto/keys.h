// X25519 key agreement and Ed25519 signatures (libsodium, with OpenSSL where noted).
// Thread-safe: pure functions; key pairs are plain values.
#pragma once

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"

namespace cloister::crypto {

inline constexpr size_t kX25519KeySize = 32;
inline constexpr size_t kEd25519PublicKeySize = 32;
inline constexpr size_t kEd25519SeedSize = 32;
inline constexpr size_t kEd25519SignatureSize = 64;

struct X25519KeyPair {
  SecretBytes private_key;  // 32 bytes, unclamped as stored
  Bytes public_key;         // 32 bytes
};
X25519KeyPair GenerateX25519();
absl::StatusOr<X25519KeyPair> X25519FromPrivate(ByteSpan private_key);
// X25519(private, peer). InvalidArgument for a wrong-size key or an all-zero shared secret
// (a low-order peer key).
absl::StatusOr<SecretBytes> X25519(ByteSpan private_key, ByteSpan peer_public_key);

struct Ed25519KeyPair {
  SecretBytes seed;   // 32 bytes: the private key as stored in files
  Bytes public_key;   // 32 bytes
};
Ed25519KeyPair GenerateEd25519();
absl::StatusOr<Ed25519KeyPair> Ed25519FromSeed(ByteSpan seed);
// Signs with the key derived from the 32-byte seed.
absl::StatusOr<Bytes> Ed25519Sign(ByteSpan seed, ByteSpan message);
// OK, or PermissionDenied("signature does not verify") / InvalidArgument for bad sizes.
// Strict: rejects non-canonical encodings and small-order keys as RFC 8032 and libsodium do.
absl::Status Ed25519Verify(ByteSpan public_key, ByteSpan message, ByteSpan signature);

}  // namespace cloister::crypto
