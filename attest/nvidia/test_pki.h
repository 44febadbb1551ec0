// Test-only helpers for attest/nvidia: synthetic device and CoRIM PKIs shaped like NVIDIA's,
// GPU reports signed by a synthetic leaf, signed RIMs, and OCSP responses, so that the
// verifier's failure paths can be driven with evidence that is otherwise valid (real NVIDIA
// evidence cannot be re-signed). Also the readers for the shared NVIDIA test vectors.
// Not thread-safe; for tests only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attest/nvidia/rim.h"
#include "attest/spdm.h"
#include "attest/x509.h"
#include "base/bytes.h"
#include "crypto/ecdsa.h"

namespace cloister::attest::testing {

// A certificate with its private key.
struct TestIdentity {
  std::unique_ptr<crypto::EcPrivateKey> key;
  Certificate cert;
};

// Validity used unless a test asks otherwise: 2020-01-01 to 2099-01-01.
absl::Time DefaultNotBefore();
absl::Time DefaultNotAfter();

// A self-signed P-384 CA.
TestIdentity MakeTestRoot(const std::string& common_name,
                          absl::Time not_before = DefaultNotBefore(),
                          absl::Time not_after = DefaultNotAfter());
// A P-384 certificate issued by `issuer`.
TestIdentity IssueTestCert(const TestIdentity& issuer, const std::string& common_name, bool is_ca,
                           std::vector<std::pair<std::string, Bytes>> extensions = {},
                           absl::Time not_before = DefaultNotBefore(),
                           absl::Time not_after = DefaultNotAfter());

// A device PKI like a Hopper GPU's: root -> "NVIDIA <chip> Identity" -> "NVIDIA <chip>
// Provisioner ICA 1" -> "<chip> A01 GSP BROM" -> leaf "<chip> A01 GSP FMC LF" whose
// 2.23.133.5.4.1 extension ends with `fwid`.
struct TestDevicePki {
  TestIdentity root, identity, ica, brom, leaf;
  Bytes fwid;
  // PEM of leaf, brom, ica, identity, root (as NVML returns it).
  std::string ChainPem() const;
};
TestDevicePki MakeTestDevicePki(const std::string& chip = "GH100");

// A RIM PKI like NVIDIA's: root -> CA -> L3 -> "HCC RIM L4 Signer".
struct TestRimPki {
  TestIdentity root, ca, l3, signer;
  std::vector<Certificate> Chain() const;  // signer, l3, ca, root
};
TestRimPki MakeTestRimPki(absl::Time signer_not_before = DefaultNotBefore(),
                          absl::Time signer_not_after = DefaultNotAfter());

// A parsed report (signature all zeros): 64 SHA-384 blocks (block i holds `block_values[i]` if
// given, else zeros), the opaque fields of a Hopper GPU with the given versions, and `nonce`.
struct TestReportSpec {
  Bytes nonce = Bytes(32, 0x11);
  std::string driver_version = "550.90.07";
  std::string vbios_version = "96.00.9F.00.01";
  std::optional<Bytes> fwid;  // FWID opaque field when set
  uint8_t nvdec0_status = 0x55;
  std::vector<std::pair<uint8_t, Bytes>> block_values;  // (block index, 48-byte value)
};
SpdmReport MakeTestReport(const TestReportSpec& spec);
// Encodes and signs `report` with `leaf_key` (raw P-384 r||s over SHA-384).
Bytes SignTestReport(const SpdmReport& report, const crypto::EcPrivateKey& leaf_key);

// A deterministic 48-byte digest for tests.
Bytes TestDigest(uint8_t seed);

// A RIM with entries 0..63, active at `active` with `values` (index -> alternatives).
Rim MakeTestRim(const std::string& version,
                const std::vector<std::pair<uint32_t, std::vector<Bytes>>>& active);
// RimToXml + SignRimXml with the PKI's signer.
std::string SignTestRim(const Rim& rim, const TestRimPki& pki);

// A DER OCSPResponse about `cert` (issued by `issuer`), signed by `responder`.
enum class TestOcspStatus { kGood, kRevoked, kHold, kUnknown };
Bytes MakeTestOcspResponse(const Certificate& cert, const Certificate& issuer,
                           const TestIdentity& responder, TestOcspStatus status,
                           absl::Time this_update, std::optional<absl::Time> next_update);

// Shared NVIDIA test vectors (shared/testdata/nvidia-cc/...).
std::string NvidiaPath(const std::string& relative);
std::string ReadNvidiaText(const std::string& relative);
Bytes ReadNvidiaHex(const std::string& relative);
absl::Time ParseTestTime(const std::string& rfc3339);

}  // namespace cloister::attest::testing
