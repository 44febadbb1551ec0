// Composite evidence bundles with NVIDIA GPU evidence: a simulated CVM report (re-signed with
// the simulated VCEK so that its REPORT_DATA binds whatever GPU reports a test puts in) plus
// real or synthetic NVIDIA SPDM reports, verified end to end by VerifyBundle.
#include "attest/nvidia/bundle_verifier.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attest/binding.h"
#include "attest/nvidia/test_pki.h"
#include "attest/sim/sim_tee.h"
#include "attest/snp_report.h"
#include "attest/test_util.h"
#include "crypto/ecdsa.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using ::cloister::attest::testing::Detail;
using ::cloister::attest::testing::Dump;
using ::cloister::attest::testing::Failed;
using ::cloister::attest::testing::MakeTestDevicePki;
using ::cloister::attest::testing::MakeTestReport;
using ::cloister::attest::testing::MakeTestRim;
using ::cloister::attest::testing::MakeTestRimPki;
using ::cloister::attest::testing::NvidiaPath;
using ::cloister::attest::testing::ParseTestTime;
using ::cloister::attest::testing::ReadNvidiaHex;
using ::cloister::attest::testing::ReadNvidiaText;
using ::cloister::attest::testing::ResultOf;
using ::cloister::attest::testing::ScopedTempDir;
using ::cloister::attest::testing::SignTestReport;
using ::cloister::attest::testing::SignTestRim;
using ::cloister::attest::testing::TestDevicePki;
using ::cloister::attest::testing::TestDigest;
using ::cloister::attest::testing::TestReportSpec;
using ::cloister::attest::testing::TestRimPki;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kE2e[] = "hopper-545.00-e2e";
constexpr char kProdVbios545[] = "rims/nvtrust-vbios/1010_0200_882_96005E0001_PROD.swidtag";

absl::Time In2024() { return ParseTestTime("2024-06-01T00:00:00Z"); }

void WriteText(const std::string& path, const std::string& text) {
  ASSERT_TRUE(WriteFileAtomic(path, text, 0644).ok()) << path;
}

// A simulated CVM and its policy, for bundles whose GPU part each test chooses.
class CompositeBundle {
 public:
  CompositeBundle() {
    sim_dir_ = temp_.path() + "/sim";
    rim_dir_ = temp_.path() + "/rims";
    std::filesystem::create_directories(rim_dir_);
    EXPECT_TRUE(EnsureSimRoots(sim_dir_).ok());
    auto key_pem = ReadFile(sim_dir_ + "/" + std::string(kSimCvmLeafKeyFile));
    EXPECT_TRUE(key_pem.ok());
    auto key = crypto::EcPrivateKey::FromPem(*key_pem);
    EXPECT_TRUE(key.ok());
    vcek_key_ = *std::move(key);
    auto roots = LoadSimRootCertificates(sim_dir_);
    EXPECT_TRUE(roots.ok());

    policy_.set_name("composite-test");
    policy_.set_tee(v1::TEE_TYPE_SIM);
    policy_.set_gpu(v1::GPU_TYPE_NVIDIA_CC);
    policy_.add_enclave_measurements(HexEncode(measurement_));
    policy_.mutable_sim()->set_cvm_root_pem(roots->cvm_root.ToPem());
    policy_.mutable_nvidia()->set_rim_dir(rim_dir_);
  }

  // The bundle over nonce() with `gpus`, its CVM report binding them (unless `bind` is false:
  // then it binds `bind_reports` instead, to model a GPU report swapped in afterwards).
  v1::EvidenceBundle Make(const std::vector<v1::GpuEvidence>& gpus, bool debug = false,
                          const std::vector<Bytes>* bind_reports = nullptr) {
    SimOptions options;
    options.gpu_count = 0;
    options.debug = debug;
    auto collector = MakeSimCollector(sim_dir_, measurement_, options);
    EXPECT_TRUE(collector.ok()) << collector.status();
    auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
    EXPECT_TRUE(bundle.ok()) << bundle.status();
    bundle->set_gpu_type(v1::GPU_TYPE_NVIDIA_CC);
    std::vector<Bytes> reports;
    for (const v1::GpuEvidence& gpu : gpus) {
      *bundle->add_gpus() = gpu;
      reports.push_back(ToBytes(gpu.spdm_report()));
    }
    Resign(*bundle, ReportData(nonce_, bind_reports ? *bind_reports : reports, hpke_, signing_));
    return *bundle;
  }

