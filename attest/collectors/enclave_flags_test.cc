// Runs the built cloister-enclave with the hardware flags on a machine without confidential
// computing hardware: it must refuse at once with exit status 1 (or 2 for a flag misuse) and
// one clear line on stderr.

#include <dlfcn.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

std::string Quote(const std::string& arg) {
  std::string quoted = "'";
  for (char c : arg) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

ProcessResult RunEnclave(const std::vector<std::string>& args) {
  std::vector<std::string> quoted = {Quote(CLOISTER_ENCLAVE_BINARY)};
  for (const std::string& arg : args) quoted.push_back(Quote(arg));
  std::string command = absl::StrCat(absl::StrJoin(quoted, " "), " 2>&1 </dev/null");
  ProcessResult run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, n);
  int status = ::pclose(pipe);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

bool HasRealNvml() {
  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return false;
  dlclose(library);
  return true;
}

class EnclaveFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override { ::unsetenv("CLOISTER_FAKE_NVML_CC"); }
  void TearDown() override { ::unsetenv("CLOISTER_FAKE_NVML_CC"); }
};

TEST_F(EnclaveFlagsTest, NvidiaCcWithoutNvmlRefusesAtOnce) {
  ProcessResult run = RunEnclave({"--gpu", "nvidia-cc"});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  if (!HasRealNvml()) {
    EXPECT_EQ(run.output,
              "cloister-enclave: --gpu nvidia-cc: NVML not available: libnvidia-ml.so.1 not "
              "found\n");
  } else {
    // A machine with an NVIDIA driver but not in a CC guest: still one line and exit 1.
    EXPECT_THAT(run.output, StartsWith("cloister-enclave: --gpu nvidia-cc: "));
    EXPECT_EQ(run.output.find('\n'), run.output.size() - 1) << run.output;
  }
}

TEST_F(EnclaveFlagsTest, NvidiaCcWithAMissingLibraryNamesIt) {
  for (const char* tee : {"sim", "sev-snp", "tdx"}) {
    ProcessResult run = RunEnclave({"--tee", tee, "--gpu", "nvidia-cc", "--fd", "0",
                                    "--nvml-library", "libcloister-no-such-nvml.so.1"});
    EXPECT_EQ(run.exit_code, 1) << tee;
    EXPECT_EQ(run.output,
              "cloister-enclave: --gpu nvidia-cc: NVML not available: "
              "libcloister-no-such-nvml.so.1 not found\n")
        << tee;
  }
}

TEST_F(EnclaveFlagsTest, NvidiaCcWithConfidentialComputingOff) {
  ::setenv("CLOISTER_FAKE_NVML_CC", "0", 1);
  ProcessResult run = RunEnclave({"--tee", "sev-snp", "--gpu", "nvidia-cc", "--fd", "0",
                                  "--nvml-library", CLOISTER_FAKE_NVML_PATH});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.output,
            "cloister-enclave: --gpu nvidia-cc: GPU confidential computing is off "
            "(nvmlSystemGetConfComputeState: ccFeature=0)\n");
}

TEST_F(EnclaveFlagsTest, NvidiaCcNeedsAHardwareTee) {
  // With GPUs that pass the check, the simulated TEE is the problem.
  ProcessResult run =
      RunEnclave({"--gpu", "nvidia-cc", "--fd", "0", "--nvml-library", CLOISTER_FAKE_NVML_PATH});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.output, "cloister-enclave: --gpu nvidia-cc needs --tee sev-snp or tdx\n");
}

// The last line of `output`, with its newline.
std::string LastLine(const std::string& output) {
  size_t end = output.size() > 0 ? output.size() - 1 : 0;
  size_t start = output.rfind('\n', end > 0 ? end - 1 : 0);
  return start == std::string::npos || end == 0 ? output : output.substr(start + 1);
}

TEST_F(EnclaveFlagsTest, HardwareTeesWithoutTheirInterfaces) {
  ProcessResult snp = RunEnclave({"--tee", "sev-snp", "--fd", "0", "--tsm-root", "/nonexistent/tsm",
                                  "--sev-guest", "/nonexistent/sev-guest"});
  EXPECT_EQ(snp.exit_code, 1);
  // Structured log lines (the executor chosen) may come first; the error is the last line.
  EXPECT_EQ(LastLine(snp.output),
            "cloister-enclave: no SEV-SNP guest interface: configfs-tsm is not at "
            "/nonexistent/tsm and /nonexistent/sev-guest does not exist (is this an SEV-SNP "
            "guest?)\n");
  ProcessResult tdx = RunEnclave({"--tee", "tdx", "--fd", "0"});
  EXPECT_EQ(tdx.exit_code, 1);
  EXPECT_EQ(LastLine(tdx.output),
            "cloister-enclave: TDX sealing needs a key service (not configured)\n");
}

TEST_F(EnclaveFlagsTest, FlagMisuse) {
  ProcessResult bad_tee = RunEnclave({"--tee", "sgx", "--fd", "0"});
  EXPECT_EQ(bad_tee.exit_code, 2);
  EXPECT_THAT(bad_tee.output, HasSubstr("--tee must be sim, sev-snp or tdx, not 'sgx'"));
  ProcessResult bad_gpu = RunEnclave({"--gpu", "amd", "--fd", "0"});
  EXPECT_EQ(bad_gpu.exit_code, 2);
  EXPECT_THAT(bad_gpu.output, HasSubstr("--gpu must be sim, nvidia-cc or none, not 'amd'"));
  ProcessResult sim_gpu = RunEnclave({"--tee", "sev-snp", "--gpu", "sim", "--fd", "0"});
  EXPECT_EQ(sim_gpu.exit_code, 2);
  EXPECT_EQ(sim_gpu.output, "cloister-enclave: --gpu sim needs --tee sim\n");
  ProcessResult policy = RunEnclave({"--tee", "tdx", "--fd", "0", "--dev-policy-out", "/tmp/x"});
  EXPECT_EQ(policy.exit_code, 2);
  EXPECT_EQ(policy.output, "cloister-enclave: --dev-policy-out needs --tee sim\n");
  // The simulated TEE still needs its directory.
  ProcessResult no_sim_dir = RunEnclave({"--fd", "0"});
  EXPECT_EQ(no_sim_dir.exit_code, 2);
  EXPECT_THAT(no_sim_dir.output, HasSubstr("usage: cloister-enclave"));
}

}  // namespace
