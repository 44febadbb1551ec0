#include <sys/stat.h>

#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "attest/binding.h"
#include "attest/measurement.h"
#include "attest/sim/sim_tee.h"
#include "attest/snp_report.h"
#include "attest/spdm.h"
#include "attest/test_util.h"
#include "attest/x509.h"
#include "base/file.h"
#include "crypto/hash.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using testing::ScopedTempDir;

std::string PathIn(const std::string& dir, std::string_view file) {
  return dir + "/" + std::string(file);
}

int Mode(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

TEST(SimRootsTest, CreatesCheckedSetOnce) {
  ScopedTempDir dir;
  std::string sim_dir = dir.path() + "/sim";
  ASSERT_TRUE(EnsureSimRoots(sim_dir).ok());
  EXPECT_EQ(Mode(sim_dir), 0700);
  for (std::string_view file : {kSimCvmLeafKeyFile, kSimGpuLeafKeyFile, kSimSealingSecretFile}) {
    EXPECT_EQ(Mode(PathIn(sim_dir, file)), 0600) << file;
  }
  for (std::string_view file : {kSimCvmRootFile, kSimCvmIntermediateFile, kSimCvmLeafFile,
                                kSimGpuRootFile, kSimGpuIntermediateFile, kSimGpuLeafFile}) {
    EXPECT_EQ(Mode(PathIn(sim_dir, file)) & 0600, 0600) << file;
    EXPECT_EQ(Mode(PathIn(sim_dir, file)) & 0022, 0) << file;
  }
  auto roots = LoadSimRootCertificates(sim_dir);
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_EQ(roots->cvm_root.SubjectCommonName(), "Cloister Simulated ARK");
  EXPECT_EQ(roots->cvm_chain[1].SubjectCommonName(), "Cloister Simulated ASK");
  EXPECT_EQ(roots->cvm_chain[0].SubjectCommonName(), "Cloister Simulated VCEK");
  EXPECT_EQ(roots->gpu_root.SubjectCommonName(), "Cloister Simulated Device Identity CA");
  EXPECT_EQ(roots->gpu_chain[0].SubjectCommonName(), "Cloister Simulated GPU FMC LF");
  auto vcek = ReadVcekExtensions(roots->cvm_chain[0]);
  ASSERT_TRUE(vcek.ok()) << vcek.status();
  EXPECT_EQ(vcek->hwid.size(), kSimChipIdSize);
  EXPECT_EQ(vcek->product_name, kSimProductName);
  auto fwid = DiceFwid(roots->gpu_chain[0]);
  ASSERT_TRUE(fwid.ok());
  EXPECT_EQ(fwid->size(), 48u);

  // A second call keeps the same roots.
  auto before = ReadFile(PathIn(sim_dir, kSimCvmRootFile));
  ASSERT_TRUE(EnsureSimRoots(sim_dir).ok());
  EXPECT_EQ(*ReadFile(PathIn(sim_dir, kSimCvmRootFile)), *before);
}

TEST(SimRootsTest, ConcurrentCallersShareOneSet) {
  ScopedTempDir dir;
  std::string sim_dir = dir.path() + "/sim";
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { results[i] = EnsureSimRoots(sim_dir); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& status : results) EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(LoadSimRootCertificates(sim_dir).ok());
}

TEST(SimRootsTest, RefusesHalfPresentSet) {
  ScopedTempDir dir;
  ASSERT_TRUE(EnsureSimRoots(dir.path()).ok());
  ASSERT_EQ(::unlink(PathIn(dir.path(), kSimGpuLeafKeyFile).c_str()), 0);
  absl::Status status = EnsureSimRoots(dir.path());
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "lacks gpu_leaf_key.pem")) << status;
  EXPECT_FALSE(FileExists(PathIn(dir.path(), kSimGpuLeafKeyFile)));  // not repaired
}

