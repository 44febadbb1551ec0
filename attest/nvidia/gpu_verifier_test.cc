#include "attest/nvidia/gpu_verifier.h"

#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "attest/nvidia/base64.h"
#include "attest/nvidia/evidence_json.h"
#include "attest/nvidia/test_pki.h"
#include "crypto/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using ::cloister::attest::testing::MakeTestDevicePki;
using ::cloister::attest::testing::MakeTestOcspResponse;
using ::cloister::attest::testing::MakeTestReport;
using ::cloister::attest::testing::MakeTestRim;
using ::cloister::attest::testing::MakeTestRimPki;
using ::cloister::attest::testing::ParseTestTime;
using ::cloister::attest::testing::ReadNvidiaHex;
using ::cloister::attest::testing::ReadNvidiaText;
using ::cloister::attest::testing::SignTestReport;
using ::cloister::attest::testing::SignTestRim;
using ::cloister::attest::testing::TestDevicePki;
using ::cloister::attest::testing::TestDigest;
using ::cloister::attest::testing::TestOcspStatus;
using ::cloister::attest::testing::TestReportSpec;
using ::cloister::attest::testing::TestRimPki;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kE2e[] = "hopper-545.00-e2e";
constexpr char kNonce545[] = "4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e";
constexpr char kNonceSdk[] = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb";
constexpr char kProdVbios545[] = "rims/nvtrust-vbios/1010_0200_882_96005E0001_PROD.swidtag";

// The order the checks run in (gpu_verifier.h).
const std::vector<std::string> kCheckOrder = {"report.parse",
                                              "report.signature",
                                              "certs.chain",
                                              "certs.fwid",
                                              "arch",
                                              "nonce",
                                              "rim.driver.signature",
                                              "rim.driver.identity",
                                              "rim.vbios.signature",
                                              "rim.vbios.identity",
                                              "measurements",
                                              "versions",
                                              "certs.ocsp"};

Bytes Hex(const std::string& hex) { return *HexDecode(hex); }

Verdict Verify(const NvidiaGpuInput& input, const NvidiaPolicy& policy, absl::Time at,
               std::string_view prefix = "") {
  auto verdict = VerifyNvidiaGpu(input, policy, at, prefix);
  EXPECT_TRUE(verdict.ok()) << verdict.status();
  return verdict.ok() ? *verdict : Verdict();
}

Check::Result ResultOf(const Verdict& verdict, const std::string& name) {
  const Check* check = verdict.Find(name);
  EXPECT_NE(check, nullptr) << "no check " << name;
  return check != nullptr ? check->result : Check::kFail;
}

std::string DetailOf(const Verdict& verdict, const std::string& name) {
  const Check* check = verdict.Find(name);
  return check != nullptr ? check->detail : std::string();
}

// Names of the checks that did not pass.
std::set<std::string> NotPassed(const Verdict& verdict) {
  std::set<std::string> out;
  for (const Check& check : verdict.checks) {
    if (check.result != Check::kPass) out.insert(check.name);
  }
  return out;
}

std::string Describe(const Verdict& verdict) {
  std::string out;
  for (const Check& check : verdict.checks) {
    absl::StrAppend(&out, "\n  ", check.name, " ", std::string(CheckResultName(check.result)), ": ",
                    check.detail);
  }
  return out;
}

NvidiaGpuInput E2eInput(bool with_rims = true) {
  NvidiaGpuInput input;
  input.report = ReadNvidiaHex(std::string(kE2e) + "/attestation_report.hex");
  input.cert_chain_pem = ReadNvidiaText(std::string(kE2e) + "/cert_chain.pem");
  if (with_rims) {
    input.driver_rim_xml = ReadNvidiaText(std::string(kE2e) + "/driver_rim_545.00_test.swidtag");
    input.vbios_rim_xml = ReadNvidiaText(std::string(kE2e) + "/vbios_rim_96005E0001_test.swidtag");
  }
  input.expected_nonce = Hex(kNonce545);
  input.arch = "HOPPER";
  return input;
}

absl::Time In2024() { return ParseTestTime("2024-06-01T00:00:00Z"); }

// ---- the complete positive vector ----

