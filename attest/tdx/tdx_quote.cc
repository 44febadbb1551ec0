#include "attest/tdx/tdx_quote.h"

#include "absl/strings/str_cat.h"
#include "attest/byte_reader.h"
#include "base/status.h"

namespace cloister::attest {
namespace {

constexpr absl::string_view kWhat = "TDX quote";
constexpr size_t kEcdsaP256SignatureSize = 64;
constexpr size_t kEcdsaP256KeySize = 64;
// A PCK chain is three certificates of about 1 KiB each; refuse anything absurd.
constexpr size_t kMaxPckChainSize = 64 * 1024;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(kWhat, ": ", message));
}

absl::StatusOr<Bytes> TakeBytes(ByteReader& reader, size_t size, absl::string_view field) {
  ASSIGN_OR_RETURN(ByteSpan span, reader.Take(size, field));
  return Bytes(span.begin(), span.end());
}

absl::StatusOr<TdReportBody> ParseBody(ByteReader& reader, uint16_t body_type) {
  TdReportBody body;
  ASSIGN_OR_RETURN(body.tee_tcb_svn, TakeBytes(reader, 16, "TEE_TCB_SVN"));
  ASSIGN_OR_RETURN(body.mr_seam, TakeBytes(reader, 48, "MRSEAM"));
  ASSIGN_OR_RETURN(body.mr_signer_seam, TakeBytes(reader, 48, "MRSIGNERSEAM"));
  ASSIGN_OR_RETURN(body.seam_attributes, TakeBytes(reader, 8, "SEAMATTRIBUTES"));
  ASSIGN_OR_RETURN(body.td_attributes, TakeBytes(reader, 8, "TDATTRIBUTES"));
  ASSIGN_OR_RETURN(body.xfam, TakeBytes(reader, 8, "XFAM"));
  ASSIGN_OR_RETURN(body.mr_td, TakeBytes(reader, 48, "MRTD"));
  ASSIGN_OR_RETURN(body.mr_config_id, TakeBytes(reader, 48, "MRCONFIGID"));
  ASSIGN_OR_RETURN(body.mr_owner, TakeBytes(reader, 48, "MROWNER"));
  ASSIGN_OR_RETURN(body.mr_owner_config, TakeBytes(reader, 48, "MROWNERCONFIG"));
  for (int i = 0; i < 4; ++i) {
    ASSIGN_OR_RETURN(body.rtmr[i], TakeBytes(reader, 48, absl::StrCat("RTMR", i)));
  }
  ASSIGN_OR_RETURN(body.report_data, TakeBytes(reader, 64, "REPORTDATA"));
  if (body_type == kTdxBodyType15) {
    ASSIGN_OR_RETURN(body.tee_tcb_svn2, TakeBytes(reader, 16, "TEE_TCB_SVN2"));
    ASSIGN_OR_RETURN(body.mr_service_td, TakeBytes(reader, 48, "MRSERVICETD"));
  }
  return body;
}

absl::StatusOr<SgxReportBody> ParseSgxReport(ByteSpan raw) {
  ByteReader reader(raw, "TDX quote QE report");
  SgxReportBody report;
  ASSIGN_OR_RETURN(report.cpu_svn, TakeBytes(reader, 16, "CPUSVN"));
  ASSIGN_OR_RETURN(report.misc_select_raw, TakeBytes(reader, 4, "MISCSELECT"));
  report.misc_select = static_cast<uint32_t>(LoadLittleEndian(report.misc_select_raw));
  RETURN_IF_ERROR(reader.Take(28, "reserved").status());
  ASSIGN_OR_RETURN(report.attributes, TakeBytes(reader, 16, "ATTRIBUTES"));
  ASSIGN_OR_RETURN(report.mr_enclave, TakeBytes(reader, 32, "MRENCLAVE"));
  RETURN_IF_ERROR(reader.Take(32, "reserved").status());
  ASSIGN_OR_RETURN(report.mr_signer, TakeBytes(reader, 32, "MRSIGNER"));
  RETURN_IF_ERROR(reader.Take(96, "reserved").status());
  ASSIGN_OR_RETURN(uint64_t prod_id, reader.LittleEndian(2, "ISVPRODID"));
  ASSIGN_OR_RETURN(uint64_t svn, reader.LittleEndian(2, "ISVSVN"));
  report.isv_prod_id = static_cast<uint16_t>(prod_id);
  report.isv_svn = static_cast<uint16_t>(svn);
  RETURN_IF_ERROR(reader.Take(60, "reserved").status());
  ASSIGN_OR_RETURN(report.report_data, TakeBytes(reader, 64, "REPORTDATA"));
  return report;
}

