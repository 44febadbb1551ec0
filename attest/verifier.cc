#include "attest/verifier.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "attest/binding.h"
#include "attest/sim/sim_verifier.h"
#include "attest/snp/snp_verifier.h"
#include "attest/tdx/tdx_verifier.h"
#include "crypto/keys.h"

namespace cloister::attest {
namespace {

std::string TeeName(int type) {
  switch (type) {
    case v1::TEE_TYPE_SIM:
      return "sim";
    case v1::TEE_TYPE_SEV_SNP:
      return "sev-snp";
    case v1::TEE_TYPE_TDX:
      return "tdx";
    case v1::TEE_TYPE_UNSPECIFIED:
      return "unspecified";
  }
  return absl::StrCat("unknown (", type, ")");
}

std::string GpuName(int type) {
  switch (type) {
    case v1::GPU_TYPE_NONE:
      return "none";
    case v1::GPU_TYPE_SIM:
      return "sim";
    case v1::GPU_TYPE_NVIDIA_CC:
      return "nvidia-cc";
    case v1::GPU_TYPE_UNSPECIFIED:
      return "unspecified";
  }
  return absl::StrCat("unknown (", type, ")");
}

void Merge(Verdict& into, Verdict&& part) {
  for (Check& check : part.checks) into.checks.push_back(std::move(check));
  for (auto& [key, value] : part.claims) into.claims[key] = std::move(value);
}

// A verdict passes only when these checks ran and passed: a verifier that forgot one fails
// closed instead of passing by omission.
std::vector<std::string> RequiredChecks(const EvidenceBundle& bundle) {
  std::vector<std::string> names = {"policy.tee",           "evidence.nonce",   "evidence.keys",
                                    "evidence.gpus",        "cvm.report.parse", "cvm.certs.chain",
                                    "cvm.report.signature", "cvm.policy",       "cvm.measurement",
                                    "cvm.report_data"};
  for (int i = 0; i < bundle.gpus_size(); ++i) {
    for (absl::string_view check : {"report.parse", "certs.chain", "report.signature", "nonce"}) {
      names.push_back(absl::StrCat("gpu", i, ".", check));
    }
  }
  return names;
}

void Conclude(Verdict& verdict, const std::vector<std::string>& required) {
  std::vector<std::string> missing;
  for (const std::string& name : required) {
    const Check* check = verdict.Find(name);
    if (check == nullptr || check->result == Check::kSkipped) missing.push_back(name);
  }
  if (!missing.empty() && verdict.NoFailures()) {
    verdict.Fail("verdict.required", absl::StrCat("required checks did not run or were skipped: ",
                                                  absl::StrJoin(missing, ", ")));
  }
  verdict.pass = verdict.NoFailures() && missing.empty();
}

void CheckAge(Verdict& verdict, const EvidenceBundle& bundle, const Policy& policy, absl::Time at) {
  const char* kName = "evidence.age";
  if (bundle.collected_at_unix() != 0) {
    verdict.claims["evidence.collected_at"] = absl::FormatTime(
        absl::RFC3339_sec, absl::FromUnixSeconds(bundle.collected_at_unix()), absl::UTCTimeZone());
  }
  if (policy.max_evidence_age_seconds() == 0) {
    verdict.Skip(kName, "the policy sets no maximum evidence age");
    return;
  }
  if (bundle.collected_at_unix() <= 0) {
    verdict.Fail(kName, "the bundle has no collection time");
    return;
  }
  absl::Time collected = absl::FromUnixSeconds(bundle.collected_at_unix());
  absl::Duration age = at - collected;
  if (age < -kMaxClockSkew) {
    verdict.Fail(kName, absl::StrCat("the evidence was collected ", absl::FormatDuration(-age),
                                     " in the future"));
  } else if (age > absl::Seconds(policy.max_evidence_age_seconds())) {
    verdict.Fail(
        kName, absl::StrCat("the evidence is ", absl::ToInt64Seconds(age),
                            " s old; the policy allows ", policy.max_evidence_age_seconds(), " s"));
  } else {
    verdict.Pass(kName,
                 absl::StrCat("the evidence is ", std::max<int64_t>(0, absl::ToInt64Seconds(age)),
                              " s old (limit ", policy.max_evidence_age_seconds(), " s)"));
  }
}

}  // namespace

std::string_view CheckResultName(Check::Result result) {
  switch (result) {
    case Check::kPass:
      return "pass";
    case Check::kFail:
      return "fail";
    case Check::kSkipped:
      return "skipped";
  }
  return "fail";
}

void Verdict::Add(std::string name, Check::Result result, std::string detail) {
  checks.push_back(Check{std::move(name), result, std::move(detail)});
}

bool Verdict::NoFailures() const {
  for (const Check& check : checks) {
    if (check.result == Check::kFail) return false;
  }
  return true;
}

const Check* Verdict::Find(std::string_view name) const {
  for (const Check& check : checks) {
    if (check.name == name) return &check;
  }
  return nullptr;
}

std::string Verdict::FailedSummary() const {
  std::vector<std::string> parts;
  for (const Check& check : checks) {
    if (check.result == Check::kFail) parts.push_back(absl::StrCat(check.name, ": ", check.detail));
  }
  return absl::StrJoin(parts, "; ");
}

absl::StatusOr<std::unique_ptr<EvidenceVerifier>> MakeCvmVerifier(v1::TeeType type) {
  if (type == v1::TEE_TYPE_SIM) return std::make_unique<SimCvmVerifier>();
  if (type == v1::TEE_TYPE_SEV_SNP) return std::make_unique<SnpCvmVerifier>();
  if (type == v1::TEE_TYPE_TDX) return std::make_unique<TdxCvmVerifier>();
  return absl::UnimplementedError(
      absl::StrCat("this build cannot verify CVM evidence of type ", TeeName(type)));
}

namespace {

absl::Mutex registry_mutex(absl::kConstInit);
std::map<int, GpuVerifierFactory>& GpuRegistry() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mutex) {
  static auto* registry = new std::map<int, GpuVerifierFactory>();
  return *registry;
}

}  // namespace