TEST(NvidiaGpuVerifierTest, Hopper545PassesWithBothRims) {
  Verdict verdict = Verify(E2eInput(), NvidiaPolicy(), In2024());
  EXPECT_TRUE(verdict.pass) << Describe(verdict);
  std::vector<std::string> names;
  for (const Check& check : verdict.checks) names.push_back(check.name);
  EXPECT_EQ(names, kCheckOrder);
  EXPECT_EQ(NotPassed(verdict), std::set<std::string>{"certs.ocsp"});
  EXPECT_EQ(DetailOf(verdict, "certs.ocsp"), "offline: no OCSP response supplied");
  EXPECT_EQ(DetailOf(verdict, "certs.fwid"),
            "the report carries no FWID (older firmware): nothing to match");
  EXPECT_EQ(DetailOf(verdict, "measurements"),
            "32 of 32 reference measurements match (index 35 skipped: NVDEC0 is disabled)");

  Json expected = Json::parse(ReadNvidiaText(std::string(kE2e) + "/expected.json"));
  const auto& claims = verdict.claims;
  EXPECT_EQ(claims.at("ueid"), expected["ueid_leaf_serial_decimal"]);
  EXPECT_EQ(claims.at("hwmodel"), expected["hwmodel_cert1_cn"]);
  EXPECT_EQ(claims.at("driver_version"), expected["opaque"]["driver_version"]);
  EXPECT_EQ(claims.at("vbios_version"), expected["opaque"]["vbios_version"]);
  EXPECT_EQ(claims.at("driver_rim.id"), expected["driver_rim_id"]);
  EXPECT_EQ(claims.at("vbios_rim.id"), expected["vbios_rim_id"]);
  EXPECT_EQ(claims.at("driver_rim.version"), "545.00");
  EXPECT_EQ(claims.at("vbios_rim.version"), "96.00.5E.00.01");
  EXPECT_EQ(claims.at("driver_rim.oemid"), "5703");
  EXPECT_EQ(claims.at("driver_rim.signer"), "HCC RIM L4 Signer");
  EXPECT_EQ(claims.at("driver_rim.expires"), "2025-06-26T06:10:12Z");
  EXPECT_EQ(claims.at("vbios_rim.expires"), "2025-06-22T09:38:54Z");
  EXPECT_EQ(claims.at("nonce"), kNonce545);
  EXPECT_EQ(claims.at("arch"), "HOPPER");
  EXPECT_EQ(claims.at("chip"), "GH100");
  EXPECT_EQ(claims.at("cc_mode"), "spt");
  EXPECT_EQ(claims.at("nvdec0"), "disabled");
  EXPECT_EQ(claims.at("measres"), "success");
  EXPECT_EQ(claims.at("project"), "1010");
  EXPECT_EQ(claims.at("board_id"), "945");
  EXPECT_EQ(claims.at("certs.expires"), "9999-12-31T23:59:59Z");
  EXPECT_EQ(claims.count("fwid"), 0u);
  std::vector<int> measured;
  for (const auto& [key, value] : claims) {
    if (absl::StartsWith(key, "measurement.")) {
      int index = 0;
      ASSERT_TRUE(absl::SimpleAtoi(key.substr(12), &index));
      measured.push_back(index);
      EXPECT_EQ(value.size(), 96u);
    }
  }
  EXPECT_EQ(measured, expected["nonzero_measurement_block_indices"].get<std::vector<int>>());
}

TEST(NvidiaGpuVerifierTest, PrefixNamesEveryCheckAndClaim) {
  Verdict verdict = Verify(E2eInput(), NvidiaPolicy(), In2024(), "gpu3.");
  EXPECT_TRUE(verdict.pass) << Describe(verdict);
  for (const Check& check : verdict.checks) EXPECT_TRUE(absl::StartsWith(check.name, "gpu3."));
  for (const auto& [key, value] : verdict.claims) EXPECT_TRUE(absl::StartsWith(key, "gpu3."));
  EXPECT_EQ(verdict.claims.at("gpu3.driver_version"), "545.00");
}

TEST(NvidiaGpuVerifierTest, ProductionVbiosRimFailsMeasurementsAt1_2_3_9) {
  NvidiaGpuInput input = E2eInput();
  input.vbios_rim_xml = ReadNvidiaText(kProdVbios545);
  Verdict verdict = Verify(input, NvidiaPolicy(), In2024());
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(NotPassed(verdict), (std::set<std::string>{"measurements", "certs.ocsp"}))
      << Describe(verdict);
  EXPECT_THAT(DetailOf(verdict, "measurements"), HasSubstr("mismatch at indices 1, 2, 3, 9"));
  EXPECT_THAT(DetailOf(verdict, "measurements"), HasSubstr("vbios 1, 2, 3, 9"));
  EXPECT_EQ(verdict.claims.at("mismatched_indices"), "1, 2, 3, 9");
  EXPECT_EQ(verdict.claims.at("measres"), "fail");
}

TEST(NvidiaGpuVerifierTest, ExpiredRimSignersFailUnlessAllowed) {
  const absl::Time later = ParseTestTime("2026-01-01T00:00:00Z");
  Verdict verdict = Verify(E2eInput(), NvidiaPolicy(), later);
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(ResultOf(verdict, "rim.driver.signature"), Check::kFail);
  EXPECT_THAT(DetailOf(verdict, "rim.driver.signature"), HasSubstr("expired on 2025-06-26"));
  EXPECT_THAT(DetailOf(verdict, "rim.vbios.signature"), HasSubstr("expired on 2025-06-22"));
  // Only the RIM signatures and what depends on their authenticity fail; device certs last
  // until 9999.
  EXPECT_EQ(ResultOf(verdict, "certs.chain"), Check::kPass);
  EXPECT_THAT(DetailOf(verdict, "measurements"), HasSubstr("not authenticated"));

  NvidiaPolicy lenient;
  lenient.allow_expired_rim = true;
  verdict = Verify(E2eInput(), lenient, later);
  EXPECT_TRUE(verdict.pass) << Describe(verdict);
  EXPECT_THAT(DetailOf(verdict, "rim.driver.signature"),
              HasSubstr("accepted because the policy allows expired RIM signers"));
}

TEST(NvidiaGpuVerifierTest, MissingRimsFailAndNameTheIds) {
  Verdict verdict = Verify(E2eInput(/*with_rims=*/false), NvidiaPolicy(), In2024());
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(DetailOf(verdict, "rim.driver.signature"),
            "no driver RIM was supplied (NVIDIA publishes it as NV_GPU_DRIVER_GH100_545.00)");
  EXPECT_EQ(DetailOf(verdict, "rim.vbios.signature"),
            "no vbios RIM was supplied (NVIDIA publishes it as "
            "NV_GPU_VBIOS_1010_0200_882_96005E0001)");
  EXPECT_EQ(ResultOf(verdict, "rim.driver.identity"), Check::kSkipped);
  EXPECT_EQ(DetailOf(verdict, "measurements"),
            "not compared: no driver RIM was supplied and no vbios RIM was supplied");
}

