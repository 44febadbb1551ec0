#include "attest/cli/verify_cli.h"

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "attest/nvidia/bundle_verifier.h"
#include "attest/nvidia/evidence_json.h"
#include "attest/nvidia/gpu_verifier.h"
#include "attest/policy.h"
#include "attest/snp/snp_verifier.h"
#include "attest/string_view.h"
#include "attest/tdx/tdx_collateral.h"
#include "attest/tdx/tdx_verifier.h"
#include "base/file.h"
#include "base/flags.h"
#include "base/status.h"

namespace cloister::attest {
namespace {

constexpr uint64_t kMaxEvidenceFileSize = 16 << 20;
constexpr size_t kCpuReportDataSize = 64;
constexpr size_t kGpuNonceSize = 32;
constexpr size_t kBundleNonceSize = 32;

constexpr char kUsage[] =
    "usage: cloister-verify SUBCOMMAND [flags]\n"
    "  sev-snp     --report FILE (--vcek FILE --ask-ark FILE | --cert-chain FILE)\n"
    "  tdx         --quote FILE [--collateral FILE]...   (TCB info, QE identity, their\n"
    "              signing chain, root CA CRL, PCK CRL; each file's kind is detected)\n"
    "  nvidia-gpu  (--report FILE --cert-chain FILE | --evidence-json FILE)\n"
    "              [--driver-rim FILE] [--vbios-rim FILE] [--ocsp FILE]...\n"
    "              (without --driver-rim/--vbios-rim: the policy's nvidia.rim_dir)\n"
    "  bundle      FILE   (serialized EvidenceBundle or ChallengeResponse)\n"
    "common flags: --policy FILE  --nonce HEX  --at RFC3339-TIME  --json\n"
    "  --nonce: sev-snp/tdx: the expected REPORT_DATA (up to 64 bytes, zero-padded);\n"
    "           nvidia-gpu/bundle: the 32-byte nonce the evidence was collected over\n"
    "exit status: 0 pass, 1 fail, 2 bad usage or unusable input\n";

// Flags taking a value, by subcommand; --json and --help take none.
const std::map<std::string, std::set<std::string>>& FlagsBySubcommand() {
  static const auto* const kFlags = new std::map<std::string, std::set<std::string>>{
      {"sev-snp", {"report", "vcek", "ask-ark", "cert-chain", "nonce", "policy", "at"}},
      {"tdx", {"quote", "report", "collateral", "nonce", "policy", "at"}},
      {"nvidia-gpu",
       {"report", "cert-chain", "driver-rim", "vbios-rim", "evidence-json", "ocsp", "nonce",
        "policy", "at"}},
      {"bundle", {"nonce", "policy", "at"}},
  };
  return *kFlags;
}

struct Options {
  std::string subcommand;
  std::map<std::string, std::string> flags;
  std::vector<std::string> collateral;  // --collateral may repeat
  std::vector<std::string> ocsp;        // --ocsp may repeat
  std::vector<std::string> positional;
  bool json = false;
  bool help = false;
};

// The flags of a subcommand taking the values `names`: each at most once, except the
// repeatable --collateral and --ocsp; --json and --help take none.
std::vector<FlagSpec> SubcommandFlags(const std::set<std::string>& names, Options& options) {
  std::vector<FlagSpec> specs = {{"--json", SwitchFlag{&options.json}},
                                 {"--help", SwitchFlag{&options.help}}};
  for (const std::string& name : names) {
    if (name == "collateral") {
      specs.push_back({"--collateral", StringListFlag{&options.collateral}});
    } else if (name == "ocsp") {
      specs.push_back({"--ocsp", StringListFlag{&options.ocsp}});
    } else {
      specs.push_back({"--" + name, CustomFlag{[&options, name](const std::string& value) {
                         if (!options.flags.emplace(name, value).second) {
                           return absl::InvalidArgumentError(
                               absl::StrCat("--", name, " is given twice"));
                         }
                         return absl::OkStatus();
                       }}});
    }
  }
  return specs;
}

absl::StatusOr<Options> ParseArgs(const std::vector<std::string>& args) {
  Options options;
  if (args.empty()) return absl::InvalidArgumentError("missing subcommand");
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    options.help = true;
    return options;
  }
  options.subcommand = args[0];
  auto known = FlagsBySubcommand().find(options.subcommand);
  if (known == FlagsBySubcommand().end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown subcommand '", options.subcommand,
                                                   "' (sev-snp, tdx, nvidia-gpu, bundle)"));
  }
  // Whatever does not start with "--" is positional, a lone "-x" too.
  const FlagSyntax syntax{.positional = &options.positional,
                          .flag_prefix = "--",
                          .unknown_flag = [&](const std::string& flag) {
                            return absl::StrCat("unknown flag ", flag, " for ", options.subcommand);
                          }};
  RETURN_IF_ERROR(ParseFlags(std::vector<std::string>(args.begin() + 1, args.end()),
                             SubcommandFlags(known->second, options), syntax));
  if (options.subcommand == "bundle") {
    if (options.positional.size() != 1 && !options.help) {
      return absl::InvalidArgumentError("bundle takes exactly one evidence file");
    }
  } else if (!options.positional.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", options.positional[0],
                                                   "' (flags take the form --name VALUE)"));
  }
  return options;
}