// Certification data type 6: QE report, its signature, QE auth data, then nested type 5.
absl::Status ParseQeCertificationData(ByteSpan data, TdxQuote& quote) {
  ByteReader reader(data, "TDX quote QE certification data");
  ASSIGN_OR_RETURN(quote.qe_report, TakeBytes(reader, kSgxReportBodySize, "QE report"));
  ASSIGN_OR_RETURN(quote.qe_report_body, ParseSgxReport(quote.qe_report));
  ASSIGN_OR_RETURN(quote.qe_report_signature,
                   TakeBytes(reader, kEcdsaP256SignatureSize, "QE report signature"));
  ASSIGN_OR_RETURN(uint64_t auth_size, reader.LittleEndian(2, "QE auth data size"));
  ASSIGN_OR_RETURN(quote.qe_auth_data, TakeBytes(reader, auth_size, "QE auth data"));
  ASSIGN_OR_RETURN(uint64_t inner_type, reader.LittleEndian(2, "inner certification data type"));
  if (inner_type != kCertificationDataPckChain) {
    return Invalid(absl::StrCat("inner certification data type ", inner_type,
                                " is not supported (5 = PCK certificate chain)"));
  }
  ASSIGN_OR_RETURN(uint64_t inner_size, reader.LittleEndian(4, "PCK chain size"));
  if (inner_size > kMaxPckChainSize) {
    return Invalid(absl::StrCat("PCK chain of ", inner_size, " bytes is too large"));
  }
  ASSIGN_OR_RETURN(ByteSpan pem, reader.Take(inner_size, "PCK chain"));
  if (reader.remaining() != 0) {
    return Invalid(absl::StrCat(reader.remaining(),
                                " unexpected bytes after the PCK chain in the QE certification "
                                "data"));
  }
  // Quoting libraries store the PEM with a terminating NUL; nothing else may be non-text.
  while (!pem.empty() && pem.back() == 0) pem = pem.first(pem.size() - 1);
  for (uint8_t c : pem) {
    if (c != '\n' && c != '\r' && c != '\t' && (c < 0x20 || c > 0x7E)) {
      return Invalid("the PCK chain is not PEM text");
    }
  }
  quote.pck_chain_pem = ToString(pem);
  return absl::OkStatus();
}

}  // namespace

uint64_t TdReportBody::td_attributes_value() const { return LoadLittleEndian(td_attributes); }

std::string TdxBodyTypeName(uint16_t body_type) {
  switch (body_type) {
    case kTdxBodyType10:
      return "TDX 1.0";
    case kTdxBodyType15:
      return "TDX 1.5";
  }
  return absl::StrCat("type ", body_type);
}

