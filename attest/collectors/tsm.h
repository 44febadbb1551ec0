// The Linux guest interfaces that produce CVM evidence and keys (shared/specs/
// attestation-formats.md section 10.3):
//   * configfs-tsm (kernel 6.7+): one report entry per request under
//     /sys/kernel/config/tsm/report; REPORT_DATA goes into `inblob`, the report (SEV-SNP) or
//     quote (TDX) comes out of `outblob`, and `auxblob` holds the SNP certificate table.
//     Filesystem access goes through TsmFs so that tests can play the kernel.
//   * /dev/sev-guest ioctls for SEV-SNP: SNP_GET_EXT_REPORT / SNP_GET_REPORT (the fallback on
//     kernels without configfs-tsm) and SNP_GET_DERIVED_KEY (the sealing key).
//   * the SNP certificate table (GUID, offset, length entries) parsed into certificates.
// Thread-safety: the functions keep no state; concurrent GetTsmReport calls use separate
// entries. TsmFs::Real() is stateless and may be shared.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attest/x509.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"

namespace cloister::attest {

inline constexpr std::string_view kDefaultTsmReportRoot = "/sys/kernel/config/tsm/report";
inline constexpr std::string_view kDefaultSevGuestDevice = "/dev/sev-guest";
inline constexpr std::string_view kTsmProviderSevGuest = "sev_guest";
inline constexpr std::string_view kTsmProviderTdxGuest = "tdx_guest";
inline constexpr size_t kTsmMaxInblobSize = 64;
inline constexpr size_t kTsmMaxOutblobSize = 32 * 1024;
inline constexpr size_t kTsmMaxAuxblobSize = 1024 * 1024;
inline constexpr int kTsmMaxAttempts = 3;

// The filesystem operations the configfs-tsm code performs. A real configfs creates the
// attribute files itself on mkdir and produces outblob when it is read.
class TsmFs {
 public:
  virtual ~TsmFs() = default;
  virtual bool IsDirectory(const std::string& path) = 0;
  virtual absl::Status MakeDir(const std::string& path) = 0;
  virtual absl::Status RemoveDir(const std::string& path) = 0;
  // Writes the whole of `data` with one open/write/close.
  virtual absl::Status Write(const std::string& path, ByteSpan data) = 0;
  // Reads the whole file; NotFound when it does not exist, OutOfRange above `max_size`.
  virtual absl::StatusOr<Bytes> Read(const std::string& path, size_t max_size) = 0;

