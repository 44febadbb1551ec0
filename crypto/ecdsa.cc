#include "crypto/ecdsa.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "crypto/openssl_util.h"

namespace cloister::crypto {
namespace {

using internal::EvpMdCtxPtr;
using internal::EvpPkeyCtxPtr;
using internal::EvpPkeyPtr;
using internal::OpenSslError;

struct BioDeleter {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct EcdsaSigDeleter {
  void operator()(ECDSA_SIG* p) const { ECDSA_SIG_free(p); }
};
struct BnDeleter {
  void operator()(BIGNUM* p) const { BN_free(p); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using EcdsaSigPtr = std::unique_ptr<ECDSA_SIG, EcdsaSigDeleter>;
using BnPtr = std::unique_ptr<BIGNUM, BnDeleter>;

struct CurveInfo {
  const char* name;        // for messages
  const char* group_name;  // OpenSSL's name
  int nid;
  size_t scalar_size;  // bytes of r, s and each point coordinate
};

CurveInfo Info(EcCurve curve) {
  if (curve == EcCurve::kP384) return {"P-384", "secp384r1", NID_secp384r1, 48};
  return {"P-256", "prime256v1", NID_X9_62_prime256v1, 32};
}

// The named curve of an EC key, or an error if the key is not an EC key on P-256 or P-384.
absl::StatusOr<EcCurve> CurveOf(const EVP_PKEY* pkey) {
  if (!EVP_PKEY_is_a(pkey, "EC")) {
    return absl::InvalidArgumentError(absl::StrCat("key is not an elliptic-curve key (it is ",
                                                   EVP_PKEY_get0_type_name(pkey), ")"));
  }
  char group[64] = {};
  size_t group_size = 0;
  if (EVP_PKEY_get_group_name(pkey, group, sizeof(group), &group_size) != 1) {
    return OpenSslError(absl::StatusCode::kInvalidArgument,
                        "EVP_PKEY_get_group_name (the key must use a named curve)");
  }
  const int nid = OBJ_sn2nid(group);
  if (nid == NID_X9_62_prime256v1) return EcCurve::kP256;
  if (nid == NID_secp384r1) return EcCurve::kP384;
  return absl::InvalidArgumentError(
      absl::StrCat("EC key is on curve ", group, "; only P-256 and P-384 are supported"));
}

// Parses a DER SubjectPublicKeyInfo or an uncompressed point on `curve`, checking that the
// point is on the curve and the key is on the expected curve.
absl::StatusOr<EvpPkeyPtr> ParsePublicKey(EcCurve curve, ByteSpan public_key) {
  const CurveInfo info = Info(curve);
  internal::ClearOpenSslErrors();
  EvpPkeyPtr pkey;
  if (public_key.size() == 1 + 2 * info.scalar_size && public_key[0] == 0x04) {
    EvpPkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_name(nullptr, "EC", nullptr));
    if (ctx == nullptr || EVP_PKEY_fromdata_init(ctx.get()) != 1) {
      return OpenSslError(absl::StatusCode::kInternal, "EVP_PKEY_fromdata_init(EC)");
    }
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME,
                                         const_cast<char*>(info.group_name), 0),
        OSSL_PARAM_construct_octet_string(
            OSSL_PKEY_PARAM_PUB_KEY, const_cast<uint8_t*>(public_key.data()), public_key.size()),
        OSSL_PARAM_construct_end()};
    EVP_PKEY* raw = nullptr;
    if (EVP_PKEY_fromdata(ctx.get(), &raw, EVP_PKEY_PUBLIC_KEY, params) != 1) {
      return OpenSslError(
          absl::StatusCode::kInvalidArgument,
          absl::StrCat("EVP_PKEY_fromdata (", info.name, " public point is not on the curve)"));
    }
    pkey.reset(raw);
  } else if (!public_key.empty() && public_key[0] == 0x30) {
    const unsigned char* cursor = public_key.data();
    pkey.reset(d2i_PUBKEY(nullptr, &cursor, static_cast<long>(public_key.size())));
    if (pkey == nullptr) {
      return OpenSslError(absl::StatusCode::kInvalidArgument,
                          "d2i_PUBKEY (public key is not a valid DER SubjectPublicKeyInfo)");
    }
    if (cursor != public_key.data() + public_key.size()) {
      return absl::InvalidArgumentError("DER public key has trailing bytes");
    }
    ASSIGN_OR_RETURN(EcCurve actual, CurveOf(pkey.get()));
    if (actual != curve) {
      return absl::InvalidArgumentError(
          absl::StrCat("public key is on ", Info(actual).name, ", expected ", info.name));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        info.name, " public key must be a DER SubjectPublicKeyInfo or an uncompressed point of ",
        1 + 2 * info.scalar_size, " bytes; got ", public_key.size(), " bytes"));
  }
  EvpPkeyCtxPtr check(EVP_PKEY_CTX_new_from_pkey(nullptr, pkey.get(), nullptr));
  if (check == nullptr || EVP_PKEY_public_check_quick(check.get()) != 1) {
    return OpenSslError(absl::StatusCode::kInvalidArgument,
                        absl::StrCat("EVP_PKEY_public_check_quick (", info.name,
                                     " public key is not a valid point)"));
  }
  return pkey;
}

// Verifies a DER-encoded signature that is already known to be canonical.
absl::Status VerifyDerSignature(const EVP_PKEY* pkey, HashAlg hash, ByteSpan message,
                                ByteSpan der) {
  EvpMdCtxPtr ctx(EVP_MD_CTX_new());
  if (ctx == nullptr) return OpenSslError(absl::StatusCode::kInternal, "EVP_MD_CTX_new");
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, internal::EvpMd(hash), nullptr,
                           const_cast<EVP_PKEY*>(pkey)) != 1) {
    return OpenSslError(absl::StatusCode::kInternal, "EVP_DigestVerifyInit(ECDSA)");
  }
  const int result =
      EVP_DigestVerify(ctx.get(), der.data(), der.size(), message.data(), message.size());
  if (result == 1) return absl::OkStatus();
  internal::ClearOpenSslErrors();
  return absl::PermissionDeniedError("ECDSA signature does not verify");
}