void RegisterGpuVerifier(v1::GpuType type, GpuVerifierFactory factory) {
  absl::MutexLock lock(&registry_mutex);
  GpuRegistry()[type] = factory;
}

absl::StatusOr<std::unique_ptr<EvidenceVerifier>> MakeGpuVerifier(v1::GpuType type) {
  if (type == v1::GPU_TYPE_SIM) return std::make_unique<SimGpuVerifier>();
  {
    absl::MutexLock lock(&registry_mutex);
    auto it = GpuRegistry().find(type);
    if (it != GpuRegistry().end()) return it->second();
  }
  return absl::UnimplementedError(
      absl::StrCat("this program cannot verify GPU evidence of type ", GpuName(type),
                   type == v1::GPU_TYPE_NVIDIA_CC ? " (the NVIDIA verifier is not linked in)" : ""));
}

Verdict VerifyBundle(const EvidenceBundle& bundle, ByteSpan expected_nonce, const Policy& policy,
                     absl::Time at) {
  Verdict verdict;
  verdict.enclave_hpke_public_key = ToBytes(bundle.enclave_hpke_public_key());
  verdict.enclave_signing_public_key = ToBytes(bundle.enclave_signing_public_key());
  verdict.claims["policy"] = policy.name();
  verdict.claims["tee"] = TeeName(bundle.tee_type());
  verdict.claims["gpu"] = GpuName(bundle.gpu_type());
  verdict.claims["evidence.nonce"] = HexEncode(AsBytes(bundle.nonce()));

  if (bundle.tee_type() == policy.tee() && bundle.gpu_type() == policy.gpu() &&
      policy.tee() != v1::TEE_TYPE_UNSPECIFIED && policy.gpu() != v1::GPU_TYPE_UNSPECIFIED) {
    verdict.Pass("policy.tee", absl::StrCat("tee ", TeeName(policy.tee()), ", gpu ",
                                            GpuName(policy.gpu()), " as the policy requires"));
  } else {
    verdict.Fail("policy.tee", absl::StrCat("the evidence is tee ", TeeName(bundle.tee_type()),
                                            ", gpu ", GpuName(bundle.gpu_type()), "; policy '",
                                            policy.name(), "' requires tee ", TeeName(policy.tee()),
                                            ", gpu ", GpuName(policy.gpu())));
  }

  if (expected_nonce.size() != kNonceSize) {
    verdict.Fail("evidence.nonce", absl::StrCat("the expected nonce is ", expected_nonce.size(),
                                                " bytes, not ", kNonceSize));
  } else if (!ConstantTimeEquals(AsBytes(bundle.nonce()), expected_nonce)) {
    verdict.Fail("evidence.nonce", "the bundle was collected over another nonce");
  } else {
    verdict.Pass("evidence.nonce", "the bundle names the expected nonce");
  }

  if (bundle.enclave_hpke_public_key().size() != 32 ||
      bundle.enclave_signing_public_key().size() != 32) {
    verdict.Fail("evidence.keys",
                 absl::StrCat("enclave keys must be 32 bytes each (HPKE ",
                              bundle.enclave_hpke_public_key().size(), ", signing ",
                              bundle.enclave_signing_public_key().size(), ")"));
  } else {
    verdict.Pass("evidence.keys", "X25519 and Ed25519 public keys present");
  }

  const bool expects_gpus = bundle.gpu_type() != v1::GPU_TYPE_NONE;
  if (bundle.gpus_size() > static_cast<int>(kMaxGpuCount)) {
    verdict.Fail("evidence.gpus", absl::StrCat(bundle.gpus_size(), " GPU reports, at most ",
                                               kMaxGpuCount, " are accepted"));
  } else if (expects_gpus != (bundle.gpus_size() > 0)) {
    verdict.Fail("evidence.gpus", absl::StrCat("gpu type ", GpuName(bundle.gpu_type()), " with ",
                                               bundle.gpus_size(), " GPU reports"));
  } else {
    verdict.Pass("evidence.gpus", absl::StrCat(bundle.gpus_size(), " GPU reports"));
  }

  // The CVM report, then the binding of nonce, GPU reports and keys in its REPORT_DATA.
  auto cvm_verifier = MakeCvmVerifier(bundle.tee_type());
  if (cvm_verifier.ok()) {
    Merge(verdict, (*cvm_verifier)->Verify(bundle, expected_nonce, policy, at));
  } else {
    verdict.Fail("cvm.report.parse", std::string(cvm_verifier.status().message()));
  }
  auto authenticated = verdict.claims.find("cvm.report_data");
  if (authenticated == verdict.claims.end()) {
    verdict.Skip("cvm.report_data", "skipped: the CVM report's signature did not verify");
  } else {
    std::vector<Bytes> gpu_reports;
    for (const v1::GpuEvidence& gpu : bundle.gpus())
      gpu_reports.push_back(ToBytes(gpu.spdm_report()));
    Bytes expected =
        ReportData(expected_nonce, gpu_reports, AsBytes(bundle.enclave_hpke_public_key()),
                   AsBytes(bundle.enclave_signing_public_key()));
    if (authenticated->second == HexEncode(expected)) {
      verdict.Pass("cvm.report_data",
                   "REPORT_DATA binds the nonce, the GPU reports and the enclave keys");
    } else {
      verdict.Fail("cvm.report_data",
                   "REPORT_DATA does not match the nonce, GPU reports and enclave keys of this "
                   "bundle");
    }
  }

  if (expects_gpus && bundle.gpus_size() > 0) {
    auto gpu_verifier = MakeGpuVerifier(bundle.gpu_type());
    if (gpu_verifier.ok()) {
      Merge(verdict, (*gpu_verifier)->Verify(bundle, expected_nonce, policy, at));
    } else {
      verdict.Fail("gpu0.report.parse", std::string(gpu_verifier.status().message()));
    }
  }

  CheckAge(verdict, bundle, policy, at);
  Conclude(verdict, RequiredChecks(bundle));
  return verdict;
}

