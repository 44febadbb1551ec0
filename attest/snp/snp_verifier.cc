#include "attest/snp/snp_verifier.h"

#include <openssl/evp.h>
#include <openssl/obj_mac.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "attest/snp/amd_roots.h"
#include "attest/snp_report.h"
#include "attest/string_view.h"
#include "base/status.h"

namespace cloister::attest {
namespace {

constexpr size_t kMaxChainCount = 4;
constexpr size_t kSnpReportDataSize = 64;
constexpr size_t kHostDataSize = 32;
constexpr size_t kIdKeyDigestSize = 48;
constexpr std::string_view kVcekCommonName = "SEV-VCEK";
constexpr std::string_view kVlekCommonName = "SEV-VLEK";

bool AllZero(ByteSpan bytes) {
  for (uint8_t b : bytes) {
    if (b != 0) return false;
  }
  return true;
}

std::string TcbText(const SnpTcb& tcb) {
  std::string text;
  if (tcb.fmc.has_value()) absl::StrAppend(&text, "fmc=", *tcb.fmc, " ");
  absl::StrAppend(&text, "bootloader=", tcb.bootloader, " tee=", tcb.tee, " snp=", tcb.snp,
                  " microcode=", tcb.microcode);
  return text;
}

// Checks that `cert` is signed with RSASSA-PSS over SHA-384, as AMD signs the ASK, ASVK, VCEK
// and VLEK. (OpenSSL verifies the signature itself during chain verification; this pins the
// algorithm so that a weaker one is refused even if a pinned ARK's key allowed it.)
absl::Status CheckRsaPssSha384(const Certificate& cert) {
  Bytes der = cert.ToDer();
  const unsigned char* cursor = der.data();
  std::unique_ptr<X509, decltype(&X509_free)> x509(
      d2i_X509(nullptr, &cursor, static_cast<long>(der.size())), &X509_free);
  int digest_nid = NID_undef;
  int key_nid = NID_undef;
  if (x509 == nullptr ||
      X509_get_signature_info(x509.get(), &digest_nid, &key_nid, nullptr, nullptr) != 1 ||
      key_nid != EVP_PKEY_RSA_PSS || digest_nid != NID_sha384) {
    return absl::PermissionDeniedError(
        absl::StrCat("certificate '", cert.SubjectCommonName(),
                     "' is not signed with RSASSA-PSS/SHA-384 as AMD signs its certificates"));
  }
  return absl::OkStatus();
}

// "SEV-Milan" -> "Milan", "SEV-VLEK-Genoa" -> "Genoa"; "" when the name has neither form.
std::string ProductOfSigner(std::string_view common_name) {
  absl::string_view name = Sv(common_name);
  if (absl::ConsumePrefix(&name, "SEV-VLEK-") || absl::ConsumePrefix(&name, "SEV-")) {
    return std::string(name);
  }
  return "";
}

absl::StatusOr<Certificate> ParseLeaf(ByteSpan bytes) {
  absl::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (absl::StrContains(text, "-----BEGIN CERTIFICATE-----")) {
    return Certificate::FromPem(StdSv(text));
  }
  if (bytes.empty()) return absl::InvalidArgumentError("no VCEK certificate was given");
  return Certificate::FromDer(bytes);
}


// Reads one VCEK TCB extension (a small INTEGER).
absl::StatusOr<uint8_t> ReadSpl(const Certificate& leaf, std::string_view oid,
                                absl::string_view what) {
  ASSIGN_OR_RETURN(Bytes value, leaf.ExtensionValue(oid));
  auto number = der::ParseInteger(value);
  if (!number.ok() || *number > 255) {
    return absl::InvalidArgumentError(absl::StrCat("the certificate's ", what, " extension (",
                                                   Sv(oid), ") is not an INTEGER from 0 to 255"));
  }
  return static_cast<uint8_t>(*number);
}

// The tcb check: the leaf's TCB extensions equal REPORTED_TCB, its hwID equals CHIP_ID, and
// REPORTED_TCB meets the policy's minimum. Returns the detail on success.
absl::StatusOr<std::string> CheckTcb(const Certificate& leaf, const SnpReport& report,
                                     const std::optional<SnpChain>& chain, bool vlek,
                                     const v1::SnpTcbMinimum& minimum) {
  ASSIGN_OR_RETURN(Bytes product_der, leaf.ExtensionValue(kVcekProductNameOid));
  auto product_name = der::ParseIa5String(product_der);
  if (!product_name.ok()) {
    return absl::InvalidArgumentError("the certificate's product-name extension is malformed");
  }
  // "Milan-B0" -> "Milan"; Turin VCEKs say just "Turin".
  std::string product = product_name->substr(0, product_name->find('-'));
  if (chain.has_value() && product != chain->product) {
    return absl::PermissionDeniedError(absl::StrCat("the certificate's product extension says '",
                                                    *product_name, "' but its chain is for ",
                                                    chain->product));
  }
  const bool turin = product == "Turin";
  const bool has_fmc = leaf.ExtensionValue(kVcekFmcSplOid).ok();
  if (turin != has_fmc) {
    return absl::InvalidArgumentError(absl::StrCat("a ", product, " certificate ",
                                                   has_fmc ? "must not carry" : "must carry",
                                                   " the FMC SPL extension ", Sv(kVcekFmcSplOid)));
  }

  SnpTcb certified;
  ASSIGN_OR_RETURN(certified.bootloader, ReadSpl(leaf, kVcekBootloaderSplOid, "bootloader SPL"));
  ASSIGN_OR_RETURN(certified.tee, ReadSpl(leaf, kVcekTeeSplOid, "TEE SPL"));
  ASSIGN_OR_RETURN(certified.snp, ReadSpl(leaf, kVcekSnpSplOid, "SNP SPL"));
  ASSIGN_OR_RETURN(certified.microcode, ReadSpl(leaf, kVcekMicrocodeSplOid, "microcode SPL"));
  if (turin) {
    ASSIGN_OR_RETURN(certified.fmc, ReadSpl(leaf, kVcekFmcSplOid, "FMC SPL"));
  }
  SnpTcb reported =
      turin ? SnpTcb::FromTurin(report.reported_tcb) : SnpTcb::FromMilanGenoa(report.reported_tcb);
  if (!(reported == certified)) {
    return absl::PermissionDeniedError(
        absl::StrCat("the certificate was issued for TCB ", TcbText(certified),
                     " but the report's REPORTED_TCB is ", TcbText(reported)));
  }

  std::string chip;
  if (vlek) {
    chip = "a VLEK is not tied to one chip";
  } else if (report.chip_key_masked()) {
    if (!AllZero(report.chip_id)) {
      return absl::PermissionDeniedError("MASK_CHIP_KEY is set but CHIP_ID is not zero");
    }
    chip = "CHIP_ID masked by the guest (MASK_CHIP_KEY), hwID not compared";
  } else {
    ASSIGN_OR_RETURN(Bytes hwid, leaf.ExtensionValue(kVcekHwidOid));
    const size_t hwid_size = turin ? 8 : 64;
    if (hwid.size() != hwid_size) {
      return absl::InvalidArgumentError(absl::StrCat("the VCEK hwID extension is ", hwid.size(),
                                                     " bytes, expected ", hwid_size, " for ",
                                                     product));
    }
    if (!ConstantTimeEquals(hwid, ByteSpan(report.chip_id).first(hwid_size))) {
      return absl::PermissionDeniedError(
          "the VCEK was issued for another chip (hwID differs from the report's CHIP_ID)");
    }
    chip = "hwID equals CHIP_ID";
  }

  std::vector<std::string> below;
  auto at_least = [&](absl::string_view what, uint32_t have, uint32_t need) {
    if (have < need) below.push_back(absl::StrCat(what, " ", have, " < ", need));
  };
  at_least("bootloader", reported.bootloader, minimum.bootloader());
  at_least("tee", reported.tee, minimum.tee());
  at_least("snp", reported.snp, minimum.snp());
  at_least("microcode", reported.microcode, minimum.microcode());
  if (turin) at_least("fmc", *reported.fmc, minimum.fmc());
  if (!below.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("REPORTED_TCB is below the policy's minimum: ", absl::StrJoin(below, ", ")));
  }
  return absl::StrCat("the ", vlek ? "VLEK" : "VCEK", " certifies TCB ", TcbText(reported), " (",
                      product, " layout), at or above the policy's minimum; ", chip);
}

std::string TcbClaimsPrefix(const std::string& prefix, absl::string_view which) {
  return absl::StrCat(prefix, which, ".");
}

void AddTcbClaims(Verdict& verdict, const std::string& prefix, absl::string_view which,
                  uint64_t raw, bool turin) {
  SnpTcb tcb = turin ? SnpTcb::FromTurin(raw) : SnpTcb::FromMilanGenoa(raw);
  std::string base = TcbClaimsPrefix(prefix, which);
  verdict.claims[base + "raw"] = absl::StrCat("0x", absl::Hex(raw, absl::kZeroPad16));
  verdict.claims[base + "bootloader"] = absl::StrCat(tcb.bootloader);
  verdict.claims[base + "tee"] = absl::StrCat(tcb.tee);
  verdict.claims[base + "snp"] = absl::StrCat(tcb.snp);
  verdict.claims[base + "microcode"] = absl::StrCat(tcb.microcode);
  if (tcb.fmc.has_value()) verdict.claims[base + "fmc"] = absl::StrCat(*tcb.fmc);
}

// Passes the verdict only when nothing failed and every required check passed; a required
// check that never ran or was skipped without another failure is a failure of its own.
void Conclude(Verdict& verdict, const std::string& prefix,
              std::initializer_list<absl::string_view> required) {
  std::vector<std::string> missing;
  for (absl::string_view name : required) {
    const Check* check = verdict.Find(absl::StrCat(prefix, name));
    if (check == nullptr || check->result != Check::kPass) missing.push_back(std::string(name));
  }
  if (!missing.empty() && verdict.NoFailures()) {
    verdict.Fail(absl::StrCat(prefix, "verdict.required"),
                 absl::StrCat("required checks did not pass: ", absl::StrJoin(missing, ", ")));
  }
  verdict.pass = verdict.NoFailures() && missing.empty();
}

}  // namespace

