#include "attest/verifier.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attest/binding.h"
#include "attest/policy.h"
#include "attest/sim/sim_tee.h"
#include "attest/snp_report.h"
#include "attest/spdm.h"
#include "attest/test_util.h"
#include "base/clock.h"
#include "base/file.h"
#include "crypto/ecdsa.h"
#include "crypto/keys.h"
#include "crypto/random.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using testing::ScopedTempDir;

// Two independent simulated TEEs (made once for the suite) and a pinned clock.
class VerifierTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    other_dir_ = new ScopedTempDir();
    ASSERT_TRUE(EnsureSimRoots(dir_->path()).ok());
    ASSERT_TRUE(EnsureSimRoots(other_dir_->path()).ok());
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete other_dir_;
  }

  void SetUp() override {
    measurement_ = crypto::RandomBytes(48);
    nonce_ = crypto::RandomBytes(32);
    hpke_ = crypto::RandomBytes(32);
    signing_ = crypto::GenerateEd25519();
    auto policy = MakeDevPolicy(dir_->path(), measurement_);
    ASSERT_TRUE(policy.ok()) << policy.status();
    policy_ = *policy;
  }

  EvidenceBundle Collect(SimOptions options = {}) {
    options.clock = &clock_;
    auto collector = MakeSimCollector(dir_->path(), measurement_, options);
    EXPECT_TRUE(collector.ok()) << collector.status();
    auto bundle = (*collector)->Collect(nonce_, hpke_, signing_.public_key);
    EXPECT_TRUE(bundle.ok()) << bundle.status();
    return *bundle;
  }

  Verdict Verify(const EvidenceBundle& bundle) {
    return VerifyBundle(bundle, nonce_, policy_, clock_.Now() + absl::Seconds(30));
  }

  std::unique_ptr<crypto::EcPrivateKey> SimKey(std::string_view file) {
    auto pem = ReadFile(dir_->path() + "/" + std::string(file));
    EXPECT_TRUE(pem.ok());
    auto key = crypto::EcPrivateKey::FromPem(*pem);
    EXPECT_TRUE(key.ok()) << key.status();
    return std::move(*key);
  }

  // Replaces the CVM report's REPORT_DATA (or any field) and signs it again with the simulated
  // VCEK key, as someone holding the chip key could.
  void ResignCvm(EvidenceBundle& bundle, const std::function<void(Bytes&)>& edit) {
    Bytes report = ToBytes(bundle.cvm_report());
    edit(report);
    auto signature =
        SimKey(kSimCvmLeafKeyFile)
            ->SignP1363(crypto::HashAlg::kSha384, ByteSpan(report).first(kSnpSignedSize));
    ASSERT_TRUE(signature.ok());
    ASSERT_TRUE(SetSnpSignature(report, *signature).ok());
    bundle.set_cvm_report(ToString(report));
  }

  // Re-encodes GPU 0's report after `edit` and signs it with the simulated GPU key.
  void ResignGpu(EvidenceBundle& bundle, const std::function<void(SpdmReport&)>& edit) {
    auto report = ParseSpdmReport(AsBytes(bundle.gpus(0).spdm_report()));
    ASSERT_TRUE(report.ok());
    edit(*report);
    auto bytes = EncodeSpdmReportToSign(*report);
    ASSERT_TRUE(bytes.ok());
    auto signature = SimKey(kSimGpuLeafKeyFile)->SignP1363(crypto::HashAlg::kSha384, *bytes);
    ASSERT_TRUE(signature.ok());
    Append(*bytes, *signature);
    bundle.mutable_gpus(0)->set_spdm_report(ToString(*bytes));
  }

  static void ExpectCheck(const Verdict& verdict, std::string_view name, Check::Result result) {
    const Check* check = verdict.Find(name);
    ASSERT_NE(check, nullptr) << "no check " << name;
    EXPECT_EQ(check->result, result) << name << ": " << check->detail;
  }
  static void ExpectOnlyFailure(const Verdict& verdict, const std::vector<std::string>& names) {
    EXPECT_FALSE(verdict.pass);
    for (const Check& check : verdict.checks) {
      bool expected = std::find(names.begin(), names.end(), check.name) != names.end();
      EXPECT_EQ(check.result == Check::kFail, expected)
          << check.name << " " << CheckResultName(check.result) << ": " << check.detail;
    }
  }

  static ScopedTempDir* dir_;
  static ScopedTempDir* other_dir_;
  FakeClock clock_;
  Bytes measurement_;
  Bytes nonce_;
  Bytes hpke_;
  crypto::Ed25519KeyPair signing_;
  Policy policy_;
};
ScopedTempDir* VerifierTest::dir_ = nullptr;
ScopedTempDir* VerifierTest::other_dir_ = nullptr;

