// The Intel TDX verifier (DESIGN.md section 5; shared/specs/attestation-formats.md section
// 10.2): checks one quote (v4 or v5), with optional PCS collateral, against a policy and
// returns a verdict of named checks, in this order:
//   report.parse       the quote parses strictly (attest/tdx/tdx_quote.h) and comes from Intel's
//                      quoting enclave (QE vendor ID)
//   certs.chain        the PCK chain inside the quote: "Intel SGX PCK Certificate" (P-256) <-
//                      PCK Platform/Processor CA <- the Intel SGX Root CA the policy pins (or
//                      the built-in one), valid at `at`
//   certs.revocation   with the root CA CRL and/or PCK CRL given: each is signed by its issuer,
//                      current at `at`, and revokes neither the PCK CA, the PCK leaf nor the
//                      collateral signer; skipped without CRLs unless the policy requires them
//   report.signature   the quote's ECDSA P-256/SHA-256 signature over header || body with the
//                      attestation key; the QE report's signature with the PCK leaf key; QE
//                      REPORTDATA == SHA-256(attestation key || QE auth data) || 32 zero bytes
//   tcb                with TCB info given: its signature by "Intel SGX TCB Signing" (chained to
//                      the pinned root), its validity at `at`, and the platform's TCB level
//                      (attest/tdx/tdx_collateral.h) among the policy's accepted statuses;
//                      skipped without TCB info unless the policy requires collateral
//   qe.identity        the same with the QE identity against the QE report
//   policy             TDATTRIBUTES.DEBUG off unless the policy allows debugging
//   measurement        MRTD is one of the policy's enclave_measurements (an empty list fails),
//                      RTMR0-3 and MRSEAM are in their allow-lists when the policy gives them
//   report_data        REPORTDATA equals the expected value (skipped when none is given)
// The verdict passes only when nothing failed and report.parse, certs.chain,
// report.signature, policy and measurement passed (plus tcb and qe.identity when the policy
// requires collateral, certs.revocation when it requires CRLs). Claims are set only when the
// quote's signatures verified. Every name gets `check_prefix` in front ("cvm." in a bundle).
// Thread-safe: pure functions; TdxCvmVerifier is stateless.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attest/policy.h"
#include "attest/verifier.h"
#include "base/bytes.h"

namespace cloister::attest {

// PCS collateral for one quote, each part optional.
struct TdxCollateral {
  std::optional<std::string> tcb_info;     // body of /tdx/certification/v4/tcb?fmspc=...
  std::optional<std::string> qe_identity;  // body of /tdx/certification/v4/qe/identity
  // The response header Tcb-Info-Issuer-Chain (URL-decoded): "Intel SGX TCB Signing" then the
  // root, PEM. Needed to authenticate tcb_info and qe_identity.
  std::string signing_chain_pem;
  std::optional<Bytes> root_ca_crl;  // DER or PEM CRL of the Intel SGX Root CA
  std::optional<Bytes> pck_crl;      // DER or PEM CRL of the PCK Platform/Processor CA
};

struct TdxInput {
  Bytes quote;
  TdxCollateral collateral;
  // The REPORTDATA the caller expects (64 bytes), e.g. its nonce padded with zeros.
  std::optional<Bytes> expected_report_data;
};

// Intel's TCB statuses that a policy may accept ("Revoked" never is).
inline constexpr std::string_view kTdxTcbStatuses[] = {"UpToDate",
                                                       "SWHardeningNeeded",
                                                       "ConfigurationNeeded",
                                                       "ConfigurationAndSWHardeningNeeded",
                                                       "OutOfDate",
                                                       "OutOfDateConfigurationNeeded"};

// Checks the parts of a TdxPolicy that the schema cannot: hex allow-lists of the right size, a
// usable root certificate, known TCB statuses. InvalidArgument naming the field.
absl::Status ValidateTdxPolicy(const v1::TdxPolicy& policy);

// Verifies one quote as described above. InvalidArgument (not a verdict) only for a bad policy
// section or an expected REPORTDATA that is not 64 bytes; bad evidence gives failed checks.
absl::StatusOr<Verdict> VerifyTdxQuote(const TdxInput& input, const Policy& policy, absl::Time at,
                                       std::string_view check_prefix = "");

// EvidenceVerifier for bundles with tee_type TEE_TYPE_TDX: verifies cvm_report as a quote (its
// PCK chain travels inside it; cvm_cert_chain_pem is not used) as "cvm.*" checks, without
// collateral, and puts the authenticated REPORTDATA into claims["cvm.report_data"].
class TdxCvmVerifier : public EvidenceVerifier {
 public:
  Verdict Verify(const EvidenceBundle& bundle, ByteSpan expected_nonce, const Policy& policy,
                 absl::Time at) const override;
};

}  // namespace cloister::attest
