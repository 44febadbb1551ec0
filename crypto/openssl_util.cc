#include "crypto/openssl_util.h"

#include <openssl/err.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace cloister::crypto::internal {

absl::Status OpenSslError(absl::StatusCode code, absl::string_view operation) {
  std::string reasons;
  char text[256];
  for (unsigned long error = ERR_get_error(); error != 0; error = ERR_get_error()) {
    ERR_error_string_n(error, text, sizeof(text));
    absl::StrAppend(&reasons, reasons.empty() ? "" : "; ", text);
  }
  if (reasons.empty()) reasons = "no reason given by the library";
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat("OpenSSL ", operation, " failed: ", reasons));
}

void ClearOpenSslErrors() { ERR_clear_error(); }

const EVP_MD* EvpMd(HashAlg alg) {
  switch (alg) {
    case HashAlg::kSha256:
      return EVP_sha256();
    case HashAlg::kSha384:
      return EVP_sha384();
    case HashAlg::kSha512:
      return EVP_sha512();
  }
  return EVP_sha256();
}

}  // namespace cloister::crypto::internal
