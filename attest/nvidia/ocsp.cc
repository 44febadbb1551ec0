#include "attest/nvidia/ocsp.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ocsp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cloister::attest {
namespace {

struct ResponseDeleter {
  void operator()(OCSP_RESPONSE* p) const { OCSP_RESPONSE_free(p); }
};
struct BasicDeleter {
  void operator()(OCSP_BASICRESP* p) const { OCSP_BASICRESP_free(p); }
};
struct CertIdDeleter {
  void operator()(OCSP_CERTID* p) const { OCSP_CERTID_free(p); }
};
struct StoreDeleter {
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
};
struct StackDeleter {
  void operator()(STACK_OF(X509) * p) const { sk_X509_free(p); }
};
using ResponsePtr = std::unique_ptr<OCSP_RESPONSE, ResponseDeleter>;
using BasicPtr = std::unique_ptr<OCSP_BASICRESP, BasicDeleter>;
using CertIdPtr = std::unique_ptr<OCSP_CERTID, CertIdDeleter>;
using StorePtr = std::unique_ptr<X509_STORE, StoreDeleter>;
using StackPtr = std::unique_ptr<STACK_OF(X509), StackDeleter>;

X509* Native(const Certificate& cert) { return static_cast<X509*>(cert.native()); }

std::string DrainOpenSslErrors() {
  std::vector<std::string> reasons;
  unsigned long err;
  while ((err = ERR_get_error()) != 0) {
    char buffer[256];
    ERR_error_string_n(err, buffer, sizeof(buffer));
    reasons.push_back(buffer);
  }
  return reasons.empty() ? std::string("no detail") : absl::StrJoin(reasons, "; ");
}

absl::Time FromGeneralizedTime(const ASN1_GENERALIZEDTIME* time) {
  struct tm parts = {};
  if (time == nullptr || ASN1_TIME_to_tm(time, &parts) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&parts));
}

std::string Rfc3339(absl::Time time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", time, absl::UTCTimeZone());
}

// The single response about `cert`, matching its CertID with the responder's hash algorithm.
OCSP_SINGLERESP* FindSingle(OCSP_BASICRESP* basic, const Certificate& cert,
                            const Certificate& issuer) {
  for (int i = 0; i < OCSP_resp_count(basic); ++i) {
    OCSP_SINGLERESP* single = OCSP_resp_get0(basic, i);
    const OCSP_CERTID* theirs = OCSP_SINGLERESP_get0_id(single);
    ASN1_OBJECT* hash_oid = nullptr;
    if (OCSP_id_get0_info(nullptr, &hash_oid, nullptr, nullptr, const_cast<OCSP_CERTID*>(theirs)) !=
        1) {
      continue;
    }
    const EVP_MD* md = EVP_get_digestbyobj(hash_oid);
    if (md == nullptr) continue;
    CertIdPtr ours(OCSP_cert_to_id(md, Native(cert), Native(issuer)));
    if (ours != nullptr && OCSP_id_cmp(ours.get(), theirs) == 0) return single;
  }
  return nullptr;
}

}  // namespace

std::string OcspStatusName(OcspStatus status) {
  switch (status) {
    case OcspStatus::kGood:
      return "good";
    case OcspStatus::kRevoked:
      return "revoked";
    case OcspStatus::kUnknown:
      return "unknown";
  }
  return "unknown";
}

absl::StatusOr<OcspCertStatus> CheckOcspResponse(const std::vector<Bytes>& responses,
                                                 const Certificate& cert, const Certificate& issuer,
                                                 const Certificate& trusted_root,
                                                 const std::vector<Certificate>& intermediates,
                                                 absl::Time at) {
  const std::string subject = cert.SubjectCommonName();
  std::vector<std::string> unusable;
  for (size_t n = 0; n < responses.size(); ++n) {
    ERR_clear_error();
    const unsigned char* cursor = responses[n].data();
    ResponsePtr response(
        d2i_OCSP_RESPONSE(nullptr, &cursor, static_cast<long>(responses[n].size())));
    if (response == nullptr || cursor != responses[n].data() + responses[n].size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("OCSP response ", n, " is not a DER OCSPResponse"));
    }
    int response_status = OCSP_response_status(response.get());
    if (response_status != OCSP_RESPONSE_STATUS_SUCCESSFUL) {
      unusable.push_back(absl::StrCat("response ", n, " has status '",
                                      OCSP_response_status_str(response_status), "'"));
      continue;
    }
    BasicPtr basic(OCSP_response_get1_basic(response.get()));
    if (basic == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("OCSP response ", n, " has no basic response"));
    }
    OCSP_SINGLERESP* single = FindSingle(basic.get(), cert, issuer);
    if (single == nullptr) continue;

    // The responder must chain to the pinned root, at the verification time, and be the
    // issuer or a responder the issuer delegated to.
    StorePtr store(X509_STORE_new());
    StackPtr untrusted(sk_X509_new_null());
    if (store == nullptr || untrusted == nullptr ||
        X509_STORE_add_cert(store.get(), Native(trusted_root)) != 1) {
      return absl::InternalError("OCSP: setting up the certificate store failed");
    }
    X509_VERIFY_PARAM_set_time(X509_STORE_get0_param(store.get()), absl::ToTimeT(at));
    sk_X509_push(untrusted.get(), Native(issuer));
    for (const Certificate& intermediate : intermediates) {
      sk_X509_push(untrusted.get(), Native(intermediate));
    }
    if (OCSP_basic_verify(basic.get(), untrusted.get(), store.get(), 0) != 1) {
      return absl::PermissionDeniedError(
          absl::StrCat("the OCSP response for '", subject, "' does not verify to the pinned '",
                       trusted_root.SubjectCommonName(), "': ", DrainOpenSslErrors()));
    }

    int reason = -1;
    ASN1_GENERALIZEDTIME* revoked_at = nullptr;
    ASN1_GENERALIZEDTIME* this_update = nullptr;
    ASN1_GENERALIZEDTIME* next_update = nullptr;
    int status = OCSP_single_get0_status(single, &reason, &revoked_at, &this_update, &next_update);
    OcspCertStatus out;
    out.subject = subject;
    out.this_update = FromGeneralizedTime(this_update);
    if (next_update != nullptr) out.next_update = FromGeneralizedTime(next_update);
    if (out.this_update > at + kOcspClockSkew) {
      return absl::PermissionDeniedError(
          absl::StrCat("the OCSP response for '", subject, "' was produced at ",
                       Rfc3339(out.this_update), ", after the verification time ", Rfc3339(at)));
    }
    if (out.next_update + kOcspClockSkew < at) {
      return absl::PermissionDeniedError(
          absl::StrCat("the OCSP response for '", subject, "' is stale: its nextUpdate ",
                       Rfc3339(out.next_update), " is before the verification time ", Rfc3339(at)));
    }
    switch (status) {
      case V_OCSP_CERTSTATUS_GOOD:
        out.status = OcspStatus::kGood;
        break;
      case V_OCSP_CERTSTATUS_REVOKED:
        out.status = OcspStatus::kRevoked;
        if (reason >= 0) out.revocation_reason = OCSP_crl_reason_str(reason);
        break;
      default:
        out.status = OcspStatus::kUnknown;
    }
    return out;
  }
  std::string why = unusable.empty() ? "" : absl::StrCat(" (", absl::StrJoin(unusable, "; "), ")");
  return absl::NotFoundError(absl::StrCat("no saved OCSP response covers '", subject, "'", why));
}

}  // namespace cloister::attest
