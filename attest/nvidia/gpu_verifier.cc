#include "attest/nvidia/gpu_verifier.h"

#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "attest/nvidia/measurements.h"
#include "attest/nvidia/ocsp.h"
#include "attest/nvidia/rim.h"
#include "attest/string_view.h"
#include "base/status.h"

namespace cloister::attest {
namespace {

constexpr size_t kExpectedNonceSize = 32;
constexpr uint8_t kProtectedPcieOn = 0xAA;

std::string Rfc3339(absl::Time time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", time, absl::UTCTimeZone());
}

bool IsSelfSigned(const Certificate& cert) {
  X509* x509 = static_cast<X509*>(cert.native());
  return X509_check_issued(x509, x509) == X509_V_OK;
}

bool AllZero(ByteSpan bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

// ---- a minimal DER reader for the Blackwell TcbInfo extension ----

struct DerElement {
  uint8_t tag = 0;
  ByteSpan contents;
};

// Reads one element (single-byte tag, definite length) from the front of `data`.
absl::StatusOr<DerElement> ReadDer(ByteSpan& data) {
  auto bad = [](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("TcbInfo extension: ", why));
  };
  if (data.size() < 2) return bad("truncated element");
  DerElement element;
  element.tag = data[0];
  if ((element.tag & 0x1F) == 0x1F) return bad("multi-byte tags are not supported");
  size_t length = data[1];
  size_t header = 2;
  if (length & 0x80) {
    size_t count = length & 0x7F;
    if (count == 0 || count > 3 || data.size() < 2 + count) return bad("bad length");
    length = 0;
    for (size_t i = 0; i < count; ++i) length = length << 8 | data[2 + i];
    header += count;
  }
  if (data.size() - header < length) return bad("element longer than its container");
  element.contents = data.subspan(header, length);
  data = data.subspan(header + length);
  return element;
}

// The first digest of TcbInfo's fwids [6]: SEQUENCE { ... [6] IMPLICIT SEQUENCE OF
// SEQUENCE { hashAlg OID, digest OCTET STRING } ... }.
absl::StatusOr<Bytes> TcbInfoFirstFwid(ByteSpan extension) {
  ByteSpan rest = extension;
  ASSIGN_OR_RETURN(DerElement tcb_info, ReadDer(rest));
  if (tcb_info.tag != 0x30 || !rest.empty()) {
    return absl::InvalidArgumentError("TcbInfo extension: not one SEQUENCE");
  }
  ByteSpan fields = tcb_info.contents;
  while (!fields.empty()) {
    ASSIGN_OR_RETURN(DerElement field, ReadDer(fields));
    if (field.tag != 0xA6) continue;
    ByteSpan fwids = field.contents;
    if (fwids.empty()) return absl::InvalidArgumentError("TcbInfo extension: empty fwids");
    ASSIGN_OR_RETURN(DerElement fwid, ReadDer(fwids));
    if (fwid.tag != 0x30) return absl::InvalidArgumentError("TcbInfo extension: bad FWID");
    ByteSpan parts = fwid.contents;
    ASSIGN_OR_RETURN(DerElement hash_alg, ReadDer(parts));
    ASSIGN_OR_RETURN(DerElement digest, ReadDer(parts));
    if (hash_alg.tag != 0x06 || digest.tag != 0x04 || digest.contents.empty()) {
      return absl::InvalidArgumentError("TcbInfo extension: bad FWID hash or digest");
    }
    return Bytes(digest.contents.begin(), digest.contents.end());
  }
  return absl::NotFoundError("TcbInfo extension: no fwids element");
}

// ---- architecture ----

struct ChipInfo {
  std::string chip;  // "GH100", from the BROM certificate's name
  std::string arch;  // "HOPPER", "BLACKWELL"; empty when not a supported GPU
};

ChipInfo ChipFromHwmodel(const std::string& hwmodel) {
  ChipInfo info;
  info.chip = hwmodel.substr(0, hwmodel.find(' '));
  if (info.chip == "GH100") {
    info.arch = "HOPPER";
  } else if (absl::StartsWith(info.chip, "GB1") || absl::StartsWith(info.chip, "GB2")) {
    info.arch = "BLACKWELL";
  }
  return info;
}

// ---- the verification, one check after another ----

class GpuVerification {
 public:
  GpuVerification(const NvidiaGpuInput& input, const NvidiaPolicy& policy,
                  const Certificate& device_root, const Certificate& corim_root, absl::Time at,
                  std::string_view prefix)
      : input_(input),
        policy_(policy),
        device_root_(device_root),
        corim_root_(corim_root),
        at_(at),
        prefix_(prefix) {}

