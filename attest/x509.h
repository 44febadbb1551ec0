// X.509 for attestation: the one wrapper over OpenSSL's certificate code in attest/. It parses
// PEM chains strictly, verifies a chain against exactly one pinned root at a given time (never a
// root the evidence supplies), verifies raw ECDSA signatures with a certificate's key, reads
// extensions (the TCG DICE FWID of GPU leaves, the AMD VCEK TCB and hwID), and issues
// certificates for the simulated TEE's roots. OpenSSL errors become absl::Status here.
// Thread-safe: Certificate is immutable after creation and may be shared; the functions hold no
// state.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/bytes.h"
#include "crypto/ecdsa.h"
#include "crypto/hash.h"

namespace cloister::attest {

// OID of the TCG DICE extension whose last 48 bytes are the firmware ID on Hopper GPU leaves.
inline constexpr std::string_view kTcgDiceFwidOid = "2.23.133.5.4.1";
inline constexpr size_t kFwidSize = 48;

struct CertificateTemplate;

class Certificate {
 public:
  // Exactly one PEM certificate (surrounding whitespace allowed).
  static absl::StatusOr<Certificate> FromPem(std::string_view pem);
  static absl::StatusOr<Certificate> FromDer(ByteSpan der);

  Certificate(const Certificate& other);
  Certificate& operator=(const Certificate& other);
  Certificate(Certificate&& other) noexcept;
  Certificate& operator=(Certificate&& other) noexcept;
  ~Certificate();

  std::string ToPem() const;
  Bytes ToDer() const;
  // The subject's and issuer's commonName, or "" when there is none.
  std::string SubjectCommonName() const;
  std::string IssuerCommonName() const;
  // The whole subject name in RFC 2253 form, for messages.
  std::string SubjectName() const;
  // Serial number as unsigned big-endian bytes and as a decimal string.
  Bytes SerialNumber() const;
  std::string SerialDecimal() const;
  absl::Time NotBefore() const;
  absl::Time NotAfter() const;
  // The subject public key as a DER SubjectPublicKeyInfo.
  Bytes PublicKeyDer() const;
  // The curve of an EC subject key; InvalidArgument for another key type or curve.
  absl::StatusOr<crypto::EcCurve> KeyCurve() const;
  bool IsCa() const;
  // The contents of the extension with this dotted OID: NotFound if absent, InvalidArgument if
  // it appears more than once.
  absl::StatusOr<Bytes> ExtensionValue(std::string_view oid) const;

  // The OpenSSL X509*, for code in this wrapper only.
  void* native() const { return x509_; }

 private:
  friend absl::StatusOr<std::vector<Certificate>> ParsePemChain(std::string_view, size_t);
  friend absl::StatusOr<Certificate> IssueCertificate(const CertificateTemplate&, ByteSpan,
                                                      const Certificate*,
                                                      const crypto::EcPrivateKey&);
  explicit Certificate(void* x509) : x509_(x509) {}  // takes ownership
  void* x509_;                                       // X509*, never null
};

// Parses concatenated PEM certificates (leaf first by convention). Only whitespace may
// surround and separate the blocks; InvalidArgument for anything else, no certificate, or more
// than `max_count`.
absl::StatusOr<std::vector<Certificate>> ParsePemChain(std::string_view pem, size_t max_count = 16);
std::string ChainToPem(const std::vector<Certificate>& chain);

// Verifies that chain[0] (the leaf; not a CA, and allowed digitalSignature when it has a
// keyUsage extension) chains through the other certificates to `trusted_root`, the only trust
// anchor, with every certificate valid at `at`. Self-signed certificates in `chain` are
// ignored, so a root sent with the evidence is never trusted. PermissionDenied naming the
// OpenSSL reason and the certificate that failed; InvalidArgument for an empty chain.
absl::Status VerifyChain(const std::vector<Certificate>& chain, const Certificate& trusted_root,
                         absl::Time at);

// Verifies a raw r || s ECDSA signature with the certificate's EC key (crypto/ecdsa.h
// semantics: PermissionDenied when it does not verify).
absl::Status VerifyP1363WithCertificate(const Certificate& signer, crypto::HashAlg hash,
                                        ByteSpan message, ByteSpan signature);

// The firmware ID of a GPU leaf: the last 48 bytes of its TCG DICE extension.
absl::StatusOr<Bytes> DiceFwid(const Certificate& leaf);

// What IssueCertificate puts in a certificate. Extensions are added non-critical with the
// given DER contents; basicConstraints, keyUsage and the key identifiers are added from
// `is_ca`.
struct CertificateTemplate {
  std::string common_name;
  std::string organization;
  bool is_ca = false;
  int path_length = -1;  // for a CA: the pathLenConstraint, -1 for none
  absl::Time not_before;
  absl::Time not_after;
  std::vector<std::pair<std::string, Bytes>> extensions;  // dotted OID -> DER contents
};
// Issues a certificate for `subject_public_key_der` (SubjectPublicKeyInfo) signed with
// ECDSA/SHA-384 by `issuer_key`. `issuer` is the issuer's certificate, or nullptr for a
// self-signed certificate (then the subject key must be the issuer key). A random 16-byte
// serial is chosen.
absl::StatusOr<Certificate> IssueCertificate(const CertificateTemplate& spec,
                                             ByteSpan subject_public_key_der,
                                             const Certificate* issuer,
                                             const crypto::EcPrivateKey& issuer_key);

// Minimal DER for the simulated roots' extensions and for reading the AMD VCEK extensions.
namespace der {
Bytes Integer(uint64_t value);
Bytes Ia5String(std::string_view text);
Bytes OctetString(ByteSpan data);
Bytes Sequence(const std::vector<Bytes>& elements);
// Dotted OID text to its DER encoding; InvalidArgument for malformed text.
absl::StatusOr<Bytes> ObjectId(std::string_view dotted);
// Strict parsers of one whole element: a non-negative INTEGER of at most 8 value bytes in
// minimal form, and an IA5String. InvalidArgument otherwise.
absl::StatusOr<uint64_t> ParseInteger(ByteSpan der);
absl::StatusOr<std::string> ParseIa5String(ByteSpan der);
}  // namespace der

}  // namespace cloister::attest
