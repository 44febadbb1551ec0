// NvmlGpus: the NVIDIA GPUs of a confidential VM as NVML reports them, for the hardware
// evidence collector. NVML is loaded at run time with dlopen (libnvidia-ml.so.1 by default),
// so Cloister builds and runs without the NVIDIA driver; only the handful of entry points in
// nvml_abi.h are used (shared/specs/attestation-formats.md sections 2 and 11). Open() refuses
// unless the driver reports confidential computing on; every NVML error becomes an
// absl::Status that names the NVML function and the GPU.
// Thread-safety: an NvmlGpus is immutable after Open() and NVML itself is thread-safe, so its
// const methods may be called from several threads. It owns the library handle and its NVML
// initialization, both released on destruction.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::attest {

inline constexpr std::string_view kNvmlLibraryName = "libnvidia-ml.so.1";
inline constexpr size_t kNvmlNonceSize = 32;

// The system-wide confidential-computing state (nvmlSystemGetConfComputeState and
// nvmlSystemGetConfComputeCapabilities).
struct NvmlCcState {
  uint32_t environment = 0;  // 0 unavailable, 1 simulation, 2 hardware
  bool cc_feature = false;   // CC mode on
  bool dev_tools_mode = false;
  uint32_t cpu_caps = 0;  // 0 none, 1 SEV, 2 TDX, 3 SEV-SNP, 4 SNP vTOM, ...
  bool gpus_cc_capable = false;
  // Whether the GPUs accept work (nvmlSystemGetConfComputeGpusReadyState); absent when the
  // driver lacks the query.
  std::optional<bool> gpus_ready;
};

struct NvmlGpuInfo {
  uint32_t index = 0;
  uint32_t architecture_code = 0;  // nvmlDeviceArchitecture_t
  std::string architecture;        // "HOPPER", "BLACKWELL", or "ARCH_<code>" for others
  std::string uuid;                // "GPU-..."
  std::string vbios_version;       // "96.00.9F.00.01"
};

class NvmlGpus {
 public:
  // Loads `library`, initializes NVML and reads the CC state, driver version and each GPU's
  // identity. FailedPrecondition when the library is missing ("NVML not available: ... not
  // found"), lacks a confidential-computing entry point (driver too old), or reports CC off;
  // other NVML failures as NvmlReturnToStatus describes.
  static absl::StatusOr<std::unique_ptr<NvmlGpus>> Open(
      const std::string& library = std::string(kNvmlLibraryName));
  ~NvmlGpus();
  NvmlGpus(const NvmlGpus&) = delete;
  NvmlGpus& operator=(const NvmlGpus&) = delete;

  const std::string& driver_version() const { return driver_version_; }
  const NvmlCcState& cc_state() const { return cc_state_; }
  const std::vector<NvmlGpuInfo>& gpus() const { return gpus_; }

  // The GPU's SPDM attestation report (GET_MEASUREMENTS request || response) over a 32-byte
  // requester nonce. InvalidArgument for a bad index or nonce size; DataLoss when NVML
  // returns a size outside its own buffer.
  absl::StatusOr<Bytes> AttestationReport(uint32_t index, ByteSpan nonce) const;
  // The GPU's attestation certificate chain (PEM, leaf first) as NVML returns it, checked to
  // parse as a PEM chain (DataLoss otherwise).
  absl::StatusOr<std::string> CertificateChainPem(uint32_t index) const;

 private:
  struct Api;
  NvmlGpus();

  std::unique_ptr<Api> api_;
  std::string driver_version_;
  NvmlCcState cc_state_;
  std::vector<NvmlGpuInfo> gpus_;
};

// The name of an nvmlReturn_t value ("NVML_ERROR_NOT_SUPPORTED"), or "NVML_ERROR_<code>" for
// one this file does not know.
std::string NvmlReturnName(int nvml_return);

// Converts an nvmlReturn_t to a Status: OK for NVML_SUCCESS, otherwise an error whose message
// names `function` and `context` (e.g. "GPU 0"), the return code and NVML's own text
// (`error_string`, may be null). Codes map to PermissionDenied (no permission), Unavailable
// (driver not loaded, GPU lost, timeout, not ready, in use), Unimplemented (not supported,
// function not found), ResourceExhausted (memory, insufficient resources), FailedPrecondition
// (uninitialized, reset required, invalid state) and Internal for the rest.
absl::Status NvmlReturnToStatus(std::string_view function, std::string_view context,
                                int nvml_return, const char* error_string);

}  // namespace cloister::attest