  Verdict Run() {
    report_ = ParseSpdmReport(input_.report);
    chain_ = ParsePemChain(input_.cert_chain_pem, kMaxDeviceChainCount);
    CheckParse();
    CheckSignature();
    CheckChain();
    CheckFwid();
    CheckArch();
    CheckNonce();
    CheckRim(RimKind::kDriver, input_.driver_rim_xml, driver_);
    CheckRim(RimKind::kVbios, input_.vbios_rim_xml, vbios_);
    CheckMeasurements();
    CheckVersions();
    CheckOcsp();
    AddReportClaims();
    Conclude();
    return std::move(verdict_);
  }

 private:
  struct RimState {
    std::optional<Rim> rim;          // parsed content, authenticated or not
    bool authenticated = false;      // the signature check passed
    std::string problem;             // why it cannot be used, for the measurement check
    std::vector<Certificate> chain;  // the verified signer chain
  };

  std::string Name(absl::string_view check) const { return absl::StrCat(prefix_, check); }
  void Pass(absl::string_view check, std::string detail) {
    verdict_.Pass(Name(check), std::move(detail));
  }
  void Fail(absl::string_view check, std::string detail) {
    verdict_.Fail(Name(check), std::move(detail));
  }
  void Skip(absl::string_view check, std::string detail) {
    verdict_.Skip(Name(check), std::move(detail));
  }
  void Claim(absl::string_view key, std::string value) {
    verdict_.claims[Name(key)] = std::move(value);
  }
  const Certificate* Leaf() const { return chain_.ok() ? &(*chain_)[0] : nullptr; }
  std::string ChainProblem() const {
    return absl::StrCat("the device certificate chain does not parse: ", chain_.status().message());
  }

  void CheckParse() {
    if (report_.ok()) {
      Pass("report.parse",
           absl::StrCat("SPDM 1.1 GET_MEASUREMENTS report, ", report_->blocks.size(),
                        " measurement blocks, ", report_->opaque_fields.size(), " opaque fields"));
    } else {
      Fail("report.parse", std::string(report_.status().message()));
    }
  }

  void CheckSignature() {
    if (!report_.ok()) return Skip("report.signature", "skipped: the report did not parse");
    if (Leaf() == nullptr) return Fail("report.signature", ChainProblem());
    absl::StatusOr<crypto::EcCurve> curve = Leaf()->KeyCurve();
    if (!curve.ok() || *curve != crypto::EcCurve::kP384) {
      return Fail("report.signature", absl::StrCat("the leaf '", Leaf()->SubjectCommonName(),
                                                   "' does not hold a P-384 key"));
    }
    absl::Status signature = VerifyP1363WithCertificate(
        *Leaf(), crypto::HashAlg::kSha384, ByteSpan(input_.report).first(report_->signed_size),
        report_->signature);
    if (signature.ok()) {
      Pass("report.signature",
           absl::StrCat("ECDSA P-384/SHA-384 over the first ", report_->signed_size,
                        " bytes verifies with the key of '", Leaf()->SubjectCommonName(), "'"));
    } else {
      Fail("report.signature",
           absl::StrCat("the report signature does not verify with the key of '",
                        Leaf()->SubjectCommonName(), "': ", signature.message()));
    }
  }

  void CheckChain() {
    if (!chain_.ok()) return Fail("certs.chain", ChainProblem());
    const std::vector<Certificate>& chain = *chain_;
    absl::Time expires = device_root_.NotAfter();
    for (const Certificate& cert : chain) {
      if (!IsSelfSigned(cert)) expires = std::min(expires, cert.NotAfter());
    }
    Claim("certs.expires", Rfc3339(expires));
    Claim("ueid", chain[0].SerialDecimal());
    if (chain.size() > 1) {
      Claim("hwmodel", chain[1].SubjectCommonName());
      Claim("brom_serial", HexEncode(chain[1].SerialNumber()));
    }
    absl::Status status = VerifyChain(chain, device_root_, at_);
    if (status.ok()) {
      Pass("certs.chain",
           absl::StrCat("'", chain[0].SubjectCommonName(), "' chains through ", chain.size(),
                        " certificates to the pinned '", device_root_.SubjectCommonName(), "'"));
    } else {
      Fail("certs.chain", std::string(status.message()));
    }
  }

