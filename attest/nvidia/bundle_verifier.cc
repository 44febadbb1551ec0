#include "attest/nvidia/bundle_verifier.h"

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attest/binding.h"
#include "attest/nvidia/gpu_verifier.h"
#include "attest/nvidia/rim.h"
#include "attest/spdm.h"
#include "attest/string_view.h"
#include "base/file.h"
#include "base/status.h"

namespace cloister::attest {
namespace {

namespace fs = std::filesystem;

// Regular files in `path` whose names end with one of `suffixes`, sorted by name.
absl::StatusOr<std::vector<fs::path>> ListFiles(const std::string& path, const char* what,
                                                std::initializer_list<std::string_view> suffixes) {
  std::error_code error;
  fs::directory_iterator it(path, error);
  if (error) {
    return absl::NotFoundError(
        absl::StrCat("the ", what, " directory ", path, " cannot be read: ", error.message()));
  }
  std::vector<fs::path> files;
  size_t seen = 0;
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) {
      return absl::NotFoundError(
          absl::StrCat("the ", what, " directory ", path, " cannot be read: ", error.message()));
    }
    if (++seen > kMaxRimDirectoryFiles) {
      return absl::InvalidArgumentError(absl::StrCat("the ", what, " directory ", path,
                                                     " holds more than ", kMaxRimDirectoryFiles,
                                                     " entries"));
    }
    if (!it->is_regular_file(error)) continue;
    const std::string name = it->path().filename().string();
    for (std::string_view suffix : suffixes) {
      if (absl::EndsWithIgnoreCase(name, Sv(suffix))) {
        files.push_back(it->path());
        break;
      }
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

const RimDirectory::Entry* RimDirectory::Find(std::string_view version) const {
  const std::string wanted = absl::AsciiStrToUpper(Sv(version));
  for (const Entry& entry : rims) {
    if (entry.version == wanted) return &entry;
  }
  return nullptr;
}

RimDirectory::Choice RimDirectory::FillRims(NvidiaGpuInput& input) const {
  Choice choice;
  absl::StatusOr<SpdmReport> report = ParseSpdmReport(input.report);
  if (!report.ok()) return choice;
  if (!input.driver_rim_xml.has_value()) {
    choice.driver = Find(report->driver_version);
    if (choice.driver != nullptr) {
      input.driver_rim_xml = choice.driver->xml;
    } else {
      choice.missing_driver =
          absl::StrCat("no RIM for driver ", report->driver_version, " in ", path);
    }
  }
  if (!input.vbios_rim_xml.has_value()) {
    choice.vbios = Find(report->vbios_version);
    if (choice.vbios != nullptr) {
      input.vbios_rim_xml = choice.vbios->xml;
    } else {
      choice.missing_vbios = absl::StrCat("no RIM for VBIOS ", report->vbios_version, " in ", path);
    }
  }
  return choice;
}

absl::StatusOr<RimDirectory> LoadRimDirectory(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<fs::path> files, ListFiles(path, "RIM", {".xml", ".swidtag"}));
  RimDirectory directory;
  directory.path = path;
  for (const fs::path& file : files) {
    const std::string name = file.filename().string();
    absl::StatusOr<std::string> xml = ReadFile(file.string(), kMaxRimXmlSize);
    if (!xml.ok()) {
      directory.skipped.push_back(absl::StrCat(name, ": ", xml.status().message()));
      continue;
    }
    absl::StatusOr<Rim> rim = ParseRim(*xml);
    if (!rim.ok()) {
      directory.skipped.push_back(absl::StrCat(name, ": ", rim.status().message()));
      continue;
    }
    directory.rims.push_back(RimDirectory::Entry{
        name, absl::AsciiStrToUpper(rim->colloquial_version), *std::move(xml)});
  }
  return directory;
}

absl::StatusOr<std::vector<Bytes>> LoadOcspDirectory(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<fs::path> files, ListFiles(path, "OCSP", {".der"}));
  std::vector<Bytes> responses;
  for (const fs::path& file : files) {
    ASSIGN_OR_RETURN(std::string der, ReadFile(file.string(), kMaxOcspResponseSize));
    responses.push_back(ToBytes(der));
  }
  return responses;
}

Verdict NvidiaGpuBundleVerifier::Verify(const EvidenceBundle& bundle, ByteSpan expected_nonce,
                                        const Policy& policy, absl::Time at) const {
  Verdict verdict;
  verdict.pass = true;
  const NvidiaPolicy nvidia = NvidiaPolicyFromPolicy(policy);

  // Reference values shared by every GPU of the bundle. A missing directory is not a call
  // failure: each GPU's RIM checks fail and say why.
  std::string rim_problem;
  std::optional<RimDirectory> rims;
  if (policy.nvidia().rim_dir().empty()) {
    rim_problem = "the policy names no RIM directory (nvidia.rim_dir)";
  } else if (auto loaded = LoadRimDirectory(policy.nvidia().rim_dir()); !loaded.ok()) {
    rim_problem = std::string(loaded.status().message());
  } else {
    rims = *std::move(loaded);
  }
  std::vector<Bytes> ocsp_responses;
  std::string ocsp_problem;
  if (!policy.nvidia().ocsp_dir().empty()) {
    if (auto loaded = LoadOcspDirectory(policy.nvidia().ocsp_dir()); loaded.ok()) {
      ocsp_responses = *std::move(loaded);
    } else {
      ocsp_problem = std::string(loaded.status().message());
    }
  }

  const bool nonce_usable =
      expected_nonce.size() == kNonceSize && bundle.enclave_hpke_public_key().size() == 32;
  for (int i = 0; i < bundle.gpus_size(); ++i) {
    const v1::GpuEvidence& gpu = bundle.gpus(i);
    const std::string prefix = absl::StrCat("gpu", i, ".");
    NvidiaGpuInput input;
    input.report = ToBytes(gpu.spdm_report());
    input.cert_chain_pem = gpu.cert_chain_pem();
    input.arch = gpu.arch();
    input.ocsp_responses = ocsp_responses;
    if (nonce_usable) {
      input.expected_nonce =
          GpuRequesterNonce(expected_nonce, AsBytes(bundle.enclave_hpke_public_key()), i);
    }
    // The RIMs are chosen by the versions the report states; the verifier then checks that
    // the RIM's identity matches and that the report's signature covers those versions.
    RimDirectory::Choice choice;
    if (rims.has_value()) {
      choice = rims->FillRims(input);
      if (choice.driver) verdict.claims[prefix + "driver_rim.file"] = choice.driver->file;
      if (choice.vbios) verdict.claims[prefix + "vbios_rim.file"] = choice.vbios->file;
    }

    absl::StatusOr<Verdict> part = VerifyNvidiaGpu(input, nvidia, at, prefix);
    if (!part.ok()) {
      verdict.Fail(prefix + "certs.chain", std::string(part.status().message()));
      verdict.pass = false;
      continue;
    }
    // Say where the reference values should have come from.
    for (Check& check : part->checks) {
      if (check.result != Check::kFail) continue;
      std::string why;
      if (check.name == prefix + "rim.driver.signature") {
        why = !rim_problem.empty() ? rim_problem : choice.missing_driver;
      } else if (check.name == prefix + "rim.vbios.signature") {
        why = !rim_problem.empty() ? rim_problem : choice.missing_vbios;
      } else if (check.name == prefix + "certs.ocsp") {
        why = ocsp_problem;
      } else if (check.name == prefix + "nonce" && !nonce_usable) {
        why = "the bundle's nonce or enclave HPKE key has the wrong size";
      }
      if (!why.empty()) check.detail = absl::StrCat(check.detail, " (", why, ")");
    }
    verdict.pass = verdict.pass && part->pass;
    for (Check& check : part->checks) verdict.checks.push_back(std::move(check));
    for (auto& [key, value] : part->claims) verdict.claims[key] = std::move(value);
  }
  return verdict;
}

void EnableNvidiaGpuVerification() {
  static std::once_flag once;
  std::call_once(once, [] {
    RegisterGpuVerifier(v1::GPU_TYPE_NVIDIA_CC,
                        [] { return std::unique_ptr<EvidenceVerifier>(new NvidiaGpuBundleVerifier); });
  });
}

}  // namespace cloister::attest
