// Offline OCSP for the NVIDIA chains (shared/specs/attestation-formats.md section 4.3): checks
// saved OCSP responses (DER OCSPResponse, as ocsp.ndis.nvidia.com returns them) for one
// certificate at a given time. Nothing is fetched: a verifier without saved responses reports
// revocation as not checked. The responder must chain to the same pinned root as the
// certificate and be authorized by its issuer (OpenSSL's OCSP_basic_verify rules), and the
// response must be current at the verification time. Saved responses carry no nonce of ours,
// so freshness rests on thisUpdate/nextUpdate alone.
// Thread-safe: pure functions.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attest/x509.h"
#include "base/bytes.h"

namespace cloister::attest {

// Clock skew tolerated between a responder's thisUpdate/nextUpdate and the verification time.
inline constexpr absl::Duration kOcspClockSkew = absl::Minutes(5);

enum class OcspStatus { kGood, kRevoked, kUnknown };
// "good", "revoked" or "unknown" (the words of NVIDIA's x-nvidia-cert-ocsp-status claim).
std::string OcspStatusName(OcspStatus status);

struct OcspCertStatus {
  std::string subject;  // the certificate's common name
  OcspStatus status = OcspStatus::kUnknown;
  std::string revocation_reason;  // e.g. "certificateHold"; empty unless revoked with a reason
  absl::Time this_update;
  absl::Time next_update = absl::InfiniteFuture();  // when the response has none
};

// Finds the response about `cert` (issued by `issuer`) among `responses` (DER OCSPResponse
// each; any CertID hash algorithm) and checks it: status successful, signature valid, the
// responder chaining to `trusted_root` through `intermediates` and authorized by the issuer,
// thisUpdate not after `at` and nextUpdate (if any) not before it, both with kOcspClockSkew.
// Returns the certificate's status as the responder states it (good, revoked, unknown): the
// caller decides. NotFound when no response covers `cert`; PermissionDenied when the covering
// response is not acceptable; InvalidArgument when a response does not parse.
absl::StatusOr<OcspCertStatus> CheckOcspResponse(const std::vector<Bytes>& responses,
                                                 const Certificate& cert, const Certificate& issuer,
                                                 const Certificate& trusted_root,
                                                 const std::vector<Certificate>& intermediates,
                                                 absl::Time at);

}  // namespace cloister::attest
