#include "attest/spdm.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "attest/byte_reader.h"
#include "attest/string_view.h"
#include "base/status.h"

namespace cloister::attest {
namespace {

constexpr absl::string_view kWhat = "SPDM report";
constexpr size_t kOpaqueFwidSize = 48;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(kWhat, ": ", message));
}

std::string Hex8(uint64_t value) { return absl::StrCat("0x", absl::Hex(value, absl::kZeroPad2)); }

// Decodes an ASCII text field: printable characters up to the first NUL, then only NULs.
absl::StatusOr<std::string> DecodeText(uint16_t type, const Bytes& value) {
  std::string text;
  size_t i = 0;
  for (; i < value.size() && value[i] != 0; ++i) {
    if (value[i] < 0x20 || value[i] > 0x7E) {
      return Invalid(absl::StrCat("opaque field ", OpaqueTypeName(type),
                                  " has a non-printable byte ", Hex8(value[i]), " at position ",
                                  i));
    }
    text.push_back(static_cast<char>(value[i]));
  }
  for (; i < value.size(); ++i) {
    if (value[i] != 0) {
      return Invalid(absl::StrCat("opaque field ", OpaqueTypeName(type),
                                  " has bytes after its terminating NUL"));
    }
  }
  return text;
}

absl::Status CheckSize(uint16_t type, const Bytes& value, size_t expected) {
  if (value.size() != expected) {
    return Invalid(absl::StrCat("opaque field ", OpaqueTypeName(type), " is ", value.size(),
                                " bytes, expected ", expected));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> DecodeSmallInteger(uint16_t type, const Bytes& value) {
  if (value.empty() || value.size() > 8) {
    return Invalid(absl::StrCat("opaque field ", OpaqueTypeName(type), " is ", value.size(),
                                " bytes, expected 1 to 8"));
  }
  return LoadLittleEndian(value);
}

// Fills the decoded members of `report` from its raw opaque fields.
absl::Status DecodeOpaqueFields(SpdmReport& report) {
  for (const auto& [type, value] : report.opaque_fields) {
    switch (static_cast<OpaqueType>(type)) {
      case OpaqueType::kDriverVersion: {
        ASSIGN_OR_RETURN(report.driver_version, DecodeText(type, value));
        break;
      }
      case OpaqueType::kVbiosVersion: {
        // GPUs carry 8 coded bytes; NVSwitches carry the BIOS version as text.
        if (value.size() == 8) {
          ASSIGN_OR_RETURN(report.vbios_version, DecodeVbiosVersion(value));
        } else {
          ASSIGN_OR_RETURN(report.vbios_version, DecodeText(type, value));
        }
        break;
      }
      case OpaqueType::kChipSku: {
        ASSIGN_OR_RETURN(report.chip_sku, DecodeText(type, value));
        break;
      }
      case OpaqueType::kChipSkuMod: {
        ASSIGN_OR_RETURN(report.chip_sku_mod, DecodeText(type, value));
        break;
      }
      case OpaqueType::kProject: {
        ASSIGN_OR_RETURN(report.project, DecodeText(type, value));
        break;
      }
      case OpaqueType::kProjectSku: {
        ASSIGN_OR_RETURN(report.project_sku, DecodeText(type, value));
        break;
      }
      case OpaqueType::kProjectSkuMod: {
        ASSIGN_OR_RETURN(report.project_sku_mod, DecodeText(type, value));
        break;
      }
      case OpaqueType::kChipInfo: {
        ASSIGN_OR_RETURN(report.chip_info, DecodeText(type, value));
        break;
      }
      case OpaqueType::kBoardId: {
        RETURN_IF_ERROR(CheckSize(type, value, 4));
        report.board_id = static_cast<uint32_t>(LoadLittleEndian(value));
        break;
      }
      case OpaqueType::kFwid: {
        RETURN_IF_ERROR(CheckSize(type, value, kOpaqueFwidSize));
        report.fwid = value;
        break;
      }
      case OpaqueType::kNvdec0Status: {
        RETURN_IF_ERROR(CheckSize(type, value, 1));
        report.nvdec0_status = value[0];
        break;
      }
      case OpaqueType::kProtectedPcieStatus: {
        RETURN_IF_ERROR(CheckSize(type, value, 1));
        report.protected_pcie_status = value[0];
        break;
      }
      case OpaqueType::kMsrsCount: {
        if (value.size() % 4 != 0) {
          return Invalid(absl::StrCat("opaque field MSRSCNT is ", value.size(),
                                      " bytes, not a multiple of 4"));
        }
        break;
      }
      case OpaqueType::kOpaqueDataVersion: {
        ASSIGN_OR_RETURN(report.opaque_data_version, DecodeSmallInteger(type, value));
        break;
      }
      case OpaqueType::kFeatureFlag: {
        ASSIGN_OR_RETURN(report.feature_flag, DecodeSmallInteger(type, value));
        break;
      }
      default:
        break;  // kept raw in opaque_fields
    }
  }
  return absl::OkStatus();
}

absl::Status ParseRequest(ByteReader& reader, SpdmReport& report) {
  ASSIGN_OR_RETURN(report.request_version, reader.U8("request SPDMVersion"));
  if (report.request_version != kSpdmVersion11) {
    return Invalid(absl::StrCat("request SPDM version ", Hex8(report.request_version),
                                ", only 0x11 (SPDM 1.1) is supported"));
  }
  ASSIGN_OR_RETURN(report.request_code, reader.U8("request code"));
  if (report.request_code != kSpdmGetMeasurements) {
    return Invalid(absl::StrCat("request code ", Hex8(report.request_code),
                                ", expected 0xe0 (GET_MEASUREMENTS)"));
  }
  ASSIGN_OR_RETURN(report.request_param1, reader.U8("request Param1"));
  if ((report.request_param1 & kSpdmSignatureRequested) == 0) {
    return Invalid("the request did not ask for a signed response (Param1 bit 0 clear)");
  }
  ASSIGN_OR_RETURN(report.request_param2, reader.U8("request Param2"));
  ASSIGN_OR_RETURN(ByteSpan nonce, reader.Take(kSpdmNonceSize, "requester nonce"));
  report.requester_nonce.assign(nonce.begin(), nonce.end());
  ASSIGN_OR_RETURN(report.slot_id, reader.U8("request SlotIDParam"));
  return absl::OkStatus();
}

absl::Status ParseBlocks(ByteReader& reader, size_t block_count, size_t record_size,
                         SpdmReport& report) {
  ASSIGN_OR_RETURN(ByteSpan record, reader.Take(record_size, "measurement record"));
  ByteReader blocks(record, "SPDM measurement record");
  std::set<uint8_t> seen;
  for (size_t n = 0; n < block_count; ++n) {
    SpdmMeasurementBlock block;
    ASSIGN_OR_RETURN(block.index, blocks.U8("block index"));
    if (block.index == 0) return Invalid(absl::StrCat("measurement block ", n, " has index 0"));
    if (!seen.insert(block.index).second) {
      return Invalid(absl::StrCat("measurement index ", block.index, " appears twice"));
    }
    ASSIGN_OR_RETURN(uint8_t spec, blocks.U8("block measurement specification"));
    if (spec != kSpdmDmtfMeasurementSpec) {
      return Invalid(absl::StrCat("measurement block ", block.index, " has specification ",
                                  Hex8(spec), ", expected 0x01 (DMTF)"));
    }
    ASSIGN_OR_RETURN(uint64_t measurement_size, blocks.LittleEndian(2, "block measurement size"));
    ASSIGN_OR_RETURN(ByteSpan measurement, blocks.Take(measurement_size, "block measurement"));
    ByteReader dmtf(measurement, "SPDM DMTF measurement");
    ASSIGN_OR_RETURN(block.value_type, dmtf.U8("DMTF value type"));
    ASSIGN_OR_RETURN(uint64_t value_size, dmtf.LittleEndian(2, "DMTF value size"));
    if (value_size + 3 != measurement_size) {
      return Invalid(absl::StrCat("measurement block ", block.index, " has value size ", value_size,
                                  " inside a measurement of ", measurement_size,
                                  " bytes (expected value size + 3)"));
    }
    ASSIGN_OR_RETURN(ByteSpan value, dmtf.Take(value_size, "DMTF value"));
    block.value.assign(value.begin(), value.end());
    report.blocks.push_back(std::move(block));
  }
  if (blocks.remaining() != 0) {
    return Invalid(absl::StrCat("measurement record length ", record_size, " leaves ",
                                blocks.remaining(), " bytes after ", block_count, " blocks"));
  }
  return absl::OkStatus();
}

absl::Status ParseOpaque(ByteReader& reader, SpdmReport& report) {
  ASSIGN_OR_RETURN(uint64_t opaque_size, reader.LittleEndian(2, "opaque length"));
  if (opaque_size == 0) return Invalid("opaque data is empty");
  ASSIGN_OR_RETURN(ByteSpan opaque, reader.Take(opaque_size, "opaque data"));
  ByteReader tlv(opaque, "SPDM opaque data");
  while (tlv.remaining() > 0) {
    size_t offset = tlv.offset();
    ASSIGN_OR_RETURN(uint64_t type, tlv.LittleEndian(2, "opaque field type"));
    ASSIGN_OR_RETURN(uint64_t size, tlv.LittleEndian(2, "opaque field length"));
    if (type == 0 || type > kMaxOpaqueType) {
      return Invalid(
          absl::StrCat("unknown opaque field type ", type, " at opaque offset ", offset));
    }
    ASSIGN_OR_RETURN(ByteSpan value, tlv.Take(size, "opaque field value"));
    auto [it, inserted] = report.opaque_fields.emplace(static_cast<uint16_t>(type),
                                                       Bytes(value.begin(), value.end()));
    if (!inserted) {
      return Invalid(absl::StrCat("opaque field ", OpaqueTypeName(type), " appears twice"));
    }
    report.opaque_field_order.push_back(static_cast<uint16_t>(type));
  }
  return DecodeOpaqueFields(report);
}

}  // namespace

std::string OpaqueTypeName(uint16_t type) {
  switch (static_cast<OpaqueType>(type)) {
    case OpaqueType::kCertIssuerName:
      return "CERT_ISSUER_NAME";
    case OpaqueType::kCertAuthorityKeyIdentifier:
      return "CERT_AUTHORITY_KEY_IDENTIFIER";
    case OpaqueType::kDriverVersion:
      return "DRIVER_VERSION";
    case OpaqueType::kGpuInfo:
      return "GPU_INFO";
    case OpaqueType::kSku:
      return "SKU";
    case OpaqueType::kVbiosVersion:
      return "VBIOS_VERSION";
    case OpaqueType::kManufacturerId:
      return "MANUFACTURER_ID";
    case OpaqueType::kTamperDetection:
      return "TAMPER_DETECTION";
    case OpaqueType::kSmc:
      return "SMC";
    case OpaqueType::kVpr:
      return "VPR";
    case OpaqueType::kNvdec0Status:
      return "NVDEC0_STATUS";
    case OpaqueType::kMsrsCount:
      return "MSRSCNT";
    case OpaqueType::kCprInfo:
      return "CPRINFO";
    case OpaqueType::kBoardId:
      return "BOARD_ID";
    case OpaqueType::kChipSku:
      return "CHIP_SKU";
    case OpaqueType::kChipSkuMod:
      return "CHIP_SKU_MOD";
    case OpaqueType::kProject:
      return "PROJECT";
    case OpaqueType::kProjectSku:
      return "PROJECT_SKU";
    case OpaqueType::kProjectSkuMod:
      return "PROJECT_SKU_MOD";
    case OpaqueType::kFwid:
      return "FWID";
    case OpaqueType::kProtectedPcieStatus:
      return "PROTECTED_PCIE_STATUS";
    case OpaqueType::kSwitchPdi:
      return "SWITCH_PDI";
    case OpaqueType::kFloorsweptPorts:
      return "FLOORSWEPT_PORTS";
    case OpaqueType::kPositionId:
      return "POSITION_ID";
    case OpaqueType::kLockSwitchStatus:
      return "LOCK_SWITCH_STATUS";
    case OpaqueType::kGpuLinkConnection:
      return "GPU_LINK_CONN";
    case OpaqueType::kSysEnableStatus:
      return "SYS_ENABLE_STATUS";
    case OpaqueType::kOpaqueDataVersion:
      return "OPAQUE_DATA_VERSION";
    case OpaqueType::kChipInfo:
      return "CHIP_INFO";
    case OpaqueType::kFeatureFlag:
      return "FEATURE_FLAG";
  }
  return absl::StrCat("TYPE_", type);
}

const SpdmMeasurementBlock* SpdmReport::FindBlock(uint8_t index) const {
  for (const SpdmMeasurementBlock& block : blocks) {
    if (block.index == index) return &block;
  }
  return nullptr;
}

const Bytes* SpdmReport::FindOpaque(OpaqueType type) const {
  auto it = opaque_fields.find(static_cast<uint16_t>(type));
  return it == opaque_fields.end() ? nullptr : &it->second;
}

absl::StatusOr<SpdmReport> ParseSpdmReport(ByteSpan report_bytes) {
  SpdmReport report;
  ByteReader reader(report_bytes, kWhat);
  RETURN_IF_ERROR(ParseRequest(reader, report));

  ASSIGN_OR_RETURN(report.response_version, reader.U8("response SPDMVersion"));
  if (report.response_version != kSpdmVersion11) {
    return Invalid(absl::StrCat("response SPDM version ", Hex8(report.response_version),
                                ", only 0x11 (SPDM 1.1) is supported"));
  }
  ASSIGN_OR_RETURN(report.response_code, reader.U8("response code"));
  if (report.response_code != kSpdmMeasurements) {
    return Invalid(absl::StrCat("response code ", Hex8(report.response_code),
                                ", expected 0x60 (MEASUREMENTS)"));
  }
  ASSIGN_OR_RETURN(report.response_param1, reader.U8("response Param1"));
  ASSIGN_OR_RETURN(report.response_param2, reader.U8("response Param2"));
  ASSIGN_OR_RETURN(uint8_t block_count, reader.U8("NumberOfBlocks"));
  if (block_count == 0) return Invalid("the response has no measurement blocks");
  ASSIGN_OR_RETURN(uint64_t record_size, reader.LittleEndian(3, "MeasurementRecordLength"));
  RETURN_IF_ERROR(ParseBlocks(reader, block_count, record_size, report));

  ASSIGN_OR_RETURN(ByteSpan responder_nonce, reader.Take(kSpdmNonceSize, "responder nonce"));
  report.responder_nonce.assign(responder_nonce.begin(), responder_nonce.end());
  RETURN_IF_ERROR(ParseOpaque(reader, report));

  report.signed_size = reader.offset();
  ASSIGN_OR_RETURN(ByteSpan signature, reader.Take(kSpdmSignatureSize, "signature"));
  report.signature.assign(signature.begin(), signature.end());
  if (reader.remaining() != 0) {
    return Invalid(absl::StrCat(reader.remaining(), " trailing bytes after the signature"));
  }
  return report;
}

absl::StatusOr<Bytes> EncodeSpdmReportToSign(const SpdmReport& report) {
  if (report.requester_nonce.size() != kSpdmNonceSize ||
      report.responder_nonce.size() != kSpdmNonceSize) {
    return absl::InvalidArgumentError("SPDM encode: nonces must be 32 bytes");
  }
  if (report.blocks.empty() || report.blocks.size() > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("SPDM encode: ", report.blocks.size(), " blocks, expected 1 to 255"));
  }
  Bytes out = {report.request_version, report.request_code, report.request_param1,
               report.request_param2};
  Append(out, report.requester_nonce);
  out.push_back(report.slot_id);
  out.insert(out.end(), {report.response_version, report.response_code, report.response_param1,
                         report.response_param2, static_cast<uint8_t>(report.blocks.size())});

  Bytes record;
  for (const SpdmMeasurementBlock& block : report.blocks) {
    if (block.value.size() + 3 > 0xFFFF) {
      return absl::InvalidArgumentError("SPDM encode: measurement value too large");
    }
    size_t measurement_size = block.value.size() + 3;
    record.insert(
        record.end(),
        {block.index, kSpdmDmtfMeasurementSpec, static_cast<uint8_t>(measurement_size),
         static_cast<uint8_t>(measurement_size >> 8), block.value_type,
         static_cast<uint8_t>(block.value.size()), static_cast<uint8_t>(block.value.size() >> 8)});
    Append(record, block.value);
  }
  if (record.size() > 0xFFFFFF) {
    return absl::InvalidArgumentError("SPDM encode: measurement record too large");
  }
  for (int i = 0; i < 3; ++i) out.push_back(static_cast<uint8_t>(record.size() >> (8 * i)));
  Append(out, record);
  Append(out, report.responder_nonce);

  Bytes opaque;
  for (uint16_t type : report.opaque_field_order) {
    auto it = report.opaque_fields.find(type);
    if (it == report.opaque_fields.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SPDM encode: opaque field ", OpaqueTypeName(type), " has no value"));
    }
    if (it->second.size() > 0xFFFF) {
      return absl::InvalidArgumentError("SPDM encode: opaque field too large");
    }
    opaque.insert(opaque.end(), {static_cast<uint8_t>(type), static_cast<uint8_t>(type >> 8),
                                 static_cast<uint8_t>(it->second.size()),
                                 static_cast<uint8_t>(it->second.size() >> 8)});
    Append(opaque, it->second);
  }
  if (opaque.size() > 0xFFFF) {
    return absl::InvalidArgumentError("SPDM encode: opaque data too large");
  }
  out.push_back(static_cast<uint8_t>(opaque.size()));
  out.push_back(static_cast<uint8_t>(opaque.size() >> 8));
  Append(out, opaque);
  return out;
}