absl::StatusOr<Bytes> EncodeDer(const ECDSA_SIG* sig) {
  unsigned char* der = nullptr;
  const int der_size = i2d_ECDSA_SIG(sig, &der);
  if (der_size <= 0) return OpenSslError(absl::StatusCode::kInternal, "i2d_ECDSA_SIG");
  Bytes out(der, der + der_size);
  OPENSSL_free(der);
  return out;
}

int PemNoPassword(char*, int, int, void*) { return -1; }

}  // namespace

absl::Status EcdsaVerifyP1363(EcCurve curve, HashAlg hash, ByteSpan public_key, ByteSpan message,
                              ByteSpan signature) {
  const CurveInfo info = Info(curve);
  if (signature.size() != 2 * info.scalar_size) {
    return absl::InvalidArgumentError(absl::StrCat(info.name, " P1363 signature must be ",
                                                   2 * info.scalar_size, " bytes, got ",
                                                   signature.size()));
  }
  ASSIGN_OR_RETURN(EvpPkeyPtr pkey, ParsePublicKey(curve, public_key));
  BnPtr r(BN_bin2bn(signature.data(), static_cast<int>(info.scalar_size), nullptr));
  BnPtr s(
      BN_bin2bn(signature.data() + info.scalar_size, static_cast<int>(info.scalar_size), nullptr));
  EcdsaSigPtr sig(ECDSA_SIG_new());
  if (r == nullptr || s == nullptr || sig == nullptr ||
      ECDSA_SIG_set0(sig.get(), r.get(), s.get()) != 1) {
    return OpenSslError(absl::StatusCode::kInternal, "ECDSA_SIG_set0");
  }
  r.release();  // owned by sig now
  s.release();
  ASSIGN_OR_RETURN(Bytes der, EncodeDer(sig.get()));
  return VerifyDerSignature(pkey.get(), hash, message, der);
}

absl::Status EcdsaVerifyDer(EcCurve curve, HashAlg hash, ByteSpan public_key, ByteSpan message,
                            ByteSpan signature) {
  const CurveInfo info = Info(curve);
  // Strict DER: parse, re-encode, and require the same bytes. This refuses BER forms (long
  // lengths, leading zeros, indefinite lengths) and trailing data whatever the library does.
  const unsigned char* cursor = signature.data();
  EcdsaSigPtr sig(d2i_ECDSA_SIG(nullptr, &cursor, static_cast<long>(signature.size())));
  internal::ClearOpenSslErrors();
  if (sig == nullptr || cursor != signature.data() + signature.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(info.name, " ECDSA signature is not a DER SEQUENCE of two INTEGERs"));
  }
  ASSIGN_OR_RETURN(Bytes canonical, EncodeDer(sig.get()));
  if (canonical.size() != signature.size() ||
      !std::equal(canonical.begin(), canonical.end(), signature.begin())) {
    return absl::InvalidArgumentError(
        absl::StrCat(info.name, " ECDSA signature is not in canonical DER"));
  }
  ASSIGN_OR_RETURN(EvpPkeyPtr pkey, ParsePublicKey(curve, public_key));
  return VerifyDerSignature(pkey.get(), hash, message, signature);
}