TEST_F(VerifierTest, RoundTripPasses) {
  Verdict verdict = Verify(Collect());
  EXPECT_TRUE(verdict.pass) << verdict.FailedSummary();
  EXPECT_EQ(verdict.FailedSummary(), "");
  for (const char* name :
       {"policy.tee", "evidence.nonce", "evidence.keys", "evidence.gpus", "cvm.report.parse",
        "cvm.certs.chain", "cvm.certs.tcb", "cvm.report.signature", "cvm.policy", "cvm.measurement",
        "cvm.report_data", "gpu0.report.parse", "gpu0.certs.chain", "gpu0.report.signature",
        "gpu0.certs.fwid", "gpu0.nonce", "gpu0.measurements", "gpu0.versions", "evidence.age"}) {
    ExpectCheck(verdict, name, Check::kPass);
  }
  EXPECT_EQ(verdict.claims["tee"], "sim");
  EXPECT_EQ(verdict.claims["cvm.measurement"], HexEncode(measurement_));
  EXPECT_EQ(verdict.claims["gpu0.driver_version"], "550.90.07");
  EXPECT_EQ(verdict.claims["gpu0.vbios_version"], "96.00.9F.00.01");
  EXPECT_EQ(verdict.claims["gpu0.hwmodel"], "Cloister Simulated GPU BROM");
  EXPECT_EQ(verdict.claims["cvm.debug"], "false");
  EXPECT_FALSE(verdict.claims["evidence.collected_at"].empty());
  EXPECT_EQ(verdict.enclave_hpke_public_key, hpke_);
  EXPECT_EQ(verdict.enclave_signing_public_key, signing_.public_key);
}

TEST_F(VerifierTest, PolicyFromAnotherSimDirFailsTheChains) {
  auto other_policy = MakeDevPolicy(other_dir_->path(), measurement_);
  ASSERT_TRUE(other_policy.ok());
  policy_ = *other_policy;
  Verdict verdict = Verify(Collect());
  ExpectOnlyFailure(verdict, {"cvm.certs.chain", "gpu0.certs.chain"});
  EXPECT_TRUE(absl::StrContains(verdict.FailedSummary(), "cvm.certs.chain: "))
      << verdict.FailedSummary();
}

TEST_F(VerifierTest, ChainFromAnotherSimDirFails) {
  EvidenceBundle bundle = Collect();
  auto other_roots = LoadSimRootCertificates(other_dir_->path());
  ASSERT_TRUE(other_roots.ok());
  bundle.set_cvm_cert_chain_pem(ChainToPem(other_roots->cvm_chain));
  Verdict verdict = Verify(bundle);
  ExpectCheck(verdict, "cvm.certs.chain", Check::kFail);
  ExpectCheck(verdict, "cvm.report.signature", Check::kFail);
  ExpectCheck(verdict, "cvm.certs.tcb", Check::kFail);
  EXPECT_FALSE(verdict.pass);
}

TEST_F(VerifierTest, WrongMeasurement) {
  policy_.set_enclave_measurements(0, HexEncode(crypto::RandomBytes(48)));
  ExpectOnlyFailure(Verify(Collect()), {"cvm.measurement"});
}