const std::string* Flag(const Options& options, const std::string& name) {
  auto it = options.flags.find(name);
  return it == options.flags.end() ? nullptr : &it->second;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what) {
  auto text = ReadFile(path, kMaxEvidenceFileSize);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat(what, " ", path, ": ", text.status().message()));
  }
  return *std::move(text);
}

absl::StatusOr<absl::Time> VerificationTime(const Options& options) {
  const std::string* at = Flag(options, "at");
  if (at == nullptr) return absl::Now();
  absl::Time time;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, *at, &time, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--at '", *at, "' is not an RFC 3339 time like 2024-06-01T00:00:00Z"));
  }
  return time;
}

// The policy from --policy, or `fallback` when none is given.
absl::StatusOr<Policy> LoadPolicy(const Options& options, Policy fallback) {
  const std::string* path = Flag(options, "policy");
  if (path == nullptr) return fallback;
  return LoadPolicyFile(*path);
}

std::string TeeYamlName(v1::TeeType tee) {
  switch (tee) {
    case v1::TEE_TYPE_SIM:
      return "sim";
    case v1::TEE_TYPE_SEV_SNP:
      return "sev-snp";
    case v1::TEE_TYPE_TDX:
      return "tdx";
    default:
      return "unspecified";
  }
}

// A policy from --policy must be for the TEE being verified.
absl::StatusOr<Policy> LoadCvmPolicy(const Options& options, v1::TeeType tee) {
  Policy fallback;
  fallback.set_name("(none: no --policy given)");
  fallback.set_tee(tee);
  fallback.set_gpu(v1::GPU_TYPE_NONE);
  ASSIGN_OR_RETURN(Policy policy, LoadPolicy(options, fallback));
  if (policy.tee() != tee) {
    return absl::InvalidArgumentError(absl::StrCat("policy '", policy.name(), "' is for tee ",
                                                   TeeYamlName(policy.tee()), ", not ",
                                                   TeeYamlName(tee)));
  }
  return policy;
}

absl::StatusOr<std::optional<Bytes>> ReportDataFromNonce(const Options& options) {
  const std::string* nonce = Flag(options, "nonce");
  if (nonce == nullptr) return std::optional<Bytes>();
  ASSIGN_OR_RETURN(Bytes bytes, ParseNonceFlag(*nonce, kCpuReportDataSize, 0));
  return std::optional<Bytes>(std::move(bytes));
}