absl::StatusOr<std::unique_ptr<EcPrivateKey>> EcPrivateKey::Generate(EcCurve curve) {
  internal::ClearOpenSslErrors();
  EVP_PKEY* pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", Info(curve).group_name);
  if (pkey == nullptr) {
    return OpenSslError(absl::StatusCode::kInternal,
                        absl::StrCat("EVP_PKEY_Q_keygen(", Info(curve).name, ")"));
  }
  return std::unique_ptr<EcPrivateKey>(new EcPrivateKey(pkey, curve));
}

absl::StatusOr<std::unique_ptr<EcPrivateKey>> EcPrivateKey::FromPem(std::string_view pem) {
  internal::ClearOpenSslErrors();
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return OpenSslError(absl::StatusCode::kInternal, "BIO_new_mem_buf");
  // No password callback: an encrypted PEM is refused instead of prompting on a terminal.
  EvpPkeyPtr pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, PemNoPassword, nullptr));
  if (pkey == nullptr) {
    return OpenSslError(absl::StatusCode::kInvalidArgument,
                        "PEM_read_bio_PrivateKey (expected an unencrypted PEM private key)");
  }
  ASSIGN_OR_RETURN(EcCurve curve, CurveOf(pkey.get()));
  return std::unique_ptr<EcPrivateKey>(new EcPrivateKey(pkey.release(), curve));
}

EcPrivateKey::~EcPrivateKey() { EVP_PKEY_free(static_cast<EVP_PKEY*>(pkey_)); }

std::string EcPrivateKey::ToPem() const {
  BioPtr bio(BIO_new(BIO_s_mem()));
  CLOISTER_CHECK(bio != nullptr);
  CLOISTER_CHECK(PEM_write_bio_PrivateKey(bio.get(), static_cast<EVP_PKEY*>(pkey_), nullptr,
                                          nullptr, 0, nullptr, nullptr) == 1);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  CLOISTER_CHECK(size > 0 && data != nullptr);
  return std::string(data, static_cast<size_t>(size));  // the BIO's buffer is wiped on free
}

Bytes EcPrivateKey::PublicKeyDer() const {
  unsigned char* der = nullptr;
  const int size = i2d_PUBKEY(static_cast<EVP_PKEY*>(pkey_), &der);
  CLOISTER_CHECK(size > 0);
  Bytes out(der, der + size);
  OPENSSL_free(der);
  return out;
}

absl::StatusOr<Bytes> EcPrivateKey::SignP1363(HashAlg hash, ByteSpan message) const {
  const CurveInfo info = Info(curve_);
  internal::ClearOpenSslErrors();
  EvpMdCtxPtr ctx(EVP_MD_CTX_new());
  if (ctx == nullptr || EVP_DigestSignInit(ctx.get(), nullptr, internal::EvpMd(hash), nullptr,
                                           static_cast<EVP_PKEY*>(pkey_)) != 1) {
    return OpenSslError(absl::StatusCode::kInternal, "EVP_DigestSignInit(ECDSA)");
  }
  size_t der_size = 0;
  if (EVP_DigestSign(ctx.get(), nullptr, &der_size, message.data(), message.size()) != 1) {
    return OpenSslError(absl::StatusCode::kInternal, "EVP_DigestSign(size)");
  }
  Bytes der(der_size);
  if (EVP_DigestSign(ctx.get(), der.data(), &der_size, message.data(), message.size()) != 1) {
    return OpenSslError(absl::StatusCode::kInternal, "EVP_DigestSign");
  }
  const unsigned char* cursor = der.data();
  EcdsaSigPtr sig(d2i_ECDSA_SIG(nullptr, &cursor, static_cast<long>(der_size)));
  if (sig == nullptr) return OpenSslError(absl::StatusCode::kInternal, "d2i_ECDSA_SIG");
  Bytes out(2 * info.scalar_size);
  const int n = static_cast<int>(info.scalar_size);
  if (BN_bn2binpad(ECDSA_SIG_get0_r(sig.get()), out.data(), n) != n ||
      BN_bn2binpad(ECDSA_SIG_get0_s(sig.get()), out.data() + n, n) != n) {
    return OpenSslError(absl::StatusCode::kInternal, "BN_bn2binpad(ECDSA r, s)");
  }
  return out;
}

}  // namespace cloister::crypto
