#include "attest/snp/snp_verifier.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "attest/snp/amd_roots.h"
#include "attest/snp_report.h"
#include "attest/test_util.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using ::cloister::attest::testing::Detail;
using ::cloister::attest::testing::Dump;
using ::cloister::attest::testing::Failed;
using ::cloister::attest::testing::ReadTestBinary;
using ::cloister::attest::testing::ResultOf;
using ::cloister::attest::testing::ReadTestHex;
using ::cloister::attest::testing::ReadTestText;
using ::cloister::attest::testing::TestDataPath;
using Json = nlohmann::json;

// Inside the validity of both Milan VCEKs (2022-09-24 .. 2029-09-24, 2023-04-03 .. 2030-04-03).
absl::Time VectorTime() { return absl::FromCivil(absl::CivilDay(2024, 6, 1), absl::UTCTimeZone()); }

struct Vector {
  std::string dir;  // relative to the test data dir, e.g. "sev-snp/milan-v2-virtee"
  SnpInput input;
  Json expected;
};

Vector LoadVector(const std::string& dir) {
  Vector vector;
  vector.dir = dir;
  if (std::filesystem::exists(TestDataPath(dir + "/report.bin"))) {
    vector.input.report = ReadTestBinary(dir + "/report.bin");
  } else {
    vector.input.report = ReadTestHex(dir + "/report.hex");
  }
  vector.input.vcek_der_or_pem = ReadTestBinary(dir + "/vcek.der");
  vector.input.ask_ark_pem = ReadTestText(dir + "/ask_ark_milan.pem");
  vector.expected = Json::parse(ReadTestText(dir + "/expected.json"));
  return vector;
}

