// Tests of the NVML loader: a missing library, and the test-only stand-in library
// (fake_nvml.cc) loaded by path for the CC gate, the per-GPU queries and error conversion.

#include "attest/collectors/nvml.h"

#include <dlfcn.h>
#include <stdlib.h>

#include "absl/strings/str_cat.h"
#include "attest/sim/sim_tee.h"
#include "attest/test_util.h"
#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using ::testing::HasSubstr;
using testing::ScopedTempDir;

constexpr const char* kFakeVariables[] = {
    "CLOISTER_FAKE_NVML_CC",          "CLOISTER_FAKE_NVML_ENV",       "CLOISTER_FAKE_NVML_DEVTOOLS",
    "CLOISTER_FAKE_NVML_GPUS",        "CLOISTER_FAKE_NVML_ARCH",      "CLOISTER_FAKE_NVML_FAIL",
    "CLOISTER_FAKE_NVML_REPORT_SIZE", "CLOISTER_FAKE_NVML_CHAIN_FILE"};

class NvmlTest : public ::testing::Test {
 protected:
  void SetUp() override { ClearFakeVariables(); }
  void TearDown() override { ClearFakeVariables(); }
  static void ClearFakeVariables() {
    for (const char* name : kFakeVariables) ::unsetenv(name);
  }
  static void Set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
  // Writes the simulated GPU chain where the stand-in library reads it.
  std::string WriteGpuChain(const std::string& extra = "") {
    std::string sim_dir = dir_.path() + "/sim";
    EXPECT_TRUE(EnsureSimRoots(sim_dir).ok());
    auto certificates = LoadSimRootCertificates(sim_dir);
    EXPECT_TRUE(certificates.ok());
    std::string pem = ChainToPem(certificates->gpu_chain);
    std::string path = dir_.path() + "/gpu_chain.pem";
    EXPECT_TRUE(WriteFileAtomic(path, pem + extra).ok());
    Set("CLOISTER_FAKE_NVML_CHAIN_FILE", path);
    return pem;
  }

  ScopedTempDir dir_;
};

TEST_F(NvmlTest, MissingLibraryIsNotAvailable) {
  auto gpus = NvmlGpus::Open("libcloister-no-such-nvml.so.1");
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpus.status().message(), "NVML not available: libcloister-no-such-nvml.so.1 not found");
}

TEST_F(NvmlTest, DefaultLibraryOnAMachineWithoutNvml) {
  void* real = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (real != nullptr) {
    dlclose(real);
    GTEST_SKIP() << "this machine has NVML";
  }
  auto gpus = NvmlGpus::Open();
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpus.status().message(), "NVML not available: libnvidia-ml.so.1 not found");
}

TEST_F(NvmlTest, FileThatIsNotALibrary) {
  std::string path = dir_.path() + "/libnvidia-ml.so.1";
  ASSERT_TRUE(WriteFileAtomic(path, "not an ELF file").ok());
  auto gpus = NvmlGpus::Open(path);
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gpus.status().message(),
              HasSubstr(absl::StrCat("NVML not available: ", path, " cannot be loaded: ")));
}

TEST_F(NvmlTest, DriverWithoutConfidentialComputing) {
  auto gpus = NvmlGpus::Open(CLOISTER_FAKE_NVML_OLD_PATH);
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gpus.status().message(),
              HasSubstr("has no nvmlSystemGetConfComputeState: the NVIDIA driver is too old for "
                        "confidential computing"));
}

TEST_F(NvmlTest, ConfidentialComputingOff) {
  Set("CLOISTER_FAKE_NVML_CC", "0");
  auto gpus = NvmlGpus::Open(CLOISTER_FAKE_NVML_PATH);
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpus.status().message(),
            "GPU confidential computing is off (nvmlSystemGetConfComputeState: ccFeature=0)");
}

TEST_F(NvmlTest, ReadsStateAndGpus) {
  Set("CLOISTER_FAKE_NVML_GPUS", "2");
  Set("CLOISTER_FAKE_NVML_DEVTOOLS", "1");
  auto gpus = NvmlGpus::Open(CLOISTER_FAKE_NVML_PATH);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_EQ((*gpus)->driver_version(), "550.90.07");
  const NvmlCcState& state = (*gpus)->cc_state();
  EXPECT_EQ(state.environment, 2u);
  EXPECT_TRUE(state.cc_feature);
  EXPECT_TRUE(state.dev_tools_mode);
  EXPECT_EQ(state.cpu_caps, 3u);
  EXPECT_TRUE(state.gpus_cc_capable);
  ASSERT_TRUE(state.gpus_ready.has_value());
  EXPECT_FALSE(*state.gpus_ready);
  ASSERT_EQ((*gpus)->gpus().size(), 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    const NvmlGpuInfo& info = (*gpus)->gpus()[i];
    EXPECT_EQ(info.index, i);
    EXPECT_EQ(info.architecture, "HOPPER");
    EXPECT_EQ(info.architecture_code, 9u);
    EXPECT_EQ(info.uuid, absl::StrCat("GPU-fake-", i));
    EXPECT_EQ(info.vbios_version, "96.00.9F.00.01");
  }
}

TEST_F(NvmlTest, ArchitectureNames) {
  Set("CLOISTER_FAKE_NVML_ARCH", "10");
  auto blackwell = NvmlGpus::Open(CLOISTER_FAKE_NVML_PATH);
  ASSERT_TRUE(blackwell.ok()) << blackwell.status();
  EXPECT_EQ((*blackwell)->gpus()[0].architecture, "BLACKWELL");
  Set("CLOISTER_FAKE_NVML_ARCH", "7");
  auto ampere = NvmlGpus::Open(CLOISTER_FAKE_NVML_PATH);
  ASSERT_TRUE(ampere.ok()) << ampere.status();
  EXPECT_EQ((*ampere)->gpus()[0].architecture, "ARCH_7");
}