  Verdict Verify(const v1::EvidenceBundle& bundle, absl::Time at) const {
    return VerifyBundle(bundle, nonce_, policy_, at);
  }

  const Bytes& nonce() const { return nonce_; }
  const Bytes& hpke() const { return hpke_; }
  const std::string& rim_dir() const { return rim_dir_; }
  Policy& policy() { return policy_; }

 private:
  void Resign(v1::EvidenceBundle& bundle, const Bytes& report_data) {
    auto report = ParseSnpReport(AsBytes(bundle.cvm_report()));
    ASSERT_TRUE(report.ok()) << report.status();
    report->report_data = report_data;
    auto bytes = EncodeSnpReportToSign(*report);
    ASSERT_TRUE(bytes.ok());
    auto signature =
        vcek_key_->SignP1363(crypto::HashAlg::kSha384, ByteSpan(*bytes).first(kSnpSignedSize));
    ASSERT_TRUE(signature.ok());
    ASSERT_TRUE(SetSnpSignature(*bytes, *signature).ok());
    bundle.set_cvm_report(ToString(*bytes));
  }

  ScopedTempDir temp_;
  std::string sim_dir_, rim_dir_;
  std::unique_ptr<crypto::EcPrivateKey> vcek_key_;
  Bytes measurement_ = Bytes(48, 0x5A);
  Bytes nonce_ = Bytes(32, 0x42);
  Bytes hpke_ = Bytes(32, 0x01);
  Bytes signing_ = Bytes(32, 0x02);
  Policy policy_;
};

// A synthetic Hopper GPU (test PKIs shaped like NVIDIA's) with matching signed RIMs.
struct SyntheticGpu {
  TestDevicePki device = MakeTestDevicePki();
  TestRimPki rims = MakeTestRimPki();
  TestReportSpec spec;

  SyntheticGpu() {
    spec.fwid = device.fwid;
    spec.block_values = {{8, TestDigest(7)}, {2, TestDigest(1)}, {10, TestDigest(9)}};
  }
  void WriteRims(const std::string& dir, bool driver = true, bool vbios = true) const {
    if (driver) {
      WriteText(dir + "/driver.xml",
                SignTestRim(MakeTestRim(spec.driver_version, {{7, {TestDigest(7)}}}), rims));
    }
    if (vbios) {
      WriteText(dir + "/vbios.swidtag",
                SignTestRim(MakeTestRim(spec.vbios_version,
                                        {{1, {TestDigest(1)}}, {9, {TestDigest(9)}}}),
                            rims));
    }
  }
  void Trust(Policy& policy) const {
    policy.mutable_nvidia()->set_device_root_pem(device.root.cert.ToPem());
    policy.mutable_nvidia()->set_corim_root_pem(rims.root.cert.ToPem());
  }
  v1::GpuEvidence Evidence() const { return Evidence(spec); }
  v1::GpuEvidence Evidence(const TestReportSpec& report_spec) const {
    v1::GpuEvidence gpu;
    gpu.set_spdm_report(ToString(SignTestReport(MakeTestReport(report_spec), *device.leaf.key)));
    gpu.set_cert_chain_pem(device.ChainPem());
    gpu.set_arch("HOPPER");
    return gpu;
  }
};

class NvidiaBundleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EnableNvidiaGpuVerification();
    gpu_.spec.nonce = GpuRequesterNonce(composite_.nonce(), composite_.hpke(), 0);
    gpu_.WriteRims(composite_.rim_dir());
    gpu_.Trust(composite_.policy());
  }

  CompositeBundle composite_;
  SyntheticGpu gpu_;
};

TEST(NvidiaBundleRegistrationTest, UnregisteredNvidiaVerifierIsUnimplemented) {
  // Each test runs in its own process under ctest; this one never enables the verifier.
  auto verifier = MakeGpuVerifier(v1::GPU_TYPE_NVIDIA_CC);
  ASSERT_FALSE(verifier.ok());
  EXPECT_THAT(verifier.status().message(), HasSubstr("NVIDIA verifier is not linked in"));
  EnableNvidiaGpuVerification();
  EXPECT_TRUE(MakeGpuVerifier(v1::GPU_TYPE_NVIDIA_CC).ok());
}