// Every folder under sev-snp/ with an expected.json (the Milan vectors).
std::vector<std::string> VectorDirs() {
  std::vector<std::string> dirs;
  for (const auto& entry : std::filesystem::directory_iterator(TestDataPath("sev-snp"))) {
    if (std::filesystem::exists(entry.path() / "expected.json")) {
      dirs.push_back("sev-snp/" + entry.path().filename().string());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

Policy PolicyFor(const Json& expected) {
  Policy policy;
  policy.set_name("test");
  policy.set_tee(v1::TEE_TYPE_SEV_SNP);
  policy.set_gpu(v1::GPU_TYPE_NONE);
  policy.add_enclave_measurements(expected["measurement"].get<std::string>());
  policy.set_allow_debug(expected["policy_debug_allowed"].get<bool>());
  return policy;
}

Bytes Hex(const std::string& hex) {
  auto bytes = HexDecode(hex);
  EXPECT_TRUE(bytes.ok()) << hex;
  return bytes.ok() ? *bytes : Bytes();
}

Verdict MustVerify(const SnpInput& input, const Policy& policy, absl::Time at = VectorTime()) {
  auto verdict = VerifySnpReport(input, policy, at);
  EXPECT_TRUE(verdict.ok()) << verdict.status();
  return verdict.ok() ? *verdict : Verdict();
}

uint64_t ParseHexNumber(const std::string& text) { return std::stoull(text, nullptr, 16); }

TEST(SnpRootsTest, BuiltInArksAreTheAmdRootsInTestData) {
  const std::vector<std::string> files = {"ask_ark_milan.pem", "ask_ark_genoa.pem",
                                          "ask_ark_turin_vcek.pem"};
  ASSERT_EQ(BuiltInAmdArkPems().size(), files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    auto chain = ParsePemChain(ReadTestText("sev-snp/amd-roots/" + files[i]));
    ASSERT_TRUE(chain.ok()) << chain.status();
    ASSERT_EQ(chain->size(), 2u);
    auto built_in = Certificate::FromPem(BuiltInAmdArkPems()[i]);
    ASSERT_TRUE(built_in.ok()) << built_in.status();
    EXPECT_EQ(built_in->ToDer(), (*chain)[1].ToDer()) << files[i];
  }
  // The VLEK bundles end in the same ARKs.
  for (const char* file :
       {"ask_ark_milan_vlek.pem", "ask_ark_genoa_vlek.pem", "ask_ark_turin_vlek.pem"}) {
    auto chain = ParsePemChain(ReadTestText(std::string("sev-snp/amd-roots/") + file));
    ASSERT_TRUE(chain.ok()) << chain.status();
    bool found = false;
    for (const std::string& pem : BuiltInAmdArkPems()) {
      found = found || Certificate::FromPem(pem)->ToDer() == chain->back().ToDer();
    }
    EXPECT_TRUE(found) << file;
  }
}

TEST(SnpVerifierTest, TheMilanVectorsAreFound) { EXPECT_EQ(VectorDirs().size(), 2u); }

// Each expected.json: the verdict passes at a time inside the VCEK's validity, and every fact
// the research helper decoded is what the verifier and the parser say.
TEST(SnpVerifierTest, ExpectedJsonVectorsPass) {
  for (const std::string& dir : VectorDirs()) {
    SCOPED_TRACE(dir);
    Vector vector = LoadVector(dir);
    const Json& e = vector.expected;
    ASSERT_EQ(vector.input.report.size(), e["length"].get<size_t>());
    vector.input.expected_report_data = Hex(e["report_data"]);
    Verdict verdict = MustVerify(vector.input, PolicyFor(e));
    EXPECT_TRUE(verdict.pass) << Dump(verdict);
    EXPECT_EQ(ResultOf(verdict, "report.parse"), Check::kPass);
    EXPECT_EQ(ResultOf(verdict, "certs.chain"),
              e["vcek_chain_valid(ARK self-signed -> ASK -> VCEK, RSASSA-PSS SHA-384)"].get<bool>()
                  ? Check::kPass
                  : Check::kFail);
    EXPECT_EQ(ResultOf(verdict, "report.signature"),
              e["report_signature_valid"].get<bool>() ? Check::kPass : Check::kFail);
    EXPECT_EQ(ResultOf(verdict, "tcb"), Check::kPass);
    EXPECT_NE(Detail(verdict, "tcb").find("hwID equals CHIP_ID"), std::string::npos);
    EXPECT_TRUE(e["vcek"]["hwid_matches_chip_id"].get<bool>());
    EXPECT_EQ(ResultOf(verdict, "policy"), Check::kPass);
    EXPECT_EQ(ResultOf(verdict, "measurement"), Check::kPass);
    EXPECT_EQ(ResultOf(verdict, "host_data"), Check::kSkipped);
    EXPECT_EQ(ResultOf(verdict, "report_data"), Check::kPass);

    // Claims.
    const auto& claims = verdict.claims;
    EXPECT_EQ(claims.at("report_version"), absl::StrCat(e["version"].get<int>()));
    EXPECT_EQ(claims.at("guest_svn"), absl::StrCat(e["guest_svn"].get<int>()));
    EXPECT_EQ(claims.at("policy"), e["policy"].get<std::string>());
    EXPECT_EQ(claims.at("policy.debug"), e["policy_debug_allowed"].get<bool>() ? "true" : "false");
    EXPECT_EQ(claims.at("policy.smt"), e["policy_smt_allowed"].get<bool>() ? "true" : "false");
    EXPECT_EQ(claims.at("policy.abi"), absl::StrCat(e["policy_abi_major_minor"][0].get<int>(), ".",
                                                    e["policy_abi_major_minor"][1].get<int>()));
    EXPECT_EQ(claims.at("vmpl"), absl::StrCat(e["vmpl"].get<int>()));
    EXPECT_EQ(claims.at("measurement"), e["measurement"].get<std::string>());
    EXPECT_EQ(claims.at("report_data"), e["report_data"].get<std::string>());
    EXPECT_EQ(claims.at("host_data"), e["host_data"].get<std::string>());
    EXPECT_EQ(claims.at("id_key_digest"), e["id_key_digest"].get<std::string>());
    EXPECT_EQ(claims.at("report_id"), e["report_id"].get<std::string>());
    EXPECT_EQ(claims.at("chip_id"), e["chip_id"].get<std::string>());
    EXPECT_EQ(claims.at("platform_info"), e["platform_info"].get<std::string>());
    EXPECT_EQ(claims.at("product"), "Milan");
    EXPECT_EQ(claims.at("signing_key"), e["signer_info"] == "0x0" ? "vcek" : "vlek");
    const auto& build = e["current_build_minor_major"];
    EXPECT_EQ(claims.at("firmware"), absl::StrCat(build[2].get<int>(), ".", build[1].get<int>(),
                                                  " build ", build[0].get<int>()));
    const auto& committed = e["committed_build_minor_major"];
    EXPECT_EQ(claims.at("committed_firmware"),
              absl::StrCat(committed[2].get<int>(), ".", committed[1].get<int>(), " build ",
                           committed[0].get<int>()));
    for (const char* which : {"reported_tcb", "current_tcb", "committed_tcb", "launch_tcb"}) {
      SCOPED_TRACE(which);
      const Json& tcb = e[which];
      EXPECT_EQ(ParseHexNumber(claims.at(absl::StrCat(which, ".raw"))),
                ParseHexNumber(tcb["raw"].get<std::string>()));
      for (const char* part : {"bootloader", "tee", "snp", "microcode"}) {
        EXPECT_EQ(claims.at(absl::StrCat(which, ".", part)), absl::StrCat(tcb[part].get<int>()));
      }
    }

    // Fields the verdict does not repeat, straight from the parser.
    auto report = ParseSnpReport(vector.input.report);
    ASSERT_TRUE(report.ok());
    EXPECT_EQ(HexEncode(report->family_id), e["family_id"].get<std::string>());
    EXPECT_EQ(HexEncode(report->image_id), e["image_id"].get<std::string>());
    EXPECT_EQ(HexEncode(report->author_key_digest), e["author_key_digest"].get<std::string>());
    EXPECT_EQ(report->signature_algo, e["signature_algo"].get<uint32_t>());
    EXPECT_EQ(absl::StrCat("0x", absl::Hex(report->signer_info)), e["signer_info"]);

    // The VCEK and chain facts.
    auto vcek = Certificate::FromDer(vector.input.vcek_der_or_pem);
    ASSERT_TRUE(vcek.ok());
    EXPECT_EQ(vcek->SubjectCommonName(), e["vcek"]["subject_cn"]);
    EXPECT_EQ(vcek->IssuerCommonName(), e["vcek"]["issuer_cn"]);
    auto expect_time = [](absl::Time time, const std::string& text) {
      // "2022-09-24 00:55:28+00:00"
      EXPECT_EQ(absl::FormatTime("%Y-%m-%d %H:%M:%S+00:00", time, absl::UTCTimeZone()), text);
    };
    expect_time(vcek->NotBefore(), e["vcek"]["not_before"]);
    expect_time(vcek->NotAfter(), e["vcek"]["not_after"]);
    auto product = vcek->ExtensionValue(kVcekProductNameOid);
    ASSERT_TRUE(product.ok());
    EXPECT_EQ(*der::ParseIa5String(*product), e["vcek"]["product_name_ext"]);
    for (const auto& [index, value] : e["vcek"]["tcb_ext"].items()) {
      auto ext = vcek->ExtensionValue(absl::StrCat("1.3.6.1.4.1.3704.1.3.", index));
      ASSERT_TRUE(ext.ok()) << index;
      EXPECT_EQ(*der::ParseInteger(*ext), value.get<uint64_t>()) << index;
    }
    auto chain = ParsePemChain(vector.input.ask_ark_pem);
    ASSERT_TRUE(chain.ok());
    ASSERT_EQ(chain->size(), e["chain_cns"].size());
    for (size_t i = 0; i < chain->size(); ++i) {
      EXPECT_EQ((*chain)[i].SubjectCommonName(), e["chain_cns"][i]);
    }
  }
}

TEST(SnpVerifierTest, OutsideTheVcekValidityTheChainFails) {
  Vector vector = LoadVector("sev-snp/milan-v2-virtee");
  Policy policy = PolicyFor(vector.expected);
  for (absl::Time at : {absl::FromCivil(absl::CivilDay(2023, 4, 1), absl::UTCTimeZone()),
                        absl::FromCivil(absl::CivilDay(2030, 5, 1), absl::UTCTimeZone())}) {
    Verdict verdict = MustVerify(vector.input, policy, at);
    EXPECT_FALSE(verdict.pass);
    EXPECT_EQ(Failed(verdict), std::vector<std::string>{"certs.chain"}) << Dump(verdict);
  }
}

class SnpMutationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vector_ = LoadVector("sev-snp/milan-v2-virtee");
    policy_ = PolicyFor(vector_.expected);
    vector_.input.expected_report_data = Hex(vector_.expected["report_data"]);
    ASSERT_TRUE(MustVerify(vector_.input, policy_).pass);
  }
  Vector vector_;
  Policy policy_;
};

TEST_F(SnpMutationTest, FlippedSignatureFailsReportSignature) {
  SnpInput input = vector_.input;
  input.report[0x2A0 + 5] ^= 0x01;  // inside R
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"report.signature"}) << Dump(verdict);
  EXPECT_TRUE(verdict.claims.empty()) << "claims from an unauthenticated report";
}

