// NVML loaded with dlopen: symbol resolution, the CC-state gate and per-GPU queries.

#include "attest/collectors/nvml.h"

#include <dlfcn.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "attest/collectors/nvml_abi.h"
#include "attest/string_view.h"
#include "attest/x509.h"
#include "base/status.h"

namespace cloister::attest {

// The resolved entry points and the library handle. Optional ones may be null.
struct NvmlGpus::Api {
  void* library = nullptr;
  bool initialized = false;
  cloister_nvmlInit_v2_fn init = nullptr;
  cloister_nvmlShutdown_fn shutdown = nullptr;
  cloister_nvmlErrorString_fn error_string = nullptr;  // optional
  cloister_nvmlSystemGetDriverVersion_fn driver_version = nullptr;
  cloister_nvmlSystemGetConfComputeState_fn cc_state = nullptr;
  cloister_nvmlSystemGetConfComputeCapabilities_fn cc_caps = nullptr;
  cloister_nvmlSystemGetConfComputeGpusReadyState_fn ready_state = nullptr;  // optional
  cloister_nvmlDeviceGetCount_v2_fn device_count = nullptr;
  cloister_nvmlDeviceGetHandleByIndex_v2_fn device_handle = nullptr;
  cloister_nvmlDeviceGetArchitecture_fn architecture = nullptr;
  cloister_nvmlDeviceGetVbiosVersion_fn vbios_version = nullptr;
  cloister_nvmlDeviceGetUUID_fn uuid = nullptr;
  cloister_nvmlDeviceGetConfComputeGpuAttestationReport_fn attestation_report = nullptr;
  cloister_nvmlDeviceGetConfComputeGpuCertificate_fn certificate = nullptr;
  std::vector<cloister_nvmlDevice_t> devices;

  ~Api() {
    if (initialized) shutdown();
    if (library != nullptr) dlclose(library);
  }