  // The real filesystem (POSIX calls; errors name the path and errno text).
  static TsmFs& Real();
};

struct TsmReportRequest {
  Bytes inblob;                       // REPORT_DATA, at most 64 bytes
  std::optional<uint32_t> privlevel;  // SNP VMPL 0-3; unset leaves the kernel's default
  std::string expected_provider;      // kTsmProviderSevGuest / kTsmProviderTdxGuest; empty: any
};

struct TsmReport {
  std::string provider;
  Bytes outblob;  // SNP: the raw report; TDX: the quote
  Bytes auxblob;  // SNP: the certificate table; empty when the provider gives none
  uint64_t generation = 0;
};

// Makes a uniquely named entry under `root`, writes privlevel and inblob, reads outblob,
// auxblob and provider, and removes the entry again (also on failure). The entry's
// `generation` is read before outblob and after auxblob; when another writer changed the
// entry in between, the whole request is retried, up to kTsmMaxAttempts times (then
// Aborted). FailedPrecondition when `root` is not a directory (no configfs-tsm) or the
// provider differs from the expected one; InvalidArgument for an inblob over 64 bytes or a
// privlevel above 3; the failing path and OS error otherwise.
absl::StatusOr<TsmReport> GetTsmReport(TsmFs& fs, const std::string& root,
                                       const TsmReportRequest& request);

// ---- /dev/sev-guest ----

struct SevGuestReport {
  Bytes report;             // the 1184-byte attestation report
  Bytes certificate_table;  // the host's certificate table; empty when it gave none
};

// Gets an SNP report over `report_data` (64 bytes) at `vmpl` from the sev-guest device with
// SNP_GET_EXT_REPORT, or with SNP_GET_REPORT (no certificates) when the kernel does not know
// the extended request. NotFound / PermissionDenied when the device cannot be opened; an
// error naming the ioctl, errno and the firmware and VMM error codes otherwise.
absl::StatusOr<SevGuestReport> GetSevGuestReport(const std::string& device, ByteSpan report_data,
                                                 uint32_t vmpl = 0);

// GUEST_FIELD_SELECT bits of SNP_GET_DERIVED_KEY: which guest fields the firmware mixes in.
inline constexpr uint64_t kSnpKeyFieldPolicy = uint64_t{1} << 0;
inline constexpr uint64_t kSnpKeyFieldImageId = uint64_t{1} << 1;
inline constexpr uint64_t kSnpKeyFieldFamilyId = uint64_t{1} << 2;
inline constexpr uint64_t kSnpKeyFieldMeasurement = uint64_t{1} << 3;
inline constexpr uint64_t kSnpKeyFieldGuestSvn = uint64_t{1} << 4;
inline constexpr uint64_t kSnpKeyFieldTcbVersion = uint64_t{1} << 5;
inline constexpr size_t kSnpDerivedKeySize = 32;

struct SnpDerivedKeyRequest {
  bool use_vmrk = false;  // root key: false = the chip's VCEK, true = the VM root key
  uint64_t guest_field_select = kSnpKeyFieldMeasurement | kSnpKeyFieldPolicy;
  uint32_t vmpl = 0;  // must not be below the guest's own VMPL
  uint32_t guest_svn = 0;
  uint64_t tcb_version = 0;
};

// The firmware's 32-byte derived key (SNP_GET_DERIVED_KEY). Errors as GetSevGuestReport;
// InvalidArgument for field-select bits outside 0-5.
absl::StatusOr<SecretBytes> GetSnpDerivedKey(const std::string& device,
                                             const SnpDerivedKeyRequest& request);

// Parsers of the firmware responses the ioctls fill, exposed for tests: the report response
// (status, report size, report at 0x20) and the derived-key response (status, key at 0x20).
// FailedPrecondition for a nonzero firmware status; DataLoss for a size that does not fit.
absl::StatusOr<Bytes> ParseSnpReportResponse(ByteSpan response);
absl::StatusOr<SecretBytes> ParseSnpDerivedKeyResponse(ByteSpan response);

// ---- SNP certificate table ----

enum class SnpCertKind { kVcek, kVlek, kAsk, kArk, kOther };

inline constexpr std::string_view kSnpVcekGuid = "63da758d-e664-4564-adc5-f4b93be8accd";
inline constexpr std::string_view kSnpVlekGuid = "a8074bc2-a25a-483e-aae6-39c045a0b8a1";
inline constexpr std::string_view kSnpAskGuid = "4ab7b379-bbac-4fe4-a02f-05aef327c782";
inline constexpr std::string_view kSnpArkGuid = "c0b406a4-a803-4952-9743-3fb6014cd0ae";
inline constexpr size_t kSnpCertTableEntrySize = 24;
inline constexpr size_t kSnpCertTableMaxEntries = 64;

struct SnpCertEntry {
  SnpCertKind kind = SnpCertKind::kOther;
  std::string guid;  // lower-case text form
  Bytes data;        // the entry's bytes as the host gave them
  // Parsed for VCEK, VLEK, ASK and ARK entries (DER, or PEM when the host gave PEM).
  std::optional<Certificate> certificate;
};

// A GUID's 16 bytes in the table's order (the text's bytes in order); InvalidArgument for
// malformed text.
absl::StatusOr<Bytes> SnpGuidBytes(std::string_view guid);

// Parses a certificate table (auxblob, or the SNP_GET_EXT_REPORT buffer): 24-byte entries
// {GUID, offset u32, length u32} (little-endian, offsets from the table start) ended by an
// all-zero entry, then the certificates. An empty table means the host gave none.
// InvalidArgument naming the entry for: no terminator, more than 64 entries, a zero length, an
// offset or length beyond the table, data overlapping the entries or another entry's data, a
// GUID given twice, or a VCEK/VLEK/ASK/ARK that does not parse as a certificate. DER
// certificates may be followed by zero padding inside their entry.
absl::StatusOr<std::vector<SnpCertEntry>> ParseSnpCertTable(ByteSpan table);

// The PEM chain, leaf first, for a report signed with `signing_key` (kSnpSigningKeyVcek or
// kSnpSigningKeyVlek from snp_report.h): VCEK or VLEK, then ASK, then ARK, each when present.
// Empty when the table lacks that leaf (the verifier must then fetch it from AMD's KDS).
std::string SnpCertChainPem(const std::vector<SnpCertEntry>& entries, uint32_t signing_key);

}  // namespace cloister::attest
