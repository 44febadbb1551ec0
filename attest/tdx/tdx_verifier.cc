#include "attest/tdx/tdx_verifier.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attest/string_view.h"
#include "attest/tdx/intel_root.h"
#include "attest/tdx/tdx_collateral.h"
#include "attest/tdx/tdx_quote.h"
#include "attest/x509.h"
#include "base/status.h"
#include "crypto/ecdsa.h"
#include "crypto/hash.h"

namespace cloister::attest {
namespace {

constexpr size_t kMaxPckChainCount = 4;
constexpr size_t kMeasurementRegisterSize = 48;
constexpr size_t kTdxReportDataSize = 64;
constexpr absl::string_view kPckLeafName = "Intel SGX PCK Certificate";

std::string TimeText(absl::Time time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", time, absl::UTCTimeZone());
}


absl::StatusOr<Certificate> PinnedRoot(const v1::TdxPolicy& policy) {
  const bool built_in = policy.root_pem().empty();
  auto root =
      Certificate::FromPem(built_in ? std::string(BuiltInIntelSgxRootPem()) : policy.root_pem());
  if (!root.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy field 'tdx.root_pem': ", root.status().message()));
  }
  if (!root->IsCa() || root->SubjectCommonName() != root->IssuerCommonName()) {
    return absl::InvalidArgumentError(absl::StrCat("policy field 'tdx.root_pem': '",
                                                   root->SubjectCommonName(),
                                                   "' is not a self-signed CA certificate"));
  }
  return *std::move(root);
}

std::set<std::string> AcceptedStatuses(const v1::TdxPolicy& policy) {
  std::set<std::string> accepted(policy.accepted_tcb_statuses().begin(),
                                 policy.accepted_tcb_statuses().end());
  if (accepted.empty()) accepted.insert("UpToDate");
  return accepted;
}

// Runs certs.revocation; `chain` is the PCK chain as given, leaf first.
void CheckRevocation(Verdict& verdict, const std::string& name, const TdxCollateral& collateral,
                     const std::vector<Certificate>& chain,
                     const std::optional<Certificate>& collateral_signer, const Certificate& root,
                     const v1::TdxPolicy& policy, absl::Time at) {
  if (!collateral.root_ca_crl.has_value() && !collateral.pck_crl.has_value()) {
    if (policy.require_revocation_check()) {
      verdict.Fail(name, "the policy requires the root CA and PCK CRLs, and none was given");
    } else {
      verdict.Skip(name, "no CRL was given; revocation not checked");
    }
    return;
  }
  if (chain.empty()) {
    verdict.Skip(name, "skipped: no PCK chain to check");
    return;
  }
  const Certificate& leaf = chain[0];
  const Certificate* pck_ca = nullptr;
  for (size_t i = 1; i < chain.size(); ++i) {
    if (chain[i].SubjectCommonName() == leaf.IssuerCommonName()) pck_ca = &chain[i];
  }
  std::vector<std::string> done;
  std::vector<std::string> problems;
  if (collateral.root_ca_crl.has_value()) {
    auto crl = Crl::Parse(*collateral.root_ca_crl);
    absl::Status status = crl.ok() ? crl->VerifyIssuedBy(root, at) : crl.status();
    if (!status.ok()) {
      problems.push_back(absl::StrCat("root CA CRL: ", status.message()));
    } else {
      if (pck_ca != nullptr && crl->Revokes(*pck_ca)) {
        problems.push_back(
            absl::StrCat("the root CA CRL revokes '", pck_ca->SubjectCommonName(), "'"));
      }
      if (collateral_signer.has_value() && crl->Revokes(*collateral_signer)) {
        problems.push_back("the root CA CRL revokes the collateral signer");
      }
      done.push_back(absl::StrCat("root CA CRL (", crl->revoked_count(), " entries, next update ",
                                  TimeText(crl->NextUpdate()), ")"));
    }
  } else if (policy.require_revocation_check()) {
    problems.push_back("the policy requires the root CA CRL and it was not given");
  }
  if (collateral.pck_crl.has_value()) {
    auto crl = Crl::Parse(*collateral.pck_crl);
    absl::Status status = crl.status();
    if (crl.ok()) {
      status = pck_ca == nullptr
                   ? absl::PermissionDeniedError("the PCK chain lacks the CA that issued the leaf")
                   : crl->VerifyIssuedBy(*pck_ca, at);
    }
    if (!status.ok()) {
      problems.push_back(absl::StrCat("PCK CRL: ", status.message()));
    } else {
      if (crl->Revokes(leaf)) {
        problems.push_back(absl::StrCat("the PCK CRL revokes the PCK certificate (serial ",
                                        HexEncode(leaf.SerialNumber()), ")"));
      }
      done.push_back(absl::StrCat("PCK CRL of '", crl->IssuerCommonName(), "' (",
                                  crl->revoked_count(), " entries, next update ",
                                  TimeText(crl->NextUpdate()), ")"));
    }
  } else if (policy.require_revocation_check()) {
    problems.push_back("the policy requires the PCK CRL and it was not given");
  }
  if (problems.empty()) {
    verdict.Pass(name, absl::StrCat("nothing revoked: ", absl::StrJoin(done, "; ")));
  } else {
    verdict.Fail(name, absl::StrJoin(problems, "; "));
  }
}

void Conclude(Verdict& verdict, const std::string& prefix,
              const std::vector<std::string>& required) {
  std::vector<std::string> missing;
  for (const std::string& name : required) {
    const Check* check = verdict.Find(absl::StrCat(prefix, name));
    if (check == nullptr || check->result != Check::kPass) missing.push_back(name);
  }
  if (!missing.empty() && verdict.NoFailures()) {
    verdict.Fail(absl::StrCat(prefix, "verdict.required"),
                 absl::StrCat("required checks did not pass: ", absl::StrJoin(missing, ", ")));
  }
  verdict.pass = verdict.NoFailures() && missing.empty();
}

}  // namespace

absl::Status ValidateTdxPolicy(const v1::TdxPolicy& policy) {
  RETURN_IF_ERROR(PinnedRoot(policy).status());
  RETURN_IF_ERROR(DecodeHexAllowList(policy.rtmr0(), kMeasurementRegisterSize, "tdx.rtmr0").status());
  RETURN_IF_ERROR(DecodeHexAllowList(policy.rtmr1(), kMeasurementRegisterSize, "tdx.rtmr1").status());
  RETURN_IF_ERROR(DecodeHexAllowList(policy.rtmr2(), kMeasurementRegisterSize, "tdx.rtmr2").status());
  RETURN_IF_ERROR(DecodeHexAllowList(policy.rtmr3(), kMeasurementRegisterSize, "tdx.rtmr3").status());
  RETURN_IF_ERROR(DecodeHexAllowList(policy.mr_seams(), kMeasurementRegisterSize, "tdx.mr_seams").status());
  for (int i = 0; i < policy.accepted_tcb_statuses_size(); ++i) {
    const std::string& status = policy.accepted_tcb_statuses(i);
    if (std::find(std::begin(kTdxTcbStatuses), std::end(kTdxTcbStatuses), status) ==
        std::end(kTdxTcbStatuses)) {
      std::vector<std::string> known(std::begin(kTdxTcbStatuses), std::end(kTdxTcbStatuses));
      return absl::InvalidArgumentError(absl::StrCat("policy field 'tdx.accepted_tcb_statuses[", i,
                                                     "]': '", status, "' is not a TCB status (",
                                                     absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Verdict> VerifyTdxQuote(const TdxInput& input, const Policy& policy, absl::Time at,
                                       std::string_view check_prefix) {
  const v1::TdxPolicy& tdx = policy.tdx();
  RETURN_IF_ERROR(ValidateTdxPolicy(tdx));
  ASSIGN_OR_RETURN(Certificate root, PinnedRoot(tdx));
  ASSIGN_OR_RETURN(std::vector<Bytes> rtmr0, DecodeHexAllowList(tdx.rtmr0(), kMeasurementRegisterSize, "tdx.rtmr0"));
  ASSIGN_OR_RETURN(std::vector<Bytes> rtmr1, DecodeHexAllowList(tdx.rtmr1(), kMeasurementRegisterSize, "tdx.rtmr1"));
  ASSIGN_OR_RETURN(std::vector<Bytes> rtmr2, DecodeHexAllowList(tdx.rtmr2(), kMeasurementRegisterSize, "tdx.rtmr2"));
  ASSIGN_OR_RETURN(std::vector<Bytes> rtmr3, DecodeHexAllowList(tdx.rtmr3(), kMeasurementRegisterSize, "tdx.rtmr3"));
  ASSIGN_OR_RETURN(std::vector<Bytes> mr_seams, DecodeHexAllowList(tdx.mr_seams(), kMeasurementRegisterSize, "tdx.mr_seams"));
  if (input.expected_report_data.has_value() &&
      input.expected_report_data->size() != kTdxReportDataSize) {
    return absl::InvalidArgumentError(absl::StrCat("the expected REPORTDATA is ",
                                                   input.expected_report_data->size(),
                                                   " bytes, expected ", kTdxReportDataSize));
  }
  const std::set<std::string> accepted_statuses = AcceptedStatuses(tdx);

  const std::string prefix(check_prefix);
  auto name = [&](absl::string_view check) { return absl::StrCat(prefix, check); };
  Verdict verdict;
  std::vector<std::string> required = {"report.parse", "certs.chain", "report.signature", "policy",
                                       "measurement"};
  if (tdx.require_collateral()) {
    required.push_back("tcb");
    required.push_back("qe.identity");
  }
  if (tdx.require_revocation_check()) required.push_back("certs.revocation");

  // report.parse
  auto quote = ParseTdxQuote(input.quote);
  if (quote.ok() && !ConstantTimeEquals(quote->header.qe_vendor_id, ByteSpan(kIntelQeVendorId))) {
    quote = absl::InvalidArgumentError(absl::StrCat("TDX quote: QE vendor ID ",
                                                    HexEncode(quote->header.qe_vendor_id),
                                                    " is not Intel's quoting enclave"));
  }
  if (quote.ok()) {
    std::string detail =
        absl::StrCat("TDX quote v", quote->header.version, ", ", TdxBodyTypeName(quote->body_type),
                     " TD report, ", input.quote.size(), " bytes");
    if (quote->trailing_size > 0) {
      absl::StrAppend(&detail, " (", quote->trailing_size,
                      " bytes after the signature data ignored: not part of the quote)");
    }
    verdict.Pass(name("report.parse"), detail);
  } else {
    verdict.Fail(name("report.parse"), std::string(quote.status().message()));
  }

  // certs.chain
  std::vector<Certificate> chain;
  std::optional<Certificate> leaf;
  if (!quote.ok()) {
    verdict.Skip(name("certs.chain"), "skipped: the quote did not parse");
  } else {
    absl::Status status;
    auto parsed = ParsePemChain(quote->pck_chain_pem, kMaxPckChainCount);
    if (!parsed.ok()) {
      status = absl::InvalidArgumentError(
          absl::StrCat("the quote's PCK chain: ", parsed.status().message()));
    } else {
      chain = *std::move(parsed);
      if (chain[0].SubjectCommonName() != kPckLeafName) {
        status = absl::PermissionDeniedError(absl::StrCat("the chain's first certificate is '",
                                                          chain[0].SubjectCommonName(),
                                                          "', expected '", kPckLeafName, "'"));
      } else if (auto curve = chain[0].KeyCurve();
                 !curve.ok() || *curve != crypto::EcCurve::kP256) {
        status = absl::PermissionDeniedError("the PCK certificate does not hold a P-256 key");
      } else {
        leaf = chain[0];
        status = VerifyChain(chain, root, at);
      }
    }
    if (status.ok()) {
      verdict.Pass(name("certs.chain"),
                   absl::StrCat(kPckLeafName, " <- ", leaf->IssuerCommonName(), " <- pinned '",
                                root.SubjectCommonName(), "', valid at ", TimeText(at)));
    } else {
      verdict.Fail(name("certs.chain"), std::string(status.message()));
    }
  }

  // The collateral signer is needed by certs.revocation (the root CRL covers it); verify the
  // collateral first and report it in tcb and qe.identity below.
  const TdxCollateral& collateral = input.collateral;
  std::optional<Certificate> collateral_signer;
  absl::Status tcb_info_status = absl::OkStatus();
  absl::Status qe_identity_status = absl::OkStatus();
  std::optional<TdxTcbInfo> tcb_info;
  std::optional<QeIdentity> qe_identity;
  if (collateral.tcb_info.has_value()) {
    auto signed_json = SplitSignedJson(*collateral.tcb_info, "tcbInfo");
    auto signer = signed_json.ok() ? VerifyCollateralSignature(
                                         *signed_json, collateral.signing_chain_pem, root, at)
                                   : absl::StatusOr<Certificate>(signed_json.status());
    auto parsed = signer.ok() ? ParseTdxTcbInfo(signed_json->signed_text)
                              : absl::StatusOr<TdxTcbInfo>(signer.status());
    if (signer.ok()) collateral_signer = *signer;
    if (parsed.ok() && (at < parsed->issue_date || at > parsed->next_update)) {
      parsed = absl::PermissionDeniedError(
          absl::StrCat("the TCB info is valid from ", TimeText(parsed->issue_date), " to ",
                       TimeText(parsed->next_update), ", not at ", TimeText(at)));
    }
    if (parsed.ok()) {
      tcb_info = *std::move(parsed);
    } else {
      tcb_info_status = parsed.status();
    }
  }
  if (collateral.qe_identity.has_value()) {
    auto signed_json = SplitSignedJson(*collateral.qe_identity, "enclaveIdentity");
    auto signer = signed_json.ok() ? VerifyCollateralSignature(
                                         *signed_json, collateral.signing_chain_pem, root, at)
                                   : absl::StatusOr<Certificate>(signed_json.status());
    auto parsed = signer.ok() ? ParseQeIdentity(signed_json->signed_text)
                              : absl::StatusOr<QeIdentity>(signer.status());
    if (signer.ok()) collateral_signer = *signer;
    if (parsed.ok() && (at < parsed->issue_date || at > parsed->next_update)) {
      parsed = absl::PermissionDeniedError(
          absl::StrCat("the QE identity is valid from ", TimeText(parsed->issue_date), " to ",
                       TimeText(parsed->next_update), ", not at ", TimeText(at)));
    }
    if (parsed.ok()) {
      qe_identity = *std::move(parsed);
    } else {
      qe_identity_status = parsed.status();
    }
  }

  // certs.revocation
  if (!quote.ok()) {
    verdict.Skip(name("certs.revocation"), "skipped: the quote did not parse");
  } else {
    CheckRevocation(verdict, name("certs.revocation"), collateral, chain, collateral_signer, root,
                    tdx, at);
  }

  if (!quote.ok()) {
    for (absl::string_view check :
         {"report.signature", "tcb", "qe.identity", "policy", "measurement", "report_data"}) {
      verdict.Skip(name(check), "skipped: the quote did not parse");
    }
    Conclude(verdict, prefix, required);
    return verdict;
  }

  // report.signature: the quote, the QE report, and the binding of the attestation key.
  bool authenticated = false;
  {
    std::vector<std::string> problems;
    Bytes key_point = {0x04};
    Append(key_point, quote->attestation_key);
    absl::Status quote_signature =
        crypto::EcdsaVerifyP1363(crypto::EcCurve::kP256, crypto::HashAlg::kSha256, key_point,
                                 ByteSpan(input.quote).first(quote->signed_size), quote->signature);
    if (!quote_signature.ok()) {
      problems.push_back(
          absl::StrCat("the quote signature does not verify with the attestation key: ",
                       quote_signature.message()));
    }
    if (!leaf.has_value()) {
      problems.push_back(
          "the QE report signature cannot be checked without a usable PCK "
          "certificate");
    } else if (absl::Status qe = VerifyP1363WithCertificate(
                   *leaf, crypto::HashAlg::kSha256, quote->qe_report, quote->qe_report_signature);
               !qe.ok()) {
      problems.push_back(
          absl::StrCat("the QE report signature does not verify with the PCK key: ", qe.message()));
    }
    Bytes bound = quote->attestation_key;
    Append(bound, quote->qe_auth_data);
    Bytes expected = crypto::Sha256(bound);
    expected.resize(64, 0);
    if (!ConstantTimeEquals(expected, quote->qe_report_body.report_data)) {
      problems.push_back(
          "the QE report does not bind the attestation key (REPORTDATA != SHA-256(attestation "
          "key || QE auth data) || zeros)");
    }
    if (problems.empty()) {
      authenticated = true;
      verdict.Pass(name("report.signature"),
                   "quote signed by the attestation key (ECDSA P-256/SHA-256), which the QE "
                   "report binds; QE report signed by the PCK key");
    } else {
      verdict.Fail(name("report.signature"), absl::StrJoin(problems, "; "));
    }
  }

  // tcb
  std::optional<PckExtensions> pck;
  absl::Status pck_status = absl::OkStatus();
  if (leaf.has_value()) {
    auto read = ReadPckExtensions(*leaf);
    if (read.ok()) {
      pck = *read;
    } else {
      pck_status = read.status();
    }
  }
  std::optional<TdxTcbResult> tcb_result;
  if (!collateral.tcb_info.has_value()) {
    if (tdx.require_collateral()) {
      verdict.Fail(name("tcb"), "the policy requires TCB info collateral and none was given");
    } else {
      verdict.Skip(name("tcb"),
                   "no TCB info collateral was given; the platform TCB is not "
                   "evaluated");
    }
  } else if (!tcb_info_status.ok()) {
    verdict.Fail(name("tcb"), std::string(tcb_info_status.message()));
  } else if (!pck.has_value()) {
    verdict.Fail(name("tcb"),
                 leaf.has_value()
                     ? absl::StrCat("the PCK certificate's SGX extension: ", pck_status.message())
                     : std::string("no usable PCK certificate to read the platform TCB from"));
  } else {
    auto result = EvaluateTdxTcb(*tcb_info, *pck, quote->body);
    if (!result.ok()) {
      verdict.Fail(name("tcb"), std::string(result.status().message()));
    } else {
      tcb_result = *result;
      std::vector<std::string> statuses = {result->status};
      if (!result->module_status.empty()) statuses.push_back(result->module_status);
      std::vector<std::string> refused;
      for (const std::string& status : statuses) {
        if (!accepted_statuses.count(status)) refused.push_back(status);
      }
      std::string detail = absl::StrCat(
          "TCB level ", result->status, " (", result->tcb_date, ")",
          result->module_status.empty()
              ? ""
              : absl::StrCat(", module ", result->module_id, " ", result->module_status),
          " for FMSPC ", HexEncode(pck->fmspc), ", TCB evaluation data number ",
          tcb_info->tcb_evaluation_data_number,
          result->advisory_ids.empty()
              ? ""
              : absl::StrCat(", advisories ", absl::StrJoin(result->advisory_ids, ",")));
      if (refused.empty()) {
        verdict.Pass(name("tcb"), detail);
      } else {
        verdict.Fail(name("tcb"), absl::StrCat(detail, ": ", absl::StrJoin(refused, ", "),
                                               " is not accepted by the policy"));
      }
    }
  }

  // qe.identity
  std::optional<std::string> qe_status;
  if (!collateral.qe_identity.has_value()) {
    if (tdx.require_collateral()) {
      verdict.Fail(name("qe.identity"),
                   "the policy requires QE identity collateral and none was given");
    } else {
      verdict.Skip(name("qe.identity"), "no QE identity collateral was given");
    }
  } else if (!qe_identity_status.ok()) {
    verdict.Fail(name("qe.identity"), std::string(qe_identity_status.message()));
  } else {
    auto status = EvaluateQeIdentity(*qe_identity, quote->qe_report_body);
    if (!status.ok()) {
      verdict.Fail(name("qe.identity"), std::string(status.status().message()));
    } else {
      qe_status = *status;
      std::string detail = absl::StrCat("Intel TD quoting enclave, ISVSVN ",
                                        quote->qe_report_body.isv_svn, ": ", *status);
      if (accepted_statuses.count(*status)) {
        verdict.Pass(name("qe.identity"), detail);
      } else {
        verdict.Fail(name("qe.identity"), absl::StrCat(detail, " is not accepted by the policy"));
      }
    }
  }

  const TdReportBody& body = quote->body;
  // policy
  if (body.debug() && !policy.allow_debug()) {
    verdict.Fail(name("policy"),
                 "the TD allows debugging (TDATTRIBUTES.DEBUG) and the policy does not");
  } else {
    verdict.Pass(name("policy"),
                 absl::StrCat("TDATTRIBUTES ", HexEncode(body.td_attributes), ": debug ",
                              body.debug() ? "on (allowed by the policy)" : "off"));
  }

  // measurement
  {
    std::vector<std::string> problems;
    const std::string mr_td = HexEncode(body.mr_td);
    bool known = false;
    for (const std::string& accepted : policy.enclave_measurements()) {
      known = known || absl::AsciiStrToLower(accepted) == mr_td;
    }
    if (policy.enclave_measurements().empty()) {
      problems.push_back(absl::StrCat("MRTD ", mr_td,
                                      " cannot be accepted: the policy lists no enclave "
                                      "measurements"));
    } else if (!known) {
      problems.push_back(absl::StrCat("MRTD ", mr_td, " is not among the policy's ",
                                      policy.enclave_measurements_size(),
                                      " accepted measurements"));
    }
    const std::vector<Bytes>* rtmr_lists[4] = {&rtmr0, &rtmr1, &rtmr2, &rtmr3};
    std::vector<std::string> checked = {"MRTD"};
    for (int i = 0; i < 4; ++i) {
      if (rtmr_lists[i]->empty()) continue;
      checked.push_back(absl::StrCat("RTMR", i));
      if (!AllowListContains(*rtmr_lists[i], body.rtmr[i])) {
        problems.push_back(absl::StrCat("RTMR", i, " ", HexEncode(body.rtmr[i]),
                                        " is not among the policy's ", rtmr_lists[i]->size(),
                                        " accepted values"));
      }
    }
    if (!mr_seams.empty()) {
      checked.push_back("MRSEAM");
      if (!AllowListContains(mr_seams, body.mr_seam)) {
        problems.push_back(absl::StrCat("MRSEAM ", HexEncode(body.mr_seam),
                                        " is not among the policy's ", mr_seams.size(),
                                        " accepted TDX modules"));
      }
    }
    if (problems.empty()) {
      verdict.Pass(name("measurement"), absl::StrCat(absl::StrJoin(checked, ", "),
                                                     " accepted by the policy (MRTD ", mr_td, ")"));
    } else {
      verdict.Fail(name("measurement"), absl::StrJoin(problems, "; "));
    }
  }

  // report_data
  if (!input.expected_report_data.has_value()) {
    verdict.Skip(name("report_data"), "no expected REPORTDATA was given");
  } else if (ConstantTimeEquals(*input.expected_report_data, body.report_data)) {
    verdict.Pass(name("report_data"), "REPORTDATA equals the expected value");
  } else {
    verdict.Fail(name("report_data"), absl::StrCat("REPORTDATA ", HexEncode(body.report_data),
                                                   " differs from the expected ",
                                                   HexEncode(*input.expected_report_data)));
  }

  if (authenticated) {
    auto& claims = verdict.claims;
    claims[name("quote_version")] = absl::StrCat(quote->header.version);
    claims[name("tdx_version")] = TdxBodyTypeName(quote->body_type);
    claims[name("mr_td")] = HexEncode(body.mr_td);
    claims[name("measurement")] = HexEncode(body.mr_td);
    for (int i = 0; i < 4; ++i) claims[name(absl::StrCat("rtmr", i))] = HexEncode(body.rtmr[i]);
    claims[name("mr_seam")] = HexEncode(body.mr_seam);
    claims[name("mr_signer_seam")] = HexEncode(body.mr_signer_seam);
    claims[name("tee_tcb_svn")] = HexEncode(body.tee_tcb_svn);
    claims[name("seam_attributes")] = HexEncode(body.seam_attributes);
    claims[name("td_attributes")] = HexEncode(body.td_attributes);
    claims[name("td_attributes.debug")] = body.debug() ? "true" : "false";
    claims[name("td_attributes.sept_ve_disable")] =
        (body.td_attributes_value() & kTdAttributesSeptVeDisable) ? "true" : "false";
    claims[name("xfam")] = HexEncode(body.xfam);
    claims[name("mr_config_id")] = HexEncode(body.mr_config_id);
    claims[name("mr_owner")] = HexEncode(body.mr_owner);
    claims[name("mr_owner_config")] = HexEncode(body.mr_owner_config);
    claims[name("report_data")] = HexEncode(body.report_data);
    if (body.tee_tcb_svn2.has_value()) claims[name("tee_tcb_svn2")] = HexEncode(*body.tee_tcb_svn2);
    if (body.mr_service_td.has_value()) {
      claims[name("mr_service_td")] = HexEncode(*body.mr_service_td);
    }
    claims[name("qe.mr_enclave")] = HexEncode(quote->qe_report_body.mr_enclave);
    claims[name("qe.mr_signer")] = HexEncode(quote->qe_report_body.mr_signer);
    claims[name("qe.isv_prod_id")] = absl::StrCat(quote->qe_report_body.isv_prod_id);
    claims[name("qe.isv_svn")] = absl::StrCat(quote->qe_report_body.isv_svn);
    if (pck.has_value()) {
      claims[name("pck.fmspc")] = HexEncode(pck->fmspc);
      claims[name("pck.pce_svn")] = absl::StrCat(pck->pce_svn);
    }
    if (tcb_result.has_value()) {
      claims[name("tcb.status")] = tcb_result->status;
      if (!tcb_result->module_status.empty()) {
        claims[name("tcb.module_status")] = tcb_result->module_status;
      }
    }
    if (qe_status.has_value()) claims[name("qe.tcb_status")] = *qe_status;
  }

  Conclude(verdict, prefix, required);
  return verdict;
}

Verdict TdxCvmVerifier::Verify(const EvidenceBundle& bundle, ByteSpan expected_nonce,
                               const Policy& policy, absl::Time at) const {
  TdxInput input;
  input.quote = ToBytes(bundle.cvm_report());
  auto verdict = VerifyTdxQuote(input, policy, at, "cvm.");
  if (!verdict.ok()) {
    Verdict refused;
    refused.Fail("cvm.policy", std::string(verdict.status().message()));
    return refused;
  }
  // VerifyBundle checks REPORTDATA against the binding itself (check cvm.report_data).
  std::erase_if(verdict->checks,
                [](const Check& check) { return check.name == "cvm.report_data"; });
  verdict->pass = verdict->NoFailures();
  return *std::move(verdict);
}

}  // namespace cloister::attest