TEST_F(VerifierTest, FlippedCvmSignatureByte) {
  EvidenceBundle bundle = Collect();
  std::string report = bundle.cvm_report();
  report[kSnpSignatureOffset + 5] ^= 0x01;
  bundle.set_cvm_report(report);
  Verdict verdict = Verify(bundle);
  ExpectOnlyFailure(verdict, {"cvm.report.signature"});
  ExpectCheck(verdict, "cvm.report_data", Check::kSkipped);
}

TEST_F(VerifierTest, FlippedGpuSignatureByte) {
  EvidenceBundle bundle = Collect();
  std::string report = bundle.gpus(0).spdm_report();
  report[report.size() - 10] ^= 0x01;
  bundle.mutable_gpus(0)->set_spdm_report(report);
  // The binding covers the GPU report bytes too.
  ExpectOnlyFailure(Verify(bundle), {"gpu0.report.signature", "cvm.report_data"});
}

TEST_F(VerifierTest, FlippedReportDataBreaksTheSignature) {
  EvidenceBundle bundle = Collect();
  std::string report = bundle.cvm_report();
  report[0x50] ^= 0x01;  // REPORT_DATA
  bundle.set_cvm_report(report);
  ExpectOnlyFailure(Verify(bundle), {"cvm.report.signature"});
}

TEST_F(VerifierTest, ResignedWrongReportDataFailsTheBinding) {
  EvidenceBundle bundle = Collect();
  ResignCvm(bundle, [](Bytes& report) { report[0x50 + 63] ^= 0x80; });
  ExpectOnlyFailure(Verify(bundle), {"cvm.report_data"});
}

TEST_F(VerifierTest, SubstitutedEnclaveKeyFailsTheBinding) {
  EvidenceBundle bundle = Collect();
  bundle.set_enclave_signing_public_key(ToString(crypto::GenerateEd25519().public_key));
  ExpectOnlyFailure(Verify(bundle), {"cvm.report_data"});
  EvidenceBundle hpke_swapped = Collect();
  hpke_swapped.set_enclave_hpke_public_key(ToString(crypto::RandomBytes(32)));
  ExpectOnlyFailure(Verify(hpke_swapped), {"cvm.report_data", "gpu0.nonce"});
}

TEST_F(VerifierTest, WrongNonce) {
  EvidenceBundle bundle = Collect();
  Verdict verdict = VerifyBundle(bundle, crypto::RandomBytes(32), policy_, clock_.Now());
  ExpectOnlyFailure(verdict, {"evidence.nonce", "gpu0.nonce", "cvm.report_data"});
  Verdict short_nonce = VerifyBundle(bundle, Bytes(16, 1), policy_, clock_.Now());
  EXPECT_FALSE(short_nonce.pass);
  ExpectCheck(short_nonce, "evidence.nonce", Check::kFail);
}

TEST_F(VerifierTest, DebugCvmNeedsAllowDebug) {
  SimOptions options;
  options.debug = true;
  EvidenceBundle bundle = Collect(options);
  Verdict verdict = Verify(bundle);
  ExpectOnlyFailure(verdict, {"cvm.policy"});
  EXPECT_TRUE(absl::StrContains(verdict.Find("cvm.policy")->detail, "debug"));
  policy_.set_allow_debug(true);
  EXPECT_TRUE(Verify(bundle).pass);
}

TEST_F(VerifierTest, NonzeroVmplIsRefused) {
  EvidenceBundle bundle = Collect();
  ResignCvm(bundle, [](Bytes& report) { report[0x30] = 2; });
  ExpectOnlyFailure(Verify(bundle), {"cvm.policy"});
}

TEST_F(VerifierTest, ReportedTcbMustMatchTheVcek) {
  EvidenceBundle bundle = Collect();
  ResignCvm(bundle, [](Bytes& report) { report[0x180] += 1; });  // REPORTED_TCB bootloader SPL
  ExpectOnlyFailure(Verify(bundle), {"cvm.certs.tcb"});
}