absl::StatusOr<Verdict> RunSevSnp(const Options& options, absl::Time at) {
  const std::string* report = Flag(options, "report");
  const std::string* vcek = Flag(options, "vcek");
  const std::string* ask_ark = Flag(options, "ask-ark");
  const std::string* chain = Flag(options, "cert-chain");
  if (report == nullptr) return absl::InvalidArgumentError("sev-snp needs --report FILE");
  if (chain == nullptr && (vcek == nullptr || ask_ark == nullptr)) {
    return absl::InvalidArgumentError(
        "sev-snp needs --vcek FILE and --ask-ark FILE, or --cert-chain FILE (VCEK, ASK[, ARK])");
  }
  if (chain != nullptr && (vcek != nullptr || ask_ark != nullptr)) {
    return absl::InvalidArgumentError("give either --cert-chain or --vcek/--ask-ark, not both");
  }
  ASSIGN_OR_RETURN(Policy policy, LoadCvmPolicy(options, v1::TEE_TYPE_SEV_SNP));
  SnpInput input;
  ASSIGN_OR_RETURN(input.report, ReadEvidenceFile(*report));
  if (chain != nullptr) {
    ASSIGN_OR_RETURN(std::string pem, ReadTextFile(*chain, "certificate chain"));
    SetSnpCertificatesFromChain(pem, input);
  } else {
    ASSIGN_OR_RETURN(std::string vcek_bytes, ReadTextFile(*vcek, "VCEK"));
    input.vcek_der_or_pem = ToBytes(vcek_bytes);
    ASSIGN_OR_RETURN(input.ask_ark_pem, ReadTextFile(*ask_ark, "ASK/ARK chain"));
  }
  ASSIGN_OR_RETURN(input.expected_report_data, ReportDataFromNonce(options));
  return VerifySnpReport(input, policy, at);
}

// Sorts one --collateral file into its slot by its contents.
absl::Status AddCollateral(const std::string& path, TdxCollateral& collateral) {
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, "collateral"));
  absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(text);
  auto set_once = [&](auto& slot, auto value, absl::string_view kind) -> absl::Status {
    if (slot.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("collateral ", path, ": a second ", kind, " was given"));
    }
    slot = std::move(value);
    return absl::OkStatus();
  };
  if (absl::StartsWith(trimmed, "{")) {
    if (absl::StrContains(text, "\"tcbInfo\""))
      return set_once(collateral.tcb_info, text, "TCB info");
    if (absl::StrContains(text, "\"enclaveIdentity\"")) {
      return set_once(collateral.qe_identity, text, "QE identity");
    }
    return absl::InvalidArgumentError(
        absl::StrCat("collateral ", path, ": JSON with neither 'tcbInfo' nor 'enclaveIdentity'"));
  }
  if (absl::StrContains(text, "-----BEGIN CERTIFICATE-----")) {
    if (!collateral.signing_chain_pem.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("collateral ", path, ": a second certificate chain was given"));
    }
    collateral.signing_chain_pem = text;
    return absl::OkStatus();
  }
  auto crl = Crl::Parse(AsBytes(text));
  if (!crl.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("collateral ", path,
                     ": not TCB info, QE identity, a PEM certificate chain or a CRL (DER or PEM)"));
  }
  if (crl->IssuerCommonName() == "Intel SGX Root CA") {
    return set_once(collateral.root_ca_crl, ToBytes(text), "root CA CRL");
  }
  return set_once(collateral.pck_crl, ToBytes(text), "PCK CRL");
}

absl::StatusOr<Verdict> RunTdx(const Options& options, absl::Time at) {
  const std::string* quote = Flag(options, "quote");
  if (quote == nullptr) quote = Flag(options, "report");
  if (quote == nullptr) return absl::InvalidArgumentError("tdx needs --quote FILE");
  if (Flag(options, "quote") != nullptr && Flag(options, "report") != nullptr) {
    return absl::InvalidArgumentError("give the quote once (--quote or --report)");
  }
  ASSIGN_OR_RETURN(Policy policy, LoadCvmPolicy(options, v1::TEE_TYPE_TDX));
  TdxInput input;
  ASSIGN_OR_RETURN(input.quote, ReadEvidenceFile(*quote));
  for (const std::string& path : options.collateral) {
    RETURN_IF_ERROR(AddCollateral(path, input.collateral));
  }
  ASSIGN_OR_RETURN(input.expected_report_data, ReportDataFromNonce(options));
  return VerifyTdxQuote(input, policy, at);
}

