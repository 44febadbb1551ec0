// Tests of the hardware collector with the kernel and driver played by test doubles: FakeTsmFs
// signs real-format SNP reports with a simulated VCEK, the stand-in NVML library answers for
// the GPUs. Checks the binding (GPU nonces, REPORT_DATA), the bundle fields, the SNP chain
// from the auxblob, TDX quotes, the start-up checks and the sealing-key refusals.

#include "attest/collectors/hardware_collector.h"

#include <stdlib.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "attest/binding.h"
#include "attest/collectors/fake_tsm_fs.h"
#include "attest/snp_report.h"
#include "attest/test_util.h"
#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using testing::BuildSnpCertTableForTest;
using testing::FakeTsmFs;
using ::testing::HasSubstr;
using testing::ScopedTempDir;
using testing::SimSnpSignerForTest;

constexpr size_t kFakeReportNonceOffset = 17;  // "fake-nvml-report" || index || nonce

Bytes Filled(size_t size, uint8_t first) {
  Bytes out(size);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(first + i);
  return out;
}

// A synthetic TDX quote of `version` 4 or 5 with `report_data` as REPORTDATA: only the fields
// the collector looks at are set.
Bytes TdxQuote(uint16_t version, ByteSpan report_data, uint32_t tee_type = 0x81) {
  Bytes quote(48, 0);
  quote[0] = static_cast<uint8_t>(version);
  quote[2] = 2;  // ECDSA P-256
  for (int i = 0; i < 4; ++i) quote[4 + i] = static_cast<uint8_t>(tee_type >> (8 * i));
  if (version == 5) {
    Append(quote, Bytes{2, 0, 0x48, 0x02, 0, 0});  // body type 2, body size 584
  }
  size_t body = quote.size();
  quote.resize(body + 584, 0);
  std::copy(report_data.begin(), report_data.end(), quote.begin() + body + 0x208);
  Append(quote, Bytes(4, 0));  // empty signature data
  return quote;
}

class HardwareCollectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name :
         {"CLOISTER_FAKE_NVML_CC", "CLOISTER_FAKE_NVML_ENV", "CLOISTER_FAKE_NVML_GPUS",
          "CLOISTER_FAKE_NVML_ARCH", "CLOISTER_FAKE_NVML_FAIL", "CLOISTER_FAKE_NVML_CHAIN_FILE"}) {
      ::unsetenv(name);
    }
    auto signer = SimSnpSignerForTest::Create(dir_.path() + "/sim");
    ASSERT_TRUE(signer.ok()) << signer.status();
    signer_ = std::move(*signer);
    root_ = dir_.path() + "/tsm/report";
    ASSERT_TRUE(MakeDirs(root_).ok());
    gpu_chain_pem_ = ChainToPem(signer_->certificates().gpu_chain);
    std::string chain_path = dir_.path() + "/gpu_chain.pem";
    ASSERT_TRUE(WriteFileAtomic(chain_path, gpu_chain_pem_).ok());
    ::setenv("CLOISTER_FAKE_NVML_CHAIN_FILE", chain_path.c_str(), 1);
  }
  void TearDown() override { ::unsetenv("CLOISTER_FAKE_NVML_CHAIN_FILE"); }

  std::unique_ptr<FakeTsmFs> SnpFs(std::optional<Bytes> auxblob = std::nullopt) {
    return std::make_unique<FakeTsmFs>(
        root_, std::string(kTsmProviderSevGuest),
        [this](ByteSpan inblob, std::optional<uint32_t> privlevel) {
          return signer_->Report(inblob, privlevel.value_or(0));
        },
        auxblob.has_value() ? std::move(auxblob) : signer_->CertTable());
  }

  HardwareOptions Options(TsmFs* fs, HardwareGpu gpu = HardwareGpu::kNvidiaCc) {
    HardwareOptions options;
    options.tee = HardwareTee::kSevSnp;
    options.gpu = gpu;
    options.tsm_root = root_;
    options.sev_guest_device = dir_.path() + "/no-sev-guest";
    options.nvml_library = CLOISTER_FAKE_NVML_PATH;
    options.clock = &clock_;
    options.tsm_fs = fs;
    return options;
  }

  ScopedTempDir dir_;
  std::string root_;
  std::string gpu_chain_pem_;
  std::unique_ptr<SimSnpSignerForTest> signer_;
  FakeClock clock_{absl::FromUnixSeconds(1'800'000'123)};
  const Bytes nonce_ = Filled(32, 0x10);
  const Bytes hpke_ = Filled(32, 0x40);
  const Bytes signing_ = Filled(32, 0x80);
};

TEST_F(HardwareCollectorTest, SnpWithTwoGpusBindsEverything) {
  ::setenv("CLOISTER_FAKE_NVML_GPUS", "2", 1);
  auto fs = SnpFs();
  auto collector = MakeHardwareCollector(Options(fs.get()));
  ASSERT_TRUE(collector.ok()) << collector.status();
  auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
  ASSERT_TRUE(bundle.ok()) << bundle.status();

  EXPECT_EQ(bundle->tee_type(), v1::TEE_TYPE_SEV_SNP);
  EXPECT_EQ(bundle->gpu_type(), v1::GPU_TYPE_NVIDIA_CC);
  EXPECT_EQ(bundle->nonce(), ToString(nonce_));
  EXPECT_EQ(bundle->enclave_hpke_public_key(), ToString(hpke_));
  EXPECT_EQ(bundle->enclave_signing_public_key(), ToString(signing_));
  EXPECT_EQ(bundle->collected_at_unix(), 1'800'000'123);
  ASSERT_EQ(bundle->gpus_size(), 2);
  std::vector<Bytes> gpu_reports;
  for (uint32_t i = 0; i < 2; ++i) {
    const v1::GpuEvidence& gpu = bundle->gpus(static_cast<int>(i));
    Bytes report = ToBytes(gpu.spdm_report());
    ASSERT_EQ(report.size(), kFakeReportNonceOffset + 32);
    EXPECT_EQ(report[kFakeReportNonceOffset - 1], i);  // asked of GPU i
    EXPECT_EQ(Bytes(report.begin() + kFakeReportNonceOffset, report.end()),
              GpuRequesterNonce(nonce_, hpke_, i));
    EXPECT_EQ(gpu.cert_chain_pem(), gpu_chain_pem_);
    EXPECT_EQ(gpu.arch(), "HOPPER");
    gpu_reports.push_back(report);
  }

  auto report = ParseSnpReport(ToBytes(bundle->cvm_report()));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->report_data, ReportData(nonce_, gpu_reports, hpke_, signing_));
  EXPECT_EQ(report->measurement, signer_->measurement());

  // The chain came from the auxblob, leaf first, and it signs the report.
  auto chain = ParsePemChain(bundle->cvm_cert_chain_pem());
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->size(), 3u);
  EXPECT_TRUE(VerifyChain(*chain, signer_->certificates().cvm_root, absl::Now()).ok());
  EXPECT_TRUE(VerifyP1363WithCertificate(
                  (*chain)[0], crypto::HashAlg::kSha384,
                  ByteSpan(ToBytes(bundle->cvm_report())).first(kSnpSignedSize), report->signature)
                  .ok());
  EXPECT_EQ(fs->entries_made(), 1);
  EXPECT_EQ(fs->entries_removed(), 1);
}

TEST_F(HardwareCollectorTest, SnpWithoutGpus) {
  auto fs = SnpFs();
  auto collector = MakeHardwareCollector(Options(fs.get(), HardwareGpu::kNone));
  ASSERT_TRUE(collector.ok()) << collector.status();
  auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
  ASSERT_TRUE(bundle.ok()) << bundle.status();
  EXPECT_EQ(bundle->gpu_type(), v1::GPU_TYPE_NONE);
  EXPECT_EQ(bundle->gpus_size(), 0);
  auto report = ParseSnpReport(ToBytes(bundle->cvm_report()));
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->report_data, ReportData(nonce_, {}, hpke_, signing_));
}