TEST_F(VerifierTest, GpuVersionAllowLists) {
  EvidenceBundle bundle = Collect();
  policy_.mutable_gpu_versions()->add_driver_versions("535.86.09");
  ExpectOnlyFailure(Verify(bundle), {"gpu0.versions"});
  policy_.mutable_gpu_versions()->add_driver_versions("550.90.07");
  policy_.mutable_gpu_versions()->add_vbios_versions("96.00.9F.00.01");
  EXPECT_TRUE(Verify(bundle).pass);
  policy_.mutable_gpu_versions()->set_vbios_versions(0, "96.00.5E.00.01");
  ExpectOnlyFailure(Verify(bundle), {"gpu0.versions"});
}

TEST_F(VerifierTest, FwidMustMatchTheLeaf) {
  EvidenceBundle bundle = Collect();
  ResignGpu(bundle, [](SpdmReport& report) {
    report.opaque_fields[static_cast<uint16_t>(OpaqueType::kFwid)] = Bytes(48, 0xAB);
  });
  // Re-signed with the device key, so only the FWID comparison (and the binding) fail.
  ExpectOnlyFailure(Verify(bundle), {"gpu0.certs.fwid", "cvm.report_data"});
}

TEST_F(VerifierTest, GpuMeasurementsMustMatchTheFirmware) {
  EvidenceBundle bundle = Collect();
  ResignGpu(bundle, [](SpdmReport& report) { report.blocks[1].value[0] ^= 1; });
  Verdict verdict = Verify(bundle);
  ExpectOnlyFailure(verdict, {"gpu0.measurements", "cvm.report_data"});
  EXPECT_TRUE(absl::StrContains(verdict.Find("gpu0.measurements")->detail, ": 2"))
      << verdict.Find("gpu0.measurements")->detail;
}

TEST_F(VerifierTest, EvidenceAge) {
  EvidenceBundle bundle = Collect();
  absl::Time collected = absl::FromUnixSeconds(bundle.collected_at_unix());
  ASSERT_EQ(policy_.max_evidence_age_seconds(), kDevPolicyMaxEvidenceAgeSeconds);
  EXPECT_TRUE(VerifyBundle(bundle, nonce_, policy_, collected + absl::Hours(23)).pass);
  ExpectOnlyFailure(VerifyBundle(bundle, nonce_, policy_, collected + absl::Hours(25)),
                    {"evidence.age"});
  ExpectOnlyFailure(VerifyBundle(bundle, nonce_, policy_, collected - absl::Minutes(10)),
                    {"evidence.age"});
  EXPECT_TRUE(VerifyBundle(bundle, nonce_, policy_, collected - absl::Minutes(2)).pass);
  policy_.set_max_evidence_age_seconds(0);
  Verdict unlimited = VerifyBundle(bundle, nonce_, policy_, collected + absl::Hours(1000));
  EXPECT_TRUE(unlimited.pass) << unlimited.FailedSummary();
  ExpectCheck(unlimited, "evidence.age", Check::kSkipped);
  policy_.set_max_evidence_age_seconds(60);
  bundle.set_collected_at_unix(0);
  ExpectOnlyFailure(VerifyBundle(bundle, nonce_, policy_, collected), {"evidence.age"});
}

TEST_F(VerifierTest, BundleTypeMustMatchPolicy) {
  EvidenceBundle bundle = Collect();
  policy_.set_gpu(v1::GPU_TYPE_NONE);
  ExpectOnlyFailure(Verify(bundle), {"policy.tee"});
  policy_.set_gpu(v1::GPU_TYPE_SIM);
  policy_.set_tee(v1::TEE_TYPE_SEV_SNP);
  Verdict verdict = Verify(bundle);
  ExpectCheck(verdict, "policy.tee", Check::kFail);
  EXPECT_TRUE(absl::StrContains(verdict.Find("policy.tee")->detail, "requires tee sev-snp"));
}