void MergeVerdict(Verdict& into, Verdict&& part) {
  for (Check& check : part.checks) into.checks.push_back(std::move(check));
  for (auto& [key, value] : part.claims) into.claims[key] = std::move(value);
}

absl::StatusOr<Verdict> RunNvidiaGpu(const Options& options, absl::Time at, std::ostream& err) {
  const std::string* report = Flag(options, "report");
  const std::string* chain = Flag(options, "cert-chain");
  const std::string* evidence_json = Flag(options, "evidence-json");
  if ((evidence_json != nullptr) == (report != nullptr || chain != nullptr)) {
    return absl::InvalidArgumentError(
        "nvidia-gpu needs either --report FILE and --cert-chain FILE, or --evidence-json FILE");
  }
  if (evidence_json == nullptr && (report == nullptr || chain == nullptr)) {
    return absl::InvalidArgumentError("nvidia-gpu needs both --report FILE and --cert-chain FILE");
  }
  Policy fallback;
  fallback.set_name("(none: no --policy given)");
  fallback.set_gpu(v1::GPU_TYPE_NVIDIA_CC);
  ASSIGN_OR_RETURN(Policy policy, LoadPolicy(options, fallback));
  if (policy.gpu() != v1::GPU_TYPE_NVIDIA_CC) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy '", policy.name(), "' does not expect NVIDIA GPUs (gpu: nvidia-cc)"));
  }
  NvidiaPolicy nvidia = NvidiaPolicyFromPolicy(policy);
  std::optional<Bytes> nonce;
  if (const std::string* hex = Flag(options, "nonce"); hex != nullptr) {
    ASSIGN_OR_RETURN(nonce, ParseNonceFlag(*hex, 0, kGpuNonceSize));
  }

  std::vector<std::pair<NvidiaGpuInput, std::string>> gpus;  // input, check prefix
  if (evidence_json != nullptr) {
    ASSIGN_OR_RETURN(std::string text, ReadTextFile(*evidence_json, "evidence JSON"));
    auto items = ParseNvidiaEvidenceJson(text);
    if (!items.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("evidence JSON ", *evidence_json, ": ", items.status().message()));
    }
    if (!nonce.has_value()) {
      err << "cloister-verify: note: no --nonce; each report is checked against the nonce "
             "recorded in the evidence file, which does not show freshness\n";
    }
    for (size_t i = 0; i < items->size(); ++i) {
      NvidiaGpuInput input;
      input.report = (*items)[i].report;
      input.cert_chain_pem = (*items)[i].cert_chain_pem;
      input.arch = (*items)[i].arch;
      input.expected_nonce = nonce.has_value() ? *nonce : (*items)[i].nonce;
      gpus.emplace_back(std::move(input), absl::StrCat("gpu", i, "."));
    }
  } else {
    NvidiaGpuInput input;
    ASSIGN_OR_RETURN(input.report, ReadEvidenceFile(*report));
    ASSIGN_OR_RETURN(input.cert_chain_pem, ReadTextFile(*chain, "certificate chain"));
    input.expected_nonce = nonce;
    gpus.emplace_back(std::move(input), "");
  }
  std::optional<std::string> driver_rim, vbios_rim;
  if (const std::string* path = Flag(options, "driver-rim"); path != nullptr) {
    ASSIGN_OR_RETURN(driver_rim, ReadTextFile(*path, "driver RIM"));
  }
  if (const std::string* path = Flag(options, "vbios-rim"); path != nullptr) {
    ASSIGN_OR_RETURN(vbios_rim, ReadTextFile(*path, "VBIOS RIM"));
  }

  // Without RIM files on the command line, the policy's RIM directory supplies them by the
  // versions each report states (the verifier then checks identity and signature).
  std::optional<RimDirectory> rim_dir;
  if ((!driver_rim.has_value() || !vbios_rim.has_value()) && !policy.nvidia().rim_dir().empty()) {
    auto loaded = LoadRimDirectory(policy.nvidia().rim_dir());
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("policy nvidia.rim_dir: ",
                                                     loaded.status().message()));
    }
    rim_dir = *std::move(loaded);
  }
  std::vector<Bytes> ocsp;
  if (!policy.nvidia().ocsp_dir().empty()) {
    auto loaded = LoadOcspDirectory(policy.nvidia().ocsp_dir());
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("policy nvidia.ocsp_dir: ",
                                                     loaded.status().message()));
    }
    ocsp = *std::move(loaded);
  }
  for (const std::string& path : options.ocsp) {
    auto der = ReadFile(path, kMaxOcspResponseSize);
    if (!der.ok()) {
      return absl::Status(der.status().code(),
                          absl::StrCat("OCSP response ", path, ": ", der.status().message()));
    }
    ocsp.push_back(ToBytes(*der));
  }

  Verdict verdict;
  verdict.pass = !gpus.empty();
  for (auto& [input, prefix] : gpus) {
    input.driver_rim_xml = driver_rim;
    input.vbios_rim_xml = vbios_rim;
    input.ocsp_responses = ocsp;
    if (rim_dir.has_value()) rim_dir->FillRims(input);
    ASSIGN_OR_RETURN(Verdict part, VerifyNvidiaGpu(input, nvidia, at, prefix));
    verdict.pass = verdict.pass && part.pass;
    MergeVerdict(verdict, std::move(part));
  }
  return verdict;
}

