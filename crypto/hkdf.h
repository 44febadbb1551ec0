// HKDF (RFC 5869), Extract and Expand as separate steps, over OpenSSL's HMAC (EVP_MAC).
// Every derived value is returned as SecretBytes, and intermediate blocks are wiped.
// Thread-safe: pure functions.
#pragma once

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"
#include "crypto/hash.h"

namespace cloister::crypto {

// PRK = HMAC-Hash(salt, ikm); an empty salt means HashSize zero bytes.
SecretBytes HkdfExtract(HashAlg alg, ByteSpan salt, ByteSpan ikm);
// OKM of `length` bytes; InvalidArgument if length > 255 * HashSize or the PRK is shorter
// than HashSize.
absl::StatusOr<SecretBytes> HkdfExpand(HashAlg alg, ByteSpan prk, ByteSpan info, size_t length);
// HKDF-Expand with `key` used directly as the PRK, whatever its size (not empty). For formats
// that skip Extract on a uniformly random key shorter than the hash: C2SP chunked encryption
// expands its 32-byte input key with HKDF-SHA-512. InvalidArgument for an empty key or a
// length over 255 * HashSize.
absl::StatusOr<SecretBytes> HkdfExpandWithKey(HashAlg alg, ByteSpan key, ByteSpan info,
                                              size_t length);
// Extract then Expand.
absl::StatusOr<SecretBytes> Hkdf(HashAlg alg, ByteSpan salt, ByteSpan ikm, ByteSpan info,
                                 size_t length);

}  // namespace cloister::crypto