TEST_F(VerifierTest, UnsupportedTypesFailClosed) {
  EvidenceBundle bundle = Collect();
  bundle.set_tee_type(v1::TEE_TYPE_TDX);
  policy_.set_tee(v1::TEE_TYPE_TDX);
  Verdict verdict = Verify(bundle);
  EXPECT_FALSE(verdict.pass);
  ExpectCheck(verdict, "cvm.report.parse", Check::kFail);
  ExpectCheck(verdict, "cvm.report_data", Check::kSkipped);

  EvidenceBundle gpu_bundle = Collect();
  gpu_bundle.set_gpu_type(v1::GPU_TYPE_NVIDIA_CC);
  policy_ = *MakeDevPolicy(dir_->path(), measurement_);
  policy_.set_gpu(v1::GPU_TYPE_NVIDIA_CC);
  Verdict gpu_verdict = Verify(gpu_bundle);
  EXPECT_FALSE(gpu_verdict.pass);
  ExpectCheck(gpu_verdict, "gpu0.report.parse", Check::kFail);
}

TEST_F(VerifierTest, CpuOnlyAndMultiGpuBundles) {
  SimOptions cpu_only;
  cpu_only.gpu_count = 0;
  EvidenceBundle bundle = Collect(cpu_only);
  ExpectOnlyFailure(Verify(bundle), {"policy.tee"});  // the dev policy expects a GPU
  policy_.set_gpu(v1::GPU_TYPE_NONE);
  EXPECT_TRUE(Verify(bundle).pass) << Verify(bundle).FailedSummary();

  policy_.set_gpu(v1::GPU_TYPE_SIM);
  SimOptions two;
  two.gpu_count = 2;
  EvidenceBundle pair = Collect(two);
  Verdict verdict = Verify(pair);
  EXPECT_TRUE(verdict.pass) << verdict.FailedSummary();
  ExpectCheck(verdict, "gpu1.nonce", Check::kPass);
  // Swapping the two GPU reports breaks their nonces and the binding.
  pair.mutable_gpus()->SwapElements(0, 1);
  ExpectOnlyFailure(Verify(pair), {"gpu0.nonce", "gpu1.nonce", "cvm.report_data"});
  // Dropping one breaks the binding.
  pair.mutable_gpus()->RemoveLast();
  EXPECT_FALSE(Verify(pair).pass);
  // A GPU type with no reports is refused.
  pair.clear_gpus();
  ExpectCheck(Verify(pair), "evidence.gpus", Check::kFail);
}

TEST_F(VerifierTest, GarbageReportsFailToParse) {
  EvidenceBundle bundle = Collect();
  bundle.set_cvm_report("not a report");
  bundle.mutable_gpus(0)->set_spdm_report(std::string(100, '\x11'));
  Verdict verdict = Verify(bundle);
  EXPECT_FALSE(verdict.pass);
  ExpectCheck(verdict, "cvm.report.parse", Check::kFail);
  ExpectCheck(verdict, "cvm.report.signature", Check::kSkipped);
  ExpectCheck(verdict, "cvm.measurement", Check::kSkipped);
  ExpectCheck(verdict, "gpu0.report.parse", Check::kFail);
  ExpectCheck(verdict, "gpu0.nonce", Check::kSkipped);
  bundle.set_cvm_cert_chain_pem("junk");
  ExpectCheck(Verify(bundle), "cvm.certs.chain", Check::kFail);
}

TEST_F(VerifierTest, EmptyPolicyRootsFail) {
  policy_.mutable_sim()->clear_cvm_root_pem();
  Verdict verdict = Verify(Collect());
  ExpectOnlyFailure(verdict, {"cvm.certs.chain"});
  EXPECT_TRUE(absl::StrContains(verdict.Find("cvm.certs.chain")->detail, "sim.cvm_root_pem"));
}

// ---- challenges ----

class ChallengeTest : public VerifierTest {
 protected:
  ChallengeResponse Cached(const Bytes& client_nonce) {
    ChallengeResponse response;
    response.set_bundle(Collect().SerializeAsString());
    auto signature = crypto::Ed25519Sign(
        signing_.seed.span(), ChallengeMessage(EvidenceDigest(response.bundle()), client_nonce));
    EXPECT_TRUE(signature.ok());
    response.set_nonce_signature(ToString(*signature));
    response.set_fresh(false);
    return response;
  }
  absl::Time At() const { return clock_.Now() + absl::Seconds(1); }
};