TEST(SimRootsTest, RefusesCorruptSets) {
  struct Case {
    std::string name;
    std::function<void(const std::string&)> damage;
    absl::StatusCode code;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"garbage certificate",
       [](const std::string& d) {
         ASSERT_TRUE(WriteFileAtomic(PathIn(d, kSimCvmIntermediateFile), "garbage", 0644).ok());
       },
       absl::StatusCode::kDataLoss, "cvm_ask.pem"},
      {"swapped keys",
       [](const std::string& d) {
         auto gpu_key = ReadFile(PathIn(d, kSimGpuLeafKeyFile));
         ASSERT_TRUE(WriteFileAtomic(PathIn(d, kSimCvmLeafKeyFile), *gpu_key, 0600).ok());
       },
       absl::StatusCode::kDataLoss, "does not belong to the certificate"},
      {"key readable by others",
       [](const std::string& d) { ::chmod(PathIn(d, kSimGpuLeafKeyFile).c_str(), 0644); },
       absl::StatusCode::kFailedPrecondition, "too open"},
      {"short sealing secret",
       [](const std::string& d) {
         ASSERT_TRUE(WriteFileAtomic(PathIn(d, kSimSealingSecretFile), "short", 0600).ok());
       },
       absl::StatusCode::kDataLoss, "sealing_secret: 5 bytes"},
      {"intermediate from another set",
       [](const std::string& d) {
         ScopedTempDir other;
         ASSERT_TRUE(EnsureSimRoots(other.path()).ok());
         auto ask = ReadFile(PathIn(other.path(), kSimCvmIntermediateFile));
         ASSERT_TRUE(WriteFileAtomic(PathIn(d, kSimCvmIntermediateFile), *ask, 0644).ok());
       },
       absl::StatusCode::kDataLoss, "cvm_vcek.pem"},
  };
  for (const Case& c : cases) {
    ScopedTempDir dir;
    ASSERT_TRUE(EnsureSimRoots(dir.path()).ok());
    c.damage(dir.path());
    absl::Status status = EnsureSimRoots(dir.path());
    EXPECT_EQ(status.code(), c.code) << c.name << ": " << status;
    EXPECT_TRUE(absl::StrContains(status.message(), c.expected)) << c.name << ": " << status;
  }
}

class SimCollectorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    ASSERT_TRUE(EnsureSimRoots(dir_->path()).ok());
  }
  static void TearDownTestSuite() { delete dir_; }
  static ScopedTempDir* dir_;

  const Bytes measurement_ = Bytes(48, 0x3C);
  const Bytes nonce_ = Bytes(32, 0x4E);
  const Bytes hpke_ = Bytes(32, 0x48);
  const Bytes signing_ = Bytes(32, 0x53);
};
ScopedTempDir* SimCollectorTest::dir_ = nullptr;

TEST_F(SimCollectorTest, ProducesRealFormatEvidence) {
  FakeClock clock;
  SimOptions options;
  options.gpu_count = 2;
  options.clock = &clock;
  auto collector = MakeSimCollector(dir_->path(), measurement_, options);
  ASSERT_TRUE(collector.ok()) << collector.status();
  auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
  ASSERT_TRUE(bundle.ok()) << bundle.status();
  EXPECT_EQ(bundle->tee_type(), v1::TEE_TYPE_SIM);
  EXPECT_EQ(bundle->gpu_type(), v1::GPU_TYPE_SIM);
  EXPECT_EQ(bundle->collected_at_unix(), absl::ToUnixSeconds(clock.Now()));
  EXPECT_EQ(ToBytes(bundle->nonce()), nonce_);
  ASSERT_EQ(bundle->gpus_size(), 2);
  auto roots = LoadSimRootCertificates(dir_->path());
  ASSERT_TRUE(roots.ok());

  std::vector<Bytes> gpu_reports;
  for (int i = 0; i < 2; ++i) {
    const v1::GpuEvidence& gpu = bundle->gpus(i);
    EXPECT_EQ(gpu.arch(), "SIM");
    Bytes bytes = ToBytes(gpu.spdm_report());
    gpu_reports.push_back(bytes);
    auto report = ParseSpdmReport(bytes);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->requester_nonce, GpuRequesterNonce(nonce_, hpke_, i));
    EXPECT_EQ(report->blocks.size(), 64u);
    EXPECT_EQ(report->driver_version, "550.90.07");
    EXPECT_EQ(report->vbios_version, "96.00.9F.00.01");
    EXPECT_EQ(report->opaque_data_version, 1u);
    EXPECT_EQ(report->feature_flag, 0u);
    EXPECT_EQ(bytes.size(), report->signed_size + kSpdmSignatureSize);
    auto chain = ParsePemChain(gpu.cert_chain_pem());
    ASSERT_TRUE(chain.ok());
    ASSERT_EQ(chain->size(), 3u);
    EXPECT_EQ(*report->fwid, DiceFwid((*chain)[0]).value());
    EXPECT_TRUE(VerifyChain(*chain, roots->gpu_root, clock.Now()).ok());
    EXPECT_TRUE(VerifyP1363WithCertificate((*chain)[0], crypto::HashAlg::kSha384,
                                           ByteSpan(bytes).first(report->signed_size),
                                           report->signature)
                    .ok());
    auto reference = SimGpuReferenceMeasurements("550.90.07", "96.00.9F.00.01");
    for (const SpdmMeasurementBlock& block : report->blocks) {
      auto it = reference.find(block.index);
      EXPECT_EQ(block.value, it != reference.end() ? it->second : Bytes(48, 0)) << int(block.index);
    }
  }

  Bytes cvm = ToBytes(bundle->cvm_report());
  auto report = ParseSnpReport(cvm);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->version, 3u);
  EXPECT_TRUE(report->policy & kSnpPolicyReservedOne);
  EXPECT_FALSE(report->debug_allowed());
  EXPECT_EQ(report->measurement, measurement_);
  EXPECT_EQ(report->report_data, ReportData(nonce_, gpu_reports, hpke_, signing_));
  auto vcek = ReadVcekExtensions(roots->cvm_chain[0]);
  ASSERT_TRUE(vcek.ok());
  EXPECT_EQ(report->chip_id, vcek->hwid);
  EXPECT_TRUE(CheckVcekMatchesReport(*vcek, *report).ok());
  auto chain = ParsePemChain(bundle->cvm_cert_chain_pem());
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ((*chain)[0].SubjectCommonName(), "Cloister Simulated VCEK");
  EXPECT_TRUE(VerifyP1363WithCertificate((*chain)[0], crypto::HashAlg::kSha384,
                                         ByteSpan(cvm).first(kSnpSignedSize), report->signature)
                  .ok());
}