TEST(NvidiaGpuVerifierTest, SwappedRimsFailIdentity) {
  NvidiaGpuInput input = E2eInput();
  std::swap(input.driver_rim_xml, input.vbios_rim_xml);
  Verdict verdict = Verify(input, NvidiaPolicy(), In2024());
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(ResultOf(verdict, "rim.driver.signature"), Check::kPass);
  EXPECT_EQ(ResultOf(verdict, "rim.driver.identity"), Check::kFail);
  EXPECT_THAT(DetailOf(verdict, "rim.driver.identity"),
              HasSubstr("version '96.00.5E.00.01' but the report says '545.00'"));
  EXPECT_EQ(ResultOf(verdict, "rim.vbios.identity"), Check::kFail);
}

TEST(NvidiaGpuVerifierTest, VersionAllowLists) {
  NvidiaPolicy policy;
  policy.allowed_driver_versions = {"550.90.07", "545.00"};
  policy.allowed_vbios_versions = {"96.00.5e.00.01"};
  Verdict verdict = Verify(E2eInput(), policy, In2024());
  EXPECT_TRUE(verdict.pass) << Describe(verdict);
  policy.allowed_driver_versions = {"550.90.07"};
  verdict = Verify(E2eInput(), policy, In2024());
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(NotPassed(verdict), (std::set<std::string>{"versions", "certs.ocsp"}));
  EXPECT_EQ(DetailOf(verdict, "versions"), "driver 545.00 is not among the allowed 550.90.07");
}

TEST(NvidiaGpuVerifierTest, NonceRules) {
  NvidiaGpuInput input = E2eInput();
  input.expected_nonce = Hex(kNonceSdk);
  Verdict verdict = Verify(input, NvidiaPolicy(), In2024());
  EXPECT_EQ(NotPassed(verdict), (std::set<std::string>{"nonce", "certs.ocsp"}));
  EXPECT_THAT(DetailOf(verdict, "nonce"), HasSubstr(kNonce545));

  input.expected_nonce.reset();
  verdict = Verify(input, NvidiaPolicy(), In2024());
  EXPECT_EQ(ResultOf(verdict, "nonce"), Check::kSkipped);
  EXPECT_FALSE(verdict.pass);  // freshness is required by default
  NvidiaPolicy no_nonce;
  no_nonce.require_nonce = false;
  verdict = Verify(input, no_nonce, In2024());
  EXPECT_TRUE(verdict.pass) << Describe(verdict);

  input.expected_nonce = Bytes(31, 0);
  auto refused = VerifyNvidiaGpu(input, NvidiaPolicy(), In2024());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NvidiaGpuVerifierTest, RequiredOcspWithoutResponsesFails) {
  NvidiaPolicy policy;
  policy.require_ocsp = true;
  Verdict verdict = Verify(E2eInput(), policy, In2024());
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(ResultOf(verdict, "certs.ocsp"), Check::kFail);
}