TEST_F(SnpMutationTest, FlippedReportDataFailsSignatureAndReportData) {
  SnpInput input = vector_.input;
  input.report[0x50] ^= 0x80;
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), (std::vector<std::string>{"report.signature", "report_data"}))
      << Dump(verdict);
}

TEST_F(SnpMutationTest, UnexpectedReportDataFailsOnlyReportData) {
  SnpInput input = vector_.input;
  (*input.expected_report_data)[63] ^= 1;
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"report_data"}) << Dump(verdict);
}

TEST_F(SnpMutationTest, MeasurementNotInPolicyFailsMeasurement) {
  Policy policy = policy_;
  policy.set_enclave_measurements(0, std::string(96, 'a'));
  Verdict verdict = MustVerify(vector_.input, policy);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"measurement"}) << Dump(verdict);

  policy.clear_enclave_measurements();
  verdict = MustVerify(vector_.input, policy);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"measurement"});
  EXPECT_NE(Detail(verdict, "measurement").find("lists no enclave measurements"),
            std::string::npos);
}

TEST_F(SnpMutationTest, FlippedMeasurementFailsSignatureAndMeasurement) {
  SnpInput input = vector_.input;
  input.report[0x90] ^= 0x01;
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), (std::vector<std::string>{"report.signature", "measurement"}))
      << Dump(verdict);
}

