// Hashes and MACs (SHA-2 family, HMAC) over OpenSSL. Thread-safe: pure functions.
#pragma once

#include "base/bytes.h"

namespace cloister::crypto {

enum class HashAlg { kSha256, kSha384, kSha512 };

size_t HashSize(HashAlg alg);
Bytes Hash(HashAlg alg, ByteSpan data);
inline Bytes Sha256(ByteSpan data) { return Hash(HashAlg::kSha256, data); }
inline Bytes Sha384(ByteSpan data) { return Hash(HashAlg::kSha384, data); }
inline Bytes Sha512(ByteSpan data) { return Hash(HashAlg::kSha512, data); }

// Incremental hashing for streams (models, files).
class Hasher {
 public:
  explicit Hasher(HashAlg alg);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void Update(ByteSpan data);
  Bytes Finish();

 private:
  void* ctx_;  // EVP_MD_CTX*
};

Bytes Hmac(HashAlg alg, ByteSpan key, ByteSpan data);

}  // namespace cloister::crypto