  void CheckFwid() {
    if (!report_.ok()) return Skip("certs.fwid", "skipped: the report did not parse");
    if (Leaf() == nullptr) return Fail("certs.fwid", ChainProblem());
    if (!report_->fwid.has_value()) {
      return Pass("certs.fwid", "the report carries no FWID (older firmware): nothing to match");
    }
    absl::StatusOr<Bytes> leaf_fwid = GpuLeafFwid(*Leaf());
    if (!leaf_fwid.ok()) {
      return Fail("certs.fwid",
                  absl::StrCat("the report has FWID ", HexEncode(*report_->fwid),
                               " but the leaf's cannot be read: ", leaf_fwid.status().message()));
    }
    if (*leaf_fwid != *report_->fwid) {
      return Fail("certs.fwid",
                  absl::StrCat("the report's FWID ", HexEncode(*report_->fwid),
                               " differs from the leaf certificate's ", HexEncode(*leaf_fwid)));
    }
    Pass("certs.fwid", "the report's FWID equals the leaf certificate's");
  }

  void CheckArch() {
    if (!chain_.ok()) return Fail("arch", ChainProblem());
    if (chain_->size() < 2) {
      return Fail("arch", "the device chain has no BROM certificate to name the chip");
    }
    const std::string hwmodel = (*chain_)[1].SubjectCommonName();
    chip_ = ChipFromHwmodel(hwmodel);
    Claim("chip", chip_.chip);
    if (chip_.arch.empty()) {
      return Fail("arch", absl::StrCat("'", hwmodel, "' is not a supported GPU (",
                                       absl::StartsWith(hwmodel, "LS_10")
                                           ? "it is an NVSwitch"
                                           : "expected GH100 Hopper or GB1xx Blackwell",
                                       ")"));
    }
    Claim("arch", chip_.arch);
    if (!input_.arch.empty() && !absl::EqualsIgnoreCase(input_.arch, chip_.arch)) {
      return Fail("arch",
                  absl::StrCat("the collector reported ", input_.arch,
                               " but the device chain is a ", chip_.chip, " (", chip_.arch, ")"));
    }
    Pass("arch", absl::StrCat(chip_.chip, " (", chip_.arch, ")"));
  }

  void CheckNonce() {
    if (!report_.ok()) return Skip("nonce", "skipped: the report did not parse");
    if (!input_.expected_nonce.has_value()) {
      return Skip("nonce", "skipped: no expected nonce was given, so freshness is not checked");
    }
    if (ConstantTimeEquals(report_->requester_nonce, *input_.expected_nonce)) {
      return Pass("nonce", "the report's requester nonce equals the expected nonce");
    }
    Fail("nonce", absl::StrCat("the report's requester nonce ", HexEncode(report_->requester_nonce),
                               " differs from the expected ", HexEncode(*input_.expected_nonce)));
  }