TEST_F(SnpMutationTest, DebugBitFailsPolicy) {
  SnpInput input = vector_.input;
  input.report[0x08 + 2] |= 0x08;  // POLICY bit 19
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), (std::vector<std::string>{"report.signature", "policy"}))
      << Dump(verdict);
  EXPECT_NE(Detail(verdict, "policy").find("DEBUG"), std::string::npos);
}

TEST(SnpVerifierTest, GenuineDebugGuestFailsPolicyUnlessAllowed) {
  // The go-sev-guest vector's guest POLICY 0xB0000 allows debugging.
  Vector vector = LoadVector("sev-snp/milan-v2-go-sev-guest");
  Policy policy = PolicyFor(vector.expected);
  ASSERT_TRUE(policy.allow_debug());
  EXPECT_TRUE(MustVerify(vector.input, policy).pass);
  policy.set_allow_debug(false);
  Verdict verdict = MustVerify(vector.input, policy);
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"policy"}) << Dump(verdict);
}

TEST_F(SnpMutationTest, SwappedLeafAndAskFailsTheChain) {
  SnpInput input = vector_.input;
  auto chain = ParsePemChain(input.ask_ark_pem);
  ASSERT_TRUE(chain.ok());
  auto vcek = Certificate::FromDer(input.vcek_der_or_pem);
  ASSERT_TRUE(vcek.ok());
  input.vcek_der_or_pem = (*chain)[0].ToDer();              // the ASK as the leaf
  input.ask_ark_pem = vcek->ToPem() + (*chain)[1].ToPem();  // the VCEK as intermediate
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(ResultOf(verdict, "certs.chain"), Check::kFail);
  EXPECT_NE(Detail(verdict, "certs.chain").find("'SEV-Milan'"), std::string::npos)
      << Detail(verdict, "certs.chain");
  EXPECT_EQ(ResultOf(verdict, "report.signature"), Check::kFail);
}

