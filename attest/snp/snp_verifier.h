// The AMD SEV-SNP verifier (DESIGN.md section 5; shared/specs/attestation-formats.md section
// 10.1): checks one attestation report with its VCEK (or VLEK) certificate and the AMD chain
// against a policy, and returns a verdict of named checks, in this order:
//   report.parse      the 1184-byte report parses strictly (attest/snp_report.h)
//   certs.chain       VCEK <- ASK <- ARK (VLEK <- ASVK <- ARK), each signed RSASSA-PSS/SHA-384,
//                     valid at `at`, ending in an ARK the policy pins (or the built-in AMD
//                     ARKs); the product (Milan, Genoa, Turin) is the same along the chain
//   report.signature  ECDSA P-384/SHA-384 over bytes [0, 0x2A0) with the leaf's key; the
//                     report's SIGNING_KEY field names the kind of leaf that was given
//   tcb               the VCEK's TCB extensions equal REPORTED_TCB (Milan/Genoa or Turin
//                     layout), its hwID equals CHIP_ID (unless MASK_CHIP_KEY; a VLEK has none),
//                     and REPORTED_TCB meets the policy's minimum
//   policy            VERSION and SIGNATURE_ALGO supported, POLICY.DEBUG off unless allowed,
//                     MIGRATE_MA off unless allowed, VMPL as required, GUEST_SVN minimum,
//                     ID_KEY_DIGEST in the allow-list when one is given
//   measurement       MEASUREMENT is one of the policy's enclave_measurements; an empty list
//                     fails (a demanding verifier never accepts code it was not told about)
//   host_data         HOST_DATA is in the allow-list (skipped when the policy lists none)
//   report_data       REPORT_DATA equals the expected value (skipped when none is given)
// The verdict passes only when nothing failed and report.parse, certs.chain,
// report.signature, tcb, policy and measurement passed. Claims (facts from the report) are
// set only when the report's signature verified. Every name gets `check_prefix` in front
// ("cvm." inside a bundle). Revocation (AMD's CRL) is not checked yet.
// Thread-safe: pure functions; SnpCvmVerifier is stateless.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attest/policy.h"
#include "attest/verifier.h"
#include "attest/x509.h"
#include "base/bytes.h"

namespace cloister::attest {

struct SnpInput {
  Bytes report;           // the 1184-byte attestation report
  Bytes vcek_der_or_pem;  // the VCEK (or VLEK) certificate, DER or PEM
  // The ASK (ASVK for a VLEK), optionally followed by the ARK, as AMD's KDS serves
  // /vcek/v1/<product>/cert_chain. An ARK in here is ignored: only pinned ARKs are trusted.
  std::string ask_ark_pem;
  // The REPORT_DATA the caller expects (64 bytes), e.g. its nonce padded with zeros.
  std::optional<Bytes> expected_report_data;
};

// What a verified chain says about its leaf.
struct SnpChain {
  std::string product;  // "Milan", "Genoa" or "Turin"
  bool vlek = false;    // the leaf is a VLEK (cloud-provisioned) rather than a VCEK
};

// Verifies leaf <- intermediate <- one of `pinned_arks` at `at`, with RSASSA-PSS/SHA-384
// signatures on the leaf and the intermediate, and the product named consistently by the
// leaf's issuer (SEV-<product> or SEV-VLEK-<product>) and the ARK (ARK-<product>).
// PermissionDenied saying which link failed.
absl::StatusOr<SnpChain> VerifySnpCertChain(const Certificate& leaf,
                                            const std::vector<Certificate>& intermediates,
                                            const std::vector<Certificate>& pinned_arks,
                                            absl::Time at);

// The ARKs a policy pins (SnpPolicy.ark_pems, or the built-in AMD ARKs when it lists none).
// InvalidArgument when an entry is not one self-signed CA certificate named ARK-<product>.
absl::StatusOr<std::vector<Certificate>> SnpPinnedArks(const v1::SnpPolicy& policy);

// Checks the parts of an SnpPolicy that the schema cannot: hex allow-lists of the right size,
// usable ARKs. InvalidArgument naming the field. (For the policy loader and the verifier.)
absl::Status ValidateSnpPolicy(const v1::SnpPolicy& policy);

// Verifies one report as described above. InvalidArgument (not a verdict) only for a bad
// policy section or an expected REPORT_DATA that is not 64 bytes; bad evidence gives failed
// checks.
absl::StatusOr<Verdict> VerifySnpReport(const SnpInput& input, const Policy& policy, absl::Time at,
                                        std::string_view check_prefix = "");

// Splits a PEM chain "leaf, intermediates..." (a bundle's cvm_cert_chain_pem) into SnpInput's
// leaf and ask_ark_pem. A chain that does not parse is passed on as the leaf bytes, so that the
// certs.chain check reports the parse error.
void SetSnpCertificatesFromChain(std::string_view chain_pem, SnpInput& input);

// EvidenceVerifier for bundles with tee_type TEE_TYPE_SEV_SNP: verifies cvm_report with
// cvm_cert_chain_pem (VCEK, ASK[, ARK]) against the policy as "cvm.*" checks and puts the
// authenticated REPORT_DATA into claims["cvm.report_data"]; the binding itself is checked by
// VerifyBundle.
class SnpCvmVerifier : public EvidenceVerifier {
 public:
  Verdict Verify(const EvidenceBundle& bundle, ByteSpan expected_nonce, const Policy& policy,
                 absl::Time at) const override;
};

}  // namespace cloister::attest