  void CheckRim(RimKind kind, const std::optional<std::string>& xml, RimState& state) {
    const std::string kind_name = RimKindName(kind);
    const std::string signature_check = absl::StrCat("rim.", kind_name, ".signature");
    const std::string identity_check = absl::StrCat("rim.", kind_name, ".identity");
    const std::string claim_prefix = absl::StrCat(kind_name, "_rim.");
    std::string expected_id;
    if (report_.ok()) {
      expected_id = kind == RimKind::kDriver ? NvidiaDriverRimId(*report_, chip_.arch)
                                             : NvidiaVbiosRimId(*report_);
      Claim(claim_prefix + "id", expected_id);
    }
    if (!xml.has_value()) {
      state.problem = absl::StrCat("no ", kind_name, " RIM was supplied");
      Fail(signature_check,
           absl::StrCat(state.problem,
                        expected_id.empty()
                            ? ""
                            : absl::StrCat(" (NVIDIA publishes it as ", expected_id, ")")));
      Skip(identity_check, absl::StrCat("skipped: ", state.problem));
      return;
    }
    absl::StatusOr<Rim> rim = ParseRim(*xml);
    if (!rim.ok()) {
      state.problem = absl::StrCat("the ", kind_name, " RIM does not parse");
      Fail(signature_check, absl::StrCat(state.problem, ": ", rim.status().message()));
      Skip(identity_check, absl::StrCat("skipped: ", state.problem));
      return;
    }
    state.rim = std::move(*rim);
    Claim(claim_prefix + "version", state.rim->colloquial_version);
    if (!state.rim->firmware_manufacturer_id.empty()) {
      Claim(claim_prefix + "oemid", state.rim->firmware_manufacturer_id);
    }
    if (!state.rim->product.empty()) Claim(claim_prefix + "product", state.rim->product);

    absl::StatusOr<RimSignatureInfo> signature =
        VerifyRimSignature(*xml, corim_root_, at_, policy_.allow_expired_rim);
    if (signature.ok()) {
      state.authenticated = true;
      state.chain = signature->chain;
      Claim(claim_prefix + "signer", signature->signer);
      Claim(claim_prefix + "expires", Rfc3339(signature->earliest_expiry));
      std::string detail =
          absl::StrCat("XML signature by '", signature->signer, "' verifies under the pinned '",
                       corim_root_.SubjectCommonName(), "'");
      if (signature->expired_but_allowed) {
        absl::StrAppend(&detail, "; a signing certificate expired on ",
                        Rfc3339(signature->earliest_expiry),
                        ", accepted because the policy allows expired RIM signers");
      }
      Pass(signature_check, std::move(detail));
    } else {
      state.problem = absl::StrCat("the ", kind_name, " RIM is not authenticated (see ", prefix_,
                                   signature_check, ")");
      Fail(signature_check, std::string(signature.status().message()));
    }

    if (!report_.ok()) {
      Skip(identity_check, "skipped: the report did not parse");
      return;
    }
    const std::string& reported =
        kind == RimKind::kDriver ? report_->driver_version : report_->vbios_version;
    if (absl::EqualsIgnoreCase(state.rim->colloquial_version, reported)) {
      Pass(identity_check, absl::StrCat("the RIM is for ", kind_name, " version ", reported,
                                        ", as the report says"));
    } else {
      Fail(identity_check,
           absl::StrCat("the RIM is for ", kind_name, " version '", state.rim->colloquial_version,
                        "' but the report says '", reported, "'"));
    }
  }

  void CheckMeasurements() {
    if (!report_.ok()) return Skip("measurements", "skipped: the report did not parse");
    const Rim* driver = driver_.rim.has_value() ? &*driver_.rim : nullptr;
    const Rim* vbios = vbios_.rim.has_value() ? &*vbios_.rim : nullptr;
    if (driver == nullptr && vbios == nullptr) {
      Claim("measres", "fail");
      return Fail("measurements",
                  absl::StrCat("not compared: ", driver_.problem, " and ", vbios_.problem));
    }
    absl::StatusOr<MeasurementComparison> comparison = CompareMeasurements(*report_, driver, vbios);
    if (!comparison.ok()) {
      Claim("measres", "fail");
      return Fail("measurements", std::string(comparison.status().message()));
    }
    std::vector<std::string> problems;
    for (const RimState* state : {&driver_, &vbios_}) {
      if (!state->problem.empty()) problems.push_back(state->problem);
    }
    if (!comparison->conflicting_indices.empty()) {
      problems.push_back(absl::StrCat("indices active in both the driver and the VBIOS RIM: ",
                                      absl::StrJoin(comparison->conflicting_indices, ", ")));
    }
    if (!comparison->mismatches.empty()) {
      std::vector<std::string> driver_indices;
      std::vector<std::string> vbios_indices;
      for (const MeasurementMismatch& mismatch : comparison->mismatches) {
        (mismatch.source == RimKind::kDriver ? driver_indices : vbios_indices)
            .push_back(absl::StrCat(mismatch.index,
                                    mismatch.runtime.has_value() ? "" : " (block missing)"));
      }
      std::vector<std::string> by_source;
      if (!driver_indices.empty()) {
        by_source.push_back(absl::StrCat("driver ", absl::StrJoin(driver_indices, ", ")));
      }
      if (!vbios_indices.empty()) {
        by_source.push_back(absl::StrCat("vbios ", absl::StrJoin(vbios_indices, ", ")));
      }
      problems.push_back(absl::StrCat("mismatch at indices ", comparison->MismatchedIndexList(),
                                      " (", absl::StrJoin(by_source, "; "),
                                      "; RIM index i is report block i+1)"));
      Claim("mismatched_indices", comparison->MismatchedIndexList());
    }
    if (comparison->golden_count > comparison->runtime_count) {
      problems.push_back(absl::StrCat("the RIMs hold ", comparison->golden_count,
                                      " active measurements but the report only ",
                                      comparison->runtime_count, " blocks"));
    }
    std::string compared = absl::StrCat(
        comparison->matched_indices.size(), " of ",
        comparison->matched_indices.size() + comparison->mismatches.size(),
        " reference measurements match",
        comparison->nvdec_index_skipped ? " (index 35 skipped: NVDEC0 is disabled)" : "");
    if (problems.empty()) {
      Claim("measres", "success");
      return Pass("measurements", compared);
    }
    Claim("measres", "fail");
    Fail("measurements", absl::StrCat(absl::StrJoin(problems, "; "), "; ", compared));
  }