TEST_F(NvidiaBundleTest, SyntheticGpuBundlePasses) {
  Verdict verdict = composite_.Verify(composite_.Make({gpu_.Evidence()}), In2024());
  EXPECT_TRUE(verdict.pass) << Dump(verdict);
  for (const char* check : {"cvm.report_data", "gpu0.report.signature", "gpu0.certs.chain",
                            "gpu0.nonce", "gpu0.rim.driver.signature", "gpu0.rim.vbios.signature",
                            "gpu0.measurements", "gpu0.versions"}) {
    EXPECT_EQ(ResultOf(verdict, check), Check::kPass) << check;
  }
  EXPECT_EQ(verdict.claims.at("gpu0.driver_rim.file"), "driver.xml");
  EXPECT_EQ(verdict.claims.at("gpu0.vbios_rim.file"), "vbios.swidtag");
  EXPECT_EQ(verdict.claims.at("gpu0.driver_version"), "550.90.07");
}

TEST_F(NvidiaBundleTest, TwoGpusEachBoundToItsIndex) {
  v1::GpuEvidence first = gpu_.Evidence();
  gpu_.spec.nonce = GpuRequesterNonce(composite_.nonce(), composite_.hpke(), 1);
  v1::GpuEvidence second = gpu_.Evidence();
  Verdict verdict = composite_.Verify(composite_.Make({first, second}), In2024());
  EXPECT_TRUE(verdict.pass) << Dump(verdict);
  // The same two reports in the other order: each nonce names the other index.
  verdict = composite_.Verify(composite_.Make({second, first}), In2024());
  EXPECT_THAT(Failed(verdict), ElementsAre("gpu0.nonce", "gpu1.nonce"));
}

// Each mutation of an otherwise valid bundle fails exactly the check that guards it.
TEST_F(NvidiaBundleTest, EveryMutationFailsTheRightCheck) {
  {  // GPU report signature
    v1::GpuEvidence gpu = gpu_.Evidence();
    std::string report = gpu.spdm_report();
    report[report.size() - 5] ^= 0x01;
    gpu.set_spdm_report(report);
    Verdict verdict = composite_.Verify(composite_.Make({gpu}), In2024());
    EXPECT_THAT(Failed(verdict), ElementsAre("gpu0.report.signature")) << Dump(verdict);
  }
  {  // GPU report collected over another nonce (bound into the CVM report all the same)
    TestReportSpec other = gpu_.spec;
    other.nonce = GpuRequesterNonce(Bytes(32, 0x43), composite_.hpke(), 0);
    Verdict verdict = composite_.Verify(composite_.Make({gpu_.Evidence(other)}), In2024());
    EXPECT_THAT(Failed(verdict), ElementsAre("gpu0.nonce")) << Dump(verdict);
  }
  {  // GPU report made for another enclave's key
    TestReportSpec other = gpu_.spec;
    other.nonce = GpuRequesterNonce(composite_.nonce(), Bytes(32, 0x09), 0);
    Verdict verdict = composite_.Verify(composite_.Make({gpu_.Evidence(other)}), In2024());
    EXPECT_THAT(Failed(verdict), ElementsAre("gpu0.nonce")) << Dump(verdict);
  }
  {  // a valid GPU report swapped in after the CVM report bound another one
    TestReportSpec other = gpu_.spec;
    other.driver_version = "550.90.08";
    std::vector<Bytes> bound = {ToBytes(gpu_.Evidence(other).spdm_report())};
    Verdict verdict = composite_.Verify(composite_.Make({gpu_.Evidence()}, false, &bound),
                                        In2024());
    EXPECT_THAT(Failed(verdict), ElementsAre("cvm.report_data")) << Dump(verdict);
  }
  {  // a measurement the RIM does not allow
    TestReportSpec other = gpu_.spec;
    other.block_values[0] = {8, TestDigest(8)};
    Verdict verdict = composite_.Verify(composite_.Make({gpu_.Evidence(other)}), In2024());
    EXPECT_THAT(Failed(verdict), ElementsAre("gpu0.measurements")) << Dump(verdict);
    EXPECT_THAT(Detail(verdict, "gpu0.measurements"), HasSubstr("indices 7"));
  }
  {  // the device chain out of order
    v1::GpuEvidence gpu = gpu_.Evidence();
    gpu.set_cert_chain_pem(gpu_.device.brom.cert.ToPem() + gpu_.device.leaf.cert.ToPem() +
                           gpu_.device.ica.cert.ToPem() + gpu_.device.identity.cert.ToPem() +
                           gpu_.device.root.cert.ToPem());
    Verdict verdict = composite_.Verify(composite_.Make({gpu}), In2024());
    EXPECT_EQ(ResultOf(verdict, "gpu0.certs.chain"), Check::kFail) << Dump(verdict);
    EXPECT_FALSE(verdict.pass);
  }
  {  // the CVM policy bits: a guest launched with debugging allowed
    Verdict verdict = composite_.Verify(composite_.Make({gpu_.Evidence()}, true), In2024());
    EXPECT_THAT(Failed(verdict), ElementsAre("cvm.policy")) << Dump(verdict);
  }
  {  // the bundle verified against another nonce
    v1::EvidenceBundle bundle = composite_.Make({gpu_.Evidence()});
    Verdict verdict = VerifyBundle(bundle, Bytes(32, 0x44), composite_.policy(), In2024());
    EXPECT_THAT(Failed(verdict), ::testing::Contains("evidence.nonce")) << Dump(verdict);
    EXPECT_THAT(Failed(verdict), ::testing::Contains("gpu0.nonce"));
    EXPECT_FALSE(verdict.pass);
  }
}

