// Intel's collateral for TDX quotes, as the Provisioning Certification Service (PCS v4)
// serves it, and the PCK certificate's SGX extensions that it is evaluated against:
//   - TCB info (/tdx/certification/v4/tcb): the TCB levels for one FMSPC, each a set of
//     minimum SVNs with a status (UpToDate, OutOfDate, ...), signed by "Intel SGX TCB Signing";
//   - QE identity (/tdx/certification/v4/qe/identity): the quoting enclave's MRSIGNER,
//     ISVPRODID, attributes and TCB levels by ISVSVN, signed by the same key;
//   - CRLs (DER or PEM): the Intel SGX Root CA's CRL and the PCK CA's CRL.
// A signed document is verified over the exact bytes of its "tcbInfo" / "enclaveIdentity"
// member in the response body, and the fields evaluated are read from those signed bytes.
// JSON parsing never throws out of this file. Time is always a parameter.
// Thread-safe: values are immutable after parsing; functions hold no state.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attest/tdx/tdx_quote.h"
#include "attest/x509.h"
#include "base/bytes.h"

namespace cloister::attest {

// --- The PCK certificate's SGX extensions (OID 1.2.840.113741.1.13.1) ---

struct PckExtensions {
  Bytes ppid;                                  // 16
  std::array<uint8_t, 16> sgx_tcb_components;  // CPUSVN components 1..16
  uint16_t pce_svn = 0;
  Bytes cpu_svn;  // 16
  Bytes pce_id;   // 2
  Bytes fmspc;    // 6
};
// InvalidArgument when the extension is missing or malformed.
absl::StatusOr<PckExtensions> ReadPckExtensions(const Certificate& pck_leaf);

// --- Signed JSON collateral ---

struct TdxTcbLevel {
  std::array<uint8_t, 16> sgx_components{};
  uint16_t pce_svn = 0;
  std::array<uint8_t, 16> tdx_components{};
  std::string status;  // "UpToDate", "OutOfDate", ...
  std::string tcb_date;
  std::vector<std::string> advisory_ids;
};

struct TdxModuleLevel {
  uint8_t isv_svn = 0;
  std::string status;
};

// The TDX module's identity: tdxModule (TDX 1.0) or one of tdxModuleIdentities (TDX 1.5,
// "TDX_<major version in hex>").
struct TdxModuleIdentity {
  std::string id;
  Bytes mr_signer;                     // 48
  Bytes attributes;                    // 8
  Bytes attributes_mask;               // 8
  std::vector<TdxModuleLevel> levels;  // empty for tdxModule
};

struct TdxTcbInfo {
  std::string id;  // "TDX"
  int version = 0;
  absl::Time issue_date;
  absl::Time next_update;
  Bytes fmspc;   // 6
  Bytes pce_id;  // 2
  int tcb_evaluation_data_number = 0;
  TdxModuleIdentity tdx_module;
  std::vector<TdxModuleIdentity> module_identities;
  std::vector<TdxTcbLevel> levels;  // in the document's order, newest first
};

struct QeIdentity {
  std::string id;  // "TD_QE"
  int version = 0;
  absl::Time issue_date;
  absl::Time next_update;
  Bytes misc_select;       // 4, as stored in the report
  Bytes misc_select_mask;  // 4
  Bytes attributes;        // 16
  Bytes attributes_mask;   // 16
  Bytes mr_signer;         // 32
  uint16_t isv_prod_id = 0;
  std::vector<TdxModuleLevel> levels;  // isvsvn -> status, newest first
};

// A PCS response body split into the signed member's exact text and the signature.
struct SignedJson {
  std::string signed_text;  // e.g. the "tcbInfo" object, byte for byte
  Bytes signature;          // 64: r || s (ECDSA P-256/SHA-256)
};
// `member` is "tcbInfo" or "enclaveIdentity". InvalidArgument for invalid JSON, a missing or
// repeated member, or a signature that is not 128 hex digits.
absl::StatusOr<SignedJson> SplitSignedJson(std::string_view body, std::string_view member);

// Parse the signed member text (SignedJson::signed_text). InvalidArgument naming the field.
absl::StatusOr<TdxTcbInfo> ParseTdxTcbInfo(std::string_view tcb_info_text);
absl::StatusOr<QeIdentity> ParseQeIdentity(std::string_view identity_text);

// Verifies `signed_json` with the first certificate of `signer_chain_pem` ("Intel SGX TCB
// Signing", followed by the root), which must chain to `root` at `at`. PermissionDenied
// saying what failed; returns the signing certificate.
absl::StatusOr<Certificate> VerifyCollateralSignature(const SignedJson& signed_json,
                                                      std::string_view signer_chain_pem,
                                                      const Certificate& root, absl::Time at);

// The outcome of matching a quote against TCB info.
struct TdxTcbResult {
  std::string status;  // the platform's TCB level status
  std::string tcb_date;
  std::vector<std::string> advisory_ids;
  std::string module_id;      // "TDX_03" for a TDX 1.5 module identity, else ""
  std::string module_status;  // the module identity's level status, or "" when none applies
};
// Intel's matching: FMSPC and PCE ID equal the PCK's; the TDX module (MRSIGNERSEAM and
// SEAMATTRIBUTES under the mask) matches tdxModule, or for TEE_TCB_SVN[1] > 0 the module
// identity TDX_<TEE_TCB_SVN[1]> with its ISVSVN level from TEE_TCB_SVN[0]; the first TCB level
// whose SGX components and PCESVN are at most the PCK's and whose TDX components are at most
// TEE_TCB_SVN (from index 2 when TEE_TCB_SVN[1] > 0) gives the status. PermissionDenied
// naming the mismatch, or "no TCB level matches" when the platform is below every level.
absl::StatusOr<TdxTcbResult> EvaluateTdxTcb(const TdxTcbInfo& info, const PckExtensions& pck,
                                            const TdReportBody& body);

// Matches the QE report against the QE identity: MISCSELECT and ATTRIBUTES under their masks,
// MRSIGNER, ISVPRODID; returns the status of the first level whose ISVSVN is at most the
// report's. PermissionDenied naming the mismatch.
absl::StatusOr<std::string> EvaluateQeIdentity(const QeIdentity& identity,
                                               const SgxReportBody& qe_report);

// --- CRLs ---

// An X.509 CRL. Move-only; immutable after parsing.
class Crl {
 public:
  // One CRL, DER or PEM ("-----BEGIN X509 CRL-----"). InvalidArgument otherwise.
  static absl::StatusOr<Crl> Parse(ByteSpan der_or_pem);
  Crl(Crl&& other) noexcept;
  Crl& operator=(Crl&& other) noexcept;
  Crl(const Crl&) = delete;
  Crl& operator=(const Crl&) = delete;
  ~Crl();

  std::string IssuerCommonName() const;
  absl::Time ThisUpdate() const;
  absl::Time NextUpdate() const;  // InfiniteFuture when absent
  size_t revoked_count() const;
  // OK when `issuer`'s subject is this CRL's issuer, its key signed the CRL, and `at` lies in
  // [thisUpdate, nextUpdate]. PermissionDenied saying which failed.
  absl::Status VerifyIssuedBy(const Certificate& issuer, absl::Time at) const;
  // True when the CRL lists `cert`'s serial number.
  bool Revokes(const Certificate& cert) const;

 private:
  explicit Crl(void* crl) : crl_(crl) {}
  void* crl_;  // X509_CRL*, never null except after a move
};

}  // namespace cloister::attest
