#include "attest/snp_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "attest/byte_reader.h"
#include "attest/string_view.h"
#include "base/status.h"

namespace cloister::attest {
namespace {

constexpr absl::string_view kWhat = "SEV-SNP report";
constexpr size_t kComponentSize = 72;  // r and s each occupy 72 little-endian bytes
constexpr size_t kP384Size = 48;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(kWhat, ": ", message));
}

uint64_t Load(ByteSpan report, size_t offset, size_t width) {
  return LoadLittleEndian(report.subspan(offset, width));
}
Bytes Slice(ByteSpan report, size_t offset, size_t size) {
  ByteSpan s = report.subspan(offset, size);
  return Bytes(s.begin(), s.end());
}
void Store(Bytes& report, size_t offset, uint64_t value, size_t width) {
  for (size_t i = 0; i < width; ++i) report[offset + i] = static_cast<uint8_t>(value >> (8 * i));
}

absl::Status CheckZero(ByteSpan report, size_t begin, size_t end, absl::string_view what) {
  for (size_t i = begin; i < end; ++i) {
    if (report[i] != 0) {
      return Invalid(absl::StrCat(what, " at offset 0x", absl::Hex(i), " is not zero"));
    }
  }
  return absl::OkStatus();
}

struct FixedField {
  Bytes SnpReport::*member;
  size_t offset;
  size_t size;
  absl::string_view name;
};
constexpr FixedField kFixedFields[] = {
    {&SnpReport::family_id, 0x10, 16, "FAMILY_ID"},
    {&SnpReport::image_id, 0x20, 16, "IMAGE_ID"},
    {&SnpReport::report_data, 0x50, 64, "REPORT_DATA"},
    {&SnpReport::measurement, 0x90, 48, "MEASUREMENT"},
    {&SnpReport::host_data, 0xC0, 32, "HOST_DATA"},
    {&SnpReport::id_key_digest, 0xE0, 48, "ID_KEY_DIGEST"},
    {&SnpReport::author_key_digest, 0x110, 48, "AUTHOR_KEY_DIGEST"},
    {&SnpReport::report_id, 0x140, 32, "REPORT_ID"},
    {&SnpReport::report_id_ma, 0x160, 32, "REPORT_ID_MA"},
    {&SnpReport::chip_id, 0x1A0, 64, "CHIP_ID"},
};

}  // namespace

SnpTcb SnpTcb::FromMilanGenoa(uint64_t raw) {
  SnpTcb tcb;
  tcb.bootloader = static_cast<uint8_t>(raw);
  tcb.tee = static_cast<uint8_t>(raw >> 8);
  tcb.snp = static_cast<uint8_t>(raw >> 48);
  tcb.microcode = static_cast<uint8_t>(raw >> 56);
  return tcb;
}

SnpTcb SnpTcb::FromTurin(uint64_t raw) {
  SnpTcb tcb;
  tcb.fmc = static_cast<uint8_t>(raw);
  tcb.bootloader = static_cast<uint8_t>(raw >> 8);
  tcb.tee = static_cast<uint8_t>(raw >> 16);
  tcb.snp = static_cast<uint8_t>(raw >> 24);
  tcb.microcode = static_cast<uint8_t>(raw >> 56);
  return tcb;
}

uint64_t SnpTcb::ToMilanGenoa() const {
  return uint64_t{bootloader} | uint64_t{tee} << 8 | uint64_t{snp} << 48 |
         uint64_t{microcode} << 56;
}

