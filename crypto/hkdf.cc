#include "crypto/hkdf.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "crypto/openssl_util.h"

namespace cloister::crypto {
namespace {

using internal::EvpMacCtxPtr;
using internal::OpenSslError;

// HMAC under one key over OpenSSL's EVP_MAC: the key is set once, and every Compute re-runs
// HMAC with it (RFC 5869 calls HMAC under the PRK once per output block).
class KeyedHmac {
 public:
  static absl::StatusOr<KeyedHmac> Create(HashAlg alg, ByteSpan key) {
    static EVP_MAC* const mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    if (mac == nullptr) return OpenSslError(absl::StatusCode::kInternal, "EVP_MAC_fetch(HMAC)");
    internal::ClearOpenSslErrors();
    EvpMacCtxPtr ctx(EVP_MAC_CTX_new(mac));
    if (ctx == nullptr) return OpenSslError(absl::StatusCode::kInternal, "EVP_MAC_CTX_new");
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(
            OSSL_MAC_PARAM_DIGEST, const_cast<char*>(EVP_MD_get0_name(internal::EvpMd(alg))), 0),
        OSSL_PARAM_construct_end()};
    // A zero-length key is legal for HMAC (RFC 2104 pads it with zeros), but OpenSSL reads a
    // null key pointer as "keep the previous key", so pass a valid pointer in every case.
    static const uint8_t kNoKey = 0;
    if (EVP_MAC_init(ctx.get(), key.empty() ? &kNoKey : key.data(), key.size(), params) != 1) {
      return OpenSslError(absl::StatusCode::kInternal, "EVP_MAC_init(HMAC)");
    }
    return KeyedHmac(std::move(ctx), HashSize(alg));
  }

  // Writes HMAC(key, parts[0] || parts[1] || ...) to `out` (HashSize bytes).
  absl::Status Compute(std::initializer_list<ByteSpan> parts, std::span<uint8_t> out) {
    CLOISTER_CHECK(out.size() == size_);
    if (!first_ && EVP_MAC_init(ctx_.get(), nullptr, 0, nullptr) != 1) {
      return OpenSslError(absl::StatusCode::kInternal, "EVP_MAC_init(HMAC, same key)");
    }
    first_ = false;
    for (ByteSpan part : parts) {
      if (!part.empty() && EVP_MAC_update(ctx_.get(), part.data(), part.size()) != 1) {
        return OpenSslError(absl::StatusCode::kInternal, "EVP_MAC_update(HMAC)");
      }
    }
    size_t written = 0;
    if (EVP_MAC_final(ctx_.get(), out.data(), &written, out.size()) != 1 || written != size_) {
      return OpenSslError(absl::StatusCode::kInternal, "EVP_MAC_final(HMAC)");
    }
    return absl::OkStatus();
  }

 private:
  KeyedHmac(EvpMacCtxPtr ctx, size_t size) : ctx_(std::move(ctx)), size_(size) {}
  EvpMacCtxPtr ctx_;
  size_t size_;
  bool first_ = true;
};

absl::StatusOr<SecretBytes> Expand(HashAlg alg, ByteSpan prk, ByteSpan info, size_t length) {
  const size_t block_size = HashSize(alg);
  if (length > 255 * block_size) {
    return absl::InvalidArgumentError(absl::StrCat("HKDF-Expand output of ", length,
                                                   " bytes exceeds the limit of 255 * ", block_size,
                                                   " bytes"));
  }
  if (length == 0) return SecretBytes();
  ASSIGN_OR_RETURN(KeyedHmac hmac, KeyedHmac::Create(alg, prk));
  const size_t block_count = (length + block_size - 1) / block_size;
  SecretBytes blocks(block_count * block_size);
  for (size_t i = 1; i <= block_count; ++i) {
    const uint8_t counter = static_cast<uint8_t>(i);
    ByteSpan previous =
        i == 1 ? ByteSpan() : blocks.span().subspan((i - 2) * block_size, block_size);
    RETURN_IF_ERROR(hmac.Compute({previous, info, ByteSpan(&counter, 1)},
                                 blocks.mutable_span().subspan((i - 1) * block_size, block_size)));
  }
  return SecretBytes(blocks.span().first(length));
}

}  // namespace

SecretBytes HkdfExtract(HashAlg alg, ByteSpan salt, ByteSpan ikm) {
  // HMAC pads a short key with zeros, so an empty salt is the same as HashSize zero bytes.
  absl::StatusOr<KeyedHmac> hmac = KeyedHmac::Create(alg, salt);
  CLOISTER_CHECK(hmac.ok());
  SecretBytes prk(HashSize(alg));
  CLOISTER_CHECK(hmac->Compute({ikm}, prk.mutable_span()).ok());
  return prk;
}

absl::StatusOr<SecretBytes> HkdfExpand(HashAlg alg, ByteSpan prk, ByteSpan info, size_t length) {
  if (prk.size() < HashSize(alg)) {
    return absl::InvalidArgumentError(absl::StrCat("HKDF-Expand PRK of ", prk.size(),
                                                   " bytes is shorter than the hash output (",
                                                   HashSize(alg), " bytes)"));
  }
  return Expand(alg, prk, info, length);
}

absl::StatusOr<SecretBytes> HkdfExpandWithKey(HashAlg alg, ByteSpan key, ByteSpan info,
                                              size_t length) {
  if (key.empty()) return absl::InvalidArgumentError("HKDF-Expand key is empty");
  return Expand(alg, key, info, length);
}

absl::StatusOr<SecretBytes> Hkdf(HashAlg alg, ByteSpan salt, ByteSpan ikm, ByteSpan info,
                                 size_t length) {
  SecretBytes prk = HkdfExtract(alg, salt, ikm);
  return HkdfExpand(alg, prk.span(), info, length);
}

}  // namespace cloister::crypto
