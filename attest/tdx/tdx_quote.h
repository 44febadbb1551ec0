// The Intel TDX quote, versions 4 and 5 (shared/specs/attestation-formats.md section 10.2),
// parsed strictly: a 48-byte header, the TD report body (584 bytes for TDX 1.0; a v5 quote
// names its body type and size first: 2 = TDX 1.0, 3 = TDX 1.5 with 648 bytes), the length of
// the signature data, then the signature data: the ECDSA P-256 quote signature (r || s,
// big-endian), the attestation public key (x || y), and certification data of type 6 (the
// QE report, its signature by the PCK key, the QE authentication data) wrapping type 5 (the
// PCK certificate chain as PEM). Every length is bounds-checked and must add up exactly;
// bytes after the signature data are not part of the quote (nothing signs them) and are
// counted, not parsed. This does NOT verify any signature. Thread-safe: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::attest {

inline constexpr size_t kTdxQuoteHeaderSize = 48;
inline constexpr size_t kTdReportBody10Size = 584;  // TDX 1.0
inline constexpr size_t kTdReportBody15Size = 648;  // TDX 1.5
inline constexpr size_t kSgxReportBodySize = 384;   // the QE's report
inline constexpr uint32_t kTdxTeeType = 0x81;
inline constexpr uint16_t kAttestationKeyEcdsaP256 = 2;
inline constexpr uint16_t kTdxBodyType10 = 2;
inline constexpr uint16_t kTdxBodyType15 = 3;
inline constexpr uint16_t kCertificationDataPckChain = 5;
inline constexpr uint16_t kCertificationDataQeReport = 6;
// QE vendor ID of Intel's quoting enclave.
inline constexpr uint8_t kIntelQeVendorId[16] = {0x93, 0x9a, 0x72, 0x33, 0xf7, 0x9c, 0x4c, 0xa9,
                                                 0x94, 0x0a, 0x0d, 0xb3, 0x95, 0x7f, 0x06, 0x07};
// TDATTRIBUTES bits.
inline constexpr uint64_t kTdAttributesDebug = uint64_t{1} << 0;
inline constexpr uint64_t kTdAttributesSeptVeDisable = uint64_t{1} << 28;

struct TdxQuoteHeader {
  uint16_t version = 0;
  uint16_t attestation_key_type = 0;
  uint32_t tee_type = 0;
  // Bytes 8-9 and 10-11: reserved in Intel's v4 layout (go-tdx-guest reads a PCE SVN and a
  // QE SVN there). Not covered by any check; kept for display.
  uint16_t reserved1 = 0;
  uint16_t reserved2 = 0;
  Bytes qe_vendor_id;  // 16
  Bytes user_data;     // 20
};

struct TdReportBody {
  Bytes tee_tcb_svn;          // 16
  Bytes mr_seam;              // 48
  Bytes mr_signer_seam;       // 48
  Bytes seam_attributes;      // 8
  Bytes td_attributes;        // 8
  Bytes xfam;                 // 8
  Bytes mr_td;                // 48
  Bytes mr_config_id;         // 48
  Bytes mr_owner;             // 48
  Bytes mr_owner_config;      // 48
  std::array<Bytes, 4> rtmr;  // 48 each
  Bytes report_data;          // 64
  // TDX 1.5 bodies (v5 body type 3) only.
  std::optional<Bytes> tee_tcb_svn2;   // 16
  std::optional<Bytes> mr_service_td;  // 48

  uint64_t td_attributes_value() const;  // little-endian
  bool debug() const { return (td_attributes_value() & kTdAttributesDebug) != 0; }
};

// The QE's SGX enclave report (384 bytes), signed by the PCK key.
struct SgxReportBody {
  Bytes cpu_svn;  // 16
  uint32_t misc_select = 0;
  Bytes misc_select_raw;  // 4, as stored
  Bytes attributes;       // 16
  Bytes mr_enclave;       // 32
  Bytes mr_signer;        // 32
  uint16_t isv_prod_id = 0;
  uint16_t isv_svn = 0;
  Bytes report_data;  // 64
};

struct TdxQuote {
  TdxQuoteHeader header;
  uint16_t body_type = kTdxBodyType10;  // v4 quotes always carry a TDX 1.0 body
  TdReportBody body;
  // Bytes [0, signed_size) are what the attestation key signed: the header and the body (with
  // a v5 quote's body type and size in between).
  size_t signed_size = 0;
  uint32_t signature_data_size = 0;
  Bytes signature;        // 64: r || s, big-endian
  Bytes attestation_key;  // 64: x || y of the P-256 attestation key
  Bytes qe_report;        // 384 raw bytes, as signed by the PCK key
  SgxReportBody qe_report_body;
  Bytes qe_report_signature;  // 64: r || s
  Bytes qe_auth_data;
  std::string pck_chain_pem;  // PEM, leaf first (trailing NUL bytes removed)
  size_t trailing_size = 0;   // bytes after the signature data, ignored
};

// Parses a v4 or v5 TDX quote. InvalidArgument naming the field and offset for anything
// malformed: a version other than 4 or 5, an attestation key other than ECDSA P-256, a TEE
// type other than TDX, an unknown body type or a body size that does not match it, lengths that
// overrun or leave bytes unaccounted inside the signature data, certification data types other
// than 6 wrapping 5, or a PCK chain that is not printable PEM text.
absl::StatusOr<TdxQuote> ParseTdxQuote(ByteSpan quote);

// "TDX 1.0" or "TDX 1.5".
std::string TdxBodyTypeName(uint16_t body_type);

}  // namespace cloister::attest
