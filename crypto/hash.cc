#include "crypto/hash.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "base/status.h"

namespace cloister::crypto {
namespace {
const EVP_MD* Md(HashAlg alg) {
  switch (alg) {
    case HashAlg::kSha256: return EVP_sha256();
    case HashAlg::kSha384: return EVP_sha384();
    case HashAlg::kSha512: return EVP_sha512();
  }
  return EVP_sha256();
}
}  // namespace

size_t HashSize(HashAlg alg) {
  switch (alg) {
    case HashAlg::kSha256: return 32;
    case HashAlg::kSha384: return 48;
    case HashAlg::kSha512: return 64;
  }
  return 32;
}

Bytes Hash(HashAlg alg, ByteSpan data) {
  Bytes out(HashSize(alg));
  unsigned int size = 0;
  CLOISTER_CHECK(EVP_Digest(data.data(), data.size(), out.data(), &size, Md(alg), nullptr) == 1);
  return out;
}

Hasher::Hasher(HashAlg alg) : ctx_(EVP_MD_CTX_new()) {
  CLOISTER_CHECK(ctx_ != nullptr);
  CLOISTER_CHECK(EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), Md(alg), nullptr) == 1);
}
Hasher::~Hasher() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }
void Hasher::Update(ByteSpan data) {
  CLOISTER_CHECK(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data.data(), data.size()) == 1);
}
Bytes Hasher::Finish() {
  Bytes out(EVP_MAX_MD_SIZE);
  unsigned int size = 0;
  CLOISTER_CHECK(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out.data(), &size) == 1);
  out.resize(size);
  return out;
}

Bytes Hmac(HashAlg alg, ByteSpan key, ByteSpan data) {
  Bytes out(EVP_MAX_MD_SIZE);
  unsigned int size = 0;
  static const uint8_t kEmpty = 0;
  CLOISTER_CHECK(HMAC(Md(alg), key.empty() ? &kEmpty : key.data(), static_cast<int>(key.size()),
                      data.data(), data.size(), out.data(), &size) != nullptr);
  out.resize(size);
  return out;
}

}  // namespace cloister::crypto