absl::StatusOr<SnpReport> ParseSnpReport(ByteSpan bytes) {
  if (bytes.size() != kSnpReportSize) {
    return Invalid(absl::StrCat("is ", bytes.size(), " bytes, expected ", kSnpReportSize));
  }
  SnpReport report;
  report.version = static_cast<uint32_t>(Load(bytes, 0x00, 4));
  if (report.version < kSnpMinVersion || report.version > kSnpMaxVersion) {
    return Invalid(absl::StrCat("version ", report.version, " is not supported (2 to 5)"));
  }
  report.guest_svn = static_cast<uint32_t>(Load(bytes, 0x04, 4));
  report.policy = Load(bytes, 0x08, 8);
  if ((report.policy & kSnpPolicyReservedOne) == 0) {
    return Invalid("POLICY bit 17 (reserved, must be 1) is clear");
  }
  report.vmpl = static_cast<uint32_t>(Load(bytes, 0x30, 4));
  report.signature_algo = static_cast<uint32_t>(Load(bytes, 0x34, 4));
  if (report.signature_algo != kSnpSignatureAlgoEcdsaP384Sha384) {
    return Invalid(absl::StrCat("SIGNATURE_ALGO ", report.signature_algo,
                                " is not supported (1 = ECDSA P-384 with SHA-384)"));
  }
  report.current_tcb = Load(bytes, 0x38, 8);
  report.platform_info = Load(bytes, 0x40, 8);
  report.signer_info = static_cast<uint32_t>(Load(bytes, 0x48, 4));
  if ((report.signer_info & ~uint32_t{0x1F}) != 0) {
    return Invalid("reserved signer-info bits 5-31 at offset 0x48 are not zero");
  }
  RETURN_IF_ERROR(CheckZero(bytes, 0x4C, 0x50, "reserved field"));
  for (const FixedField& field : kFixedFields) {
    report.*field.member = Slice(bytes, field.offset, field.size);
  }
  report.reported_tcb = Load(bytes, 0x180, 8);
  if (report.version >= 3) {
    report.cpuid_family = bytes[0x188];
    report.cpuid_model = bytes[0x189];
    report.cpuid_stepping = bytes[0x18A];
  } else {
    RETURN_IF_ERROR(CheckZero(bytes, 0x188, 0x18B, "CPUID field of a version 2 report"));
  }
  RETURN_IF_ERROR(CheckZero(bytes, 0x18B, 0x1A0, "reserved field"));
  report.committed_tcb = Load(bytes, 0x1E0, 8);
  report.current_build = bytes[0x1E8];
  report.current_minor = bytes[0x1E9];
  report.current_major = bytes[0x1EA];
  RETURN_IF_ERROR(CheckZero(bytes, 0x1EB, 0x1EC, "reserved field"));
  report.committed_build = bytes[0x1EC];
  report.committed_minor = bytes[0x1ED];
  report.committed_major = bytes[0x1EE];
  RETURN_IF_ERROR(CheckZero(bytes, 0x1EF, 0x1F0, "reserved field"));
  report.launch_tcb = Load(bytes, 0x1F0, 8);
  if (report.version >= 5) {
    report.launch_mitigation_vector = Load(bytes, 0x1F8, 8);
    report.current_mitigation_vector = Load(bytes, 0x200, 8);
  } else {
    RETURN_IF_ERROR(CheckZero(bytes, 0x1F8, 0x208, "mitigation vector of a pre-v5 report"));
  }
  RETURN_IF_ERROR(CheckZero(bytes, 0x208, kSnpSignedSize, "reserved field"));

  // Signature: r and s as 72-byte little-endian integers; P-384 values fit in 48 bytes.
  for (int component = 0; component < 2; ++component) {
    size_t base = kSnpSignatureOffset + component * kComponentSize;
    RETURN_IF_ERROR(CheckZero(bytes, base + kP384Size, base + kComponentSize,
                              component == 0 ? "signature R padding" : "signature S padding"));
    ByteSpan little = bytes.subspan(base, kP384Size);
    report.signature.insert(report.signature.end(), little.rbegin(), little.rend());
  }
  RETURN_IF_ERROR(CheckZero(bytes, kSnpSignatureOffset + 2 * kComponentSize, kSnpReportSize,
                            "reserved signature area"));
  return report;
}

absl::StatusOr<Bytes> EncodeSnpReportToSign(const SnpReport& report) {
  Bytes out(kSnpReportSize, 0);
  Store(out, 0x00, report.version, 4);
  Store(out, 0x04, report.guest_svn, 4);
  Store(out, 0x08, report.policy, 8);
  Store(out, 0x30, report.vmpl, 4);
  Store(out, 0x34, report.signature_algo, 4);
  Store(out, 0x38, report.current_tcb, 8);
  Store(out, 0x40, report.platform_info, 8);
  Store(out, 0x48, report.signer_info, 4);
  for (const FixedField& field : kFixedFields) {
    const Bytes& value = report.*field.member;
    if (value.size() != field.size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SEV-SNP encode: ", field.name, " is ", value.size(), " bytes, expected ", field.size));
    }
    std::copy(value.begin(), value.end(), out.begin() + field.offset);
  }
  Store(out, 0x180, report.reported_tcb, 8);
  if (report.version >= 3) {
    out[0x188] = report.cpuid_family.value_or(0);
    out[0x189] = report.cpuid_model.value_or(0);
    out[0x18A] = report.cpuid_stepping.value_or(0);
  }
  Store(out, 0x1E0, report.committed_tcb, 8);
  out[0x1E8] = report.current_build;
  out[0x1E9] = report.current_minor;
  out[0x1EA] = report.current_major;
  out[0x1EC] = report.committed_build;
  out[0x1ED] = report.committed_minor;
  out[0x1EE] = report.committed_major;
  Store(out, 0x1F0, report.launch_tcb, 8);
  if (report.version >= 5) {
    Store(out, 0x1F8, report.launch_mitigation_vector.value_or(0), 8);
    Store(out, 0x200, report.current_mitigation_vector.value_or(0), 8);
  }
  return out;
}