TEST_F(HardwareCollectorTest, PrivlevelReachesTheReport) {
  auto fs = SnpFs();
  HardwareOptions options = Options(fs.get(), HardwareGpu::kNone);
  options.privlevel = 1;
  auto collector = MakeHardwareCollector(options);
  ASSERT_TRUE(collector.ok()) << collector.status();
  auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
  ASSERT_TRUE(bundle.ok()) << bundle.status();
  EXPECT_EQ(ParseSnpReport(ToBytes(bundle->cvm_report()))->vmpl, 1u);
  options.privlevel = 4;
  EXPECT_EQ(MakeHardwareCollector(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(HardwareCollectorTest, HostWithoutCertificatesGivesAnEmptyChain) {
  auto fs = SnpFs(Bytes());
  auto collector = MakeHardwareCollector(Options(fs.get(), HardwareGpu::kNone));
  ASSERT_TRUE(collector.ok()) << collector.status();
  auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
  ASSERT_TRUE(bundle.ok()) << bundle.status();
  EXPECT_EQ(bundle->cvm_cert_chain_pem(), "");
  EXPECT_FALSE(bundle->cvm_report().empty());
}

TEST_F(HardwareCollectorTest, MalformedCertificateTableIsRefused) {
  Bytes table = BuildSnpCertTableForTest({{kSnpVcekGuid, ToBytes("garbage")}});
  auto fs = SnpFs(table);
  auto collector = MakeHardwareCollector(Options(fs.get(), HardwareGpu::kNone));
  ASSERT_TRUE(collector.ok()) << collector.status();
  auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
  EXPECT_EQ(bundle.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bundle.status().message(), HasSubstr("the host's certificates are unusable"));
}

TEST_F(HardwareCollectorTest, ReportOverOtherDataIsRefused) {
  FakeTsmFs fs(
      root_, std::string(kTsmProviderSevGuest),
      [this](ByteSpan, std::optional<uint32_t>) { return signer_->Report(Bytes(64, 0), 0); },
      signer_->CertTable());
  auto collector = MakeHardwareCollector(Options(&fs, HardwareGpu::kNone));
  ASSERT_TRUE(collector.ok());
  auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
  EXPECT_EQ(bundle.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(bundle.status().message(), "the SNP report's REPORT_DATA is not the one requested");
}

TEST_F(HardwareCollectorTest, OutblobThatIsNotAnSnpReportIsRefused) {
  FakeTsmFs fs(
      root_, std::string(kTsmProviderSevGuest),
      [](ByteSpan inblob, std::optional<uint32_t>) -> absl::StatusOr<Bytes> {
        return Bytes(inblob.begin(), inblob.end());
      },
      Bytes());
  auto collector = MakeHardwareCollector(Options(&fs, HardwareGpu::kNone));
  ASSERT_TRUE(collector.ok());
  auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
  EXPECT_EQ(bundle.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bundle.status().message(), HasSubstr("the SNP report does not parse"));
}

TEST_F(HardwareCollectorTest, TdxProviderUnderSnpIsRefused) {
  FakeTsmFs fs(
      root_, std::string(kTsmProviderTdxGuest),
      [](ByteSpan inblob, std::optional<uint32_t>) { return TdxQuote(4, inblob); }, std::nullopt);
  auto collector = MakeHardwareCollector(Options(&fs, HardwareGpu::kNone));
  ASSERT_TRUE(collector.ok());
  EXPECT_EQ((*collector)->Collect(nonce_, hpke_, signing_).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(HardwareCollectorTest, TdxQuotesOfBothVersions) {
  for (uint16_t version : {4, 5}) {
    FakeTsmFs fs(
        root_, std::string(kTsmProviderTdxGuest),
        [version](ByteSpan inblob, std::optional<uint32_t>) { return TdxQuote(version, inblob); },
        std::nullopt);
    HardwareOptions options = Options(&fs);
    options.tee = HardwareTee::kTdx;
    auto collector = MakeHardwareCollector(options);
    ASSERT_TRUE(collector.ok()) << collector.status();
    auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
    ASSERT_TRUE(bundle.ok()) << bundle.status();
    EXPECT_EQ(bundle->tee_type(), v1::TEE_TYPE_TDX);
    EXPECT_EQ(bundle->gpu_type(), v1::GPU_TYPE_NVIDIA_CC);
    ASSERT_EQ(bundle->gpus_size(), 1);
    Bytes expected_data =
        ReportData(nonce_, {ToBytes(bundle->gpus(0).spdm_report())}, hpke_, signing_);
    EXPECT_EQ(ToBytes(bundle->cvm_report()), TdxQuote(version, expected_data));
    EXPECT_EQ(bundle->cvm_cert_chain_pem(), "");
  }
}

TEST_F(HardwareCollectorTest, TdxQuoteChecks) {
  struct Case {
    std::function<Bytes(ByteSpan)> make;
    std::string message;
  };
  std::vector<Case> cases = {
      {[](ByteSpan) { return TdxQuote(4, Bytes(64, 0)); },
       "the TDX quote's REPORTDATA is not the one requested"},
      {[](ByteSpan data) { return TdxQuote(4, data, 0x00); }, "not TDX (0x81)"},
      {[](ByteSpan data) { return TdxQuote(3, data); }, "version 3, not 4 or 5"},
      {[](ByteSpan) { return Bytes(100, 0); }, "too short for a quote"},
  };
  for (const Case& c : cases) {
    FakeTsmFs fs(
        root_, std::string(kTsmProviderTdxGuest),
        [&c](ByteSpan inblob, std::optional<uint32_t>) -> absl::StatusOr<Bytes> {
          return c.make(inblob);
        },
        std::nullopt);
    HardwareOptions options = Options(&fs, HardwareGpu::kNone);
    options.tee = HardwareTee::kTdx;
    auto collector = MakeHardwareCollector(options);
    ASSERT_TRUE(collector.ok()) << collector.status();
    auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
    EXPECT_EQ(bundle.status().code(), absl::StatusCode::kDataLoss) << c.message;
    EXPECT_THAT(bundle.status().message(), HasSubstr(c.message));
  }
}

TEST_F(HardwareCollectorTest, MissingTeeInterfacesAreRefusedAtCreation) {
  HardwareOptions snp = Options(nullptr, HardwareGpu::kNone);
  snp.tsm_root = dir_.path() + "/no-tsm";
  auto none = MakeHardwareCollector(snp);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("no SEV-SNP guest interface"));

  HardwareOptions tdx = snp;
  tdx.tee = HardwareTee::kTdx;
  auto tdx_none = MakeHardwareCollector(tdx);
  EXPECT_EQ(tdx_none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(tdx_none.status().message(), HasSubstr("no configfs-tsm at"));
}

// Without configfs-tsm an SNP collector uses /dev/sev-guest; a regular file standing in for
// the device refuses the ioctls, and the error says which one.
TEST_F(HardwareCollectorTest, SnpFallsBackToSevGuest) {
  HardwareOptions options = Options(nullptr, HardwareGpu::kNone);
  options.tsm_root = dir_.path() + "/no-tsm";
  options.sev_guest_device = dir_.path() + "/sev-guest";
  ASSERT_TRUE(WriteFileAtomic(options.sev_guest_device, "").ok());
  auto collector = MakeHardwareCollector(options);
  ASSERT_TRUE(collector.ok()) << collector.status();
  auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
  EXPECT_THAT(bundle.status().message(),
              HasSubstr("SNP_GET_REPORT on " + options.sev_guest_device + " failed"));
}

TEST_F(HardwareCollectorTest, GpuChecks) {
  auto fs = SnpFs();
  EXPECT_TRUE(CheckGpuReady(Options(fs.get(), HardwareGpu::kNone)).ok());
  EXPECT_TRUE(CheckGpuReady(Options(fs.get())).ok());

  HardwareOptions absent = Options(fs.get());
  absent.nvml_library = "libcloister-no-such-nvml.so.1";
  EXPECT_EQ(CheckGpuReady(absent).message(),
            "NVML not available: libcloister-no-such-nvml.so.1 not found");
  EXPECT_EQ(MakeHardwareCollector(absent).status().message(),
            "NVML not available: libcloister-no-such-nvml.so.1 not found");
  // A collector without GPUs never loads NVML.
  absent.gpu = HardwareGpu::kNone;
  EXPECT_TRUE(MakeHardwareCollector(absent).ok());

  struct Case {
    const char* variable;
    const char* value;
    std::string message;
  };
  std::vector<Case> cases = {
      {"CLOISTER_FAKE_NVML_CC", "0",
       "GPU confidential computing is off (nvmlSystemGetConfComputeState: ccFeature=0)"},
      {"CLOISTER_FAKE_NVML_ENV", "1",
       "GPU confidential computing is not in the hardware environment "
       "(nvmlSystemGetConfComputeState: environment=1)"},
      {"CLOISTER_FAKE_NVML_GPUS", "0", "NVML found no GPU (nvmlDeviceGetCount_v2 returned 0)"},
      {"CLOISTER_FAKE_NVML_ARCH", "7",
       "GPU 0 (GPU-fake-0) is ARCH_7, not Hopper or Blackwell: it has no confidential computing"},
  };
  for (const Case& c : cases) {
    ::setenv(c.variable, c.value, 1);
    absl::Status status = CheckGpuReady(Options(fs.get()));
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << c.message;
    EXPECT_EQ(status.message(), c.message);
    EXPECT_EQ(MakeHardwareCollector(Options(fs.get())).status().message(), c.message);
    ::unsetenv(c.variable);
  }
}

TEST_F(HardwareCollectorTest, GpuFailureDuringCollectIsReported) {
  auto fs = SnpFs();
  auto collector = MakeHardwareCollector(Options(fs.get()));
  ASSERT_TRUE(collector.ok()) << collector.status();
  ::setenv("CLOISTER_FAKE_NVML_FAIL", "nvmlDeviceGetConfComputeGpuAttestationReport=15", 1);
  auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
  ::unsetenv("CLOISTER_FAKE_NVML_FAIL");
  EXPECT_EQ(bundle.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(bundle.status().message(),
              HasSubstr("nvmlDeviceGetConfComputeGpuAttestationReport (GPU 0) failed"));
  EXPECT_EQ(fs->entries_made(), 0);  // no CVM report without the GPU evidence
}

TEST_F(HardwareCollectorTest, BadCollectArguments) {
  auto fs = SnpFs();
  auto collector = MakeHardwareCollector(Options(fs.get(), HardwareGpu::kNone));
  ASSERT_TRUE(collector.ok());
  EXPECT_EQ((*collector)->Collect(Bytes(31, 0), hpke_, signing_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*collector)->Collect(nonce_, Bytes(33, 0), signing_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*collector)->Collect(nonce_, hpke_, Bytes()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fs->entries_made(), 0);
}

TEST_F(HardwareCollectorTest, ConcurrentCollectsEachGetTheirOwnBinding) {
  ::setenv("CLOISTER_FAKE_NVML_GPUS", "2", 1);
  auto fs = SnpFs();
  auto collector = MakeHardwareCollector(Options(fs.get()));
  ASSERT_TRUE(collector.ok()) << collector.status();
  constexpr int kThreads = 4;
  std::vector<absl::StatusOr<v1::EvidenceBundle>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      results[t] = (*collector)->Collect(Filled(32, static_cast<uint8_t>(t * 32)), hpke_, signing_);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(results[t].ok()) << results[t].status();
    const auto& bundle = *results[t];
    std::vector<Bytes> gpu_reports;
    for (const auto& gpu : bundle.gpus()) gpu_reports.push_back(ToBytes(gpu.spdm_report()));
    Bytes nonce = Filled(32, static_cast<uint8_t>(t * 32));
    EXPECT_EQ(ParseSnpReport(ToBytes(bundle.cvm_report()))->report_data,
              ReportData(nonce, gpu_reports, hpke_, signing_));
  }
  EXPECT_EQ(fs->entries_made(), kThreads);
  EXPECT_EQ(fs->entries_removed(), kThreads);
}

TEST_F(HardwareCollectorTest, SealingKeys) {
  HardwareOptions tdx = Options(nullptr, HardwareGpu::kNone);
  tdx.tee = HardwareTee::kTdx;
  auto tdx_key = HardwareSealingKey(tdx, AsBytes("label"));
  EXPECT_EQ(tdx_key.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(tdx_key.status().message(), "TDX sealing needs a key service (not configured)");

  HardwareOptions snp = Options(nullptr, HardwareGpu::kNone);
  auto snp_key = HardwareSealingKey(snp, AsBytes("label"));
  EXPECT_EQ(snp_key.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(snp_key.status().message(), HasSubstr("not an SEV-SNP guest"));
}

}  // namespace
}  // namespace cloister::attest