TEST_F(SnpMutationTest, ArkBeforeAskStillVerifies) {
  SnpInput input = vector_.input;
  auto chain = ParsePemChain(input.ask_ark_pem);
  ASSERT_TRUE(chain.ok());
  input.ask_ark_pem = (*chain)[1].ToPem() + (*chain)[0].ToPem();
  EXPECT_TRUE(MustVerify(input, policy_).pass);
  // Without the ASK the chain cannot be built.
  input.ask_ark_pem = (*chain)[1].ToPem();
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"certs.chain"}) << Dump(verdict);
}

TEST_F(SnpMutationTest, OnlyPinnedArksAnchorTheChain) {
  Policy policy = policy_;
  policy.mutable_snp()->add_ark_pems(BuiltInAmdArkPems()[1]);  // Genoa only
  Verdict verdict = MustVerify(vector_.input, policy);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"certs.chain"}) << Dump(verdict);
  EXPECT_NE(Detail(verdict, "certs.chain").find("pins no ARK-Milan"), std::string::npos);

  policy.mutable_snp()->add_ark_pems(BuiltInAmdArkPems()[0]);
  EXPECT_TRUE(MustVerify(vector_.input, policy).pass);
}

TEST_F(SnpMutationTest, AnotherChipsVcekFailsTcbAndSignature) {
  SnpInput input = vector_.input;
  input.vcek_der_or_pem = ReadTestBinary("sev-snp/milan-v2-go-sev-guest/vcek.der");
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), (std::vector<std::string>{"report.signature", "tcb"}))
      << Dump(verdict);
}

TEST_F(SnpMutationTest, PolicyMinimumTcbAndVmplAndHostData) {
  Policy policy = policy_;
  policy.mutable_snp()->mutable_minimum_tcb()->set_microcode(116);  // the report has 115
  Verdict verdict = MustVerify(vector_.input, policy);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"tcb"}) << Dump(verdict);
  EXPECT_NE(Detail(verdict, "tcb").find("microcode 115 < 116"), std::string::npos);
  policy.mutable_snp()->mutable_minimum_tcb()->set_microcode(115);
  policy.mutable_snp()->mutable_minimum_tcb()->set_snp(8);
  EXPECT_TRUE(MustVerify(vector_.input, policy).pass);

  policy = policy_;
  policy.mutable_snp()->set_vmpl(1);
  verdict = MustVerify(vector_.input, policy);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"policy"}) << Dump(verdict);

  policy = policy_;
  policy.mutable_snp()->add_host_data(std::string(64, '1'));
  verdict = MustVerify(vector_.input, policy);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"host_data"}) << Dump(verdict);
  policy.mutable_snp()->add_host_data(std::string(64, '0'));
  verdict = MustVerify(vector_.input, policy);
  EXPECT_TRUE(verdict.pass);
  EXPECT_EQ(ResultOf(verdict, "host_data"), Check::kPass);

  policy = policy_;
  policy.mutable_snp()->add_id_key_digests(std::string(96, 'f'));
  verdict = MustVerify(vector_.input, policy);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"policy"}) << Dump(verdict);
}

TEST_F(SnpMutationTest, TruncatedReportFailsParseAndSkipsTheRest) {
  SnpInput input = vector_.input;
  input.report.pop_back();
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"report.parse"}) << Dump(verdict);
  EXPECT_EQ(ResultOf(verdict, "report.signature"), Check::kSkipped);
  EXPECT_EQ(ResultOf(verdict, "measurement"), Check::kSkipped);
}

TEST_F(SnpMutationTest, MissingOrGarbageCertificatesFailTheChain) {
  SnpInput input = vector_.input;
  input.vcek_der_or_pem = ToBytes("not a certificate");
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(ResultOf(verdict, "certs.chain"), Check::kFail);
  EXPECT_EQ(ResultOf(verdict, "report.signature"), Check::kSkipped);
  EXPECT_FALSE(verdict.pass);

  input = vector_.input;
  input.ask_ark_pem.clear();
  verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"certs.chain"});
  EXPECT_NE(Detail(verdict, "certs.chain").find("no ASK"), std::string::npos);
}

