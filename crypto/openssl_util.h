// Internal to crypto/: the one place that turns OpenSSL's error queue into absl::Status, plus
// RAII owners for the OpenSSL objects the wrappers use. Not part of the public contract; code
// outside crypto/ never includes this file.
// Thread-safe: OpenSSL's error queue is per thread, and the helpers hold no state.
#pragma once

#include <openssl/evp.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "crypto/hash.h"

namespace cloister::crypto::internal {

// Drains this thread's OpenSSL error queue into a status of `code` whose message names the
// operation that failed and the library's reasons, e.g.
// "OpenSSL EVP_DigestVerifyInit failed: error:...:unsupported". Always returns a non-OK status.
absl::Status OpenSslError(absl::StatusCode code, absl::string_view operation);

// Forgets errors left by earlier calls on this thread, so a later OpenSslError reports only
// the reasons of the call that failed.
void ClearOpenSslErrors();

// The message digest for `alg` (a built-in, never null).
const EVP_MD* EvpMd(HashAlg alg);

struct EvpPkeyDeleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct EvpPkeyCtxDeleter {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct EvpMdCtxDeleter {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
struct EvpCipherCtxDeleter {
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};
struct EvpMacCtxDeleter {
  void operator()(EVP_MAC_CTX* p) const { EVP_MAC_CTX_free(p); }
};
using EvpPkeyPtr = std::unique_ptr<EVP_PKEY, EvpPkeyDeleter>;
using EvpPkeyCtxPtr = std::unique_ptr<EVP_PKEY_CTX, EvpPkeyCtxDeleter>;
using EvpMdCtxPtr = std::unique_ptr<EVP_MD_CTX, EvpMdCtxDeleter>;
using EvpCipherCtxPtr = std::unique_ptr<EVP_CIPHER_CTX, EvpCipherCtxDeleter>;
using EvpMacCtxPtr = std::unique_ptr<EVP_MAC_CTX, EvpMacCtxDeleter>;

}  // namespace cloister::crypto::internal
