// The AMD SEV-SNP attestation report (ABI spec 56860; shared/specs/attestation-formats.md
// section 10.1): a fixed 1184-byte little-endian layout whose first 0x2A0 bytes are signed
// with ECDSA P-384/SHA-384 by the chip's VCEK (or VLEK). The simulated CVM report uses the same
// layout. The parser accepts report versions 2 to 5, checks every reserved field is zero, and
// converts the signature to the big-endian r || s that crypto/ecdsa.h takes; it does NOT verify
// the signature. The encoder is the inverse (for the simulated CVM). Thread-safe: pure
// functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "attest/x509.h"
#include "base/bytes.h"

namespace cloister::attest {

inline constexpr size_t kSnpReportSize = 0x4A0;  // 1184
inline constexpr size_t kSnpSignedSize = 0x2A0;  // bytes [0, 0x2A0) are signed
inline constexpr size_t kSnpSignatureOffset = 0x2A0;
inline constexpr uint32_t kSnpMinVersion = 2;
inline constexpr uint32_t kSnpMaxVersion = 5;
inline constexpr uint32_t kSnpSignatureAlgoEcdsaP384Sha384 = 1;

// Guest policy bits (offset 0x08).
inline constexpr uint64_t kSnpPolicySmtAllowed = uint64_t{1} << 16;
inline constexpr uint64_t kSnpPolicyReservedOne = uint64_t{1} << 17;  // must be 1
inline constexpr uint64_t kSnpPolicyMigrateMa = uint64_t{1} << 18;
inline constexpr uint64_t kSnpPolicyDebug = uint64_t{1} << 19;
inline constexpr uint64_t kSnpPolicySingleSocket = uint64_t{1} << 20;

// SIGNING_KEY values (bits 2-4 of the signer info at 0x48).
inline constexpr uint32_t kSnpSigningKeyVcek = 0;
inline constexpr uint32_t kSnpSigningKeyVlek = 1;
inline constexpr uint32_t kSnpSigningKeyNone = 7;

// TCB_VERSION split into its security patch levels. The byte layout differs by product:
// Milan and Genoa put bootloader, TEE, SNP, microcode at bytes 0, 1, 6, 7; Turin puts FMC,
// bootloader, TEE, SNP, microcode at bytes 0, 1, 2, 3, 7.
struct SnpTcb {
  uint8_t bootloader = 0;
  uint8_t tee = 0;
  uint8_t snp = 0;
  uint8_t microcode = 0;
  std::optional<uint8_t> fmc;  // Turin only

  static SnpTcb FromMilanGenoa(uint64_t raw);
  static SnpTcb FromTurin(uint64_t raw);
  uint64_t ToMilanGenoa() const;
  bool operator==(const SnpTcb&) const = default;
};

struct SnpReport {
  uint32_t version = 0;
  uint32_t guest_svn = 0;
  uint64_t policy = 0;
  Bytes family_id;  // 16
  Bytes image_id;   // 16
  uint32_t vmpl = 0;
  uint32_t signature_algo = 0;
  uint64_t current_tcb = 0;
  uint64_t platform_info = 0;
  uint32_t signer_info = 0;  // bit 0 AUTHOR_KEY_EN, bit 1 MASK_CHIP_KEY, bits 2-4 SIGNING_KEY
  Bytes report_data;         // 64
  Bytes measurement;         // 48
  Bytes host_data;           // 32
  Bytes id_key_digest;       // 48
  Bytes author_key_digest;   // 48
  Bytes report_id;           // 32
  Bytes report_id_ma;        // 32
  uint64_t reported_tcb = 0;
  // Version 3 and later: CPUID family, model and stepping of the chip.
  std::optional<uint8_t> cpuid_family;
  std::optional<uint8_t> cpuid_model;
  std::optional<uint8_t> cpuid_stepping;
  Bytes chip_id;  // 64; zero when MASK_CHIP_KEY is set
  uint64_t committed_tcb = 0;
  uint8_t current_build = 0;
  uint8_t current_minor = 0;
  uint8_t current_major = 0;
  uint8_t committed_build = 0;
  uint8_t committed_minor = 0;
  uint8_t committed_major = 0;
  uint64_t launch_tcb = 0;
  // Version 5 and later.
  std::optional<uint64_t> launch_mitigation_vector;
  std::optional<uint64_t> current_mitigation_vector;
  // The signature as big-endian r || s (96 bytes), ready for EcdsaVerifyP1363.
  Bytes signature;

  bool debug_allowed() const { return (policy & kSnpPolicyDebug) != 0; }
  bool chip_key_masked() const { return (signer_info & 2) != 0; }
  uint32_t signing_key() const { return (signer_info >> 2) & 7; }
};

// Parses exactly 1184 bytes. InvalidArgument (naming the field) for a wrong size, a version
// outside 2..5, an unknown signature algorithm, policy bit 17 clear, nonzero reserved bytes, or
// signature components that do not fit P-384.
absl::StatusOr<SnpReport> ParseSnpReport(ByteSpan report);

// Lays out `report` as the 1184-byte report with the signature area zero (the caller signs
// bytes [0, kSnpSignedSize) and stores the signature with SetSnpSignature). InvalidArgument if a
// fixed-size field has the wrong size.
absl::StatusOr<Bytes> EncodeSnpReportToSign(const SnpReport& report);
// Writes a big-endian r || s P-384 signature (96 bytes) into the report's signature area in
// the little-endian, zero-padded form of the ABI.
absl::Status SetSnpSignature(Bytes& report, ByteSpan signature_p1363);

// AMD VCEK extension OIDs (1.3.6.1.4.1.3704.1.*); the simulated VCEK uses them too.
inline constexpr std::string_view kVcekStructVersionOid = "1.3.6.1.4.1.3704.1.1";
inline constexpr std::string_view kVcekProductNameOid = "1.3.6.1.4.1.3704.1.2";
inline constexpr std::string_view kVcekBootloaderSplOid = "1.3.6.1.4.1.3704.1.3.1";
inline constexpr std::string_view kVcekTeeSplOid = "1.3.6.1.4.1.3704.1.3.2";
inline constexpr std::string_view kVcekSnpSplOid = "1.3.6.1.4.1.3704.1.3.3";
inline constexpr std::string_view kVcekMicrocodeSplOid = "1.3.6.1.4.1.3704.1.3.8";
inline constexpr std::string_view kVcekFmcSplOid = "1.3.6.1.4.1.3704.1.3.9";  // Turin
inline constexpr std::string_view kVcekHwidOid = "1.3.6.1.4.1.3704.1.4";

// What a VCEK certificate says about the chip: its product, the TCB it was issued for, and
// the chip's hardware ID (64 bytes on Milan and Genoa, 8 on Turin).
struct VcekInfo {
  std::string product_name;  // "Milan-B0"
  SnpTcb tcb;
  Bytes hwid;
};
// Reads the VCEK extensions; InvalidArgument when one is missing or malformed.
absl::StatusOr<VcekInfo> ReadVcekExtensions(const Certificate& vcek);
// Checks that the VCEK was issued for this report's chip and reported TCB (Milan/Genoa TCB
// layout, or Turin when the VCEK carries the FMC SPL): hwID == CHIP_ID, SPLs ==
// REPORTED_TCB. PermissionDenied naming the first difference.
absl::Status CheckVcekMatchesReport(const VcekInfo& vcek, const SnpReport& report);

}  // namespace cloister::attest