  void CheckVersions() {
    if (!report_.ok()) return Skip("versions", "skipped: the report did not parse");
    auto allowed = [](const std::vector<std::string>& list, const std::string& value) {
      if (list.empty()) return true;
      return std::any_of(list.begin(), list.end(), [&](const std::string& item) {
        return absl::EqualsIgnoreCase(item, value);
      });
    };
    std::vector<std::string> refused;
    if (!allowed(policy_.allowed_driver_versions, report_->driver_version)) {
      refused.push_back(absl::StrCat("driver ", report_->driver_version,
                                     " is not among the allowed ",
                                     absl::StrJoin(policy_.allowed_driver_versions, ", ")));
    }
    if (!allowed(policy_.allowed_vbios_versions, report_->vbios_version)) {
      refused.push_back(absl::StrCat("VBIOS ", report_->vbios_version, " is not among the allowed ",
                                     absl::StrJoin(policy_.allowed_vbios_versions, ", ")));
    }
    if (!refused.empty()) return Fail("versions", absl::StrJoin(refused, "; "));
    Pass("versions",
         absl::StrCat("driver ", report_->driver_version,
                      policy_.allowed_driver_versions.empty() ? " (any allowed)" : " (allowed)",
                      ", VBIOS ", report_->vbios_version,
                      policy_.allowed_vbios_versions.empty() ? " (any allowed)" : " (allowed)"));
  }

  // The certificates whose revocation matters: everything but the leaf and root of the device
  // chain, everything but the root of a RIM chain. Each pairs with its issuer; a self-signed
  // issuer is replaced by the pinned root.
  struct OcspTarget {
    const Certificate* cert;
    const Certificate* issuer;
    const Certificate* root;
    const std::vector<Certificate>* chain;
    std::string what;
  };
  void AddOcspTargets(const std::vector<Certificate>& chain, size_t first, const Certificate& root,
                      absl::string_view what, std::vector<OcspTarget>& out) {
    for (size_t i = first; i < chain.size(); ++i) {
      if (IsSelfSigned(chain[i])) continue;
      const Certificate* issuer =
          i + 1 < chain.size() && !IsSelfSigned(chain[i + 1]) ? &chain[i + 1] : &root;
      out.push_back(OcspTarget{&chain[i], issuer, &root, &chain, std::string(what)});
    }
  }