  absl::Status Check(std::string_view function, std::string_view context, int code) const {
    return NvmlReturnToStatus(function, context, code,
                              error_string != nullptr ? error_string(code) : nullptr);
  }
};

namespace {

constexpr int kNvmlSuccess = 0;

struct ReturnInfo {
  int code;
  const char* name;
  absl::StatusCode status;
};

constexpr ReturnInfo kReturns[] = {
    {0, "NVML_SUCCESS", absl::StatusCode::kOk},
    {1, "NVML_ERROR_UNINITIALIZED", absl::StatusCode::kFailedPrecondition},
    {2, "NVML_ERROR_INVALID_ARGUMENT", absl::StatusCode::kInternal},
    {3, "NVML_ERROR_NOT_SUPPORTED", absl::StatusCode::kUnimplemented},
    {4, "NVML_ERROR_NO_PERMISSION", absl::StatusCode::kPermissionDenied},
    {5, "NVML_ERROR_ALREADY_INITIALIZED", absl::StatusCode::kInternal},
    {6, "NVML_ERROR_NOT_FOUND", absl::StatusCode::kNotFound},
    {7, "NVML_ERROR_INSUFFICIENT_SIZE", absl::StatusCode::kInternal},
    {8, "NVML_ERROR_INSUFFICIENT_POWER", absl::StatusCode::kUnavailable},
    {9, "NVML_ERROR_DRIVER_NOT_LOADED", absl::StatusCode::kUnavailable},
    {10, "NVML_ERROR_TIMEOUT", absl::StatusCode::kUnavailable},
    {11, "NVML_ERROR_IRQ_ISSUE", absl::StatusCode::kUnavailable},
    {12, "NVML_ERROR_LIBRARY_NOT_FOUND", absl::StatusCode::kFailedPrecondition},
    {13, "NVML_ERROR_FUNCTION_NOT_FOUND", absl::StatusCode::kUnimplemented},
    {14, "NVML_ERROR_CORRUPTED_INFOROM", absl::StatusCode::kDataLoss},
    {15, "NVML_ERROR_GPU_IS_LOST", absl::StatusCode::kUnavailable},
    {16, "NVML_ERROR_RESET_REQUIRED", absl::StatusCode::kFailedPrecondition},
    {17, "NVML_ERROR_OPERATING_SYSTEM", absl::StatusCode::kInternal},
    {18, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", absl::StatusCode::kFailedPrecondition},
    {19, "NVML_ERROR_IN_USE", absl::StatusCode::kUnavailable},
    {20, "NVML_ERROR_MEMORY", absl::StatusCode::kResourceExhausted},
    {21, "NVML_ERROR_NO_DATA", absl::StatusCode::kNotFound},
    {22, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED", absl::StatusCode::kUnimplemented},
    {23, "NVML_ERROR_INSUFFICIENT_RESOURCES", absl::StatusCode::kResourceExhausted},
    {24, "NVML_ERROR_FREQ_NOT_SUPPORTED", absl::StatusCode::kUnimplemented},
    {25, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", absl::StatusCode::kFailedPrecondition},
    {26, "NVML_ERROR_DEPRECATED", absl::StatusCode::kUnimplemented},
    {27, "NVML_ERROR_NOT_READY", absl::StatusCode::kUnavailable},
    {28, "NVML_ERROR_GPU_NOT_FOUND", absl::StatusCode::kNotFound},
    {29, "NVML_ERROR_INVALID_STATE", absl::StatusCode::kFailedPrecondition},
    {999, "NVML_ERROR_UNKNOWN", absl::StatusCode::kInternal},
};

const ReturnInfo* FindReturn(int code) {
  for (const ReturnInfo& info : kReturns) {
    if (info.code == code) return &info;
  }
  return nullptr;
}

// A NUL-terminated string from a fixed buffer NVML filled (never reads past the buffer).
std::string FromBuffer(const char* buffer, size_t size) {
  return std::string(buffer, strnlen(buffer, size));
}

std::string ArchitectureName(unsigned int code) {
  switch (code) {
    case CLOISTER_NVML_DEVICE_ARCH_HOPPER:
      return "HOPPER";
    case CLOISTER_NVML_DEVICE_ARCH_BLACKWELL:
      return "BLACKWELL";
    default:
      return absl::StrCat("ARCH_", code);
  }
}

template <typename Fn>
absl::Status Resolve(void* library, const std::string& library_name, const char* symbol, Fn& out,
                     bool required) {
  out = reinterpret_cast<Fn>(dlsym(library, symbol));
  if (out == nullptr && required) {
    return absl::FailedPreconditionError(
        absl::StrCat(library_name, " has no ", symbol,
                     ": the NVIDIA driver is too old for confidential computing"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string NvmlReturnName(int nvml_return) {
  const ReturnInfo* info = FindReturn(nvml_return);
  return info != nullptr ? info->name : absl::StrCat("NVML_ERROR_", nvml_return);
}

absl::Status NvmlReturnToStatus(std::string_view function, std::string_view context,
                                int nvml_return, const char* error_string) {
  if (nvml_return == kNvmlSuccess) return absl::OkStatus();
  const ReturnInfo* info = FindReturn(nvml_return);
  absl::StatusCode code = info != nullptr ? info->status : absl::StatusCode::kInternal;
  std::string message = absl::StrCat(
      Sv(function), context.empty() ? "" : " (", Sv(context), context.empty() ? "" : ")",
      " failed: ", NvmlReturnName(nvml_return), " (", nvml_return, ")");
  if (error_string != nullptr && *error_string != '\0') {
    absl::StrAppend(&message, ": ", error_string);
  }
  return absl::Status(code, message);
}

NvmlGpus::NvmlGpus() : api_(std::make_unique<Api>()) {}
NvmlGpus::~NvmlGpus() = default;

absl::StatusOr<std::unique_ptr<NvmlGpus>> NvmlGpus::Open(const std::string& library) {
  std::unique_ptr<NvmlGpus> gpus(new NvmlGpus());
  Api& api = *gpus->api_;
  dlerror();
  api.library = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api.library == nullptr) {
    const char* reason = dlerror();
    std::string text = reason != nullptr ? reason : "";
    if (text.empty() || text.find("No such file") != std::string::npos) {
      return absl::FailedPreconditionError(
          absl::StrCat("NVML not available: ", library, " not found"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("NVML not available: ", library, " cannot be loaded: ", text));
  }
  RETURN_IF_ERROR(Resolve(api.library, library, "nvmlInit_v2", api.init, true));
  RETURN_IF_ERROR(Resolve(api.library, library, "nvmlShutdown", api.shutdown, true));
  RETURN_IF_ERROR(Resolve(api.library, library, "nvmlErrorString", api.error_string, false));
  RETURN_IF_ERROR(
      Resolve(api.library, library, "nvmlSystemGetDriverVersion", api.driver_version, true));
  RETURN_IF_ERROR(
      Resolve(api.library, library, "nvmlSystemGetConfComputeState", api.cc_state, true));
  RETURN_IF_ERROR(
      Resolve(api.library, library, "nvmlSystemGetConfComputeCapabilities", api.cc_caps, true));
  RETURN_IF_ERROR(Resolve(api.library, library, "nvmlSystemGetConfComputeGpusReadyState",
                          api.ready_state, false));
  RETURN_IF_ERROR(Resolve(api.library, library, "nvmlDeviceGetCount_v2", api.device_count, true));
  RETURN_IF_ERROR(
      Resolve(api.library, library, "nvmlDeviceGetHandleByIndex_v2", api.device_handle, true));
  RETURN_IF_ERROR(
      Resolve(api.library, library, "nvmlDeviceGetArchitecture", api.architecture, true));
  RETURN_IF_ERROR(
      Resolve(api.library, library, "nvmlDeviceGetVbiosVersion", api.vbios_version, true));
  RETURN_IF_ERROR(Resolve(api.library, library, "nvmlDeviceGetUUID", api.uuid, true));
  RETURN_IF_ERROR(Resolve(api.library, library, "nvmlDeviceGetConfComputeGpuAttestationReport",
                          api.attestation_report, true));
  RETURN_IF_ERROR(Resolve(api.library, library, "nvmlDeviceGetConfComputeGpuCertificate",
                          api.certificate, true));

  RETURN_IF_ERROR(api.Check("nvmlInit_v2", "", api.init()));
  api.initialized = true;

  cloister_nvmlConfComputeSystemState_t state{};
  RETURN_IF_ERROR(api.Check("nvmlSystemGetConfComputeState", "", api.cc_state(&state)));
  gpus->cc_state_.environment = state.environment;
  gpus->cc_state_.cc_feature = state.ccFeature != 0;
  gpus->cc_state_.dev_tools_mode = state.devToolsMode != 0;
  if (!gpus->cc_state_.cc_feature) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU confidential computing is off (nvmlSystemGetConfComputeState: ccFeature=",
                     state.ccFeature, ")"));
  }
  cloister_nvmlConfComputeSystemCaps_t caps{};
  RETURN_IF_ERROR(api.Check("nvmlSystemGetConfComputeCapabilities", "", api.cc_caps(&caps)));
  gpus->cc_state_.cpu_caps = caps.cpuCaps;
  gpus->cc_state_.gpus_cc_capable = caps.gpusCaps != 0;
  if (api.ready_state != nullptr) {
    uint32_t ready = 0;
    RETURN_IF_ERROR(
        api.Check("nvmlSystemGetConfComputeGpusReadyState", "", api.ready_state(&ready)));
    gpus->cc_state_.gpus_ready = ready != 0;
  }

  char driver[CLOISTER_NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
  RETURN_IF_ERROR(
      api.Check("nvmlSystemGetDriverVersion", "", api.driver_version(driver, sizeof(driver))));
  gpus->driver_version_ = FromBuffer(driver, sizeof(driver));

  unsigned int count = 0;
  RETURN_IF_ERROR(api.Check("nvmlDeviceGetCount_v2", "", api.device_count(&count)));
  constexpr unsigned int kMaxGpuCount = 64;
  if (count > kMaxGpuCount) {
    return absl::InternalError(
        absl::StrCat("nvmlDeviceGetCount_v2 reported ", count, " GPUs, more than ", kMaxGpuCount));
  }
  for (unsigned int i = 0; i < count; ++i) {
    std::string context = absl::StrCat("GPU ", i);
    cloister_nvmlDevice_t device = nullptr;
    RETURN_IF_ERROR(
        api.Check("nvmlDeviceGetHandleByIndex_v2", context, api.device_handle(i, &device)));
    NvmlGpuInfo info;
    info.index = i;
    unsigned int arch = 0;
    RETURN_IF_ERROR(
        api.Check("nvmlDeviceGetArchitecture", context, api.architecture(device, &arch)));
    info.architecture_code = arch;
    info.architecture = ArchitectureName(arch);
    char vbios[CLOISTER_NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE] = {};
    RETURN_IF_ERROR(api.Check("nvmlDeviceGetVbiosVersion", context,
                              api.vbios_version(device, vbios, sizeof(vbios))));
    info.vbios_version = FromBuffer(vbios, sizeof(vbios));
    char uuid[CLOISTER_NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    RETURN_IF_ERROR(api.Check("nvmlDeviceGetUUID", context, api.uuid(device, uuid, sizeof(uuid))));
    info.uuid = FromBuffer(uuid, sizeof(uuid));
    api.devices.push_back(device);
    gpus->gpus_.push_back(std::move(info));
  }
  return gpus;
}

absl::StatusOr<Bytes> NvmlGpus::AttestationReport(uint32_t index, ByteSpan nonce) const {
  if (index >= api_->devices.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU ", index, " does not exist (", api_->devices.size(), " GPUs)"));
  }
  if (nonce.size() != kNvmlNonceSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU attestation nonce is ", nonce.size(), " bytes, expected 32"));
  }
  // 12 KiB: on the heap rather than the stack of a worker thread.
  auto report = std::make_unique<cloister_nvmlConfComputeGpuAttestationReport_t>();
  std::memset(report.get(), 0, sizeof(*report));
  std::memcpy(report->nonce, nonce.data(), nonce.size());
  std::string context = absl::StrCat("GPU ", index);
  RETURN_IF_ERROR(api_->Check("nvmlDeviceGetConfComputeGpuAttestationReport", context,
                              api_->attestation_report(api_->devices[index], report.get())));
  if (report->attestationReportSize == 0 ||
      report->attestationReportSize > sizeof(report->attestationReport)) {
    return absl::DataLossError(absl::StrCat(
        "nvmlDeviceGetConfComputeGpuAttestationReport (", context, ") returned a report size of ",
        report->attestationReportSize, " bytes, outside 1..", sizeof(report->attestationReport)));
  }
  return Bytes(report->attestationReport,
               report->attestationReport + report->attestationReportSize);
}

absl::StatusOr<std::string> NvmlGpus::CertificateChainPem(uint32_t index) const {
  if (index >= api_->devices.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU ", index, " does not exist (", api_->devices.size(), " GPUs)"));
  }
  auto certificate = std::make_unique<cloister_nvmlConfComputeGpuCertificate_t>();
  std::memset(certificate.get(), 0, sizeof(*certificate));
  std::string context = absl::StrCat("GPU ", index);
  RETURN_IF_ERROR(api_->Check("nvmlDeviceGetConfComputeGpuCertificate", context,
                              api_->certificate(api_->devices[index], certificate.get())));
  uint32_t size = certificate->attestationCertChainSize;
  if (size == 0 || size > sizeof(certificate->attestationCertChain)) {
    return absl::DataLossError(absl::StrCat(
        "nvmlDeviceGetConfComputeGpuCertificate (", context, ") returned a chain size of ", size,
        " bytes, outside 1..", sizeof(certificate->attestationCertChain)));
  }
  std::string pem(reinterpret_cast<const char*>(certificate->attestationCertChain), size);
  // The driver may count a terminating NUL.
  while (!pem.empty() && pem.back() == '\0') pem.pop_back();
  auto chain = ParsePemChain(pem);
  if (!chain.ok()) {
    return absl::DataLossError(
        absl::StrCat("nvmlDeviceGetConfComputeGpuCertificate (", context,
                     ") returned a chain that does not parse: ", chain.status().message()));
  }
  return pem;
}

}  // namespace cloister::attest
