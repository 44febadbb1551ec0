// The /dev/sev-guest ioctl ABI (Linux uapi linux/sev-guest.h; shared/specs/
// attestation-formats.md section 10.3), declared here with the kernel's layouts so the code
// does not depend on the build machine's kernel headers; tsm_test.cc checks these against
// <linux/sev-guest.h> where that header exists. Internal to attest/collectors/.
// Thread-safety: declarations only.
#pragma once

#include <sys/ioctl.h>

#include <cstddef>
#include <cstdint>

namespace cloister::attest::sev_guest_abi {

// struct snp_guest_request_ioctl.
struct GuestRequest {
  uint8_t msg_version;  // 1
  uint64_t req_data;    // user address of the request
  uint64_t resp_data;   // user address of the response
  uint64_t exitinfo2;   // bits 0-31 firmware error, bits 32-63 VMM error
};

// struct snp_report_req.
struct ReportRequest {
  uint8_t user_data[64];  // REPORT_DATA
  uint32_t vmpl;
  uint8_t reserved[28];
};

// struct snp_ext_report_req.
struct ExtReportRequest {
  ReportRequest data;
  uint64_t certs_address;  // page-aligned buffer for the certificate table
  uint32_t certs_len;      // a multiple of the page size
};

// struct snp_derived_key_req (the firmware's MSG_KEY_REQ).
struct DerivedKeyRequest {
  uint32_t root_key_select;  // bit 0: 0 VCEK, 1 VMRK
  uint32_t reserved;
  uint64_t guest_field_select;
  uint32_t vmpl;
  uint32_t guest_svn;
  uint64_t tcb_version;
};

inline constexpr size_t kReportResponseSize = 4000;    // struct snp_report_resp
inline constexpr size_t kDerivedKeyResponseSize = 64;  // struct snp_derived_key_resp
// Offsets inside the firmware responses (MSG_REPORT_RSP, MSG_KEY_RSP).
inline constexpr size_t kResponseStatusOffset = 0;
inline constexpr size_t kReportSizeOffset = 4;
inline constexpr size_t kReportOffset = 0x20;
inline constexpr size_t kDerivedKeyOffset = 0x20;
inline constexpr size_t kDerivedKeySize = 32;

inline constexpr uint32_t kMessageVersion = 1;
inline constexpr uint32_t kVmmErrorInvalidLength = 1;  // certificate buffer too small
inline constexpr uint32_t kVmmErrorBusy = 2;
inline constexpr size_t kPageSize = 4096;
// SEV_FW_BLOB_MAX_SIZE: the largest certificate buffer the kernel accepts.
inline constexpr size_t kMaxCertsSize = 0x4000;

inline constexpr unsigned long kGetReport = _IOWR('S', 0x0, GuestRequest);
inline constexpr unsigned long kGetDerivedKey = _IOWR('S', 0x1, GuestRequest);
inline constexpr unsigned long kGetExtReport = _IOWR('S', 0x2, GuestRequest);

static_assert(sizeof(GuestRequest) == 32);
static_assert(sizeof(ReportRequest) == 96);
static_assert(offsetof(ExtReportRequest, certs_address) == 96);
static_assert(sizeof(ExtReportRequest) == 112);
static_assert(sizeof(DerivedKeyRequest) == 32);

}  // namespace cloister::attest::sev_guest_abi