  void CheckOcsp() {
    if (input_.ocsp_responses.empty()) {
      if (policy_.require_ocsp) {
        return Fail("certs.ocsp",
                    "no OCSP responses were supplied and the policy requires revocation checks");
      }
      return Skip("certs.ocsp", "offline: no OCSP response supplied");
    }
    std::vector<OcspTarget> targets;
    if (chain_.ok()) AddOcspTargets(*chain_, 1, device_root_, "device", targets);
    if (driver_.authenticated) AddOcspTargets(driver_.chain, 0, corim_root_, "driver RIM", targets);
    if (vbios_.authenticated) AddOcspTargets(vbios_.chain, 0, corim_root_, "VBIOS RIM", targets);
    std::vector<std::string> good;
    std::vector<std::string> bad;
    std::vector<std::string> missing;
    for (const OcspTarget& target : targets) {
      const std::string who =
          absl::StrCat(target.what, " '", target.cert->SubjectCommonName(), "'");
      absl::StatusOr<OcspCertStatus> status = CheckOcspResponse(
          input_.ocsp_responses, *target.cert, *target.issuer, *target.root, *target.chain, at_);
      if (absl::IsNotFound(status.status())) {
        missing.push_back(who);
      } else if (!status.ok()) {
        bad.push_back(absl::StrCat(who, ": ", status.status().message()));
      } else if (status->status == OcspStatus::kGood) {
        good.push_back(who);
      } else if (status->status == OcspStatus::kRevoked &&
                 status->revocation_reason == "certificateHold" && policy_.allow_ocsp_cert_hold) {
        good.push_back(absl::StrCat(who, " (on hold, allowed by the policy)"));
      } else {
        bad.push_back(absl::StrCat(who, " is ", OcspStatusName(status->status),
                                   status->revocation_reason.empty()
                                       ? ""
                                       : absl::StrCat(" (", status->revocation_reason, ")")));
      }
    }
    if (!bad.empty()) return Fail("certs.ocsp", absl::StrJoin(bad, "; "));
    if (!missing.empty()) {
      std::string detail =
          absl::StrCat("no saved OCSP response for ", absl::StrJoin(missing, ", "),
                       good.empty() ? "" : absl::StrCat("; good: ", absl::StrJoin(good, ", ")));
      if (policy_.require_ocsp) return Fail("certs.ocsp", std::move(detail));
      return Skip("certs.ocsp", absl::StrCat("offline: ", detail));
    }
    Pass("certs.ocsp", absl::StrCat("good: ", absl::StrJoin(good, ", ")));
  }

  void AddReportClaims() {
    if (!report_.ok()) return;
    const SpdmReport& report = *report_;
    Claim("driver_version", report.driver_version);
    Claim("vbios_version", report.vbios_version);
    Claim("nonce", HexEncode(report.requester_nonce));
    if (!report.project.empty()) Claim("project", report.project);
    if (!report.project_sku.empty()) Claim("project_sku", report.project_sku);
    if (!report.chip_sku.empty()) Claim("chip_sku", report.chip_sku);
    if (report.board_id.has_value()) Claim("board_id", absl::StrCat(*report.board_id));
    if (report.fwid.has_value()) Claim("fwid", HexEncode(*report.fwid));
    if (report.nvdec0_status.has_value()) {
      Claim("nvdec0", *report.nvdec0_status == kNvdecDisabled  ? "disabled"
                      : *report.nvdec0_status == kNvdecEnabled ? "enabled"
                                                               : "invalid");
    }
    if (report.protected_pcie_status.has_value()) {
      Claim("protected_pcie", *report.protected_pcie_status == kProtectedPcieOn ? "on" : "off");
    }
    if (report.feature_flag.has_value()) Claim("feature_flag", absl::StrCat(*report.feature_flag));
    // The CC mode: FEATURE_FLAG when the opaque data version defines it, else (Hopper, which
    // has no multi-GPU passthrough) the protected-PCIe status.
    if (report.feature_flag.has_value() && report.opaque_data_version.value_or(0) >= 1) {
      static constexpr const char* kModes[] = {"spt", "mpt", "ppcie"};
      Claim("cc_mode", *report.feature_flag < 3
                           ? kModes[*report.feature_flag]
                           : absl::StrCat("unknown (", *report.feature_flag, ")"));
    } else if (chip_.arch == "HOPPER") {
      Claim("cc_mode", report.protected_pcie_status == kProtectedPcieOn ? "ppcie" : "spt");
    }
    for (const SpdmMeasurementBlock& block : report.blocks) {
      if (AllZero(block.value)) continue;
      Claim(absl::StrCat("measurement.", block.index < 10 ? "0" : "", block.index),
            HexEncode(block.value));
    }
  }

  void Conclude() {
    const std::string ocsp = Name("certs.ocsp");
    const std::string nonce = Name("nonce");
    bool pass = true;
    for (const Check& check : verdict_.checks) {
      if (check.result == Check::kPass) continue;
      if (check.result == Check::kSkipped && ((check.name == ocsp && !policy_.require_ocsp) ||
                                              (check.name == nonce && !policy_.require_nonce))) {
        continue;
      }
      pass = false;
    }
    verdict_.pass = pass;
  }