absl::StatusOr<Verdict> RunBundle(const Options& options, absl::Time at, std::ostream& err) {
  const std::string& path = options.positional[0];
  if (Flag(options, "policy") == nullptr) {
    return absl::InvalidArgumentError("bundle needs --policy FILE");
  }
  ASSIGN_OR_RETURN(Policy policy, LoadPolicyFile(*Flag(options, "policy")));
  ASSIGN_OR_RETURN(Bytes bytes, ReadEvidenceFile(path));
  std::optional<Bytes> nonce;
  if (const std::string* hex = Flag(options, "nonce"); hex != nullptr) {
    ASSIGN_OR_RETURN(nonce, ParseNonceFlag(*hex, 0, kBundleNonceSize));
  }
  const std::string serialized = ToString(bytes);
  // A ChallengeResponse starts with field 1 as bytes (tag 0x0A); an EvidenceBundle with field
  // 1 as an enum (tag 0x08) or, with tee_type unset, a later field.
  if (!bytes.empty() && bytes[0] == 0x0A) {
    ChallengeResponse response;
    if (!response.ParseFromString(serialized)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bundle ", path, ": not a serialized ChallengeResponse"));
    }
    if (!nonce.has_value()) {
      return absl::InvalidArgumentError(
          "a challenge response is verified against the client's nonce: give --nonce HEX");
    }
    return VerifyChallenge(response, *nonce, policy, at);
  }
  EvidenceBundle bundle;
  if (!bundle.ParseFromString(serialized)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bundle ", path, ": not a serialized EvidenceBundle or ChallengeResponse"));
  }
  if (!nonce.has_value()) {
    err << "cloister-verify: note: no --nonce; the bundle is checked against its own nonce, "
           "which does not show freshness\n";
  }
  Bytes expected = nonce.has_value() ? *nonce : ToBytes(bundle.nonce());
  return VerifyBundle(bundle, expected, policy, at);
}

std::string Upper(Check::Result result) {
  switch (result) {
    case Check::kPass:
      return "PASS";
    case Check::kFail:
      return "FAIL";
    case Check::kSkipped:
      return "SKIP";
  }
  return "FAIL";
}

}  // namespace

absl::StatusOr<Bytes> ReadEvidenceFile(const std::string& path) {
  auto text = ReadFile(path, kMaxEvidenceFileSize);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("evidence file ", path, ": ", text.status().message()));
  }
  std::string hex;
  bool is_hex = true;
  for (char c : *text) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) continue;
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      is_hex = false;
      break;
    }
    hex.push_back(c);
  }
  if (is_hex && !hex.empty() && hex.size() % 2 == 0) {
    auto bytes = HexDecode(hex);
    if (bytes.ok()) return *std::move(bytes);
  }
  if (text->empty())
    return absl::InvalidArgumentError(absl::StrCat("evidence file ", path, " is empty"));
  return ToBytes(*text);
}