TEST_F(SnpMutationTest, PemVcekAndPrefixAndBundleAdapter) {
  SnpInput input = vector_.input;
  auto vcek = Certificate::FromDer(input.vcek_der_or_pem);
  ASSERT_TRUE(vcek.ok());
  input.vcek_der_or_pem = ToBytes(vcek->ToPem());
  auto verdict = VerifySnpReport(input, policy_, VectorTime(), "cvm.");
  ASSERT_TRUE(verdict.ok());
  EXPECT_TRUE(verdict->pass);
  EXPECT_NE(verdict->Find("cvm.report.signature"), nullptr);
  EXPECT_EQ(verdict->claims.count("cvm.measurement"), 1u);

  EvidenceBundle bundle;
  bundle.set_tee_type(v1::TEE_TYPE_SEV_SNP);
  bundle.set_cvm_report(ToString(vector_.input.report));
  bundle.set_cvm_cert_chain_pem(vcek->ToPem() + vector_.input.ask_ark_pem);
  Verdict from_bundle = SnpCvmVerifier().Verify(bundle, {}, policy_, VectorTime());
  EXPECT_TRUE(from_bundle.pass) << Dump(from_bundle);
  EXPECT_EQ(from_bundle.Find("cvm.report_data"), nullptr) << "VerifyBundle owns that check";
  EXPECT_EQ(from_bundle.claims.at("cvm.report_data"), vector_.expected["report_data"]);
  for (const char* check : {"cvm.report.parse", "cvm.certs.chain", "cvm.report.signature",
                            "cvm.policy", "cvm.measurement", "cvm.tcb"}) {
    EXPECT_EQ(ResultOf(from_bundle, check), Check::kPass) << check;
  }

  bundle.set_cvm_cert_chain_pem("garbage");
  from_bundle = SnpCvmVerifier().Verify(bundle, {}, policy_, VectorTime());
  EXPECT_FALSE(from_bundle.pass);
  EXPECT_EQ(ResultOf(from_bundle, "cvm.certs.chain"), Check::kFail);
}