  const NvidiaGpuInput& input_;
  const NvidiaPolicy& policy_;
  const Certificate& device_root_;
  const Certificate& corim_root_;
  const absl::Time at_;
  const std::string prefix_;

  Verdict verdict_;
  absl::StatusOr<SpdmReport> report_ = absl::UnknownError("not parsed");
  absl::StatusOr<std::vector<Certificate>> chain_ = absl::UnknownError("not parsed");
  ChipInfo chip_;
  RimState driver_;
  RimState vbios_;
};

}  // namespace

std::string NvidiaDriverRimId(const SpdmReport& report, std::string_view arch) {
  if (absl::EqualsIgnoreCase(Sv(arch), "BLACKWELL")) {
    std::string chip = report.chip_info.empty() ? "GB100" : report.chip_info;
    return absl::AsciiStrToUpper(
        absl::StrCat("NV_GPU_CC_DRIVER_", chip, "_", report.driver_version));
  }
  return absl::AsciiStrToUpper(absl::StrCat("NV_GPU_DRIVER_GH100_", report.driver_version));
}

std::string NvidiaVbiosRimId(const SpdmReport& report) {
  return absl::AsciiStrToUpper(
      absl::StrCat("NV_GPU_VBIOS_", report.project, "_", report.project_sku, "_", report.chip_sku,
                   "_", absl::StrReplaceAll(report.vbios_version, {{".", ""}})));
}

NvidiaPolicy NvidiaPolicyFromPolicy(const Policy& policy) {
  NvidiaPolicy out;
  const v1::NvidiaGpuPolicy& section = policy.nvidia();
  if (!section.device_root_pem().empty()) out.device_root_pem = section.device_root_pem();
  if (!section.corim_root_pem().empty()) out.corim_root_pem = section.corim_root_pem();
  out.require_ocsp = section.require_ocsp();
  out.allow_ocsp_cert_hold = section.allow_ocsp_cert_hold();
  out.allow_expired_rim = section.allow_expired_rim();
  for (const std::string& version : policy.gpu_versions().driver_versions()) {
    out.allowed_driver_versions.push_back(version);
  }
  for (const std::string& version : policy.gpu_versions().vbios_versions()) {
    out.allowed_vbios_versions.push_back(version);
  }
  return out;
}

absl::StatusOr<Bytes> GpuLeafFwid(const Certificate& leaf) {
  absl::StatusOr<Bytes> tcb_info = leaf.ExtensionValue(kTcgDiceTcbInfoOid);
  if (tcb_info.ok()) return TcbInfoFirstFwid(*tcb_info);
  if (!absl::IsNotFound(tcb_info.status())) return tcb_info.status();
  absl::StatusOr<Bytes> fwid = DiceFwid(leaf);
  if (absl::IsNotFound(fwid.status())) {
    return absl::NotFoundError(absl::StrCat("the leaf '", leaf.SubjectCommonName(),
                                            "' has neither DICE extension ", Sv(kTcgDiceFwidOid),
                                            " nor ", Sv(kTcgDiceTcbInfoOid)));
  }
  return fwid;
}

absl::StatusOr<Verdict> VerifyNvidiaGpu(const NvidiaGpuInput& input, const NvidiaPolicy& policy,
                                        absl::Time at, std::string_view check_prefix) {
  absl::StatusOr<Certificate> device_root = Certificate::FromPem(policy.device_root_pem);
  if (!device_root.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("NVIDIA policy: the device root is unusable: ",
                                                   device_root.status().message()));
  }
  absl::StatusOr<Certificate> corim_root = Certificate::FromPem(policy.corim_root_pem);
  if (!corim_root.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NVIDIA policy: the CoRIM root is unusable: ", corim_root.status().message()));
  }
  if (input.expected_nonce.has_value() && input.expected_nonce->size() != kExpectedNonceSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the expected nonce is ", input.expected_nonce->size(), " bytes; GPU nonces are 32"));
  }
  return GpuVerification(input, policy, *device_root, *corim_root, at, check_prefix).Run();
}

}  // namespace cloister::attest