absl::StatusOr<std::string> DecodeVbiosVersion(ByteSpan value) {
  if (value.size() != 8) {
    return Invalid(absl::StrCat("VBIOS_VERSION is ", value.size(), " bytes, expected 8"));
  }
  // Reverse the bytes and hex-encode (upper case); the version is the last 8 digits followed
  // by digits 6-7, in dotted pairs.
  Bytes reversed(value.rbegin(), value.rend());
  std::string hex = absl::AsciiStrToUpper(HexEncode(reversed));
  std::string digits = hex.substr(8, 8) + hex.substr(6, 2);
  std::vector<std::string> pairs;
  for (size_t i = 0; i < digits.size(); i += 2) pairs.push_back(digits.substr(i, 2));
  return absl::StrJoin(pairs, ".");
}

absl::StatusOr<Bytes> EncodeVbiosVersion(std::string_view version_text) {
  absl::string_view version = Sv(version_text);
  std::vector<absl::string_view> parts = absl::StrSplit(version, '.');
  if (parts.size() != 5) {
    return absl::InvalidArgumentError(absl::StrCat(
        "VBIOS version '", version, "' is not five dot-separated hex pairs (like 96.00.9F.00.01)"));
  }
  Bytes values;
  for (absl::string_view part : parts) {
    auto decoded = part.size() == 2 ? HexDecode(StdSv(part)) : absl::InvalidArgumentError("");
    if (!decoded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("VBIOS version '", version,
                       "' is not five dot-separated hex pairs (like 96.00.9F.00.01)"));
    }
    values.push_back((*decoded)[0]);
  }
  // The inverse of DecodeVbiosVersion: pairs a.b.c.d.e are stored as d c b a e 0 0 0.
  return Bytes{values[3], values[2], values[1], values[0], values[4], 0, 0, 0};
}

}  // namespace cloister::attest