absl::StatusOr<Bytes> ParseNonceFlag(std::string_view hex, size_t padded_size, size_t exact_size) {
  std::string text(absl::StripAsciiWhitespace(Sv(hex)));
  if (absl::StartsWith(text, "0x")) text = text.substr(2);
  auto bytes = HexDecode(text);
  if (!bytes.ok() || bytes->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--nonce '", Sv(hex), "' is not hex"));
  }
  if (padded_size > 0) {
    if (bytes->size() > padded_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nonce is ", bytes->size(), " bytes; at most ", padded_size, " fit the report data"));
    }
    bytes->resize(padded_size, 0);
  } else if (bytes->size() != exact_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nonce is ", bytes->size(), " bytes, expected ", exact_size));
  }
  return bytes;
}

std::string FormatVerdictText(const Verdict& verdict, std::string_view title) {
  std::string out = absl::StrCat(Sv(title), ": ", verdict.pass ? "PASS" : "FAIL", "\n");
  size_t width = 0;
  for (const Check& check : verdict.checks) width = std::max(width, check.name.size());
  for (const Check& check : verdict.checks) {
    absl::StrAppend(&out, "  ", Upper(check.result), "  ", check.name,
                    std::string(width - check.name.size(), ' '), "  ", check.detail, "\n");
  }
  if (!verdict.claims.empty()) {
    absl::StrAppend(&out, "claims:\n");
    for (const auto& [key, value] : verdict.claims) {
      absl::StrAppend(&out, "  ", key, " = ", value, "\n");
    }
  }
  return out;
}

std::string FormatVerdictJson(const Verdict& verdict) {
  nlohmann::ordered_json json;
  json["verdict"] = verdict.pass ? "pass" : "fail";
  json["checks"] = nlohmann::ordered_json::array();
  for (const Check& check : verdict.checks) {
    nlohmann::ordered_json item;
    item["name"] = check.name;
    item["result"] = std::string(CheckResultName(check.result));
    item["detail"] = check.detail;
    json["checks"].push_back(std::move(item));
  }
  json["claims"] = nlohmann::ordered_json::object();
  for (const auto& [key, value] : verdict.claims) json["claims"][key] = value;
  // Evidence bytes may reach a detail; never let bad UTF-8 throw.
  return json.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

int RunVerifyCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  auto fail = [&](const absl::Status& status) {
    err << "cloister-verify: " << status.message() << "\n";
    return kExitUsage;
  };
  EnableNvidiaGpuVerification();
  auto options = ParseArgs(args);
  if (!options.ok()) {
    err << "cloister-verify: " << options.status().message()
        << " (cloister-verify --help for usage)\n";
    return kExitUsage;
  }
  if (options->help) {
    out << kUsage;
    return kExitPass;
  }
  auto at = VerificationTime(*options);
  if (!at.ok()) return fail(at.status());

  absl::StatusOr<Verdict> verdict;
  if (options->subcommand == "sev-snp") {
    verdict = RunSevSnp(*options, *at);
  } else if (options->subcommand == "tdx") {
    verdict = RunTdx(*options, *at);
  } else if (options->subcommand == "nvidia-gpu") {
    verdict = RunNvidiaGpu(*options, *at, err);
  } else {
    verdict = RunBundle(*options, *at, err);
  }
  if (!verdict.ok()) return fail(verdict.status());

  if (options->json) {
    out << FormatVerdictJson(*verdict);
  } else {
    out << FormatVerdictText(
        *verdict, absl::StrCat(options->subcommand, " at ",
                               absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", *at, absl::UTCTimeZone())));
  }
  return verdict->pass ? kExitPass : kExitFail;
}

}  // namespace cloister::attest
