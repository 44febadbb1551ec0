// Attestation verification (DESIGN.md section 5): checks an evidence bundle against a policy
// and returns a verdict made of named checks, each pass, fail or skipped with a reason, plus
// the claims an auditor or a session needs. The verdict passes only when no check fails and
// every required check (the signatures, chains, measurement, binding and GPU nonces) passed.
// Verifiers are plug-ins behind EvidenceVerifier: one per TEE type for the CVM report and one
// per GPU type for the GPU reports; VerifyBundle picks them by the bundle's types and checks
// what spans both (the policy's types, the REPORT_DATA binding, the evidence's age).
// Time is always a parameter. Chains are verified against the roots in the policy only.
// Thread-safe: pure functions; verifier objects are immutable.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attest/policy.h"
#include "base/bytes.h"
#include "cloister/attest/v1/evidence.pb.h"

namespace cloister::attest {

using EvidenceBundle = ::cloister::attest::v1::EvidenceBundle;
using ChallengeResponse = ::cloister::attest::v1::ChallengeResponse;

// Clock skew tolerated for a bundle's collection time lying in the verifier's future.
inline constexpr absl::Duration kMaxClockSkew = absl::Minutes(5);
inline constexpr size_t kMaxGpuCount = 16;

struct Check {
  enum Result { kPass, kFail, kSkipped };
  std::string name;  // stable, e.g. "cvm.report.signature", "gpu0.nonce"
  Result result = kFail;
  std::string detail;
};
// "pass", "fail" or "skipped" (the words of cloister-verify --json).
std::string_view CheckResultName(Check::Result result);

struct Verdict {
  bool pass = false;
  std::vector<Check> checks;  // in the order they ran
  // Facts read from authenticated evidence, e.g. "cvm.measurement" -> hex,
  // "gpu0.driver_version" -> "550.90.07", "evidence.collected_at" -> RFC 3339.
  std::map<std::string, std::string> claims;

  // Session material from the bundle (meaningful only when `pass`). The digest is set by
  // VerifyChallenge, which has the serialized bundle; VerifyBundle leaves it empty.
  Bytes evidence_digest;
  Bytes enclave_hpke_public_key;
  Bytes enclave_signing_public_key;
  // The enclave's operator-published models, name -> digest (hex), when VerifyChallenge
  // verified the enclave's signature over them; empty otherwise.
  std::map<std::string, std::string> published_models;

  // One line listing the failed checks with their details ("name: detail; ..."), or "" when
  // none failed.
  std::string FailedSummary() const;
  // The check with this name, or nullptr.
  const Check* Find(std::string_view name) const;

  void Add(std::string name, Check::Result result, std::string detail);
  void Pass(std::string name, std::string detail) {
    Add(std::move(name), Check::kPass, std::move(detail));
  }
  void Fail(std::string name, std::string detail) {
    Add(std::move(name), Check::kFail, std::move(detail));
  }
  void Skip(std::string name, std::string detail) {
    Add(std::move(name), Check::kSkipped, std::move(detail));
  }
  // True when no check so far failed.
  bool NoFailures() const;
};

// Verifies its part of a bundle: a CVM verifier the cvm_report and cvm_cert_chain_pem (checks
// "cvm.*"), a GPU verifier every entry of `gpus` (checks "gpu<i>.*"). A CVM verifier puts the
// REPORT_DATA it authenticated into claims["cvm.report_data"] (hex) so that VerifyBundle can
// check the binding; it sets `pass` from its own checks only.
class EvidenceVerifier {
 public:
  virtual ~EvidenceVerifier() = default;
  virtual Verdict Verify(const EvidenceBundle& bundle, ByteSpan expected_nonce,
                         const Policy& policy, absl::Time at) const = 0;
};

// The verifier for a TEE or GPU type; Unimplemented for types this program cannot verify (a
// GPU type whose verifier library is not linked and registered).
absl::StatusOr<std::unique_ptr<EvidenceVerifier>> MakeCvmVerifier(v1::TeeType type);
absl::StatusOr<std::unique_ptr<EvidenceVerifier>> MakeGpuVerifier(v1::GpuType type);

// Makes MakeGpuVerifier(type) return `factory`'s verifier from now on. For GPU verifiers that
// live in their own library because of what they link (the NVIDIA one needs xmlsec1, which the
// enclave must not link): see EnableNvidiaGpuVerification in attest/nvidia/bundle_verifier.h.
// Thread-safe.
using GpuVerifierFactory = std::unique_ptr<EvidenceVerifier> (*)();
void RegisterGpuVerifier(v1::GpuType type, GpuVerifierFactory factory);

// Verifies a whole bundle collected over `expected_nonce` against `policy` at time `at`.
// Checks, in order: policy.tee (bundle types equal the policy's), evidence.nonce,
// evidence.keys, evidence.gpus, the CVM verifier's cvm.* checks, cvm.report_data (REPORT_DATA ==
// ReportData(expected_nonce, GPU reports, keys)), the GPU verifier's gpu<i>.* checks, and
// evidence.age (only meaningful when the collection time is authenticated, as in
// VerifyChallenge; skipped when the policy sets no maximum). Never fails as a call: bad
// evidence gives failed checks.
Verdict VerifyBundle(const EvidenceBundle& bundle, ByteSpan expected_nonce, const Policy& policy,
                     absl::Time at);

// Verifies an enclave's answer to a client's challenge with `client_nonce` (32 bytes):
// - fresh answers: the bundle's nonce must equal the client's (check challenge.nonce);
// - cached answers: refused when the policy requires fresh evidence (challenge.fresh); the
//   enclave's Ed25519 signature over ChallengeMessage(EvidenceDigest(bundle), client_nonce)
//   must verify with the bundle's signing key (challenge.signature);
// then VerifyBundle over the bundle's own nonce; then the published models (check
// published.models: the enclave's signature over PublishedModelsMessage(digest, client_nonce,
// list) verifies with the bundle's signing key and the list parses; skipped when the enclave
// sent none) and, for each of the policy's published_models pins, check published.<name>: the
// signed list holds that name with that digest. Sets evidence_digest, the enclave keys,
// published_models and the claims "published.<name>.digest|kind|size".
// InvalidArgument (not a verdict) when the client nonce has the wrong size or the bundle does
// not parse.
absl::StatusOr<Verdict> VerifyChallenge(const ChallengeResponse& response, ByteSpan client_nonce,
                                        const Policy& policy, absl::Time at);

}  // namespace cloister::attest