TEST_F(NvidiaBundleTest, VersionsOutsideThePolicyFail) {
  composite_.policy().mutable_gpu_versions()->add_driver_versions("535.86.09");
  Verdict verdict = composite_.Verify(composite_.Make({gpu_.Evidence()}), In2024());
  EXPECT_THAT(Failed(verdict), ElementsAre("gpu0.versions")) << Dump(verdict);
}

TEST_F(NvidiaBundleTest, MissingRimsSayWhereTheyWereLookedFor) {
  std::filesystem::remove(composite_.rim_dir() + "/vbios.swidtag");
  Verdict verdict = composite_.Verify(composite_.Make({gpu_.Evidence()}), In2024());
  EXPECT_EQ(ResultOf(verdict, "gpu0.rim.vbios.signature"), Check::kFail);
  EXPECT_THAT(Detail(verdict, "gpu0.rim.vbios.signature"),
              HasSubstr("no RIM for VBIOS 96.00.9F.00.01 in " + composite_.rim_dir()));
  EXPECT_FALSE(verdict.pass);

  composite_.policy().mutable_nvidia()->clear_rim_dir();
  verdict = composite_.Verify(composite_.Make({gpu_.Evidence()}), In2024());
  EXPECT_THAT(Detail(verdict, "gpu0.rim.driver.signature"), HasSubstr("nvidia.rim_dir"));
  EXPECT_FALSE(verdict.pass);

  composite_.policy().mutable_nvidia()->set_rim_dir(composite_.rim_dir() + "/absent");
  verdict = composite_.Verify(composite_.Make({gpu_.Evidence()}), In2024());
  EXPECT_THAT(Detail(verdict, "gpu0.rim.driver.signature"), HasSubstr("cannot be read"));
  EXPECT_FALSE(verdict.pass);
}

TEST_F(NvidiaBundleTest, OnlyThePinnedDeviceRootAnchorsTheChain) {
  composite_.policy().mutable_nvidia()->clear_device_root_pem();  // NVIDIA's real root
  Verdict verdict = composite_.Verify(composite_.Make({gpu_.Evidence()}), In2024());
  EXPECT_EQ(ResultOf(verdict, "gpu0.certs.chain"), Check::kFail);
  EXPECT_FALSE(verdict.pass);
}

TEST_F(NvidiaBundleTest, RequiredOcspReadsTheOcspDirectory) {
  composite_.policy().mutable_nvidia()->set_require_ocsp(true);
  Verdict verdict = composite_.Verify(composite_.Make({gpu_.Evidence()}), In2024());
  EXPECT_THAT(Failed(verdict), ElementsAre("gpu0.certs.ocsp")) << Dump(verdict);
}

