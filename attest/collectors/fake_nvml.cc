// TEST ONLY: a stand-in for libnvidia-ml.so.1 that the NVML loader's tests dlopen by path. It
// exports the NVML entry points nvml_abi.h declares and answers from environment variables,
// read on every call, so that each test sets the situation it needs:
//   CLOISTER_FAKE_NVML_CC          ccFeature (default 1)
//   CLOISTER_FAKE_NVML_ENV         environment (default 2, hardware)
//   CLOISTER_FAKE_NVML_DEVTOOLS    devToolsMode (default 0)
//   CLOISTER_FAKE_NVML_GPUS        GPU count (default 1)
//   CLOISTER_FAKE_NVML_ARCH        architecture code of every GPU (default 9, Hopper)
//   CLOISTER_FAKE_NVML_FAIL        "<function>=<nvmlReturn_t>": that entry point fails
//   CLOISTER_FAKE_NVML_REPORT_SIZE attestationReportSize to claim (default: the real size)
//   CLOISTER_FAKE_NVML_CHAIN_FILE  file whose bytes are returned as attestationCertChain
// Its "report" is not SPDM: "fake-nvml-report" || GPU index (1 byte) || the 32-byte nonce, so
// tests can see which nonce reached which GPU. Built with CLOISTER_FAKE_NVML_OLD_DRIVER it
// lacks the confidential-computing entry points, like a driver older than CC support.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attest/collectors/nvml_abi.h"

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kInsufficientSize = 7;
constexpr char kReportPrefix[] = "fake-nvml-report";

unsigned EnvNumber(const char* name, unsigned fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? static_cast<unsigned>(std::strtoul(value, nullptr, 0))
                                            : fallback;
}

// The configured failure for `function`, or success.
int Failure(const char* function) {
  const char* value = std::getenv("CLOISTER_FAKE_NVML_FAIL");
  if (value == nullptr) return kSuccess;
  std::string spec = value;
  size_t equals = spec.find('=');
  if (equals == std::string::npos || spec.substr(0, equals) != function) return kSuccess;
  return std::atoi(spec.c_str() + equals + 1);
}

int CopyString(const char* text, char* out, unsigned int size) {
  if (out == nullptr) return kInvalidArgument;
  if (std::strlen(text) + 1 > size) return kInsufficientSize;
  std::strcpy(out, text);
  return kSuccess;
}

// Devices are the addresses 1..count cast to handles; never dereferenced.
cloister_nvmlDevice_t Handle(unsigned index) {
  return reinterpret_cast<cloister_nvmlDevice_t>(static_cast<uintptr_t>(index) + 1);
}
unsigned Index(cloister_nvmlDevice_t device) {
  return static_cast<unsigned>(reinterpret_cast<uintptr_t>(device) - 1);
}
bool Valid(cloister_nvmlDevice_t device) {
  return device != nullptr && Index(device) < EnvNumber("CLOISTER_FAKE_NVML_GPUS", 1);
}

}  // namespace

#define FAIL_IF_ASKED(name)           \
  do {                                \
    int failure = Failure(name);      \
    if (failure != 0) return failure; \
  } while (0)