absl::StatusOr<SnpChain> VerifySnpCertChain(const Certificate& leaf,
                                            const std::vector<Certificate>& intermediates,
                                            const std::vector<Certificate>& pinned_arks,
                                            absl::Time at) {
  const std::string leaf_name = leaf.SubjectCommonName();
  SnpChain out;
  if (leaf_name == kVlekCommonName) {
    out.vlek = true;
  } else if (leaf_name != kVcekCommonName) {
    return absl::PermissionDeniedError(
        absl::StrCat("the leaf certificate is '", leaf_name, "', expected SEV-VCEK or SEV-VLEK"));
  }
  auto curve = leaf.KeyCurve();
  if (!curve.ok() || *curve != crypto::EcCurve::kP384) {
    return absl::PermissionDeniedError(
        absl::StrCat("the ", leaf_name, " certificate does not hold a P-384 key"));
  }
  const std::string signer_name = leaf.IssuerCommonName();
  out.product = ProductOfSigner(signer_name);
  const std::string expected_signer = absl::StrCat(out.vlek ? "SEV-VLEK-" : "SEV-", out.product);
  if (out.product.empty() || signer_name != expected_signer) {
    return absl::PermissionDeniedError(
        absl::StrCat("the ", leaf_name, " is issued by '", signer_name, "', not by an AMD ",
                     out.vlek ? "ASVK (SEV-VLEK-<product>)" : "ASK (SEV-<product>)"));
  }
  const Certificate* signer = nullptr;
  for (const Certificate& cert : intermediates) {
    if (cert.SubjectCommonName() == signer_name) signer = &cert;
  }
  if (signer == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("the chain lacks the '", signer_name,
                                                    "' certificate that issued the ", leaf_name,
                                                    " (give the ASK/ASK-ARK file)"));
  }
  const std::string ark_name = absl::StrCat("ARK-", out.product);
  const Certificate* ark = nullptr;
  std::vector<std::string> pinned_names;
  for (const Certificate& candidate : pinned_arks) {
    pinned_names.push_back(candidate.SubjectCommonName());
    if (candidate.SubjectCommonName() == ark_name) ark = &candidate;
  }
  if (ark == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the policy pins no ", ark_name,
        " (it pins: ", pinned_names.empty() ? "nothing" : absl::StrJoin(pinned_names, ", "), ")"));
  }
  RETURN_IF_ERROR(CheckRsaPssSha384(leaf));
  RETURN_IF_ERROR(CheckRsaPssSha384(*signer));
  std::vector<Certificate> chain = {leaf};
  chain.insert(chain.end(), intermediates.begin(), intermediates.end());
  RETURN_IF_ERROR(VerifyChain(chain, *ark, at));
  return out;
}

