// NVIDIA Reference Integrity Manifests (RIMs): the signed SWID XML documents (ISO 19770-2:2015
// with the TCG RIM information model) that hold the reference measurements of a GPU driver or
// VBIOS (shared/specs/attestation-formats.md section 5). ParseRim reads the content strictly;
// VerifyRimSignature checks the enveloped XML-DSig signature with libxmlsec1 (canonicalization
// is xmlsec's) using the key of the first KeyInfo certificate, after that certificate has been
// chained to a pinned CoRIM root at a given time. RimToXml and SignRimXml write RIMs, for the
// simulated GPU and for tests.
//
// Safety: documents are parsed with network access off, document type declarations (and so
// external entities) refused, a size cap, and only same-document ("") references allowed, so
// nothing is ever fetched. xmlsec and libxml2 are initialised once per process, thread-safely,
// on first use; that initialisation also replaces libxml2's external entity loader for the
// whole process with one that loads nothing, and removes xmlsec's I/O callbacks.
// Thread-safe: pure functions; Rim is a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attest/x509.h"
#include "base/bytes.h"
#include "crypto/ecdsa.h"

namespace cloister::attest {

inline constexpr std::string_view kSwidNamespace =
    "http://standards.iso.org/iso/19770/-2/2015/schema.xsd";
inline constexpr std::string_view kTcgRimNamespace =
    "https://trustedcomputinggroup.org/resource/tcg-reference-integrity-manifest-rim-"
    "information-model/";
// The namespace of the Hash0..HashN attributes: their values are SHA-384 digests in hex.
inline constexpr std::string_view kSha384HashNamespace = "http://www.w3.org/2001/04/xmlenc#sha384";

inline constexpr size_t kMaxRimXmlSize = size_t{4} << 20;
inline constexpr size_t kMaxRimMeasurementCount = 255;
inline constexpr size_t kMaxRimAlternatives = 32;
// RIM index i is compared with report block i + 1, which must fit the SPDM index byte.
inline constexpr uint32_t kMaxRimIndex = 254;

// One Payload/Resource of type "Measurement".
struct RimMeasurement {
  uint32_t index = 0;  // 0..254; compared with the report's measurement block index + 1
  bool active = false;
  std::string name;                 // e.g. "HashedMeasurement_1_FSP"; may be empty
  size_t size = 0;                  // bytes of each digest (48 for SHA-384)
  std::vector<Bytes> alternatives;  // Hash0..Hash{n-1}; any one of them is a match

  bool operator==(const RimMeasurement&) const = default;
};

struct Rim {
  // SoftwareIdentity attributes.
  std::string name;         // "GH100"
  std::string tag_id;       // 96 hex digits in NVIDIA's RIMs
  std::string version;      // "1.0"
  std::string tag_version;  // "0"
  std::string creator;      // the Entity name, "NVIDIA Corporation"
  // Meta attributes.
  std::string colloquial_version;  // "545.00" (driver) or "96.00.5E.00.01" (VBIOS)
  std::string product;             // "GH100"
  std::string edition;             // "GPU"
  std::string revision;            // "r1"
  std::string binding_spec;        // TCG "RIMIM"
  std::string binding_spec_version;
  std::string platform_manufacturer_id;
  std::string platform_model;
  std::string firmware_manufacturer_id;  // "5703": the oemid claim
  // Payload, in document order; indices are unique.
  std::vector<RimMeasurement> measurements;
  // The certificates of the signature's KeyInfo/X509Data in document order (the signer
  // first); empty for an unsigned RIM. Not authenticated by ParseRim.
  std::vector<Certificate> signer_chain;

  // The entry with this index, or nullptr.
  const RimMeasurement* Find(uint32_t index) const;
  // The active entries, in document order.
  std::vector<const RimMeasurement*> ActiveMeasurements() const;
};

// Parses a RIM without checking its signature: root SoftwareIdentity in the SWID namespace,
// exactly one Meta with a colloquialVersion, exactly one Payload whose elements are all
// Resources of type "Measurement" with a decimal index (at most 254, unique), active
// "True"/"False", alternatives (1 to 32), size (1 to 64) and exactly the attributes Hash0 to
// Hash{alternatives-1} in the SHA-384 namespace, each `size` bytes of hex. InvalidArgument
// naming the element and attribute for anything else, for malformed XML, a document type
// declaration, or a document over kMaxRimXmlSize.
absl::StatusOr<Rim> ParseRim(std::string_view xml);

// What VerifyRimSignature established.
struct RimSignatureInfo {
  std::vector<Certificate> chain;    // KeyInfo certificates, signer first
  std::string signer;                // the signer's common name
  absl::Time earliest_expiry;        // the soonest notAfter of the chain and the pinned root
  bool expired_but_allowed = false;  // a certificate had expired at `at`; allowed by the caller
};

// Verifies a RIM's signature at time `at`:
//  1. exactly one ds:Signature, a child of the root, whose KeyInfo/X509Data carries the
//     signer's certificate first;
//  2. that chain verifies to `corim_root` (the only trust anchor; a root carried in the
//     document is ignored) with every certificate valid at `at`, the signer not a CA and
//     holding a P-384 key. An expired certificate is refused naming it and its expiry date,
//     unless `allow_expired` (then the chain must verify at a time when every certificate
//     was valid, and the result says so);
//  3. the XML-DSig signature verifies with the signer's key: one Reference with URI "",
//     transforms enveloped-signature and C14N (1.0, 1.1 or exclusive), digest SHA-384,
//     signature ECDSA-SHA384; any other algorithm is refused.
// PermissionDenied when the chain or signature does not verify (the message says which and
// why); InvalidArgument when the document or its signature element is malformed.
absl::StatusOr<RimSignatureInfo> VerifyRimSignature(std::string_view xml,
                                                    const Certificate& corim_root, absl::Time at,
                                                    bool allow_expired = false);

// Writes `rim` (without signer_chain) as unsigned SWID XML in NVIDIA's layout; ParseRim
// reads the result back equal.
std::string RimToXml(const Rim& rim);

// Signs an unsigned RIM as NVIDIA does: appends an enveloped ds:Signature (C14N 1.1,
// ECDSA-SHA384, SHA-384 digest) made with `signer_key`, carrying `chain` (signer first) in
// KeyInfo/X509Data. InvalidArgument if the XML does not parse, already has a signature, or the
// chain's first certificate does not hold the key's public half.
absl::StatusOr<std::string> SignRimXml(std::string_view xml, const crypto::EcPrivateKey& signer_key,
                                       const std::vector<Certificate>& chain);

}  // namespace cloister::attest
