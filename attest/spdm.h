// The GPU attestation report: an SPDM 1.1 GET_MEASUREMENTS request (37 bytes, carrying the
// requester's nonce) followed by the GPU's signed MEASUREMENTS response, exactly as NVIDIA
// GPUs in confidential-computing mode produce it (shared/specs/attestation-formats.md
// section 3). The parser is shared by the NVIDIA and simulated GPU verifiers; it checks every
// length, refuses trailing bytes, unknown opaque types and duplicates, and does NOT verify the
// signature (callers verify `signature` over the first `signed_size` bytes with the leaf key).
// The encoder builds the same bytes for the simulated GPU. Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::attest {

inline constexpr size_t kSpdmRequestSize = 37;
inline constexpr size_t kSpdmNonceSize = 32;
inline constexpr size_t kSpdmSignatureSize = 96;  // raw ECDSA P-384 r || s, big-endian
inline constexpr uint8_t kSpdmVersion11 = 0x11;
inline constexpr uint8_t kSpdmGetMeasurements = 0xE0;
inline constexpr uint8_t kSpdmMeasurements = 0x60;
inline constexpr uint8_t kSpdmDmtfMeasurementSpec = 0x01;
// GET_MEASUREMENTS Param1 bit 0: the requester asked for a signed response.
inline constexpr uint8_t kSpdmSignatureRequested = 0x01;
// GET_MEASUREMENTS Param2: all measurement blocks.
inline constexpr uint8_t kSpdmAllMeasurements = 0xFF;

// Opaque-data TLV types (section 3.4). Values 1 to 36 are defined; anything else is refused.
enum class OpaqueType : uint16_t {
  kCertIssuerName = 1,
  kCertAuthorityKeyIdentifier = 2,
  kDriverVersion = 3,
  kGpuInfo = 4,
  kSku = 5,
  kVbiosVersion = 6,
  kManufacturerId = 7,
  kTamperDetection = 8,
  kSmc = 9,
  kVpr = 10,
  kNvdec0Status = 11,
  kMsrsCount = 12,
  kCprInfo = 13,
  kBoardId = 14,
  kChipSku = 15,
  kChipSkuMod = 16,
  kProject = 17,
  kProjectSku = 18,
  kProjectSkuMod = 19,
  kFwid = 20,
  kProtectedPcieStatus = 21,
  kSwitchPdi = 22,
  kFloorsweptPorts = 23,
  kPositionId = 24,
  kLockSwitchStatus = 25,
  kGpuLinkConnection = 32,
  kSysEnableStatus = 33,
  kOpaqueDataVersion = 34,
  kChipInfo = 35,
  kFeatureFlag = 36,
};
inline constexpr uint16_t kMaxOpaqueType = 36;
// The name of a TLV type for messages and claims ("DRIVER_VERSION"), or "TYPE_<n>".
std::string OpaqueTypeName(uint16_t type);

// One measurement block. `value` is the DMTF measurement value: a digest (48 bytes of
// SHA-384 on NVIDIA GPUs) unless bit 7 of `value_type` is set (raw bit stream).
struct SpdmMeasurementBlock {
  uint8_t index = 0;  // 1..255, unique within a report
  uint8_t value_type = 0;
  Bytes value;
};

struct SpdmReport {
  // GET_MEASUREMENTS request (bytes 0..36).
  uint8_t request_version = kSpdmVersion11;
  uint8_t request_code = kSpdmGetMeasurements;
  uint8_t request_param1 = kSpdmSignatureRequested;
  uint8_t request_param2 = kSpdmAllMeasurements;
  Bytes requester_nonce;  // 32 bytes: the verifier's (derived) nonce
  uint8_t slot_id = 0;

  // MEASUREMENTS response.
  uint8_t response_version = kSpdmVersion11;
  uint8_t response_code = kSpdmMeasurements;
  uint8_t response_param1 = 0;
  uint8_t response_param2 = 0;
  std::vector<SpdmMeasurementBlock> blocks;  // in report order
  Bytes responder_nonce;                     // 32 bytes chosen by the GPU
  std::vector<uint16_t> opaque_field_order;  // TLV types in report order
  std::map<uint16_t, Bytes> opaque_fields;   // raw TLV values by type
  Bytes signature;                           // 96 bytes, r || s big-endian
  // The signature covers report bytes [0, signed_size): request and response without the
  // signature. Set by the parser.
  size_t signed_size = 0;

  // Decoded opaque fields, filled by the parser (empty or nullopt when absent).
  std::string driver_version;  // "550.90.07"
  std::string vbios_version;   // "96.00.9F.00.01" (GPUs) or the switch BIOS string
  std::string chip_sku;
  std::string chip_sku_mod;
  std::string project;
  std::string project_sku;
  std::string project_sku_mod;
  std::string chip_info;
  std::optional<uint32_t> board_id;
  std::optional<Bytes> fwid;  // 48 bytes
  std::optional<uint8_t> nvdec0_status;
  std::optional<uint8_t> protected_pcie_status;
  std::optional<uint64_t> opaque_data_version;
  std::optional<uint64_t> feature_flag;

  // The block with this index, or nullptr.
  const SpdmMeasurementBlock* FindBlock(uint8_t index) const;
  // The raw value of an opaque field, or nullptr.
  const Bytes* FindOpaque(OpaqueType type) const;
};

// Parses and checks a whole report: SPDM 1.1 request (code 0xE0, signature requested) and
// response (code 0x60, at least one block, DMTF blocks whose sizes add up exactly, unique
// nonzero indices), opaque TLVs that consume the opaque length exactly (types 1..36, no
// duplicates, fixed-size fields of the right size, text fields printable), and a 96-byte
// signature that ends the report. Any violation is an InvalidArgument naming the field and
// offset.
absl::StatusOr<SpdmReport> ParseSpdmReport(ByteSpan report);

// Encodes `report` up to (not including) the signature, from the raw fields: the request
// fields, blocks, responder nonce and the opaque fields in `opaque_field_order` (the decoded
// fields are ignored). The caller signs the result and appends the 96-byte signature.
// InvalidArgument if a size cannot be encoded (nonces not 32 bytes, an opaque type missing
// from the map, lengths beyond the 16/24-bit fields).
absl::StatusOr<Bytes> EncodeSpdmReportToSign(const SpdmReport& report);

// NVIDIA's VBIOS version coding (section 3.4): 8 bytes <-> "96.00.9F.00.01".
absl::StatusOr<std::string> DecodeVbiosVersion(ByteSpan value);
absl::StatusOr<Bytes> EncodeVbiosVersion(std::string_view version);

}  // namespace cloister::attest