TEST_F(ChallengeTest, CachedEvidenceWithSignature) {
  Bytes client_nonce = crypto::RandomBytes(32);
  ChallengeResponse response = Cached(client_nonce);
  auto verdict = VerifyChallenge(response, client_nonce, policy_, At());
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_TRUE(verdict->pass) << verdict->FailedSummary();
  ExpectCheck(*verdict, "challenge.signature", Check::kPass);
  ExpectCheck(*verdict, "challenge.fresh", Check::kPass);
  EXPECT_EQ(verdict->evidence_digest, EvidenceDigest(response.bundle()));
  EXPECT_EQ(verdict->enclave_signing_public_key, signing_.public_key);
  EXPECT_EQ(verdict->enclave_hpke_public_key, hpke_);
  EXPECT_EQ(verdict->claims["evidence.digest"], HexEncode(verdict->evidence_digest));
}

TEST_F(ChallengeTest, CachedEvidenceFailures) {
  Bytes client_nonce = crypto::RandomBytes(32);
  ChallengeResponse response = Cached(client_nonce);

  // Another client's nonce.
  auto other = VerifyChallenge(response, crypto::RandomBytes(32), policy_, At());
  ASSERT_TRUE(other.ok());
  ExpectOnlyFailure(*other, {"challenge.signature"});

  // A flipped signature byte.
  ChallengeResponse flipped = response;
  std::string signature = flipped.nonce_signature();
  signature[3] ^= 1;
  flipped.set_nonce_signature(signature);
  ExpectOnlyFailure(*VerifyChallenge(flipped, client_nonce, policy_, At()),
                    {"challenge.signature"});

  // The bundle changed after signing (the host edits the collection time).
  EvidenceBundle bundle;
  ASSERT_TRUE(bundle.ParseFromString(response.bundle()));
  bundle.set_collected_at_unix(bundle.collected_at_unix() + 1);
  ChallengeResponse edited = response;
  edited.set_bundle(bundle.SerializeAsString());
  ExpectOnlyFailure(*VerifyChallenge(edited, client_nonce, policy_, At()), {"challenge.signature"});

  // The policy wants fresh evidence.
  policy_.set_require_fresh_evidence(true);
  ExpectOnlyFailure(*VerifyChallenge(response, client_nonce, policy_, At()), {"challenge.fresh"});
}

TEST_F(ChallengeTest, FreshEvidence) {
  policy_.set_require_fresh_evidence(true);
  ChallengeResponse response;
  response.set_bundle(Collect().SerializeAsString());
  response.set_fresh(true);
  auto verdict = VerifyChallenge(response, nonce_, policy_, At());
  ASSERT_TRUE(verdict.ok());
  EXPECT_TRUE(verdict->pass) << verdict->FailedSummary();
  ExpectCheck(*verdict, "challenge.nonce", Check::kPass);
  ExpectCheck(*verdict, "challenge.signature", Check::kSkipped);

  auto other = VerifyChallenge(response, crypto::RandomBytes(32), policy_, At());
  ASSERT_TRUE(other.ok());
  ExpectOnlyFailure(*other, {"challenge.nonce"});
}

TEST_F(ChallengeTest, BadInputIsAnError) {
  ChallengeResponse response = Cached(nonce_);
  EXPECT_TRUE(
      absl::IsInvalidArgument(VerifyChallenge(response, Bytes(31, 0), policy_, At()).status()));
  response.set_bundle("\xff\xff\xff");
  EXPECT_TRUE(absl::IsInvalidArgument(VerifyChallenge(response, nonce_, policy_, At()).status()));
  response.clear_bundle();
  EXPECT_TRUE(absl::IsInvalidArgument(VerifyChallenge(response, nonce_, policy_, At()).status()));
}

}  // namespace
}  // namespace cloister::attest
