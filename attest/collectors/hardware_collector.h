// The hardware evidence collector: the EvidenceCollector the enclave uses inside a
// confidential VM (DESIGN.md section 4). Per Collect() it asks each NVIDIA GPU in CC mode for
// an SPDM report over GpuRequesterNonce(nonce, hpke key, i) through NVML, computes
// REPORT_DATA = ReportData(nonce, GPU reports, keys), and gets the CVM report over it through
// configfs-tsm (SEV-SNP: the raw report and the VCEK/ASK/ARK chain from the auxblob
// certificate table; TDX: the quote, whose PCK chain it carries inside). On SEV-SNP guests
// without configfs-tsm it falls back to /dev/sev-guest. Also: the start-up GPU check and the
// SEV-SNP sealing key.
// Thread-safety: a collector may be shared; Collect() serializes callers (the hardware
// requests are slow and the GPU reports must pair with the CVM report they are hashed into).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attest/collector.h"
#include "attest/collectors/nvml.h"
#include "attest/collectors/tsm.h"
#include "base/clock.h"
#include "base/secret_bytes.h"

namespace cloister::attest {

enum class HardwareTee { kSevSnp, kTdx };
enum class HardwareGpu { kNone, kNvidiaCc };

struct HardwareOptions {
  HardwareTee tee = HardwareTee::kSevSnp;
  HardwareGpu gpu = HardwareGpu::kNone;
  std::string tsm_root = std::string(kDefaultTsmReportRoot);
  std::string sev_guest_device = std::string(kDefaultSevGuestDevice);
  std::string nvml_library = std::string(kNvmlLibraryName);
  // SNP VMPL written to configfs-tsm privlevel and used for /dev/sev-guest requests; unset
  // leaves the kernel's default (privlevel) and uses VMPL 0 for the ioctls.
  std::optional<uint32_t> privlevel;
  const Clock* clock = nullptr;  // for collected_at; nullptr means Clock::Real()
  // The filesystem configfs-tsm is reached through; nullptr means TsmFs::Real(). Tests pass
  // a stand-in that plays the kernel. Not owned; must outlive the collector.
  TsmFs* tsm_fs = nullptr;
};

// Refuses `gpu: nvidia-cc` unless NVML loads, confidential computing is on in the hardware
// environment and at least one GPU is present, every one Hopper or Blackwell; OK for
// `gpu: none`. FailedPrecondition with one line, e.g. "NVML not available: libnvidia-ml.so.1
// not found" or "GPU confidential computing is off (nvmlSystemGetConfComputeState:
// ccFeature=0)"; other NVML errors as NvmlReturnToStatus describes.
absl::Status CheckGpuReady(const HardwareOptions& options);

// A collector for `options`: checks the GPUs (as CheckGpuReady) and that the TEE interface
// is there (configfs-tsm at tsm_root, or for SEV-SNP the sev-guest device), FailedPrecondition
// otherwise. Collect() returns bundles with tee_type SEV_SNP or TDX, gpu_type NVIDIA_CC (one
// GpuEvidence per GPU, arch "HOPPER" or "BLACKWELL") or NONE. Collect() fails with the
// interface's error, or DataLoss when the CVM report does not carry the REPORT_DATA asked for.
absl::StatusOr<std::unique_ptr<EvidenceCollector>> MakeHardwareCollector(HardwareOptions options);

// The SEV-SNP sealing key for a purpose label: the firmware's key derived from the VCEK with
// the guest's measurement and policy mixed in (SNP_GET_DERIVED_KEY on sev_guest_device), then
// HKDF-SHA256(salt "cloister/v1 snp sealing", ikm that key, info LP(label)), 32 bytes.
// Another measurement, policy or chip gives an unrelated key. For TDX: Unimplemented (TDX
// sealing needs a key service, which is not configured).
absl::StatusOr<SecretBytes> HardwareSealingKey(const HardwareOptions& options, ByteSpan label);

}  // namespace cloister::attest