absl::StatusOr<TdxQuote> ParseTdxQuote(ByteSpan bytes) {
  ByteReader reader(bytes, kWhat);
  TdxQuote quote;
  TdxQuoteHeader& header = quote.header;
  ASSIGN_OR_RETURN(uint64_t version, reader.LittleEndian(2, "version"));
  header.version = static_cast<uint16_t>(version);
  if (header.version != 4 && header.version != 5) {
    return Invalid(absl::StrCat("version ", header.version, " is not supported (4 or 5)"));
  }
  ASSIGN_OR_RETURN(uint64_t key_type, reader.LittleEndian(2, "attestation key type"));
  header.attestation_key_type = static_cast<uint16_t>(key_type);
  if (header.attestation_key_type != kAttestationKeyEcdsaP256) {
    return Invalid(absl::StrCat("attestation key type ", header.attestation_key_type,
                                " is not supported (2 = ECDSA P-256)"));
  }
  ASSIGN_OR_RETURN(uint64_t tee_type, reader.LittleEndian(4, "TEE type"));
  header.tee_type = static_cast<uint32_t>(tee_type);
  if (header.tee_type != kTdxTeeType) {
    return Invalid(absl::StrCat("TEE type 0x", absl::Hex(header.tee_type), " is not TDX (0x81)"));
  }
  ASSIGN_OR_RETURN(uint64_t reserved1, reader.LittleEndian(2, "reserved header bytes"));
  ASSIGN_OR_RETURN(uint64_t reserved2, reader.LittleEndian(2, "reserved header bytes"));
  header.reserved1 = static_cast<uint16_t>(reserved1);
  header.reserved2 = static_cast<uint16_t>(reserved2);
  ASSIGN_OR_RETURN(header.qe_vendor_id, TakeBytes(reader, 16, "QE vendor ID"));
  ASSIGN_OR_RETURN(header.user_data, TakeBytes(reader, 20, "user data"));

  if (header.version == 5) {
    ASSIGN_OR_RETURN(uint64_t body_type, reader.LittleEndian(2, "body type"));
    ASSIGN_OR_RETURN(uint64_t body_size, reader.LittleEndian(4, "body size"));
    quote.body_type = static_cast<uint16_t>(body_type);
    size_t expected_size;
    if (quote.body_type == kTdxBodyType10) {
      expected_size = kTdReportBody10Size;
    } else if (quote.body_type == kTdxBodyType15) {
      expected_size = kTdReportBody15Size;
    } else {
      return Invalid(
          absl::StrCat("body type ", body_type, " is not a TD report (2 = TDX 1.0, 3 = TDX 1.5)"));
    }
    if (body_size != expected_size) {
      return Invalid(absl::StrCat("body size ", body_size, " does not match body type ", body_type,
                                  " (", expected_size, " bytes)"));
    }
  }
  ASSIGN_OR_RETURN(quote.body, ParseBody(reader, quote.body_type));
  quote.signed_size = reader.offset();

  ASSIGN_OR_RETURN(uint64_t signature_data_size, reader.LittleEndian(4, "signature data size"));
  quote.signature_data_size = static_cast<uint32_t>(signature_data_size);
  ASSIGN_OR_RETURN(ByteSpan signature_data, reader.Take(signature_data_size, "signature data"));
  quote.trailing_size = reader.remaining();

  ByteReader signed_data(signature_data, "TDX quote signature data");
  ASSIGN_OR_RETURN(quote.signature,
                   TakeBytes(signed_data, kEcdsaP256SignatureSize, "quote signature"));
  ASSIGN_OR_RETURN(quote.attestation_key,
                   TakeBytes(signed_data, kEcdsaP256KeySize, "attestation key"));
  ASSIGN_OR_RETURN(uint64_t cert_type, signed_data.LittleEndian(2, "certification data type"));
  if (cert_type != kCertificationDataQeReport) {
    return Invalid(absl::StrCat("certification data type ", cert_type,
                                " is not supported (6 = QE report certification data)"));
  }
  ASSIGN_OR_RETURN(uint64_t cert_size, signed_data.LittleEndian(4, "certification data size"));
  ASSIGN_OR_RETURN(ByteSpan cert_data, signed_data.Take(cert_size, "certification data"));
  if (signed_data.remaining() != 0) {
    return Invalid(
        absl::StrCat(signed_data.remaining(), " unexpected bytes after the certification data"));
  }
  RETURN_IF_ERROR(ParseQeCertificationData(cert_data, quote));
  return quote;
}

}  // namespace cloister::attest