extern "C" {

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlInit_v2(void) {
  FAIL_IF_ASKED("nvmlInit_v2");
  return kSuccess;
}

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlShutdown(void) { return kSuccess; }

__attribute__((visibility("default"))) const char* nvmlErrorString(cloister_nvmlReturn_t code) {
  return code == 3 ? "Not Supported (fake)" : "Fake NVML error";
}

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlSystemGetDriverVersion(
    char* version, unsigned int size) {
  FAIL_IF_ASKED("nvmlSystemGetDriverVersion");
  return CopyString("550.90.07", version, size);
}

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlDeviceGetCount_v2(
    unsigned int* count) {
  FAIL_IF_ASKED("nvmlDeviceGetCount_v2");
  if (count == nullptr) return kInvalidArgument;
  *count = EnvNumber("CLOISTER_FAKE_NVML_GPUS", 1);
  return kSuccess;
}

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(
    unsigned int index, cloister_nvmlDevice_t* device) {
  FAIL_IF_ASKED("nvmlDeviceGetHandleByIndex_v2");
  if (device == nullptr || index >= EnvNumber("CLOISTER_FAKE_NVML_GPUS", 1)) {
    return kInvalidArgument;
  }
  *device = Handle(index);
  return kSuccess;
}

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlDeviceGetArchitecture(
    cloister_nvmlDevice_t device, unsigned int* arch) {
  FAIL_IF_ASKED("nvmlDeviceGetArchitecture");
  if (!Valid(device) || arch == nullptr) return kInvalidArgument;
  *arch = EnvNumber("CLOISTER_FAKE_NVML_ARCH", CLOISTER_NVML_DEVICE_ARCH_HOPPER);
  return kSuccess;
}

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlDeviceGetVbiosVersion(
    cloister_nvmlDevice_t device, char* version, unsigned int size) {
  FAIL_IF_ASKED("nvmlDeviceGetVbiosVersion");
  if (!Valid(device)) return kInvalidArgument;
  return CopyString("96.00.9F.00.01", version, size);
}

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlDeviceGetUUID(
    cloister_nvmlDevice_t device, char* uuid, unsigned int size) {
  FAIL_IF_ASKED("nvmlDeviceGetUUID");
  if (!Valid(device)) return kInvalidArgument;
  char text[64];
  std::snprintf(text, sizeof(text), "GPU-fake-%u", Index(device));
  return CopyString(text, uuid, size);
}

#ifndef CLOISTER_FAKE_NVML_OLD_DRIVER

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlSystemGetConfComputeState(
    cloister_nvmlConfComputeSystemState_t* state) {
  FAIL_IF_ASKED("nvmlSystemGetConfComputeState");
  if (state == nullptr) return kInvalidArgument;
  state->environment = EnvNumber("CLOISTER_FAKE_NVML_ENV", 2);
  state->ccFeature = EnvNumber("CLOISTER_FAKE_NVML_CC", 1);
  state->devToolsMode = EnvNumber("CLOISTER_FAKE_NVML_DEVTOOLS", 0);
  return kSuccess;
}

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlSystemGetConfComputeCapabilities(
    cloister_nvmlConfComputeSystemCaps_t* caps) {
  FAIL_IF_ASKED("nvmlSystemGetConfComputeCapabilities");
  if (caps == nullptr) return kInvalidArgument;
  caps->cpuCaps = 3;  // AMD SEV-SNP
  caps->gpusCaps = 1;
  return kSuccess;
}

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlSystemGetConfComputeGpusReadyState(
    uint32_t* ready) {
  FAIL_IF_ASKED("nvmlSystemGetConfComputeGpusReadyState");
  if (ready == nullptr) return kInvalidArgument;
  *ready = 0;
  return kSuccess;
}

__attribute__((visibility("default"))) cloister_nvmlReturn_t
nvmlDeviceGetConfComputeGpuAttestationReport(
    cloister_nvmlDevice_t device, cloister_nvmlConfComputeGpuAttestationReport_t* report) {
  FAIL_IF_ASKED("nvmlDeviceGetConfComputeGpuAttestationReport");
  if (!Valid(device) || report == nullptr) return kInvalidArgument;
  size_t size = 0;
  std::memcpy(report->attestationReport, kReportPrefix, sizeof(kReportPrefix) - 1);
  size += sizeof(kReportPrefix) - 1;
  report->attestationReport[size++] = static_cast<uint8_t>(Index(device));
  std::memcpy(report->attestationReport + size, report->nonce, sizeof(report->nonce));
  size += sizeof(report->nonce);
  report->attestationReportSize =
      EnvNumber("CLOISTER_FAKE_NVML_REPORT_SIZE", static_cast<unsigned>(size));
  report->isCecAttestationReportPresent = 0;
  report->cecAttestationReportSize = 0;
  return kSuccess;
}

__attribute__((visibility("default"))) cloister_nvmlReturn_t nvmlDeviceGetConfComputeGpuCertificate(
    cloister_nvmlDevice_t device, cloister_nvmlConfComputeGpuCertificate_t* certificate) {
  FAIL_IF_ASKED("nvmlDeviceGetConfComputeGpuCertificate");
  if (!Valid(device) || certificate == nullptr) return kInvalidArgument;
  const char* path = std::getenv("CLOISTER_FAKE_NVML_CHAIN_FILE");
  size_t size = 0;
  if (path != nullptr) {
    FILE* file = std::fopen(path, "rb");
    if (file == nullptr) return 999;
    size = std::fread(certificate->attestationCertChain, 1,
                      sizeof(certificate->attestationCertChain), file);
    std::fclose(file);
  }
  certificate->attestationCertChainSize = static_cast<uint32_t>(size);
  certificate->certChainSize = 0;
  return kSuccess;
}

#endif  // CLOISTER_FAKE_NVML_OLD_DRIVER

}  // extern "C"