TEST(NvidiaGpuVerifierTest, UnusablePolicyIsAnError) {
  NvidiaPolicy policy;
  policy.device_root_pem = "not a certificate";
  EXPECT_EQ(VerifyNvidiaGpu(E2eInput(), policy, In2024()).status().code(),
            absl::StatusCode::kInvalidArgument);
  policy = NvidiaPolicy();
  policy.corim_root_pem = "";
  EXPECT_EQ(VerifyNvidiaGpu(E2eInput(), policy, In2024()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- mutations of the real vector ----

TEST(NvidiaGpuVerifierMutationTest, FlippedSignatureByte) {
  NvidiaGpuInput input = E2eInput();
  input.report.back() ^= 0x01;
  Verdict verdict = Verify(input, NvidiaPolicy(), In2024());
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(NotPassed(verdict), (std::set<std::string>{"report.signature", "certs.ocsp"}));
}

TEST(NvidiaGpuVerifierMutationTest, FlippedNonceByte) {
  NvidiaGpuInput input = E2eInput();
  input.report[4] ^= 0x01;  // first byte of the requester nonce
  Verdict verdict = Verify(input, NvidiaPolicy(), In2024());
  EXPECT_EQ(NotPassed(verdict), (std::set<std::string>{"report.signature", "nonce", "certs.ocsp"}));
}

TEST(NvidiaGpuVerifierMutationTest, FlippedMeasurementByte) {
  NvidiaGpuInput input = E2eInput();
  // Block 8 (RIM index 7) starts at 45 + 7 * 55; its digest 7 bytes further.
  input.report[45 + 7 * 55 + 7] ^= 0x01;
  Verdict verdict = Verify(input, NvidiaPolicy(), In2024());
  EXPECT_EQ(NotPassed(verdict),
            (std::set<std::string>{"report.signature", "measurements", "certs.ocsp"}));
  EXPECT_THAT(DetailOf(verdict, "measurements"), HasSubstr("mismatch at indices 7 (driver 7;"));
}

TEST(NvidiaGpuVerifierMutationTest, ReorderedChain) {
  NvidiaGpuInput input = E2eInput();
  auto chain = ParsePemChain(input.cert_chain_pem);
  ASSERT_TRUE(chain.ok());
  std::swap((*chain)[0], (*chain)[1]);
  input.cert_chain_pem = ChainToPem(*chain);
  Verdict verdict = Verify(input, NvidiaPolicy(), In2024());
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(ResultOf(verdict, "certs.chain"), Check::kFail);
  EXPECT_EQ(ResultOf(verdict, "report.signature"), Check::kFail);
  EXPECT_EQ(verdict.claims.at("hwmodel"), "GH100 A01 GSP FMC LF");  // chain[1] is the leaf now
}

TEST(NvidiaGpuVerifierMutationTest, DeviceSuppliedRootIsNeverTrusted) {
  // Replace the real chain by a synthetic one with the same names whose root the device
  // "sends": the pinned NVIDIA root does not anchor it.
  TestDevicePki pki = MakeTestDevicePki();
  NvidiaGpuInput input = E2eInput();
  input.cert_chain_pem = pki.ChainPem();
  Verdict verdict = Verify(input, NvidiaPolicy(), In2024());
  EXPECT_EQ(ResultOf(verdict, "certs.chain"), Check::kFail);
  EXPECT_THAT(DetailOf(verdict, "certs.chain"),
              HasSubstr("pinned root 'NVIDIA Device Identity CA'"));
}

TEST(NvidiaGpuVerifierMutationTest, TruncatedReport) {
  NvidiaGpuInput input = E2eInput();
  input.report.resize(input.report.size() - 1);
  Verdict verdict = Verify(input, NvidiaPolicy(), In2024());
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(ResultOf(verdict, "report.parse"), Check::kFail);
  EXPECT_EQ(ResultOf(verdict, "report.signature"), Check::kSkipped);
  EXPECT_EQ(ResultOf(verdict, "measurements"), Check::kSkipped);
  EXPECT_EQ(ResultOf(verdict, "certs.chain"), Check::kPass);
}

TEST(NvidiaGpuVerifierMutationTest, GarbageChain) {
  NvidiaGpuInput input = E2eInput();
  input.cert_chain_pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  Verdict verdict = Verify(input, NvidiaPolicy(), In2024());
  EXPECT_FALSE(verdict.pass);
  for (const char* name : {"report.signature", "certs.chain", "certs.fwid", "arch"}) {
    EXPECT_EQ(ResultOf(verdict, name), Check::kFail) << name;
  }
}

// ---- the other real captures, as their expected.json say ----

struct RealVector {
  std::string folder;
  std::string report_file;
  std::string nonce;
};

void ExpectReportFacts(const Verdict& verdict, const Json& expected) {
  const auto& claims = verdict.claims;
  EXPECT_EQ(ResultOf(verdict, "report.parse"), Check::kPass);
  EXPECT_EQ(ResultOf(verdict, "report.signature") == Check::kPass,
            expected["report_signature_valid"].get<bool>());
  EXPECT_EQ(ResultOf(verdict, "certs.chain") == Check::kPass,
            expected["cert_chain_signatures_valid_to_pinned_root"].get<bool>());
  if (expected["fwid_match"].is_boolean()) {
    EXPECT_EQ(ResultOf(verdict, "certs.fwid") == Check::kPass, expected["fwid_match"].get<bool>());
  } else {  // "no FWID field in report"
    EXPECT_EQ(ResultOf(verdict, "certs.fwid"), Check::kPass);
    EXPECT_EQ(claims.count("fwid"), 0u);
  }
  EXPECT_EQ(claims.at("ueid"), expected["ueid_leaf_serial_decimal"]);
  EXPECT_EQ(claims.at("hwmodel"), expected["hwmodel_cert1_cn"]);
  EXPECT_EQ(claims.at("nonce"), expected["request"]["nonce"]);
  EXPECT_EQ(claims.at("driver_rim.id"), expected["driver_rim_id"]);
  EXPECT_EQ(claims.at("vbios_rim.id"), expected["vbios_rim_id"]);
  const Json& opaque = expected["opaque"];
  EXPECT_EQ(claims.at("driver_version"), opaque["driver_version"]);
  EXPECT_EQ(claims.at("vbios_version"), opaque["vbios_version"]);
  EXPECT_EQ(claims.at("project"), opaque["project"]);
  EXPECT_EQ(claims.at("project_sku"), opaque["project_sku"]);
  EXPECT_EQ(claims.at("chip_sku"), opaque["chip_sku"]);
  EXPECT_EQ(claims.at("board_id"), absl::StrCat(opaque["board_id"].get<int>()));
  EXPECT_EQ(claims.at("nvdec0"), opaque["nvdec0_status"] == "0x55" ? "disabled" : "enabled");
  if (opaque.contains("fwid")) {
    EXPECT_EQ(claims.at("fwid"), opaque["fwid"]);
  }
  if (opaque.contains("protected_pcie_status")) {
    EXPECT_EQ(claims.at("protected_pcie"),
              opaque["protected_pcie_status"] == "0xaa" ? "on" : "off");
  }
  std::vector<int> measured;
  for (const auto& [key, value] : claims) {
    if (absl::StartsWith(key, "measurement.")) measured.push_back(std::stoi(key.substr(12)));
  }
  EXPECT_EQ(measured, expected["nonzero_measurement_block_indices"].get<std::vector<int>>());
}

void ExpectChainNames(const std::string& pem, const Json& expected) {
  auto chain = ParsePemChain(pem);
  ASSERT_TRUE(chain.ok());
  std::vector<std::string> names;
  for (const Certificate& cert : *chain) names.push_back(cert.SubjectCommonName());
  EXPECT_EQ(names, expected["cert_chain_subject_cns"].get<std::vector<std::string>>());
}

TEST(NvidiaGpuVerifierRealTest, Hopper550NrasCapture) {
  const std::string folder = "hopper-550.90.07-nras";
  Json expected = Json::parse(ReadNvidiaText(folder + "/expected.json"));
  NvidiaGpuInput input;
  input.report = ReadNvidiaHex(folder + "/attestation_report.hex");
  input.cert_chain_pem = ReadNvidiaText(folder + "/cert_chain.pem");
  input.expected_nonce = Hex(expected["request"]["nonce"]);
  ASSERT_EQ(input.report.size(), expected["total_length"].get<size_t>());
  Verdict verdict = Verify(input, NvidiaPolicy(), ParseTestTime("2025-06-11T00:00:00Z"));
  ExpectReportFacts(verdict, expected);
  ExpectChainNames(input.cert_chain_pem, expected);
  EXPECT_EQ(ResultOf(verdict, "nonce"), Check::kPass);
  EXPECT_EQ(ResultOf(verdict, "arch"), Check::kPass);
  // No public RIMs exist for it: the verdict cannot pass offline, and says what to fetch.
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(
      NotPassed(verdict),
      (std::set<std::string>{"rim.driver.signature", "rim.driver.identity", "rim.vbios.signature",
                             "rim.vbios.identity", "measurements", "certs.ocsp"}));
  EXPECT_THAT(DetailOf(verdict, "rim.driver.signature"),
              HasSubstr("NV_GPU_DRIVER_GH100_550.90.07"));

  // What NVIDIA's NRAS said about the same evidence agrees with our claims.
  Json nras = Json::parse(ReadNvidiaText(folder + "/nras_claims_v3_decoded.json"))["GPU-0"];
  EXPECT_EQ(verdict.claims.at("ueid"), nras["ueid"]);
  EXPECT_EQ(verdict.claims.at("hwmodel"), nras["hwmodel"]);
  EXPECT_EQ(verdict.claims.at("driver_version"), nras["x-nvidia-gpu-driver-version"]);
  EXPECT_EQ(verdict.claims.at("vbios_version"), nras["x-nvidia-gpu-vbios-version"]);
  EXPECT_EQ(verdict.claims.at("nonce"), nras["eat_nonce"]);
  EXPECT_EQ(verdict.claims.at("certs.expires"),
            nras["x-nvidia-gpu-attestation-report-cert-chain"]["x-nvidia-cert-expiration-date"]);

  // The detached EAT: the overall token's submodule digest is the SHA-256 of the GPU token,
  // and its eat_nonce is the report's nonce (expected.json "nras_eat").
  Json eat = Json::parse(ReadNvidiaText(folder + "/nras_detached_eat_v3.json"));
  const std::string overall = eat[0][1];
  const std::string gpu_token = eat[1]["GPU-0"];
  std::vector<std::string> parts = absl::StrSplit(overall, '.');
  ASSERT_EQ(parts.size(), 3u);
  std::string payload = parts[1];
  for (char& c : payload) c = c == '-' ? '+' : c == '_' ? '/' : c;
  while (payload.size() % 4 != 0) payload.push_back('=');
  auto decoded = Base64Decode(payload);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  Json claims = Json::parse(ToString(*decoded));
  const Json& want = expected["nras_eat"]["overall_claims"];
  EXPECT_EQ(claims["sub"], want["sub"]);
  EXPECT_EQ(claims["x-nvidia-overall-att-result"], want["x-nvidia-overall-att-result"]);
  EXPECT_EQ(claims["eat_nonce"], want["eat_nonce"]);
  EXPECT_EQ(claims["eat_nonce"], verdict.claims.at("nonce"));
  EXPECT_EQ(claims["submods"]["GPU-0"][1][1], want["submods"]["GPU-0"][1][1]);
  EXPECT_EQ(claims["submods"]["GPU-0"][1][1], HexEncode(crypto::Sha256(AsBytes(gpu_token))));
}

TEST(NvidiaGpuVerifierRealTest, InvalidSignatureSample) {
  const std::string folder = "attestation-sdk-samples/hopper-invalid-signature";
  Json expected = Json::parse(ReadNvidiaText(folder + "/expected.json"));
  NvidiaGpuInput input;
  input.report = ReadNvidiaHex(folder + "/attestation_report_BAD_SIGNATURE.hex");
  input.cert_chain_pem = ReadNvidiaText(folder + "/cert_chain.pem");
  input.expected_nonce = Hex(expected["request"]["nonce"]);
  Verdict verdict = Verify(input, NvidiaPolicy(), ParseTestTime("2025-06-01T00:00:00Z"));
  EXPECT_FALSE(verdict.pass);
  ExpectReportFacts(verdict, expected);
  ExpectChainNames(input.cert_chain_pem, expected);
  EXPECT_EQ(ResultOf(verdict, "report.signature"), Check::kFail);
  EXPECT_THAT(DetailOf(verdict, "report.signature"), HasSubstr("does not verify"));
  EXPECT_EQ(ResultOf(verdict, "certs.fwid"), Check::kFail);
  EXPECT_EQ(verdict.claims.at("cc_mode"), "ppcie");  // protected PCIe on
}

TEST(NvidiaGpuVerifierRealTest, Hopper535WithItsRims) {
  const std::string folder = "attestation-sdk-samples/hopper-535.86.09";
  Json expected = Json::parse(ReadNvidiaText(folder + "/expected.json"));
  NvidiaGpuInput input;
  input.report = ReadNvidiaHex(folder + "/attestation_report.hex");
  input.cert_chain_pem = ReadNvidiaText(folder + "/cert_chain.pem");
  input.driver_rim_xml =
      ReadNvidiaText(folder + "/driver_rim_535.86.09_TAMPERED_measurement_mismatch.xml");
  input.vbios_rim_xml = ReadNvidiaText(folder + "/vbios_rim_96005E0001_measurement_mismatch.xml");
  input.expected_nonce = Hex(expected["request"]["nonce"]);
  Verdict verdict = Verify(input, NvidiaPolicy(), ParseTestTime("2025-06-01T00:00:00Z"));
  EXPECT_FALSE(verdict.pass);
  ExpectReportFacts(verdict, expected);
  ExpectChainNames(input.cert_chain_pem, expected);
  EXPECT_EQ(NotPassed(verdict),
            (std::set<std::string>{"rim.driver.signature", "measurements", "certs.ocsp"}))
      << Describe(verdict);
  EXPECT_THAT(DetailOf(verdict, "measurements"), HasSubstr("the driver RIM is not authenticated"));
  EXPECT_THAT(DetailOf(verdict, "measurements"),
              HasSubstr("mismatch at indices 7, 9, 21, 22, 25, 26, 27, 29, 30, 31, 32, 34, 37, "
                        "39, 40, 41 (driver 7, 21, 22, 25, 26, 27, 29, 30, 31, 32, 34, 37, 39, "
                        "40, 41; vbios 9;"));
}

TEST(NvidiaGpuVerifierRealTest, Hopper570WithExpiredDriverRim) {
  const std::string folder = "attestation-sdk-samples/hopper-570.124.03";
  Json expected = Json::parse(ReadNvidiaText(folder + "/expected.json"));
  NvidiaGpuInput input;
  input.report = ReadNvidiaHex(folder + "/attestation_report.hex");
  input.cert_chain_pem = ReadNvidiaText(folder + "/cert_chain.pem");
  input.driver_rim_xml = ReadNvidiaText(folder + "/driver_rim_570.124.03_EXPIRED_signer.xml");
  input.vbios_rim_xml = ReadNvidiaText("rims/nvtrust-vbios/1010_0205_862_96005E0004_PROD.swidtag");
  input.expected_nonce = Hex(expected["request"]["nonce"]);
  Verdict verdict = Verify(input, NvidiaPolicy(), ParseTestTime("2025-06-01T00:00:00Z"));
  EXPECT_FALSE(verdict.pass);
  ExpectReportFacts(verdict, expected);
  ExpectChainNames(input.cert_chain_pem, expected);
  EXPECT_EQ(ResultOf(verdict, "rim.driver.signature"), Check::kFail);
  EXPECT_THAT(DetailOf(verdict, "rim.driver.signature"), HasSubstr("expired on 2025-01-02"));
  EXPECT_EQ(ResultOf(verdict, "rim.vbios.signature"), Check::kPass) << Describe(verdict);
  EXPECT_EQ(ResultOf(verdict, "rim.driver.identity"), Check::kPass);
  EXPECT_THAT(DetailOf(verdict, "measurements"),
              HasSubstr("mismatch at indices 7, 9, 21, 22, 25, 26, 27, 29, 30, 31, 32, 34, 36, "
                        "37, 39, 40"));
}

TEST(NvidiaGpuVerifierRealTest, CertHoldEvidenceJson) {
  const std::string folder = "attestation-sdk-samples/hopper-570.86.10-cert-hold";
  Json expected = Json::parse(ReadNvidiaText(folder + "/expected.json"))["evidence_items"][0];
  auto items = ParseNvidiaEvidenceJson(ReadNvidiaText(folder + "/gpu_evidence.json"));
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), 1u);
  const NvidiaEvidenceItem& item = (*items)[0];
  EXPECT_EQ(item.arch, expected["json_arch_field"]);
  EXPECT_EQ(HexEncode(item.nonce), expected["json_nonce_field"]);
  EXPECT_EQ(item.report.size(), expected["total_length"].get<size_t>());
  NvidiaGpuInput input;
  input.report = item.report;
  input.cert_chain_pem = item.cert_chain_pem;
  input.expected_nonce = item.nonce;
  input.arch = item.arch;
  Verdict verdict = Verify(input, NvidiaPolicy(), ParseTestTime("2025-06-01T00:00:00Z"));
  ExpectReportFacts(verdict, expected);
  ExpectChainNames(input.cert_chain_pem, expected);
  EXPECT_EQ(ResultOf(verdict, "nonce"), Check::kPass);
  EXPECT_EQ(ResultOf(verdict, "arch"), Check::kPass);
  // Revocation (the point of this sample) needs saved OCSP responses: offline it is skipped.
  EXPECT_EQ(ResultOf(verdict, "certs.ocsp"), Check::kSkipped);
}

TEST(NvidiaGpuVerifierRealTest, NvSwitchIsNotAGpu) {
  const std::string folder = "attestation-sdk-samples/nvswitch-ls10";
  Json expected = Json::parse(ReadNvidiaText(folder + "/expected.json"));
  NvidiaGpuInput input;
  input.report = ReadNvidiaHex(folder + "/attestation_report.hex");
  input.cert_chain_pem = ReadNvidiaText(folder + "/cert_chain.pem");
  input.expected_nonce = Hex(expected["request_nonce"]);
  ASSERT_EQ(input.report.size(), expected["total_length"].get<size_t>());
  Verdict verdict = Verify(input, NvidiaPolicy(), ParseTestTime("2025-06-01T00:00:00Z"));
  ExpectChainNames(input.cert_chain_pem, expected);
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(ResultOf(verdict, "report.signature") == Check::kPass,
            expected["report_signature_valid"].get<bool>());
  EXPECT_EQ(ResultOf(verdict, "certs.chain"), Check::kPass);
  EXPECT_EQ(ResultOf(verdict, "nonce"), Check::kPass);
  EXPECT_EQ(ResultOf(verdict, "arch"), Check::kFail);
  EXPECT_THAT(DetailOf(verdict, "arch"), HasSubstr("NVSwitch"));
}

// ---- synthetic evidence: valid except for what each test changes ----

struct Synthetic {
  TestDevicePki device = MakeTestDevicePki();
  TestRimPki rims = MakeTestRimPki();
  TestReportSpec spec;
  Rim driver = MakeTestRim("550.90.07", {});
  Rim vbios = MakeTestRim("96.00.9F.00.01", {});

  Synthetic() {
    spec.fwid = device.fwid;
    spec.block_values = {{8, TestDigest(7)},
                         {22, TestDigest(21)},
                         {36, TestDigest(35)},
                         {2, TestDigest(1)},
                         {10, TestDigest(9)}};
    driver = MakeTestRim(
        "550.90.07",
        {{7, {TestDigest(7)}}, {21, {TestDigest(99), TestDigest(21)}}, {35, {TestDigest(35)}}});
    vbios = MakeTestRim("96.00.9F.00.01", {{1, {TestDigest(1)}}, {9, {TestDigest(9)}}});
  }
  NvidiaPolicy Policy() const {
    NvidiaPolicy policy;
    policy.device_root_pem = device.root.cert.ToPem();
    policy.corim_root_pem = rims.root.cert.ToPem();
    return policy;
  }
  NvidiaGpuInput Input() const {
    NvidiaGpuInput input;
    input.report = SignTestReport(MakeTestReport(spec), *device.leaf.key);
    input.cert_chain_pem = device.ChainPem();
    input.driver_rim_xml = SignTestRim(driver, rims);
    input.vbios_rim_xml = SignTestRim(vbios, rims);
    input.expected_nonce = spec.nonce;
    return input;
  }
};

TEST(NvidiaGpuVerifierSyntheticTest, ValidEvidencePasses) {
  Synthetic s;
  Verdict verdict = Verify(s.Input(), s.Policy(), In2024(), "gpu0.");
  EXPECT_TRUE(verdict.pass) << Describe(verdict);
  EXPECT_EQ(DetailOf(verdict, "gpu0.certs.fwid"),
            "the report's FWID equals the leaf certificate's");
  EXPECT_EQ(verdict.claims.at("gpu0.fwid"), HexEncode(s.device.fwid));
  // The real NVIDIA roots do not anchor synthetic evidence.
  verdict = Verify(s.Input(), NvidiaPolicy(), In2024());
  EXPECT_EQ(NotPassed(verdict),
            (std::set<std::string>{"certs.chain", "rim.driver.signature", "rim.vbios.signature",
                                   "measurements", "certs.ocsp"}));
}

TEST(NvidiaGpuVerifierSyntheticTest, MeasurementChangeNamesTheIndex) {
  Synthetic s;
  s.spec.block_values.push_back({10, TestDigest(42)});  // block 10 = VBIOS index 9
  s.spec.block_values.erase(s.spec.block_values.begin() + 4);
  Verdict verdict = Verify(s.Input(), s.Policy(), In2024());
  EXPECT_EQ(NotPassed(verdict), (std::set<std::string>{"measurements", "certs.ocsp"}))
      << Describe(verdict);
  EXPECT_THAT(DetailOf(verdict, "measurements"),
              HasSubstr("mismatch at indices 9 (vbios 9; RIM index i is report block i+1)"));
}

TEST(NvidiaGpuVerifierSyntheticTest, NvdecEnabledComparesIndex35) {
  Synthetic s;
  s.spec.block_values[2] = {36, TestDigest(77)};
  Verdict verdict = Verify(s.Input(), s.Policy(), In2024());
  EXPECT_TRUE(verdict.pass) << Describe(verdict);  // NVDEC disabled: 35 skipped
  s.spec.nvdec0_status = 0xAA;
  verdict = Verify(s.Input(), s.Policy(), In2024());
  EXPECT_THAT(DetailOf(verdict, "measurements"), HasSubstr("mismatch at indices 35"));
}

TEST(NvidiaGpuVerifierSyntheticTest, ConflictingRims) {
  Synthetic s;
  s.vbios = MakeTestRim("96.00.9F.00.01", {{1, {TestDigest(1)}}, {7, {TestDigest(7)}}});
  Verdict verdict = Verify(s.Input(), s.Policy(), In2024());
  EXPECT_EQ(NotPassed(verdict), (std::set<std::string>{"measurements", "certs.ocsp"}));
  EXPECT_THAT(DetailOf(verdict, "measurements"),
              HasSubstr("indices active in both the driver and the VBIOS RIM: 7"));
}

TEST(NvidiaGpuVerifierSyntheticTest, FwidMismatchWithValidSignature) {
  Synthetic s;
  s.spec.fwid = TestDigest(0x55);
  Verdict verdict = Verify(s.Input(), s.Policy(), In2024());
  EXPECT_EQ(NotPassed(verdict), (std::set<std::string>{"certs.fwid", "certs.ocsp"}));
}

TEST(NvidiaGpuVerifierSyntheticTest, ExpiredDeviceCertificate) {
  Synthetic s;
  Verdict verdict = Verify(s.Input(), s.Policy(), ParseTestTime("2100-01-01T00:00:00Z"));
  EXPECT_EQ(ResultOf(verdict, "certs.chain"), Check::kFail);
  EXPECT_THAT(DetailOf(verdict, "certs.chain"), HasSubstr("expired"));
}

TEST(NvidiaGpuVerifierSyntheticTest, BlackwellLeafAndIds) {
  Synthetic s;
  s.device = MakeTestDevicePki("GB100");
  // The Blackwell TcbInfo: SEQUENCE { [0] vendor, [1] model, [6] fwids { SEQUENCE { OID,
  // digest } } }, with the FWID as its first digest.
  Bytes fwid = TestDigest(0xB1);
  Bytes vendor = {0x80, 6, 'N', 'V', 'I', 'D', 'I', 'A'};
  Bytes model = {0x81, 5, 'G', 'B', '1', '0', '0'};
  Bytes one_fwid =
      der::Sequence({*der::ObjectId("2.16.840.1.101.3.4.2.2"), der::OctetString(fwid)});
  Bytes fwids = {0xA6, static_cast<uint8_t>(one_fwid.size())};
  Append(fwids, one_fwid);
  Bytes body = vendor;
  Append(body, model);
  Append(body, fwids);
  Bytes tcb_info = {0x30, static_cast<uint8_t>(body.size())};
  Append(tcb_info, body);
  s.device.leaf = testing::IssueTestCert(s.device.brom, "GB100 A01 GSP FMC LF", false,
                                         {{std::string(kTcgDiceTcbInfoOid), tcb_info}});
  auto leaf_fwid = GpuLeafFwid(s.device.leaf.cert);
  ASSERT_TRUE(leaf_fwid.ok()) << leaf_fwid.status();
  EXPECT_EQ(*leaf_fwid, fwid);
  s.spec.fwid = fwid;
  NvidiaGpuInput input = s.Input();
  input.arch = "BLACKWELL";
  Verdict verdict = Verify(input, s.Policy(), In2024());
  EXPECT_TRUE(verdict.pass) << Describe(verdict);
  EXPECT_EQ(verdict.claims.at("arch"), "BLACKWELL");
  EXPECT_EQ(verdict.claims.at("driver_rim.id"), "NV_GPU_CC_DRIVER_GB100_550.90.07");
  input.arch = "HOPPER";
  verdict = Verify(input, s.Policy(), In2024());
  EXPECT_EQ(NotPassed(verdict), (std::set<std::string>{"arch", "certs.ocsp"}));
}

TEST(NvidiaGpuVerifierSyntheticTest, OcspResponses) {
  Synthetic s;
  const absl::Time at = In2024();
  const absl::Time produced = at - absl::Hours(1);
  const absl::Time next = at + absl::Hours(24);
  // Device certificates in scope: BROM, ICA, Identity (not the leaf, not the root).
  auto device = [&](TestOcspStatus brom_status) {
    return std::vector<Bytes>{
        MakeTestOcspResponse(s.device.brom.cert, s.device.ica.cert, s.device.ica, brom_status,
                             produced, next),
        MakeTestOcspResponse(s.device.ica.cert, s.device.identity.cert, s.device.identity,
                             TestOcspStatus::kGood, produced, next),
        MakeTestOcspResponse(s.device.identity.cert, s.device.root.cert, s.device.root,
                             TestOcspStatus::kGood, produced, next)};
  };
  // RIM certificates in scope: signer, L3, CA (both RIMs share the test chain).
  std::vector<Bytes> rim = {MakeTestOcspResponse(s.rims.signer.cert, s.rims.l3.cert, s.rims.l3,
                                                 TestOcspStatus::kGood, produced, next),
                            MakeTestOcspResponse(s.rims.l3.cert, s.rims.ca.cert, s.rims.ca,
                                                 TestOcspStatus::kGood, produced, next),
                            MakeTestOcspResponse(s.rims.ca.cert, s.rims.root.cert, s.rims.root,
                                                 TestOcspStatus::kGood, produced, next)};

  NvidiaGpuInput input = s.Input();
  NvidiaPolicy policy = s.Policy();
  policy.require_ocsp = true;
  input.ocsp_responses = device(TestOcspStatus::kGood);
  input.ocsp_responses.insert(input.ocsp_responses.end(), rim.begin(), rim.end());
  Verdict verdict = Verify(input, policy, at);
  EXPECT_TRUE(verdict.pass) << Describe(verdict);
  EXPECT_EQ(ResultOf(verdict, "certs.ocsp"), Check::kPass);
  EXPECT_THAT(DetailOf(verdict, "certs.ocsp"), HasSubstr("device 'GH100 A01 GSP BROM'"));

  // Only the device responses: the RIM certificates are not covered.
  input.ocsp_responses = device(TestOcspStatus::kGood);
  verdict = Verify(input, policy, at);
  EXPECT_EQ(ResultOf(verdict, "certs.ocsp"), Check::kFail);
  policy.require_ocsp = false;
  verdict = Verify(input, policy, at);
  EXPECT_EQ(ResultOf(verdict, "certs.ocsp"), Check::kSkipped);
  EXPECT_THAT(DetailOf(verdict, "certs.ocsp"), HasSubstr("no saved OCSP response for driver RIM"));
  EXPECT_TRUE(verdict.pass);

  // A revoked BROM fails; on hold fails unless the policy tolerates holds.
  input.ocsp_responses = device(TestOcspStatus::kRevoked);
  verdict = Verify(input, policy, at);
  EXPECT_EQ(ResultOf(verdict, "certs.ocsp"), Check::kFail);
  EXPECT_THAT(DetailOf(verdict, "certs.ocsp"),
              HasSubstr("'GH100 A01 GSP BROM' is revoked (keyCompromise)"));
  EXPECT_FALSE(verdict.pass);
  input.ocsp_responses = device(TestOcspStatus::kHold);
  verdict = Verify(input, policy, at);
  EXPECT_EQ(ResultOf(verdict, "certs.ocsp"), Check::kFail);
  policy.allow_ocsp_cert_hold = true;
  verdict = Verify(input, policy, at);
  EXPECT_NE(ResultOf(verdict, "certs.ocsp"), Check::kFail);
  EXPECT_THAT(DetailOf(verdict, "certs.ocsp"), HasSubstr("on hold, allowed by the policy"));

  // Garbage is an error, not a pass.
  input.ocsp_responses = {Bytes{0x30, 0x00}};
  verdict = Verify(input, policy, at);
  EXPECT_EQ(ResultOf(verdict, "certs.ocsp"), Check::kFail);
}

TEST(NvidiaPolicyTest, FromCloisterPolicy) {
  Policy policy;
  policy.mutable_gpu_versions()->add_driver_versions("550.90.07");
  policy.mutable_gpu_versions()->add_vbios_versions("96.00.9F.00.01");
  NvidiaPolicy nvidia = NvidiaPolicyFromPolicy(policy);
  EXPECT_EQ(nvidia.allowed_driver_versions, std::vector<std::string>{"550.90.07"});
  EXPECT_EQ(nvidia.allowed_vbios_versions, std::vector<std::string>{"96.00.9F.00.01"});
  EXPECT_EQ(nvidia.device_root_pem, std::string(kNvidiaDeviceIdentityCaPem));
  EXPECT_EQ(nvidia.corim_root_pem, std::string(kNvidiaCorimRootCaPem));
  EXPECT_FALSE(nvidia.allow_expired_rim);
  EXPECT_TRUE(nvidia.require_nonce);
}

}  // namespace
}  // namespace cloister::attest