namespace {

// The published-model checks of VerifyChallenge (see verifier.h).
void VerifyPublishedModels(const ChallengeResponse& response, ByteSpan digest,
                           ByteSpan client_nonce, const EvidenceBundle& bundle,
                           const Policy& policy, Verdict& verdict,
                           std::vector<std::string>& required) {
  bool verified = false;
  v1::PublishedModels list;
  if (response.published_models().empty() && response.published_models_signature().empty()) {
    verdict.Skip("published.models", "the enclave sent no list of published models");
  } else if (absl::Status signature = crypto::Ed25519Verify(
                 AsBytes(bundle.enclave_signing_public_key()),
                 PublishedModelsMessage(digest, client_nonce, AsBytes(response.published_models())),
                 AsBytes(response.published_models_signature()));
             !signature.ok()) {
    verdict.Fail("published.models",
                 absl::StrCat("the signature over the published models does not verify with the "
                              "bundle's signing key: ",
                              signature.message()));
  } else if (!list.ParseFromString(response.published_models())) {
    verdict.Fail("published.models", "the signed list of published models does not parse");
  } else {
    verified = true;
    std::vector<std::string> names;
    for (const v1::PublishedModel& model : list.models()) {
      verdict.published_models[model.name()] = model.digest();
      verdict.claims[absl::StrCat("published.", model.name(), ".digest")] = model.digest();
      verdict.claims[absl::StrCat("published.", model.name(), ".kind")] = model.kind();
      verdict.claims[absl::StrCat("published.", model.name(), ".size")] =
          absl::StrCat(model.size());
      names.push_back(model.name());
    }
    verdict.Pass("published.models",
                 names.empty() ? "the enclave signed an empty list of published models"
                               : absl::StrCat("the enclave signed its published models: ",
                                              absl::StrJoin(names, ", ")));
  }
  if (!policy.published_models().empty()) required.push_back("published.models");
  for (const v1::PublishedModelPin& pin : policy.published_models()) {
    std::string name = absl::StrCat("published.", pin.name());
    auto it = verdict.published_models.find(pin.name());
    if (!verified) {
      verdict.Fail(name, "no verified list of published models to find it in");
    } else if (it == verdict.published_models.end()) {
      verdict.Fail(name, absl::StrCat("the policy pins published model '", pin.name(),
                                      "' but the enclave does not publish it"));
    } else if (absl::AsciiStrToLower(it->second) != absl::AsciiStrToLower(pin.digest())) {
      verdict.Fail(name, absl::StrCat("published model '", pin.name(), "' has digest ", it->second,
                                      ", the policy pins ", pin.digest()));
    } else {
      verdict.Pass(name, absl::StrCat("published model '", pin.name(), "' has the pinned digest"));
    }
    required.push_back(name);
  }
}

}  // namespace

