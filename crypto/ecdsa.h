// ECDSA and P-curve key handling over OpenSSL, for attestation evidence (P-384/SHA-384 GPU
// reports and chains, P-256/SHA-256 TDX quotes) and the simulated TEE's signers.
// Thread-safe: pure functions; an EcPrivateKey owns an OpenSSL key and is immutable after
// creation, so it may be shared between threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "crypto/hash.h"

namespace cloister::crypto {

enum class EcCurve { kP256, kP384 };

// Verifies a raw r||s signature (IEEE P1363; exactly 2*32 or 2*48 bytes, else invalid).
// `public_key` is a DER SubjectPublicKeyInfo or an uncompressed point (0x04 || X || Y) on
// `curve`; the point must be on the curve. OK, PermissionDenied("... does not verify"), or
// InvalidArgument for a malformed key or signature encoding.
absl::Status EcdsaVerifyP1363(EcCurve curve, HashAlg hash, ByteSpan public_key, ByteSpan message,
                              ByteSpan signature);
// Verifies a strict DER signature (BER and non-canonical encodings are refused).
absl::Status EcdsaVerifyDer(EcCurve curve, HashAlg hash, ByteSpan public_key, ByteSpan message,
                            ByteSpan signature);

// A private key for signing (simulated TEE signers).
class EcPrivateKey {
 public:
  static absl::StatusOr<std::unique_ptr<EcPrivateKey>> Generate(EcCurve curve);
  static absl::StatusOr<std::unique_ptr<EcPrivateKey>> FromPem(std::string_view pem);
  ~EcPrivateKey();
  EcPrivateKey(const EcPrivateKey&) = delete;
  EcPrivateKey& operator=(const EcPrivateKey&) = delete;
  // Unencrypted PKCS#8 PEM ("-----BEGIN PRIVATE KEY-----"), as FromPem reads it.
  std::string ToPem() const;
  EcCurve curve() const { return curve_; }
  Bytes PublicKeyDer() const;  // SubjectPublicKeyInfo
  absl::StatusOr<Bytes> SignP1363(HashAlg hash, ByteSpan message) const;
  void* evp_pkey() const { return pkey_; }  // EVP_PKEY*, for X.509 code in attest/

 private:
  EcPrivateKey(void* pkey, EcCurve curve) : pkey_(pkey), curve_(curve) {}
  void* pkey_;
  EcCurve curve_;
};

}  // namespace cloister::crypto
