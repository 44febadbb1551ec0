#include "attest/sim/sim_verifier.h"

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attest/binding.h"
#include "attest/sim/sim_tee.h"
#include "attest/snp_report.h"
#include "attest/spdm.h"
#include "attest/x509.h"

namespace cloister::attest {
namespace {

constexpr size_t kMaxChainCount = 8;

// A chain from the evidence checked against the policy's root, with its leaf for later checks.
struct CheckedChain {
  std::optional<Certificate> leaf;
  std::vector<Certificate> chain;
};

// Runs the "<prefix>certs.chain" check and returns the leaf if the chain parsed (even when it
// did not verify, so later checks can still say something; the verdict fails anyway).
CheckedChain CheckChain(Verdict& verdict, const std::string& name, const std::string& chain_pem,
                        const std::string& root_pem, absl::string_view root_field, absl::Time at) {
  CheckedChain out;
  auto chain = ParsePemChain(chain_pem, kMaxChainCount);
  if (!chain.ok()) {
    verdict.Fail(name,
                 absl::StrCat("the evidence's certificate chain: ", chain.status().message()));
    return out;
  }
  out.chain = *chain;
  out.leaf = out.chain[0];
  auto root = Certificate::FromPem(root_pem);
  if (!root.ok()) {
    verdict.Fail(
        name, absl::StrCat("the policy has no usable ", root_field, ": ", root.status().message()));
    return out;
  }
  if (auto curve = out.leaf->KeyCurve(); !curve.ok() || *curve != crypto::EcCurve::kP384) {
    verdict.Fail(name, absl::StrCat("the leaf '", out.leaf->SubjectCommonName(),
                                    "' does not hold a P-384 key"));
    return out;
  }
  absl::Status status = VerifyChain(out.chain, *root, at);
  if (!status.ok()) {
    verdict.Fail(name, std::string(status.message()));
  } else {
    verdict.Pass(name, absl::StrCat("'", out.leaf->SubjectCommonName(), "' chains to the pinned '",
                                    root->SubjectCommonName(), "'"));
  }
  return out;
}

bool AllZero(ByteSpan bytes) {
  for (uint8_t b : bytes) {
    if (b != 0) return false;
  }
  return true;
}

}  // namespace

Verdict SimCvmVerifier::Verify(const EvidenceBundle& bundle, ByteSpan expected_nonce,
                               const Policy& policy, absl::Time at) const {
  Verdict verdict;
  ByteSpan report_bytes = AsBytes(bundle.cvm_report());
  auto report = ParseSnpReport(report_bytes);
  if (report.ok()) {
    verdict.Pass("cvm.report.parse", absl::StrCat("SEV-SNP layout, version ", report->version));
  } else {
    verdict.Fail("cvm.report.parse", std::string(report.status().message()));
  }

  CheckedChain chain = CheckChain(verdict, "cvm.certs.chain", bundle.cvm_cert_chain_pem(),
                                  policy.sim().cvm_root_pem(), "sim.cvm_root_pem", at);

  const std::string not_parsed = "skipped: the report did not parse";
  if (!report.ok() || !chain.leaf.has_value()) {
    std::string why = !report.ok() ? not_parsed : "skipped: no certificate chain to read";
    verdict.Skip("cvm.certs.tcb", why);
    verdict.Skip("cvm.report.signature", why);
  } else {
    auto vcek = ReadVcekExtensions(*chain.leaf);
    absl::Status match = vcek.ok() ? CheckVcekMatchesReport(*vcek, *report) : vcek.status();
    if (match.ok()) {
      verdict.Pass("cvm.certs.tcb", "the VCEK was issued for this chip and TCB");
    } else {
      verdict.Fail("cvm.certs.tcb", std::string(match.message()));
    }

    absl::Status signature =
        report->signing_key() != kSnpSigningKeyVcek
            ? absl::PermissionDeniedError(absl::StrCat("the report names signing key ",
                                                       report->signing_key(),
                                                       "; the simulated CVM signs with its VCEK"))
            : VerifyP1363WithCertificate(*chain.leaf, crypto::HashAlg::kSha384,
                                         report_bytes.first(kSnpSignedSize), report->signature);
    if (signature.ok()) {
      verdict.Pass("cvm.report.signature", "ECDSA P-384/SHA-384 by the VCEK");
      verdict.claims["cvm.report_data"] = HexEncode(report->report_data);
    } else {
      verdict.Fail("cvm.report.signature", std::string(signature.message()));
    }
  }

  if (!report.ok()) {
    verdict.Skip("cvm.policy", not_parsed);
    verdict.Skip("cvm.measurement", not_parsed);
    verdict.pass = false;
    return verdict;
  }

  std::vector<std::string> policy_problems;
  if (report->debug_allowed() && !policy.allow_debug()) {
    policy_problems.push_back(
        "the CVM allows debugging (POLICY.DEBUG set) and the policy does not");
  }
  if (report->vmpl != 0) {
    policy_problems.push_back(
        absl::StrCat("the report came from VMPL ", report->vmpl, ", expected 0"));
  }
  if (policy_problems.empty()) {
    verdict.Pass("cvm.policy",
                 absl::StrCat("debug ", report->debug_allowed() ? "on (allowed by policy)" : "off",
                              ", VMPL 0"));
  } else {
    verdict.Fail("cvm.policy", absl::StrJoin(policy_problems, "; "));
  }

  std::string measurement = HexEncode(report->measurement);
  bool known = false;
  for (const std::string& accepted : policy.enclave_measurements()) {
    known = known || absl::AsciiStrToLower(accepted) == measurement;
  }
  if (known) {
    verdict.Pass("cvm.measurement", absl::StrCat("measurement ", measurement, " is accepted"));
  } else {
    verdict.Fail("cvm.measurement",
                 absl::StrCat("measurement ", measurement, " is not among the policy's ",
                              policy.enclave_measurements_size(), " accepted measurements"));
  }

  SnpTcb tcb = SnpTcb::FromMilanGenoa(report->reported_tcb);
  verdict.claims["cvm.measurement"] = measurement;
  verdict.claims["cvm.report_version"] = absl::StrCat(report->version);
  verdict.claims["cvm.debug"] = report->debug_allowed() ? "true" : "false";
  verdict.claims["cvm.vmpl"] = absl::StrCat(report->vmpl);
  verdict.claims["cvm.chip_id"] = HexEncode(report->chip_id);
  verdict.claims["cvm.tcb"] = absl::StrCat("bootloader=", tcb.bootloader, " tee=", tcb.tee,
                                           " snp=", tcb.snp, " microcode=", tcb.microcode);
  verdict.pass = verdict.NoFailures();
  return verdict;
}

Verdict SimGpuVerifier::Verify(const EvidenceBundle& bundle, ByteSpan expected_nonce,
                               const Policy& policy, absl::Time at) const {
  Verdict verdict;
  for (int i = 0; i < bundle.gpus_size(); ++i) {
    const v1::GpuEvidence& gpu = bundle.gpus(i);
    const std::string prefix = absl::StrCat("gpu", i, ".");
    auto name = [&](absl::string_view check) { return absl::StrCat(prefix, check); };
    ByteSpan report_bytes = AsBytes(gpu.spdm_report());

    auto report = ParseSpdmReport(report_bytes);
    if (report.ok()) {
      verdict.Pass(name("report.parse"),
                   absl::StrCat("SPDM 1.1 measurements, ", report->blocks.size(), " blocks"));
    } else {
      verdict.Fail(name("report.parse"), std::string(report.status().message()));
    }
    CheckedChain chain = CheckChain(verdict, name("certs.chain"), gpu.cert_chain_pem(),
                                    policy.sim().gpu_root_pem(), "sim.gpu_root_pem", at);
    const std::string not_parsed = "skipped: the report did not parse";
    if (!report.ok()) {
      for (absl::string_view check :
           {"report.signature", "certs.fwid", "nonce", "measurements", "versions"}) {
        verdict.Skip(name(check), not_parsed);
      }
      continue;
    }

    if (!chain.leaf.has_value()) {
      verdict.Skip(name("report.signature"), "skipped: no certificate chain to read");
      verdict.Skip(name("certs.fwid"), "skipped: no certificate chain to read");
    } else {
      absl::Status signature =
          VerifyP1363WithCertificate(*chain.leaf, crypto::HashAlg::kSha384,
                                     report_bytes.first(report->signed_size), report->signature);
      if (signature.ok()) {
        verdict.Pass(name("report.signature"), "ECDSA P-384/SHA-384 by the device leaf key");
      } else {
        verdict.Fail(name("report.signature"), std::string(signature.message()));
      }
      if (!report->fwid.has_value()) {
        verdict.Pass(name("certs.fwid"), "the report carries no FWID (older firmware)");
      } else if (auto fwid = DiceFwid(*chain.leaf); !fwid.ok()) {
        verdict.Fail(name("certs.fwid"), std::string(fwid.status().message()));
      } else if (*fwid != *report->fwid) {
        verdict.Fail(name("certs.fwid"),
                     absl::StrCat("the report's FWID ", HexEncode(*report->fwid),
                                  " differs from the leaf certificate's ", HexEncode(*fwid)));
      } else {
        verdict.Pass(name("certs.fwid"), "the report's FWID equals the leaf certificate's");
      }
      verdict.claims[name("ueid")] = chain.leaf->SerialDecimal();
      if (chain.chain.size() > 1)
        verdict.claims[name("hwmodel")] = chain.chain[1].SubjectCommonName();
    }

    if (expected_nonce.size() != kNonceSize || bundle.enclave_hpke_public_key().size() != 32) {
      verdict.Fail(name("nonce"),
                   "cannot derive the expected GPU nonce: the nonce or the "
                   "enclave HPKE key has the wrong size");
    } else {
      Bytes expected = GpuRequesterNonce(expected_nonce, AsBytes(bundle.enclave_hpke_public_key()),
                                         static_cast<uint32_t>(i));
      if (expected == report->requester_nonce) {
        verdict.Pass(name("nonce"), "the requester nonce is derived from the expected nonce");
      } else {
        verdict.Fail(name("nonce"),
                     absl::StrCat("the requester nonce ", HexEncode(report->requester_nonce),
                                  " is not the one derived from the expected nonce and the "
                                  "enclave key (",
                                  HexEncode(expected), ")"));
      }
    }

    std::map<uint8_t, Bytes> reference =
        SimGpuReferenceMeasurements(report->driver_version, report->vbios_version);
    std::vector<std::string> mismatched;
    for (const SpdmMeasurementBlock& block : report->blocks) {
      auto it = reference.find(block.index);
      bool ok = it != reference.end() ? block.value == it->second : AllZero(block.value);
      if (!ok) mismatched.push_back(absl::StrCat(block.index));
    }
    for (const auto& [index, digest] : reference) {
      if (report->FindBlock(index) == nullptr)
        mismatched.push_back(absl::StrCat(index, " (missing)"));
    }
    if (mismatched.empty()) {
      verdict.Pass(name("measurements"),
                   absl::StrCat(reference.size(), " measurements match the simulated firmware"));
    } else {
      verdict.Fail(name("measurements"),
                   absl::StrCat("measurement blocks differ from the simulated firmware's: ",
                                absl::StrJoin(mismatched, ", ")));
    }

    const auto& versions = policy.gpu_versions();
    std::vector<std::string> refused;
    auto allowed = [](const auto& list, const std::string& value) {
      if (list.empty()) return true;
      for (const std::string& item : list) {
        if (absl::EqualsIgnoreCase(item, value)) return true;
      }
      return false;
    };
    if (!allowed(versions.driver_versions(), report->driver_version)) {
      refused.push_back(
          absl::StrCat("driver ", report->driver_version, " is not in the allowed list"));
    }
    if (!allowed(versions.vbios_versions(), report->vbios_version)) {
      refused.push_back(
          absl::StrCat("VBIOS ", report->vbios_version, " is not in the allowed list"));
    }
    if (refused.empty()) {
      verdict.Pass(name("versions"), absl::StrCat("driver ", report->driver_version, ", VBIOS ",
                                                  report->vbios_version));
    } else {
      verdict.Fail(name("versions"), absl::StrJoin(refused, "; "));
    }
    verdict.claims[name("driver_version")] = report->driver_version;
    verdict.claims[name("vbios_version")] = report->vbios_version;
    if (report->fwid.has_value()) verdict.claims[name("fwid")] = HexEncode(*report->fwid);
  }
  verdict.pass = verdict.NoFailures();
  return verdict;
}

}  // namespace cloister::attest