TEST_F(SnpMutationTest, BadPolicyOrExpectedSizeIsAnError) {
  SnpInput input = vector_.input;
  input.expected_report_data = Bytes(32, 0);
  EXPECT_EQ(VerifySnpReport(input, policy_, VectorTime()).status().code(),
            absl::StatusCode::kInvalidArgument);

  Policy policy = policy_;
  policy.mutable_snp()->add_host_data("abc");
  EXPECT_EQ(VerifySnpReport(vector_.input, policy, VectorTime()).status().code(),
            absl::StatusCode::kInvalidArgument);
  policy = policy_;
  policy.mutable_snp()->add_ark_pems(ReadTestText("sev-snp/amd-roots/ask_ark_milan.pem"));
  auto status = ValidateSnpPolicy(policy.snp());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  policy = policy_;
  auto ask = ParsePemChain(ReadTestText("sev-snp/amd-roots/ask_ark_milan.pem"));
  policy.mutable_snp()->add_ark_pems((*ask)[0].ToPem());  // the ASK is not an ARK
  EXPECT_EQ(ValidateSnpPolicy(policy.snp()).code(), absl::StatusCode::kInvalidArgument);
  policy = policy_;
  policy.mutable_snp()->set_vmpl(4);
  EXPECT_EQ(ValidateSnpPolicy(policy.snp()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SnpChainTest, TurinVcekChainsToTheBuiltInTurinArk) {
  const std::string dir = "sev-snp/turin-vcek-only-virtee/";
  auto vcek = Certificate::FromDer(ReadTestBinary(dir + "vcek.der"));
  ASSERT_TRUE(vcek.ok()) << vcek.status();
  auto intermediates = ParsePemChain(ReadTestText(dir + "ask_ark_turin.pem"));
  ASSERT_TRUE(intermediates.ok());
  v1::SnpPolicy policy;
  auto arks = SnpPinnedArks(policy);
  ASSERT_TRUE(arks.ok());
  absl::Time at = absl::FromCivil(absl::CivilDay(2025, 6, 1), absl::UTCTimeZone());
  auto chain = VerifySnpCertChain(*vcek, *intermediates, *arks, at);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->product, "Turin");
  EXPECT_FALSE(chain->vlek);
  // Turin VCEKs carry the FMC SPL and an 8-byte hwID.
  EXPECT_TRUE(vcek->ExtensionValue(kVcekFmcSplOid).ok());
  EXPECT_EQ(vcek->ExtensionValue(kVcekHwidOid)->size(), 8u);

  // Before its validity, and with only Milan pinned, it fails.
  EXPECT_EQ(VerifySnpCertChain(*vcek, *intermediates, *arks,
                               absl::FromCivil(absl::CivilDay(2024, 1, 1), absl::UTCTimeZone()))
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  policy.add_ark_pems(BuiltInAmdArkPems()[0]);
  auto milan_only = SnpPinnedArks(policy);
  ASSERT_TRUE(milan_only.ok());
  EXPECT_EQ(VerifySnpCertChain(*vcek, *intermediates, *milan_only, at).status().code(),
            absl::StatusCode::kPermissionDenied);
  // A Milan ASK does not issue a Turin VCEK.
  auto milan = ParsePemChain(ReadTestText("sev-snp/amd-roots/ask_ark_milan.pem"));
  EXPECT_FALSE(VerifySnpCertChain(*vcek, *milan, *arks, at).ok());
}

// A chain with the right names under a pinned root, signed with ECDSA instead of AMD's
// RSASSA-PSS/SHA-384, is refused: the signature algorithm is pinned too.
TEST(SnpChainTest, OnlyRsaPssSignedChainsAreAccepted) {
  absl::Time now = absl::FromCivil(absl::CivilDay(2024, 6, 1), absl::UTCTimeZone());
  auto make = [&](const std::string& name, bool is_ca, const crypto::EcPrivateKey& subject,
                  const Certificate* issuer, const crypto::EcPrivateKey& issuer_key) {
    CertificateTemplate spec;
    spec.common_name = name;
    spec.is_ca = is_ca;
    spec.not_before = now - absl::Hours(24);
    spec.not_after = now + absl::Hours(24);
    auto cert = IssueCertificate(spec, subject.PublicKeyDer(), issuer, issuer_key);
    EXPECT_TRUE(cert.ok()) << cert.status();
    return *cert;
  };
  auto ark_key = crypto::EcPrivateKey::Generate(crypto::EcCurve::kP384);
  auto ask_key = crypto::EcPrivateKey::Generate(crypto::EcCurve::kP384);
  auto vcek_key = crypto::EcPrivateKey::Generate(crypto::EcCurve::kP384);
  ASSERT_TRUE(ark_key.ok() && ask_key.ok() && vcek_key.ok());
  Certificate ark = make("ARK-Milan", true, **ark_key, nullptr, **ark_key);
  Certificate ask = make("SEV-Milan", true, **ask_key, &ark, **ark_key);
  Certificate vcek = make("SEV-VCEK", false, **vcek_key, &ask, **ask_key);
  // The chain itself is sound...
  ASSERT_TRUE(VerifyChain({vcek, ask}, ark, now).ok());
  // ...but not signed the way AMD signs.
  auto chain = VerifySnpCertChain(vcek, {ask}, {ark}, now);
  ASSERT_FALSE(chain.ok());
  EXPECT_NE(chain.status().message().find("RSASSA-PSS/SHA-384"), std::string::npos)
      << chain.status();
}

TEST(SnpPolicyYamlTest, TheSnpSectionLoadsFromYaml) {
  const std::string yaml = absl::StrCat(R"(name: snp-test
tee: sev-snp
gpu: none
enclave_measurements: [")",
                                        std::string(96, 'a'), R"("]
snp:
  minimum_tcb:
    bootloader: 3
    microcode: 115
  vmpl: 0
  host_data: [")",
                                        std::string(64, '0'), R"("]
  allow_migration_agent: false
)");
  auto policy = ParsePolicyYaml(yaml, "snp.yaml");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->snp().minimum_tcb().bootloader(), 3u);
  EXPECT_EQ(policy->snp().minimum_tcb().microcode(), 115u);
  EXPECT_EQ(policy->snp().host_data_size(), 1);
  EXPECT_TRUE(ValidateSnpPolicy(policy->snp()).ok());
  auto again = ParsePolicyYaml(PolicyToYaml(*policy), "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), policy->SerializeAsString());
}

}  // namespace
}  // namespace cloister::attest