// Real H100 evidence (driver 545.00) in a bundle, with NVIDIA's roots and the vector's RIMs in
// the policy's RIM directory. It was collected over NVIDIA's nonce, not over one derived from
// this bundle, so exactly gpu0.nonce fails; everything else about the real GPU passes.
class RealGpuBundleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EnableNvidiaGpuVerification();
    gpu_.set_spdm_report(ToString(ReadNvidiaHex(std::string(kE2e) + "/attestation_report.hex")));
    gpu_.set_cert_chain_pem(ReadNvidiaText(std::string(kE2e) + "/cert_chain.pem"));
    gpu_.set_arch("HOPPER");
    WriteText(composite_.rim_dir() + "/NV_GPU_DRIVER_GH100_545.00.xml",
              ReadNvidiaText(std::string(kE2e) + "/driver_rim_545.00_test.swidtag"));
  }
  CompositeBundle composite_;
  v1::GpuEvidence gpu_;
};

TEST_F(RealGpuBundleTest, Hopper545InABundleFailsOnlyTheBoundNonce) {
  WriteText(composite_.rim_dir() + "/vbios.xml",
            ReadNvidiaText(std::string(kE2e) + "/vbios_rim_96005E0001_test.swidtag"));
  Verdict verdict = composite_.Verify(composite_.Make({gpu_}), In2024());
  EXPECT_THAT(Failed(verdict), ElementsAre("gpu0.nonce")) << Dump(verdict);
  for (const char* check : {"cvm.report_data", "gpu0.report.signature", "gpu0.certs.chain",
                            "gpu0.rim.driver.signature", "gpu0.rim.vbios.signature",
                            "gpu0.measurements", "gpu0.versions"}) {
    EXPECT_EQ(ResultOf(verdict, check), Check::kPass) << check;
  }
  EXPECT_EQ(ResultOf(verdict, "gpu0.certs.ocsp"), Check::kSkipped);
  EXPECT_EQ(verdict.claims.at("gpu0.driver_version"), "545.00");
  EXPECT_EQ(verdict.claims.at("gpu0.vbios_rim.file"), "vbios.xml");
}

TEST_F(RealGpuBundleTest, ProductionVbiosRimFailsMeasurementsAt1_2_3_9) {
  WriteText(composite_.rim_dir() + "/vbios.xml", ReadNvidiaText(kProdVbios545));
  Verdict verdict = composite_.Verify(composite_.Make({gpu_}), In2024());
  EXPECT_THAT(Failed(verdict), ElementsAre("gpu0.nonce", "gpu0.measurements")) << Dump(verdict);
  EXPECT_THAT(Detail(verdict, "gpu0.measurements"), HasSubstr("indices 1, 2, 3, 9"));
}

TEST(RimDirectoryTest, IndexesByVersionAndListsWhatItSkipped) {
  ScopedTempDir temp;
  WriteText(temp.path() + "/a.xml",
            ReadNvidiaText(std::string(kE2e) + "/driver_rim_545.00_test.swidtag"));
  WriteText(temp.path() + "/b.SWIDTAG",
            ReadNvidiaText(std::string(kE2e) + "/vbios_rim_96005E0001_test.swidtag"));
  WriteText(temp.path() + "/broken.xml", "<not a rim/>");
  WriteText(temp.path() + "/notes.txt", "ignored");
  auto directory = LoadRimDirectory(temp.path());
  ASSERT_TRUE(directory.ok()) << directory.status();
  ASSERT_EQ(directory->rims.size(), 2u);
  EXPECT_EQ(directory->Find("545.00")->file, "a.xml");
  EXPECT_EQ(directory->Find("96.00.5e.00.01")->file, "b.SWIDTAG");
  EXPECT_EQ(directory->Find("550.90.07"), nullptr);
  ASSERT_EQ(directory->skipped.size(), 1u);
  EXPECT_THAT(directory->skipped[0], HasSubstr("broken.xml: "));

  EXPECT_TRUE(absl::IsNotFound(LoadRimDirectory(temp.path() + "/missing").status()));
}

}  // namespace
}  // namespace cloister::attest