absl::Status SetSnpSignature(Bytes& report, ByteSpan signature_p1363) {
  if (report.size() != kSnpReportSize || signature_p1363.size() != 2 * kP384Size) {
    return absl::InvalidArgumentError(
        "SEV-SNP encode: a 1184-byte report and a 96-byte r || s signature are required");
  }
  std::fill(report.begin() + kSnpSignatureOffset, report.end(), 0);
  for (int component = 0; component < 2; ++component) {
    ByteSpan big = signature_p1363.subspan(component * kP384Size, kP384Size);
    std::copy(big.rbegin(), big.rend(),
              report.begin() + kSnpSignatureOffset + component * kComponentSize);
  }
  return absl::OkStatus();
}

absl::StatusOr<VcekInfo> ReadVcekExtensions(const Certificate& vcek) {
  VcekInfo info;
  auto read_spl = [&](std::string_view oid, absl::string_view name) -> absl::StatusOr<uint8_t> {
    ASSIGN_OR_RETURN(Bytes value, vcek.ExtensionValue(oid));
    auto number = der::ParseInteger(value);
    if (!number.ok() || *number > 255) {
      return absl::InvalidArgumentError(
          absl::StrCat("VCEK extension ", name, " (", Sv(oid), ") is not a small INTEGER"));
    }
    return static_cast<uint8_t>(*number);
  };
  ASSIGN_OR_RETURN(Bytes product, vcek.ExtensionValue(kVcekProductNameOid));
  auto product_name = der::ParseIa5String(product);
  if (!product_name.ok()) {
    return absl::InvalidArgumentError("VCEK product-name extension is not an IA5String");
  }
  info.product_name = *product_name;
  ASSIGN_OR_RETURN(info.tcb.bootloader, read_spl(kVcekBootloaderSplOid, "bootloader SPL"));
  ASSIGN_OR_RETURN(info.tcb.tee, read_spl(kVcekTeeSplOid, "TEE SPL"));
  ASSIGN_OR_RETURN(info.tcb.snp, read_spl(kVcekSnpSplOid, "SNP SPL"));
  ASSIGN_OR_RETURN(info.tcb.microcode, read_spl(kVcekMicrocodeSplOid, "microcode SPL"));
  if (vcek.ExtensionValue(kVcekFmcSplOid).ok()) {
    ASSIGN_OR_RETURN(info.tcb.fmc, read_spl(kVcekFmcSplOid, "FMC SPL"));
  }
  ASSIGN_OR_RETURN(info.hwid, vcek.ExtensionValue(kVcekHwidOid));
  if (info.hwid.size() != 64 && info.hwid.size() != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("VCEK hwID extension is ", info.hwid.size(), " bytes, expected 64 or 8"));
  }
  return info;
}

absl::Status CheckVcekMatchesReport(const VcekInfo& vcek, const SnpReport& report) {
  if (report.chip_key_masked()) {
    return absl::PermissionDeniedError(
        "the report masks CHIP_ID, so it cannot be matched to a VCEK");
  }
  ByteSpan chip_id(report.chip_id);
  if (vcek.hwid.size() == 8) chip_id = chip_id.first(8);  // Turin: 8-byte hwID
  if (!ConstantTimeEquals(vcek.hwid, chip_id)) {
    return absl::PermissionDeniedError("the VCEK was issued for another chip (hwID != CHIP_ID)");
  }
  SnpTcb reported = vcek.tcb.fmc.has_value() ? SnpTcb::FromTurin(report.reported_tcb)
                                             : SnpTcb::FromMilanGenoa(report.reported_tcb);
  if (!(reported == vcek.tcb)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the VCEK was issued for TCB bootloader ", vcek.tcb.bootloader, " TEE ", vcek.tcb.tee,
        " SNP ", vcek.tcb.snp, " microcode ", vcek.tcb.microcode, " but the report's TCB is ",
        reported.bootloader, "/", reported.tee, "/", reported.snp, "/", reported.microcode));
  }
  return absl::OkStatus();
}

}  // namespace cloister::attest
