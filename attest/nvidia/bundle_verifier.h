// The NVIDIA confidential-computing GPU verifier behind EvidenceVerifier, so that composite
// evidence bundles (a CVM report plus one SPDM report per GPU, DESIGN.md section 4) are checked
// by VerifyBundle with real NVIDIA evidence. For GPU i of a bundle it runs VerifyNvidiaGpu with
// check prefix "gpu<i>.", the requester nonce GpuRequesterNonce(bundle nonce, enclave HPKE key,
// i) (so a GPU report collected for another CVM, nonce or enclave fails gpu<i>.nonce, and one
// swapped in afterwards fails cvm.report_data), the roots and flags of the policy's `nvidia`
// section, the policy's gpu_versions, and the driver and VBIOS RIMs found in nvidia.rim_dir by
// the report's versions. Saved OCSP responses come from nvidia.ocsp_dir.
//
// The verifier lives in cloister_attest_nvidia (it needs xmlsec1, which the enclave must not
// link); programs that verify bundles call EnableNvidiaGpuVerification() once, after which
// MakeGpuVerifier(GPU_TYPE_NVIDIA_CC) returns it.
// Thread-safe: the verifier is stateless; RIM and OCSP files are read on every Verify call.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attest/nvidia/gpu_verifier.h"
#include "attest/verifier.h"
#include "base/bytes.h"

namespace cloister::attest {

inline constexpr size_t kMaxRimDirectoryFiles = 256;
inline constexpr size_t kMaxOcspResponseSize = 64 << 10;

// The signed RIMs of a directory, indexed by their colloquialVersion (the driver version such
// as "550.90.07", or the VBIOS version such as "96.00.9F.00.01", compared case-insensitively).
// Files named *.xml or *.swidtag are read (at most kMaxRimDirectoryFiles, each at most
// kMaxRimXmlSize); files that do not parse as RIMs are listed in `skipped` with the reason.
// Parsing does not authenticate: the verifier checks each RIM's signature when it uses it.
struct RimDirectory {
  std::string path;
  struct Entry {
    std::string file;
    std::string version;  // upper case
    std::string xml;
  };
  std::vector<Entry> rims;  // in file-name order
  std::vector<std::string> skipped;  // "FILE: reason"

  // The first RIM with this colloquialVersion, or nullptr.
  const Entry* Find(std::string_view version) const;

  // What FillRims chose for one GPU: the entries used (nullptr when none), and for a kind it
  // looked for and did not find, why ("no RIM for driver 545.00 in DIR").
  struct Choice {
    const Entry* driver = nullptr;
    const Entry* vbios = nullptr;
    std::string missing_driver, missing_vbios;
  };
  // Sets `input`'s driver and VBIOS RIMs that are still unset to the ones whose versions equal
  // those its report states. Nothing is chosen when the report does not parse (the verifier
  // then fails report.parse).
  Choice FillRims(NvidiaGpuInput& input) const;
};
// NotFound when `path` is not a readable directory; InvalidArgument when it holds too many files.
absl::StatusOr<RimDirectory> LoadRimDirectory(const std::string& path);

// The DER OCSP responses (*.der) saved in `path`, in file-name order.
absl::StatusOr<std::vector<Bytes>> LoadOcspDirectory(const std::string& path);

class NvidiaGpuBundleVerifier : public EvidenceVerifier {
 public:
  Verdict Verify(const EvidenceBundle& bundle, ByteSpan expected_nonce, const Policy& policy,
                 absl::Time at) const override;
};

// Registers NvidiaGpuBundleVerifier for GPU_TYPE_NVIDIA_CC. Idempotent.
void EnableNvidiaGpuVerification();

}  // namespace cloister::attest