absl::StatusOr<std::vector<Certificate>> SnpPinnedArks(const v1::SnpPolicy& policy) {
  std::vector<std::string> pems(policy.ark_pems().begin(), policy.ark_pems().end());
  const bool built_in = pems.empty();
  if (built_in) pems = BuiltInAmdArkPems();
  std::vector<Certificate> arks;
  for (size_t i = 0; i < pems.size(); ++i) {
    std::string where = built_in ? absl::StrCat("built-in AMD ARK ", i)
                                 : absl::StrCat("policy field 'snp.ark_pems[", i, "]'");
    auto cert = Certificate::FromPem(pems[i]);
    if (!cert.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", cert.status().message()));
    }
    if (!cert->IsCa() || cert->SubjectCommonName() != cert->IssuerCommonName() ||
        !absl::StartsWith(cert->SubjectCommonName(), "ARK-")) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": '", cert->SubjectCommonName(), "' is not a self-signed AMD ARK-<product> CA"));
    }
    arks.push_back(*std::move(cert));
  }
  return arks;
}

absl::Status ValidateSnpPolicy(const v1::SnpPolicy& policy) {
  RETURN_IF_ERROR(SnpPinnedArks(policy).status());
  RETURN_IF_ERROR(DecodeHexAllowList(policy.host_data(), kHostDataSize, "snp.host_data").status());
  RETURN_IF_ERROR(
      DecodeHexAllowList(policy.id_key_digests(), kIdKeyDigestSize, "snp.id_key_digests").status());
  if (policy.minimum_report_version() > kSnpMaxVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy field 'snp.minimum_report_version': ", policy.minimum_report_version(),
                     " is newer than any version this verifier reads (", kSnpMaxVersion, ")"));
  }
  if (policy.vmpl() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy field 'snp.vmpl': ", policy.vmpl(), " is not a VMPL (0 to 3)"));
  }
  const v1::SnpTcbMinimum& tcb = policy.minimum_tcb();
  for (uint32_t level : {tcb.bootloader(), tcb.tee(), tcb.snp(), tcb.microcode(), tcb.fmc()}) {
    if (level > 255) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy field 'snp.minimum_tcb': ", level, " is not an SPL (0 to 255)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Verdict> VerifySnpReport(const SnpInput& input, const Policy& policy, absl::Time at,
                                        std::string_view check_prefix) {
  const v1::SnpPolicy& snp = policy.snp();
  RETURN_IF_ERROR(ValidateSnpPolicy(snp));
  ASSIGN_OR_RETURN(std::vector<Certificate> arks, SnpPinnedArks(snp));
  ASSIGN_OR_RETURN(std::vector<Bytes> host_data,
                   DecodeHexAllowList(snp.host_data(), kHostDataSize, "snp.host_data"));
  ASSIGN_OR_RETURN(std::vector<Bytes> id_keys,
                   DecodeHexAllowList(snp.id_key_digests(), kIdKeyDigestSize, "snp.id_key_digests"));
  if (input.expected_report_data.has_value() &&
      input.expected_report_data->size() != kSnpReportDataSize) {
    return absl::InvalidArgumentError(absl::StrCat("the expected REPORT_DATA is ",
                                                   input.expected_report_data->size(),
                                                   " bytes, expected ", kSnpReportDataSize));
  }

  const std::string prefix(check_prefix);
  auto name = [&](absl::string_view check) { return absl::StrCat(prefix, check); };
  Verdict verdict;

  // report.parse
  auto report = ParseSnpReport(input.report);
  if (report.ok()) {
    verdict.Pass(name("report.parse"), absl::StrCat("SEV-SNP report version ", report->version,
                                                    ", ", input.report.size(), " bytes"));
  } else {
    verdict.Fail(name("report.parse"), std::string(report.status().message()));
  }

  // certs.chain
  std::optional<Certificate> leaf;
  std::optional<SnpChain> chain;
  {
    auto parsed_leaf = ParseLeaf(input.vcek_der_or_pem);
    std::vector<Certificate> intermediates;
    absl::Status status = parsed_leaf.status();
    if (parsed_leaf.ok()) {
      leaf = *parsed_leaf;
      if (input.ask_ark_pem.empty()) {
        status = absl::InvalidArgumentError("no ASK certificate was given");
      } else if (auto parsed = ParsePemChain(input.ask_ark_pem, kMaxChainCount); parsed.ok()) {
        intermediates = *std::move(parsed);
      } else {
        status = absl::InvalidArgumentError(
            absl::StrCat("the ASK/ARK file: ", parsed.status().message()));
      }
    }
    if (status.ok()) {
      auto verified = VerifySnpCertChain(*leaf, intermediates, arks, at);
      status = verified.status();
      if (verified.ok()) chain = *verified;
    }
    if (chain.has_value()) {
      verdict.Pass(
          name("certs.chain"),
          absl::StrCat(leaf->SubjectCommonName(), " <- ", leaf->IssuerCommonName(),
                       " <- pinned ARK-", chain->product, " (RSASSA-PSS/SHA-384), valid at ",
                       absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", at, absl::UTCTimeZone())));
    } else {
      verdict.Fail(name("certs.chain"), std::string(status.message()));
    }
  }

  const std::string not_parsed = "skipped: the report did not parse";
  const std::string no_leaf = "skipped: no usable VCEK certificate";

  // report.signature
  bool authenticated = false;
  const bool leaf_is_vlek = leaf.has_value() && leaf->SubjectCommonName() == kVlekCommonName;
  if (!report.ok()) {
    verdict.Skip(name("report.signature"), not_parsed);
  } else if (!leaf.has_value()) {
    verdict.Skip(name("report.signature"), no_leaf);
  } else {
    absl::Status status;
    const uint32_t key = report->signing_key();
    if (key != kSnpSigningKeyVcek && key != kSnpSigningKeyVlek) {
      status = absl::PermissionDeniedError(absl::StrCat(
          "the report's SIGNING_KEY is ", key, ", not VCEK (0) or VLEK (1): it is unsigned"));
    } else if ((key == kSnpSigningKeyVlek) != leaf_is_vlek) {
      status = absl::PermissionDeniedError(absl::StrCat(
          "the report says it is signed by the ", key == kSnpSigningKeyVlek ? "VLEK" : "VCEK",
          " but the certificate given is a ", leaf->SubjectCommonName()));
    } else if (auto curve = leaf->KeyCurve(); !curve.ok() || *curve != crypto::EcCurve::kP384) {
      status = absl::PermissionDeniedError("the certificate does not hold a P-384 key");
    } else {
      status = VerifyP1363WithCertificate(*leaf, crypto::HashAlg::kSha384,
                                          ByteSpan(input.report).first(kSnpSignedSize),
                                          report->signature);
    }
    if (status.ok()) {
      authenticated = true;
      verdict.Pass(name("report.signature"),
                   absl::StrCat("ECDSA P-384/SHA-384 over bytes 0..0x29F verifies with the ",
                                leaf_is_vlek ? "VLEK" : "VCEK", " key"));
    } else {
      verdict.Fail(name("report.signature"), std::string(status.message()));
    }
  }

  // tcb
  if (!report.ok()) {
    verdict.Skip(name("tcb"), not_parsed);
  } else if (!leaf.has_value()) {
    verdict.Skip(name("tcb"), no_leaf);
  } else {
    auto detail = CheckTcb(*leaf, *report, chain, leaf_is_vlek, snp.minimum_tcb());
    if (detail.ok()) {
      verdict.Pass(name("tcb"), *detail);
    } else {
      verdict.Fail(name("tcb"), std::string(detail.status().message()));
    }
  }

  if (!report.ok()) {
    for (absl::string_view check : {"policy", "measurement", "host_data", "report_data"}) {
      verdict.Skip(name(check), not_parsed);
    }
    Conclude(verdict, prefix,
             {"report.parse", "certs.chain", "report.signature", "tcb", "policy", "measurement"});
    return verdict;
  }

  // policy
  {
    std::vector<std::string> problems;
    const uint32_t minimum_version = std::max(snp.minimum_report_version(), kSnpMinVersion);
    if (report->version < minimum_version) {
      problems.push_back(absl::StrCat("report version ", report->version,
                                      " is older than the policy's minimum ", minimum_version));
    }
    if (report->signature_algo != kSnpSignatureAlgoEcdsaP384Sha384) {
      problems.push_back(absl::StrCat("SIGNATURE_ALGO ", report->signature_algo, " is not 1"));
    }
    if (report->debug_allowed() && !policy.allow_debug()) {
      problems.push_back(
          "the guest POLICY allows debugging (DEBUG, bit 19) and the policy does not");
    }
    if ((report->policy & kSnpPolicyMigrateMa) != 0 && !snp.allow_migration_agent()) {
      problems.push_back(
          "the guest POLICY allows a migration agent (MIGRATE_MA, bit 18) and the policy does not");
    }
    if (report->vmpl != snp.vmpl()) {
      problems.push_back(absl::StrCat("the report came from VMPL ", report->vmpl,
                                      ", the policy requires VMPL ", snp.vmpl()));
    }
    if (report->guest_svn < snp.minimum_guest_svn()) {
      problems.push_back(absl::StrCat("GUEST_SVN ", report->guest_svn,
                                      " is below the policy's minimum ", snp.minimum_guest_svn()));
    }
    if (!id_keys.empty() && !AllowListContains(id_keys, report->id_key_digest)) {
      problems.push_back(absl::StrCat("ID_KEY_DIGEST ", HexEncode(report->id_key_digest),
                                      " is not among the policy's ", id_keys.size(),
                                      " accepted ID keys"));
    }
    if (problems.empty()) {
      verdict.Pass(name("policy"),
                   absl::StrCat("version ", report->version, ", ECDSA P-384/SHA-384, POLICY 0x",
                                absl::Hex(report->policy), " (debug ",
                                report->debug_allowed() ? "allowed by the policy" : "off",
                                "), VMPL ", report->vmpl, ", GUEST_SVN ", report->guest_svn));
    } else {
      verdict.Fail(name("policy"), absl::StrJoin(problems, "; "));
    }
  }

  // measurement
  {
    const std::string measurement = HexEncode(report->measurement);
    bool known = false;
    for (const std::string& accepted : policy.enclave_measurements()) {
      known = known || absl::AsciiStrToLower(accepted) == measurement;
    }
    if (policy.enclave_measurements().empty()) {
      verdict.Fail(name("measurement"),
                   absl::StrCat("MEASUREMENT ", measurement,
                                " cannot be accepted: the policy lists no enclave measurements"));
    } else if (known) {
      verdict.Pass(name("measurement"),
                   absl::StrCat("MEASUREMENT ", measurement, " is accepted by the policy"));
    } else {
      verdict.Fail(name("measurement"),
                   absl::StrCat("MEASUREMENT ", measurement, " is not among the policy's ",
                                policy.enclave_measurements_size(), " accepted measurements"));
    }
  }

  // host_data
  if (host_data.empty()) {
    verdict.Skip(name("host_data"), "the policy does not constrain HOST_DATA");
  } else if (AllowListContains(host_data, report->host_data)) {
    verdict.Pass(name("host_data"),
                 absl::StrCat("HOST_DATA ", HexEncode(report->host_data), " is accepted"));
  } else {
    verdict.Fail(name("host_data"),
                 absl::StrCat("HOST_DATA ", HexEncode(report->host_data),
                              " is not among the policy's ", host_data.size(), " accepted values"));
  }

  // report_data
  if (!input.expected_report_data.has_value()) {
    verdict.Skip(name("report_data"), "no expected REPORT_DATA was given");
  } else if (ConstantTimeEquals(*input.expected_report_data, report->report_data)) {
    verdict.Pass(name("report_data"), "REPORT_DATA equals the expected value");
  } else {
    verdict.Fail(name("report_data"), absl::StrCat("REPORT_DATA ", HexEncode(report->report_data),
                                                   " differs from the expected ",
                                                   HexEncode(*input.expected_report_data)));
  }

  if (authenticated) {
    const bool turin =
        chain.has_value() ? chain->product == "Turin" : leaf->ExtensionValue(kVcekFmcSplOid).ok();
    auto& claims = verdict.claims;
    claims[name("report_version")] = absl::StrCat(report->version);
    claims[name("guest_svn")] = absl::StrCat(report->guest_svn);
    claims[name("policy")] = absl::StrCat("0x", absl::Hex(report->policy));
    claims[name("policy.abi")] =
        absl::StrCat((report->policy >> 8) & 0xFF, ".", report->policy & 0xFF);
    claims[name("policy.debug")] = report->debug_allowed() ? "true" : "false";
    claims[name("policy.smt")] = (report->policy & kSnpPolicySmtAllowed) ? "true" : "false";
    claims[name("policy.migrate_ma")] = (report->policy & kSnpPolicyMigrateMa) ? "true" : "false";
    claims[name("policy.single_socket")] =
        (report->policy & kSnpPolicySingleSocket) ? "true" : "false";
    claims[name("vmpl")] = absl::StrCat(report->vmpl);
    claims[name("signing_key")] = leaf_is_vlek ? "vlek" : "vcek";
    if (chain.has_value()) claims[name("product")] = chain->product;
    claims[name("measurement")] = HexEncode(report->measurement);
    claims[name("host_data")] = HexEncode(report->host_data);
    claims[name("report_data")] = HexEncode(report->report_data);
    claims[name("id_key_digest")] = HexEncode(report->id_key_digest);
    claims[name("report_id")] = HexEncode(report->report_id);
    claims[name("chip_id")] = HexEncode(report->chip_id);
    claims[name("platform_info")] = absl::StrCat("0x", absl::Hex(report->platform_info));
    claims[name("firmware")] = absl::StrCat(report->current_major, ".", report->current_minor,
                                            " build ", report->current_build);
    claims[name("committed_firmware")] = absl::StrCat(
        report->committed_major, ".", report->committed_minor, " build ", report->committed_build);
    AddTcbClaims(verdict, prefix, "reported_tcb", report->reported_tcb, turin);
    AddTcbClaims(verdict, prefix, "current_tcb", report->current_tcb, turin);
    AddTcbClaims(verdict, prefix, "committed_tcb", report->committed_tcb, turin);
    AddTcbClaims(verdict, prefix, "launch_tcb", report->launch_tcb, turin);
  }

  Conclude(verdict, prefix,
           {"report.parse", "certs.chain", "report.signature", "tcb", "policy", "measurement"});
  return verdict;
}

void SetSnpCertificatesFromChain(std::string_view chain_pem, SnpInput& input) {
  auto chain = ParsePemChain(chain_pem, kMaxChainCount + 1);
  if (!chain.ok()) {
    input.vcek_der_or_pem = ToBytes(chain_pem);
    input.ask_ark_pem.clear();
    return;
  }
  input.vcek_der_or_pem = ToBytes((*chain)[0].ToPem());
  input.ask_ark_pem = ChainToPem(std::vector<Certificate>(chain->begin() + 1, chain->end()));
}

Verdict SnpCvmVerifier::Verify(const EvidenceBundle& bundle, ByteSpan expected_nonce,
                               const Policy& policy, absl::Time at) const {
  SnpInput input;
  input.report = ToBytes(bundle.cvm_report());
  SetSnpCertificatesFromChain(bundle.cvm_cert_chain_pem(), input);
  auto verdict = VerifySnpReport(input, policy, at, "cvm.");
  if (!verdict.ok()) {
    Verdict refused;
    refused.Fail("cvm.policy", std::string(verdict.status().message()));
    return refused;
  }
  // VerifyBundle checks REPORT_DATA against the binding itself (check cvm.report_data, from
  // the claim set above when the signature verified); drop the skipped standalone check.
  std::erase_if(verdict->checks,
                [](const Check& check) { return check.name == "cvm.report_data"; });
  verdict->pass = verdict->NoFailures();
  return *std::move(verdict);
}

}  // namespace cloister::attest