absl::StatusOr<Verdict> VerifyChallenge(const ChallengeResponse& response, ByteSpan client_nonce,
                                        const Policy& policy, absl::Time at) {
  if (client_nonce.size() != kNonceSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("client nonce is ", client_nonce.size(), " bytes, expected ", kNonceSize));
  }
  EvidenceBundle bundle;
  if (response.bundle().empty() || !bundle.ParseFromString(response.bundle())) {
    return absl::InvalidArgumentError("challenge response: the evidence bundle does not parse");
  }
  Bytes digest = EvidenceDigest(response.bundle());

  Verdict verdict;
  std::vector<std::string> required;
  if (response.fresh()) {
    verdict.Pass("challenge.fresh", "fresh evidence collected over the client's nonce");
    if (ConstantTimeEquals(AsBytes(bundle.nonce()), client_nonce)) {
      verdict.Pass("challenge.nonce", "the fresh bundle names the client's nonce");
    } else {
      verdict.Fail("challenge.nonce", "the fresh bundle was collected over another nonce");
    }
    verdict.Skip("challenge.signature", "fresh evidence needs no signature over the nonce");
    required.push_back("challenge.nonce");
  } else {
    if (policy.require_fresh_evidence()) {
      verdict.Fail("challenge.fresh",
                   absl::StrCat("policy '", policy.name(),
                                "' requires fresh evidence; the enclave sent cached evidence"));
    } else {
      verdict.Pass("challenge.fresh", "cached evidence, allowed by the policy");
    }
    absl::Status signature = crypto::Ed25519Verify(AsBytes(bundle.enclave_signing_public_key()),
                                                   ChallengeMessage(digest, client_nonce),
                                                   AsBytes(response.nonce_signature()));
    if (signature.ok()) {
      verdict.Pass("challenge.signature",
                   "the enclave's signing key signed the client's nonce and this evidence");
    } else {
      verdict.Fail("challenge.signature",
                   absl::StrCat("the signature over the client's nonce does not verify with "
                                "the bundle's signing key: ",
                                signature.message()));
    }
    required.push_back("challenge.signature");
  }

  Verdict bundle_verdict = VerifyBundle(bundle, AsBytes(bundle.nonce()), policy, at);
  const bool bundle_pass = bundle_verdict.pass;
  Merge(verdict, std::move(bundle_verdict));
  verdict.evidence_digest = digest;
  verdict.enclave_hpke_public_key = ToBytes(bundle.enclave_hpke_public_key());
  verdict.enclave_signing_public_key = ToBytes(bundle.enclave_signing_public_key());
  verdict.claims["evidence.digest"] = HexEncode(digest);
  VerifyPublishedModels(response, digest, client_nonce, bundle, policy, verdict, required);
  Conclude(verdict, required);
  verdict.pass = verdict.pass && bundle_pass;
  return verdict;
}

}  // namespace cloister::attest