TEST_F(SimCollectorTest, DebugOptionSetsPolicyBit) {
  SimOptions options;
  options.debug = true;
  options.gpu_count = 0;
  auto collector = MakeSimCollector(dir_->path(), measurement_, options);
  ASSERT_TRUE(collector.ok());
  auto bundle = (*collector)->Collect(nonce_, hpke_, signing_);
  ASSERT_TRUE(bundle.ok());
  EXPECT_EQ(bundle->gpu_type(), v1::GPU_TYPE_NONE);
  EXPECT_EQ(bundle->gpus_size(), 0);
  auto report = ParseSnpReport(ToBytes(bundle->cvm_report()));
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->debug_allowed());
}

TEST_F(SimCollectorTest, RefusesBadArguments) {
  EXPECT_FALSE(MakeSimCollector(dir_->path(), Bytes(47, 0)).ok());
  SimOptions many;
  many.gpu_count = 17;
  EXPECT_FALSE(MakeSimCollector(dir_->path(), measurement_, many).ok());
  SimOptions bad_vbios;
  bad_vbios.vbios_version = "1.2";
  EXPECT_FALSE(MakeSimCollector(dir_->path(), measurement_, bad_vbios).ok());
  ScopedTempDir empty;
  EXPECT_TRUE(absl::IsNotFound(MakeSimCollector(empty.path(), measurement_).status()));

  auto collector = MakeSimCollector(dir_->path(), measurement_);
  ASSERT_TRUE(collector.ok());
  EXPECT_FALSE((*collector)->Collect(Bytes(31, 0), hpke_, signing_).ok());
  EXPECT_FALSE((*collector)->Collect(nonce_, Bytes(33, 0), signing_).ok());
  EXPECT_FALSE((*collector)->Collect(nonce_, hpke_, Bytes()).ok());
}

TEST_F(SimCollectorTest, SealingKeys) {
  auto key = SimSealingKey(dir_->path(), measurement_, AsBytes("model keys"));
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->size(), 32u);
  auto same = SimSealingKey(dir_->path(), measurement_, AsBytes("model keys"));
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(ConstantTimeEquals(key->span(), same->span()));
  Bytes other_measurement = measurement_;
  other_measurement[0] ^= 1;
  auto other = SimSealingKey(dir_->path(), other_measurement, AsBytes("model keys"));
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(ConstantTimeEquals(key->span(), other->span()));
  auto other_label = SimSealingKey(dir_->path(), measurement_, AsBytes("receipts"));
  ASSERT_TRUE(other_label.ok());
  EXPECT_FALSE(ConstantTimeEquals(key->span(), other_label->span()));

  ScopedTempDir second;
  ASSERT_TRUE(EnsureSimRoots(second.path()).ok());
  auto other_dir = SimSealingKey(second.path(), measurement_, AsBytes("model keys"));
  ASSERT_TRUE(other_dir.ok());
  EXPECT_FALSE(ConstantTimeEquals(key->span(), other_dir->span()));

  EXPECT_TRUE(absl::IsInvalidArgument(SimSealingKey(dir_->path(), Bytes(32, 0), {}).status()));
  ScopedTempDir empty;
  EXPECT_TRUE(absl::IsNotFound(SimSealingKey(empty.path(), measurement_, {}).status()));
}

TEST(MeasureFileTest, HashesTheFile) {
  ScopedTempDir dir;
  std::string path = dir.path() + "/enclave";
  std::string content(200000, 'x');
  content += "tail";
  ASSERT_TRUE(WriteFileAtomic(path, content, 0755).ok());
  auto measurement = MeasureFile(path);
  ASSERT_TRUE(measurement.ok()) << measurement.status();
  EXPECT_EQ(*measurement, crypto::Sha384(AsBytes(content)));
  EXPECT_TRUE(absl::IsNotFound(MeasureFile(dir.path() + "/missing").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MeasureFile(dir.path()).status()));
}

}  // namespace
}  // namespace cloister::attest