TEST_F(NvmlTest, ReportIsOverTheNonceGiven) {
  Set("CLOISTER_FAKE_NVML_GPUS", "2");
  auto gpus = NvmlGpus::Open(CLOISTER_FAKE_NVML_PATH);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  Bytes nonce(32);
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<uint8_t>(0xC0 + i);
  auto report = (*gpus)->AttestationReport(1, nonce);
  ASSERT_TRUE(report.ok()) << report.status();
  Bytes expected = ToBytes("fake-nvml-report");
  expected.push_back(1);
  Append(expected, nonce);
  EXPECT_EQ(*report, expected);

  EXPECT_EQ((*gpus)->AttestationReport(2, nonce).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*gpus)->AttestationReport(0, Bytes(31, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(NvmlTest, ReportSizeOutsideTheBufferIsDataLoss) {
  auto gpus = NvmlGpus::Open(CLOISTER_FAKE_NVML_PATH);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  Set("CLOISTER_FAKE_NVML_REPORT_SIZE", "8193");
  auto report = (*gpus)->AttestationReport(0, Bytes(32, 1));
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(report.status().message(), HasSubstr("report size of 8193 bytes"));
  Set("CLOISTER_FAKE_NVML_REPORT_SIZE", "0");
  EXPECT_EQ((*gpus)->AttestationReport(0, Bytes(32, 1)).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(NvmlTest, CertificateChain) {
  std::string pem = WriteGpuChain(std::string(1, '\0'));  // the driver counts a NUL
  auto gpus = NvmlGpus::Open(CLOISTER_FAKE_NVML_PATH);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  auto chain = (*gpus)->CertificateChainPem(0);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(*chain, pem);
  EXPECT_EQ((*gpus)->CertificateChainPem(1).status().code(), absl::StatusCode::kInvalidArgument);

  std::string garbage = dir_.path() + "/garbage.pem";
  ASSERT_TRUE(WriteFileAtomic(garbage, "-----BEGIN CERTIFICATE-----\nnope\n").ok());
  Set("CLOISTER_FAKE_NVML_CHAIN_FILE", garbage);
  auto bad = (*gpus)->CertificateChainPem(0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("returned a chain that does not parse"));

  ::unsetenv("CLOISTER_FAKE_NVML_CHAIN_FILE");
  auto empty = (*gpus)->CertificateChainPem(0);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(empty.status().message(), HasSubstr("chain size of 0 bytes"));
}

TEST_F(NvmlTest, NvmlErrorsNameTheFunctionAndGpu) {
  auto gpus = NvmlGpus::Open(CLOISTER_FAKE_NVML_PATH);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  Set("CLOISTER_FAKE_NVML_FAIL", "nvmlDeviceGetConfComputeGpuAttestationReport=3");
  auto report = (*gpus)->AttestationReport(0, Bytes(32, 1));
  EXPECT_EQ(report.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(report.status().message(),
            "nvmlDeviceGetConfComputeGpuAttestationReport (GPU 0) failed: "
            "NVML_ERROR_NOT_SUPPORTED (3): Not Supported (fake)");
  Set("CLOISTER_FAKE_NVML_FAIL", "nvmlDeviceGetConfComputeGpuCertificate=15");
  auto chain = (*gpus)->CertificateChainPem(0);
  EXPECT_EQ(chain.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(chain.status().message(),
              HasSubstr("nvmlDeviceGetConfComputeGpuCertificate (GPU 0) failed: "
                        "NVML_ERROR_GPU_IS_LOST (15)"));
}

TEST_F(NvmlTest, OpenFailuresNameTheFunction) {
  Set("CLOISTER_FAKE_NVML_FAIL", "nvmlInit_v2=9");
  auto init = NvmlGpus::Open(CLOISTER_FAKE_NVML_PATH);
  EXPECT_EQ(init.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(init.status().message(),
              HasSubstr("nvmlInit_v2 failed: NVML_ERROR_DRIVER_NOT_LOADED (9)"));
  Set("CLOISTER_FAKE_NVML_FAIL", "nvmlDeviceGetUUID=4");
  auto uuid = NvmlGpus::Open(CLOISTER_FAKE_NVML_PATH);
  EXPECT_EQ(uuid.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(uuid.status().message(), HasSubstr("nvmlDeviceGetUUID (GPU 0) failed"));
  Set("CLOISTER_FAKE_NVML_FAIL", "nvmlSystemGetConfComputeState=3");
  auto state = NvmlGpus::Open(CLOISTER_FAKE_NVML_PATH);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(state.status().message(), HasSubstr("nvmlSystemGetConfComputeState failed"));
}

TEST(NvmlReturnTest, Conversion) {
  EXPECT_TRUE(NvmlReturnToStatus("f", "", 0, nullptr).ok());
  absl::Status no_permission =
      NvmlReturnToStatus("nvmlFoo", "GPU 3", 4, "Insufficient Permissions");
  EXPECT_EQ(no_permission.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(no_permission.message(),
            "nvmlFoo (GPU 3) failed: NVML_ERROR_NO_PERMISSION (4): Insufficient Permissions");
  absl::Status unknown = NvmlReturnToStatus("nvmlBar", "", 999, nullptr);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(unknown.message(), "nvmlBar failed: NVML_ERROR_UNKNOWN (999)");
  EXPECT_EQ(NvmlReturnName(12345), "NVML_ERROR_12345");
  EXPECT_EQ(NvmlReturnToStatus("f", "", 27, "").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NvmlReturnToStatus("f", "", 20, "").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(NvmlReturnToStatus("f", "", 29, "").code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cloister::attest
