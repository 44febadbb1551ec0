// The NVIDIA Hopper/Blackwell GPU evidence verifier (DESIGN.md section 5;
// shared/specs/attestation-formats.md sections 3 to 7), offline and deterministic: the
// verification time, the trust anchors, the RIMs and any saved OCSP responses are all inputs,
// and nothing is fetched. It checks one GPU's SPDM attestation report and device certificate
// chain against an NvidiaPolicy, with the driver and VBIOS RIMs as reference values, and
// returns a Verdict of named checks (each prefixed with `check_prefix`, e.g. "gpu0."), in
// this order:
//   report.parse        the SPDM 1.1 report parses strictly (attest/spdm.h)
//   report.signature    ECDSA P-384/SHA-384 (raw r||s) over everything before the 96-byte
//                       signature, with the leaf certificate's key
//   certs.chain         the device chain verifies to the PINNED device root (a root sent with
//                       the evidence is never trusted) at the verification time
//   certs.fwid          the report's FWID equals the leaf's (Hopper: last 48 bytes of the
//                       2.23.133.5.4.1 extension; Blackwell: first digest of 2.23.133.5.4.1.1);
//                       passes when the report carries no FWID (older firmware)
//   arch                the chain is a GPU's (GH100 Hopper, GB100/GB10x Blackwell), matching the
//                       collector's arch when one is given; NVSwitch evidence fails here
//   nonce               the requester nonce equals the expected nonce; skipped when none given
//   rim.driver.signature, rim.vbios.signature
//                       the RIM's XML-DSig signature and its chain to the PINNED CoRIM root
//   rim.driver.identity, rim.vbios.identity
//                       the RIM's colloquialVersion equals the report's driver / VBIOS version
//   measurements        report block i+1 against RIM index i (section 5.4); a failure names
//                       the mismatching RIM indices ("mismatch at indices 1, 2, 3, 9")
//   versions            the report's driver and VBIOS versions are in the policy's lists
//   certs.ocsp          saved OCSP responses for the device chain (all but leaf and root) and
//                       the RIM chains (all but the root); skipped offline unless required
// The verdict passes only when every check passes, except that certs.ocsp may be skipped
// unless the policy requires it, and nonce may be skipped when the policy does not require it.
// Claims (same prefix): arch, chip, hwmodel, ueid, brom_serial, driver_version,
// vbios_version, project, project_sku, chip_sku, board_id, fwid, nonce, cc_mode,
// feature_flag, protected_pcie, nvdec0, measres, mismatched_indices, measurement.<block> (hex
// of each non-zero block), certs.expires, driver_rim.* / vbios_rim.* (id to fetch, version,
// product, oemid, and once the signature verified: signer, expires).
// Thread-safe: a pure function.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attest/nvidia/roots.h"
#include "attest/policy.h"
#include "attest/spdm.h"
#include "attest/verifier.h"
#include "attest/x509.h"
#include "base/bytes.h"

namespace cloister::attest {

// The DICE TcbInfo extension of Blackwell leaves (its FWID list is element [6]).
inline constexpr std::string_view kTcgDiceTcbInfoOid = "2.23.133.5.4.1.1";
inline constexpr size_t kMaxDeviceChainCount = 8;

struct NvidiaGpuInput {
  Bytes report;                // the SPDM attestation report (request || signed response)
  std::string cert_chain_pem;  // the device chain as NVML returns it, leaf first
  std::optional<std::string> driver_rim_xml;
  std::optional<std::string> vbios_rim_xml;
  std::optional<Bytes> expected_nonce;  // 32 bytes; the verifier's challenge
  // Saved DER OCSPResponses for the device and RIM chains; empty when offline.
  std::vector<Bytes> ocsp_responses;
  // The architecture the collector reported ("HOPPER", "BLACKWELL"); empty when unknown.
  std::string arch;
};

struct NvidiaPolicy {
  // Pinned trust anchors (PEM). Defaults: NVIDIA's published roots (attest/nvidia/roots.h).
  std::string device_root_pem = std::string(kNvidiaDeviceIdentityCaPem);
  std::string corim_root_pem = std::string(kNvidiaCorimRootCaPem);
  // Allowed versions (VBIOS compared case-insensitively); an empty list allows any.
  std::vector<std::string> allowed_driver_versions;
  std::vector<std::string> allowed_vbios_versions;
  // Accept RIMs whose signing certificates have expired (RIM content stays valid while its
  // signers expire every ~2 years); the signature must still verify to the pinned root.
  bool allow_expired_rim = false;
  // Fail unless saved OCSP responses show every checked certificate good.
  bool require_ocsp = false;
  // Accept a certificate revoked with reason certificateHold (NVIDIA's --allow_hold_cert).
  bool allow_ocsp_cert_hold = false;
  // Fail when no expected nonce is given (freshness unknown).
  bool require_nonce = true;
};

// The ids under which NVIDIA's RIM service publishes the reference values for a report
// (section 5.1): "NV_GPU_DRIVER_GH100_<driver>" (Hopper), "NV_GPU_CC_DRIVER_<CHIP_INFO or
// GB100>_<driver>" (Blackwell, `arch` "BLACKWELL"), and
// "NV_GPU_VBIOS_<PROJECT>_<PROJECT_SKU>_<CHIP_SKU>_<VBIOS without dots>", upper case.
std::string NvidiaDriverRimId(const SpdmReport& report, std::string_view arch);
std::string NvidiaVbiosRimId(const SpdmReport& report);

// The NVIDIA part of a cloister policy: its GPU version lists and its `nvidia` section's roots
// (NVIDIA's published ones where the section names none) and revocation and RIM-expiry flags.
NvidiaPolicy NvidiaPolicyFromPolicy(const Policy& policy);

// The firmware ID in a GPU leaf certificate: the first digest of the Blackwell TcbInfo
// extension (2.23.133.5.4.1.1) when present, else the last 48 bytes of the Hopper DICE
// extension (2.23.133.5.4.1). NotFound when the leaf has neither; InvalidArgument when the
// extension is malformed.
absl::StatusOr<Bytes> GpuLeafFwid(const Certificate& leaf);

// Verifies one GPU's evidence at time `at` (see the file comment for the checks). Bad evidence
// never makes the call fail: it gives failed checks. InvalidArgument only when the policy is
// unusable (a root that is not exactly one PEM certificate) or an expected nonce is not 32
// bytes.
absl::StatusOr<Verdict> VerifyNvidiaGpu(const NvidiaGpuInput& input, const NvidiaPolicy& policy,
                                        absl::Time at, std::string_view check_prefix = "");

}  // namespace cloister::attest
