#include "attest/tdx/tdx_verifier.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "attest/snp/amd_roots.h"
#include "attest/tdx/intel_root.h"
#include "attest/tdx/tdx_collateral.h"
#include "attest/tdx/tdx_quote.h"
#include "attest/test_util.h"
#include "base/file.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using ::cloister::attest::testing::Detail;
using ::cloister::attest::testing::Dump;
using ::cloister::attest::testing::Failed;
using ::cloister::attest::testing::ReadTestBinary;
using ::cloister::attest::testing::ResultOf;
using ::cloister::attest::testing::ReadTestText;
using Json = nlohmann::json;

constexpr char kV4Quote[] = "tdx/tdx_prod_quote_SPR_E4.dat";
constexpr char kV5Quote[] = "tdx/quote_v5_sample.dat";

// Inside the validity of the PCK chain, both CRLs, the TCB info and the QE identity samples.
absl::Time CollateralTime() {
  return absl::FromCivil(absl::CivilDay(2023, 6, 20), absl::UTCTimeZone());
}
// Inside the v5 sample's PCK validity (from 2026-01-27).
absl::Time V5Time() { return absl::FromCivil(absl::CivilDay(2026, 2, 15), absl::UTCTimeZone()); }

std::string LocalTestData(const std::string& name) {
  auto text = ReadFile(std::string(CLOISTER_TDX_LOCAL_TESTDATA_DIR) + "/" + name);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : std::string();
}

Json Expected() { return Json::parse(ReadTestText("tdx/expected_tdx_prod_quote_SPR_E4.json")); }

Bytes Hex(const std::string& hex) {
  auto bytes = HexDecode(hex);
  EXPECT_TRUE(bytes.ok()) << hex;
  return bytes.ok() ? *bytes : Bytes();
}

Policy PolicyWithMrtd(const std::string& mr_td_hex) {
  Policy policy;
  policy.set_name("test");
  policy.set_tee(v1::TEE_TYPE_TDX);
  policy.set_gpu(v1::GPU_TYPE_NONE);
  policy.add_enclave_measurements(mr_td_hex);
  return policy;
}

TdxCollateral FullCollateral() {
  TdxCollateral collateral;
  collateral.tcb_info = ReadTestText("tdx/sample_tcbInfo_response");
  collateral.qe_identity = ReadTestText("tdx/sample_qeIdentity_response");
  collateral.signing_chain_pem = LocalTestData("tcb_info_issuer_chain.pem");
  collateral.root_ca_crl = ReadTestBinary("tdx/rootcrl.der");
  collateral.pck_crl = ReadTestBinary("tdx/pckcrl");
  return collateral;
}

Verdict MustVerify(const TdxInput& input, const Policy& policy, absl::Time at = CollateralTime()) {
  auto verdict = VerifyTdxQuote(input, policy, at);
  EXPECT_TRUE(verdict.ok()) << verdict.status();
  return verdict.ok() ? *verdict : Verdict();
}

TEST(TdxRootTest, BuiltInRootIsTheIntelRootInTestData) {
  auto built_in = Certificate::FromPem(BuiltInIntelSgxRootPem());
  auto file = Certificate::FromPem(ReadTestText("tdx/intel_sgx_root_ca.pem"));
  ASSERT_TRUE(built_in.ok() && file.ok());
  EXPECT_EQ(built_in->ToDer(), file->ToDer());
  EXPECT_EQ(built_in->SubjectCommonName(), "Intel SGX Root CA");
}

// Every field of expected_tdx_prod_quote_SPR_E4.json.
TEST(TdxQuoteTest, ParsesTheV4QuoteAsExpected) {
  Json e = Expected();
  Bytes bytes = ReadTestBinary(kV4Quote);
  ASSERT_EQ(bytes.size(), e["length"].get<size_t>());
  auto quote = ParseTdxQuote(bytes);
  ASSERT_TRUE(quote.ok()) << quote.status();
  const Json& h = e["header"];
  EXPECT_EQ(quote->header.version, h["version"].get<int>());
  EXPECT_EQ(quote->header.attestation_key_type, h["attestation_key_type"].get<int>());
  EXPECT_EQ(absl::StrCat("0x", absl::Hex(quote->header.tee_type)), h["tee_type"]);
  EXPECT_EQ(HexEncode(quote->header.qe_vendor_id), h["qe_vendor_id"]);
  EXPECT_EQ(HexEncode(quote->header.user_data), h["user_data"]);
  EXPECT_EQ(quote->header.reserved1,
            h["bytes_0x08_0x09 (go-tdx-guest: pce_svn; Intel v4 spec: reserved)"].get<int>());
  EXPECT_EQ(quote->header.reserved2,
            h["bytes_0x0A_0x0B (go-tdx-guest: qe_svn; Intel v4 spec: reserved)"].get<int>());
  const Json& b = e["td_quote_body"];
  const TdReportBody& body = quote->body;
  EXPECT_EQ(HexEncode(body.tee_tcb_svn), b["tee_tcb_svn"]);
  EXPECT_EQ(HexEncode(body.mr_seam), b["mr_seam"]);
  EXPECT_EQ(HexEncode(body.mr_signer_seam), b["mr_signer_seam"]);
  EXPECT_EQ(HexEncode(body.seam_attributes), b["seam_attributes"]);
  EXPECT_EQ(HexEncode(body.td_attributes), b["td_attributes"]);
  EXPECT_EQ(HexEncode(body.xfam), b["xfam"]);
  EXPECT_EQ(HexEncode(body.mr_td), b["mr_td"]);
  EXPECT_EQ(HexEncode(body.mr_config_id), b["mr_config_id"]);
  EXPECT_EQ(HexEncode(body.mr_owner), b["mr_owner"]);
  EXPECT_EQ(HexEncode(body.mr_owner_config), b["mr_owner_config"]);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(HexEncode(body.rtmr[i]), b[absl::StrCat("rtmr", i)]);
  EXPECT_EQ(HexEncode(body.report_data), b["report_data"]);
  EXPECT_FALSE(body.tee_tcb_svn2.has_value());
  EXPECT_EQ(quote->signature_data_size, e["signed_data_length"].get<uint32_t>());
  EXPECT_EQ(quote->signed_size, 0x278u);
  EXPECT_EQ(e["certification_data_type"].get<int>(), kCertificationDataQeReport);
  EXPECT_EQ(e["inner_certification_data_type"].get<int>(), kCertificationDataPckChain);
  const Json& qe = e["qe_report"];
  EXPECT_EQ(HexEncode(quote->qe_report_body.mr_enclave), qe["mrenclave"]);
  EXPECT_EQ(HexEncode(quote->qe_report_body.mr_signer), qe["mrsigner"]);
  EXPECT_EQ(quote->qe_report_body.isv_prod_id, qe["isv_prod_id"].get<int>());
  EXPECT_EQ(quote->qe_report_body.isv_svn, qe["isv_svn"].get<int>());
  auto chain = ParsePemChain(quote->pck_chain_pem);
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->size(), e["pck_chain_cns"].size());
  for (size_t i = 0; i < chain->size(); ++i) {
    EXPECT_EQ((*chain)[i].SubjectCommonName(), e["pck_chain_cns"][i]);
  }
  EXPECT_EQ(chain->back().ToDer(), Certificate::FromPem(BuiltInIntelSgxRootPem())->ToDer());
  EXPECT_TRUE(e["pck_chain_root_equals_intel_sgx_root_ca"].get<bool>());
  // go-tdx-guest appended 39 bytes of text after the quote; they are counted, not parsed.
  EXPECT_EQ(quote->trailing_size, bytes.size() - 0x27C - quote->signature_data_size);
}

TEST(TdxVerifierTest, V4QuotePassesWithoutCollateral) {
  Json e = Expected();
  TdxInput input;
  input.quote = ReadTestBinary(kV4Quote);
  input.expected_report_data = Hex(e["td_quote_body"]["report_data"]);
  Verdict verdict = MustVerify(input, PolicyWithMrtd(e["td_quote_body"]["mr_td"]));
  EXPECT_TRUE(verdict.pass) << Dump(verdict);
  const bool quote_ok =
      e["quote_signature_valid(ECDSA-P256/SHA-256 over bytes 0..0x277 with the attestation key "
        "in the quote)"]
          .get<bool>();
  const bool qe_ok = e["qe_report_signature_valid_with_pck_leaf"].get<bool>();
  const bool binding_ok =
      e["qe_report_data_check(SHA-256(attestation_key||qe_auth_data) == report_data[0:32], rest "
        "zero)"]
          .get<bool>();
  EXPECT_TRUE(quote_ok && qe_ok && binding_ok);
  EXPECT_EQ(ResultOf(verdict, "report.parse"), Check::kPass);
  EXPECT_NE(Detail(verdict, "report.parse").find("39 bytes after the signature data ignored"),
            std::string::npos);
  EXPECT_EQ(ResultOf(verdict, "certs.chain"), Check::kPass);
  EXPECT_EQ(ResultOf(verdict, "report.signature"), Check::kPass);
  EXPECT_EQ(ResultOf(verdict, "certs.revocation"), Check::kSkipped);
  EXPECT_EQ(ResultOf(verdict, "tcb"), Check::kSkipped);
  EXPECT_EQ(ResultOf(verdict, "qe.identity"), Check::kSkipped);
  EXPECT_EQ(ResultOf(verdict, "policy"), Check::kPass);
  EXPECT_EQ(ResultOf(verdict, "measurement"), Check::kPass);
  EXPECT_EQ(ResultOf(verdict, "report_data"), Check::kPass);
  const auto& c = verdict.claims;
  const Json& b = e["td_quote_body"];
  EXPECT_EQ(c.at("mr_td"), b["mr_td"]);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.at(absl::StrCat("rtmr", i)), b[absl::StrCat("rtmr", i)]);
  EXPECT_EQ(c.at("mr_seam"), b["mr_seam"]);
  EXPECT_EQ(c.at("tee_tcb_svn"), b["tee_tcb_svn"]);
  EXPECT_EQ(c.at("td_attributes"), b["td_attributes"]);
  EXPECT_EQ(c.at("td_attributes.debug"), "false");
  EXPECT_EQ(c.at("xfam"), b["xfam"]);
  EXPECT_EQ(c.at("report_data"), b["report_data"]);
  EXPECT_EQ(c.at("quote_version"), "4");
  EXPECT_EQ(c.at("tdx_version"), "TDX 1.0");
  EXPECT_EQ(c.at("qe.mr_signer"), e["qe_report"]["mrsigner"]);
  EXPECT_EQ(c.at("pck.fmspc"), "50806f000000");
}

TEST(TdxVerifierTest, V4QuoteWithSampleCollateral) {
  Json e = Expected();
  TdxInput input;
  input.quote = ReadTestBinary(kV4Quote);
  input.collateral = FullCollateral();
  Verdict verdict = MustVerify(input, PolicyWithMrtd(e["td_quote_body"]["mr_td"]));
  // The CRLs are current and revoke nothing of this chain; the QE is Intel's, up to date.
  EXPECT_EQ(ResultOf(verdict, "certs.revocation"), Check::kPass) << Dump(verdict);
  EXPECT_EQ(ResultOf(verdict, "qe.identity"), Check::kPass) << Dump(verdict);
  EXPECT_NE(Detail(verdict, "qe.identity").find("UpToDate"), std::string::npos);
  EXPECT_EQ(verdict.claims.at("qe.tcb_status"), "UpToDate");
  // The 2023 TCB info is signed correctly, but this 2022 platform (SGX components 3,3,2,2,2,...
  // and TEE_TCB_SVN 03.00.04) is below every level it lists (5,5,2,2,3,... and 3,0,5).
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"tcb"}) << Dump(verdict);
  EXPECT_NE(Detail(verdict, "tcb").find("no TCB level of the TCB info matches"), std::string::npos);
  EXPECT_FALSE(verdict.pass);
}

TEST(TdxVerifierTest, CollateralProblemsFailTcb) {
  Json e = Expected();
  Policy policy = PolicyWithMrtd(e["td_quote_body"]["mr_td"]);
  TdxInput input;
  input.quote = ReadTestBinary(kV4Quote);
  input.collateral = FullCollateral();

  TdxInput unsigned_input = input;
  unsigned_input.collateral.signing_chain_pem.clear();
  Verdict verdict = MustVerify(unsigned_input, policy);
  EXPECT_EQ(ResultOf(verdict, "tcb"), Check::kFail);
  EXPECT_NE(Detail(verdict, "tcb").find("cannot be authenticated"), std::string::npos);
  EXPECT_EQ(ResultOf(verdict, "qe.identity"), Check::kFail);

  TdxInput tampered = input;
  tampered.collateral.tcb_info =
      absl::StrReplaceAll(*input.collateral.tcb_info, {{"\"OutOfDate\"", "\"UpToDate\""}});
  ASSERT_NE(*tampered.collateral.tcb_info, *input.collateral.tcb_info);
  verdict = MustVerify(tampered, policy);
  EXPECT_NE(Detail(verdict, "tcb").find("signature does not verify"), std::string::npos)
      << Detail(verdict, "tcb");
  EXPECT_EQ(ResultOf(verdict, "qe.identity"), Check::kPass);

  verdict =
      MustVerify(input, policy, absl::FromCivil(absl::CivilDay(2023, 7, 20), absl::UTCTimeZone()));
  EXPECT_NE(Detail(verdict, "tcb").find("the TCB info is valid from"), std::string::npos)
      << Detail(verdict, "tcb");
  EXPECT_NE(Detail(verdict, "qe.identity").find("the QE identity is valid from"),
            std::string::npos);
  EXPECT_EQ(ResultOf(verdict, "certs.revocation"), Check::kFail);  // the PCK CRL expired too

  TdxInput swapped = input;
  swapped.collateral.pck_crl = ReadTestBinary("tdx/rootcrl.der");
  verdict = MustVerify(swapped, policy);
  EXPECT_EQ(ResultOf(verdict, "certs.revocation"), Check::kFail);
  EXPECT_NE(Detail(verdict, "certs.revocation").find("not by 'Intel SGX PCK Platform CA'"),
            std::string::npos)
      << Detail(verdict, "certs.revocation");
}

TEST(TdxVerifierTest, PolicyRequirementsForCollateralAndCrls) {
  Json e = Expected();
  Policy policy = PolicyWithMrtd(e["td_quote_body"]["mr_td"]);
  policy.mutable_tdx()->set_require_collateral(true);
  policy.mutable_tdx()->set_require_revocation_check(true);
  TdxInput input;
  input.quote = ReadTestBinary(kV4Quote);
  Verdict verdict = MustVerify(input, policy);
  EXPECT_EQ(Failed(verdict), (std::vector<std::string>{"certs.revocation", "tcb", "qe.identity"}))
      << Dump(verdict);
  EXPECT_FALSE(verdict.pass);

  // Only the root CRL: still refused when the policy requires both.
  input.collateral.root_ca_crl = ReadTestBinary("tdx/rootcrl.der");
  verdict = MustVerify(input, policy);
  EXPECT_NE(Detail(verdict, "certs.revocation").find("requires the PCK CRL"), std::string::npos);
}

class TdxMutationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    e_ = Expected();
    input_.quote = ReadTestBinary(kV4Quote);
    input_.expected_report_data = Hex(e_["td_quote_body"]["report_data"]);
    policy_ = PolicyWithMrtd(e_["td_quote_body"]["mr_td"]);
    ASSERT_TRUE(MustVerify(input_, policy_).pass);
  }
  // Offset of a body field in the quote (v4: body at 0x30).
  static size_t Body(size_t offset) { return 0x30 + offset; }
  Json e_;
  TdxInput input_;
  Policy policy_;
};

TEST_F(TdxMutationTest, FlippedQuoteSignatureFailsReportSignature) {
  TdxInput input = input_;
  input.quote[0x27C + 10] ^= 1;
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"report.signature"}) << Dump(verdict);
  EXPECT_NE(Detail(verdict, "report.signature").find("quote signature"), std::string::npos);
  EXPECT_TRUE(verdict.claims.empty());
}

TEST_F(TdxMutationTest, FlippedReportDataFailsSignatureAndReportData) {
  TdxInput input = input_;
  input.quote[Body(0x208)] ^= 1;
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), (std::vector<std::string>{"report.signature", "report_data"}))
      << Dump(verdict);
  // And a different expected value alone fails only report_data.
  input = input_;
  (*input.expected_report_data)[0] ^= 1;
  verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"report_data"}) << Dump(verdict);
}

TEST_F(TdxMutationTest, MeasurementChecks) {
  TdxInput input = input_;
  input.quote[Body(0x88)] ^= 1;  // MRTD
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), (std::vector<std::string>{"report.signature", "measurement"}))
      << Dump(verdict);

  Policy policy = policy_;
  policy.set_enclave_measurements(0, std::string(96, 'b'));
  verdict = MustVerify(input_, policy);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"measurement"}) << Dump(verdict);

  policy = policy_;
  policy.mutable_tdx()->add_rtmr2(std::string(96, '0'));
  verdict = MustVerify(input_, policy);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"measurement"}) << Dump(verdict);
  EXPECT_NE(Detail(verdict, "measurement").find("RTMR2"), std::string::npos);
  policy.mutable_tdx()->add_rtmr2(e_["td_quote_body"]["rtmr2"].get<std::string>());
  policy.mutable_tdx()->add_rtmr3(e_["td_quote_body"]["rtmr3"].get<std::string>());
  policy.mutable_tdx()->add_mr_seams(e_["td_quote_body"]["mr_seam"].get<std::string>());
  verdict = MustVerify(input_, policy);
  EXPECT_TRUE(verdict.pass) << Dump(verdict);
  EXPECT_NE(Detail(verdict, "measurement").find("MRTD, RTMR2, RTMR3, MRSEAM"), std::string::npos);

  policy = policy_;
  policy.mutable_tdx()->add_mr_seams(std::string(96, 'c'));
  verdict = MustVerify(input_, policy);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"measurement"});
}

TEST_F(TdxMutationTest, DebugBitFailsPolicy) {
  TdxInput input = input_;
  input.quote[Body(0x78)] |= 1;  // TDATTRIBUTES.DEBUG
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), (std::vector<std::string>{"report.signature", "policy"}))
      << Dump(verdict);
  EXPECT_NE(Detail(verdict, "policy").find("DEBUG"), std::string::npos);
  Policy policy = policy_;
  policy.set_allow_debug(true);
  verdict = MustVerify(input, policy);
  EXPECT_EQ(ResultOf(verdict, "policy"), Check::kPass);
}

TEST_F(TdxMutationTest, QeReportAndAuthDataAreBound) {
  auto quote = ParseTdxQuote(input_.quote);
  ASSERT_TRUE(quote.ok());
  const size_t qe_report_offset = 0x27C + 64 + 64 + 6;
  TdxInput input = input_;
  input.quote[qe_report_offset + 64] ^= 1;  // QE MRENCLAVE
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"report.signature"});
  EXPECT_NE(Detail(verdict, "report.signature").find("QE report signature"), std::string::npos);

  input = input_;
  input.quote[qe_report_offset + 384 + 64 + 2] ^= 1;  // first QE auth data byte
  verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"report.signature"});
  EXPECT_NE(Detail(verdict, "report.signature").find("does not bind the attestation key"),
            std::string::npos);

  input = input_;
  input.quote[0x27C + 64 + 3] ^= 1;  // attestation key
  verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"report.signature"});
}

TEST_F(TdxMutationTest, ReorderedPckChainFailsTheChain) {
  auto quote = ParseTdxQuote(input_.quote);
  ASSERT_TRUE(quote.ok());
  auto chain = ParsePemChain(quote->pck_chain_pem);
  ASSERT_TRUE(chain.ok());
  ASSERT_EQ(chain->size(), 3u);
  std::string reordered = (*chain)[1].ToPem() + (*chain)[0].ToPem() + (*chain)[2].ToPem();
  std::string original = quote->pck_chain_pem;
  ASSERT_EQ(reordered.size(), original.size());
  std::string bytes = ToString(input_.quote);
  size_t at = bytes.find(original);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, original.size(), reordered);
  TdxInput input = input_;
  input.quote = ToBytes(bytes);
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_FALSE(verdict.pass);
  EXPECT_EQ(ResultOf(verdict, "certs.chain"), Check::kFail);
  EXPECT_NE(Detail(verdict, "certs.chain").find("'Intel SGX PCK Platform CA'"), std::string::npos)
      << Detail(verdict, "certs.chain");
  EXPECT_EQ(ResultOf(verdict, "report.signature"), Check::kFail);
}

TEST_F(TdxMutationTest, OnlyThePinnedRootAndTimesInsideValidity) {
  Policy policy = policy_;
  policy.mutable_tdx()->set_root_pem(BuiltInAmdArkPems()[0]);  // a CA, but not Intel's
  Verdict verdict = MustVerify(input_, policy);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"certs.chain"}) << Dump(verdict);

  verdict =
      MustVerify(input_, policy_, absl::FromCivil(absl::CivilDay(2022, 1, 1), absl::UTCTimeZone()));
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"certs.chain"}) << Dump(verdict);
}

TEST_F(TdxMutationTest, MalformedQuotesFailParse) {
  TdxInput input = input_;
  input.quote.resize(1000);
  Verdict verdict = MustVerify(input, policy_);
  EXPECT_EQ(Failed(verdict), std::vector<std::string>{"report.parse"}) << Dump(verdict);
  EXPECT_EQ(ResultOf(verdict, "report.signature"), Check::kSkipped);
  EXPECT_FALSE(verdict.pass);

  input = input_;
  input.quote[12] ^= 1;  // QE vendor ID
  verdict = MustVerify(input, policy_);
  EXPECT_EQ(ResultOf(verdict, "report.parse"), Check::kFail);
  EXPECT_NE(Detail(verdict, "report.parse").find("QE vendor"), std::string::npos);

  for (auto [offset, value] :
       std::vector<std::pair<size_t, uint8_t>>{{0, 3}, {2, 3}, {4, 0}, {0x27C + 128, 5}}) {
    Bytes bytes = input_.quote;
    bytes[offset] = value;
    EXPECT_FALSE(ParseTdxQuote(bytes).ok()) << offset;
  }
  Bytes grown = input_.quote;
  grown[0x278] += 1;  // the signature data size now includes one trailing byte
  EXPECT_FALSE(ParseTdxQuote(grown).ok());
}

TEST_F(TdxMutationTest, BadPolicyOrExpectedSizeIsAnError) {
  TdxInput input = input_;
  input.expected_report_data = Bytes(63, 0);
  EXPECT_EQ(VerifyTdxQuote(input, policy_, CollateralTime()).status().code(),
            absl::StatusCode::kInvalidArgument);
  Policy policy = policy_;
  policy.mutable_tdx()->add_rtmr0("00");
  EXPECT_EQ(VerifyTdxQuote(input_, policy, CollateralTime()).status().code(),
            absl::StatusCode::kInvalidArgument);
  policy = policy_;
  policy.mutable_tdx()->add_accepted_tcb_statuses("Fine");
  EXPECT_EQ(ValidateTdxPolicy(policy.tdx()).code(), absl::StatusCode::kInvalidArgument);
  policy = policy_;
  policy.mutable_tdx()->set_root_pem("not pem");
  EXPECT_EQ(ValidateTdxPolicy(policy.tdx()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TdxMutationTest, BundleAdapterUsesCvmPrefix) {
  EvidenceBundle bundle;
  bundle.set_tee_type(v1::TEE_TYPE_TDX);
  bundle.set_cvm_report(ToString(input_.quote));
  Verdict verdict = TdxCvmVerifier().Verify(bundle, {}, policy_, CollateralTime());
  EXPECT_TRUE(verdict.pass) << Dump(verdict);
  EXPECT_EQ(verdict.Find("cvm.report_data"), nullptr);
  EXPECT_EQ(verdict.claims.at("cvm.report_data"), e_["td_quote_body"]["report_data"]);
  for (const char* check : {"cvm.report.parse", "cvm.certs.chain", "cvm.report.signature",
                            "cvm.policy", "cvm.measurement"}) {
    EXPECT_EQ(ResultOf(verdict, check), Check::kPass) << check;
  }
}

TEST(TdxQuoteTest, V5SampleParsesAndVerifies) {
  Bytes bytes = ReadTestBinary(kV5Quote);
  auto quote = ParseTdxQuote(bytes);
  ASSERT_TRUE(quote.ok()) << quote.status();
  EXPECT_EQ(quote->header.version, 5);
  EXPECT_EQ(quote->body_type, kTdxBodyType15);
  EXPECT_EQ(quote->signed_size, kTdxQuoteHeaderSize + 6 + kTdReportBody15Size);
  ASSERT_TRUE(quote->body.tee_tcb_svn2.has_value());
  ASSERT_TRUE(quote->body.mr_service_td.has_value());
  EXPECT_EQ(quote->trailing_size, 0u);

  TdxInput input;
  input.quote = bytes;
  Verdict verdict = MustVerify(input, PolicyWithMrtd(HexEncode(quote->body.mr_td)), V5Time());
  EXPECT_TRUE(verdict.pass) << Dump(verdict);
  EXPECT_EQ(verdict.claims.at("tdx_version"), "TDX 1.5");
  EXPECT_EQ(verdict.claims.at("tee_tcb_svn2"), HexEncode(*quote->body.tee_tcb_svn2));
}

TEST(TdxCollateralTest, PckExtensionsOfTheV4Quote) {
  auto quote = ParseTdxQuote(ReadTestBinary(kV4Quote));
  ASSERT_TRUE(quote.ok());
  auto chain = ParsePemChain(quote->pck_chain_pem);
  ASSERT_TRUE(chain.ok());
  auto pck = ReadPckExtensions((*chain)[0]);
  ASSERT_TRUE(pck.ok()) << pck.status();
  EXPECT_EQ(HexEncode(pck->fmspc), "50806f000000");
  EXPECT_EQ(HexEncode(pck->pce_id), "0000");
  EXPECT_EQ(pck->pce_svn, 11);
  EXPECT_EQ(HexEncode(pck->cpu_svn), "03030202020100020000000000000000");
  std::array<uint8_t, 16> components{3, 3, 2, 2, 2, 1, 0, 2};
  EXPECT_EQ(pck->sgx_tcb_components, components);
  EXPECT_FALSE(ReadPckExtensions((*chain)[1]).ok()) << "a CA has no SGX extension";
}

// The 2026 TCB info for the v5 sample's FMSPC (its signer is not in our test data, so this
// evaluates the parsed document directly). TEE_TCB_SVN 0b.01.04: module TDX_01 at SVN 11 (>= 6:
// UpToDate); PCK components 4,4,2,2,4,1,0,5 and PCESVN 13 meet the first level (3,3,2,2,4,1,0,5;
// 13), and TEE_TCB_SVN[2..] = 4 meets its TDX components from index 2 (3).
TEST(TdxCollateralTest, EvaluatesTheV5SampleWithModuleIdentities) {
  auto quote = ParseTdxQuote(ReadTestBinary(kV5Quote));
  ASSERT_TRUE(quote.ok());
  auto chain = ParsePemChain(quote->pck_chain_pem);
  ASSERT_TRUE(chain.ok());
  auto pck = ReadPckExtensions((*chain)[0]);
  ASSERT_TRUE(pck.ok()) << pck.status();
  auto signed_json = SplitSignedJson(ReadTestText("tdx/sample_tcbinfo_response_v5"), "tcbInfo");
  ASSERT_TRUE(signed_json.ok()) << signed_json.status();
  auto info = ParseTdxTcbInfo(signed_json->signed_text);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->module_identities.size(), 2u);
  auto result = EvaluateTdxTcb(*info, *pck, quote->body);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->status, "UpToDate");
  EXPECT_EQ(result->module_id, "TDX_01");
  EXPECT_EQ(result->module_status, "UpToDate");

  // One PCK component lower: the first level no longer matches, the second (OutOfDate) does.
  PckExtensions older = *pck;
  older.sgx_tcb_components[0] = 2;
  result = EvaluateTdxTcb(*info, older, quote->body);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->status, "OutOfDate");
  // The module's SVN below every TDX_01 level.
  TdReportBody body = quote->body;
  body.tee_tcb_svn[0] = 1;
  EXPECT_FALSE(EvaluateTdxTcb(*info, *pck, body).ok());
  // Another platform.
  PckExtensions other = *pck;
  other.fmspc[0] ^= 1;
  EXPECT_NE(EvaluateTdxTcb(*info, other, quote->body).status().message().find("FMSPC"),
            std::string::npos);
}

TEST(TdxCollateralTest, QeIdentityMatching) {
  auto quote = ParseTdxQuote(ReadTestBinary(kV4Quote));
  ASSERT_TRUE(quote.ok());
  auto signed_json =
      SplitSignedJson(ReadTestText("tdx/sample_qeIdentity_response"), "enclaveIdentity");
  ASSERT_TRUE(signed_json.ok()) << signed_json.status();
  auto identity = ParseQeIdentity(signed_json->signed_text);
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(*EvaluateQeIdentity(*identity, quote->qe_report_body), "UpToDate");
  SgxReportBody report = quote->qe_report_body;
  report.isv_svn = 3;
  EXPECT_FALSE(EvaluateQeIdentity(*identity, report).ok());
  report = quote->qe_report_body;
  report.mr_signer[0] ^= 1;
  EXPECT_NE(EvaluateQeIdentity(*identity, report).status().message().find("MRSIGNER"),
            std::string::npos);
  report = quote->qe_report_body;
  report.attributes[0] ^= 0x02;  // a masked-in attribute bit
  EXPECT_FALSE(EvaluateQeIdentity(*identity, report).ok());
}

TEST(TdxCollateralTest, SignedJsonIsStrict) {
  EXPECT_FALSE(SplitSignedJson("not json", "tcbInfo").ok());
  EXPECT_FALSE(SplitSignedJson(R"({"tcbInfo":{}})", "tcbInfo").ok());  // no signature
  EXPECT_FALSE(
      SplitSignedJson(absl::StrCat(R"({"tcbInfo":{},"signature":")", std::string(126, 'a'), "\"}"),
                      "tcbInfo")
          .ok());
  EXPECT_FALSE(SplitSignedJson(absl::StrCat(R"({"tcbInfo":{},"tcbInfo":{},"signature":")",
                                            std::string(128, 'a'), "\"}"),
                               "tcbInfo")
                   .ok());
  EXPECT_FALSE(SplitSignedJson(std::string(10000, '[') + std::string(10000, ']'), "tcbInfo").ok());
  auto ok = SplitSignedJson(absl::StrCat(R"( { "other" : [1, "}"], "tcbInfo" : {"a": "\"{"} ,)",
                                         R"("signature":")", std::string(128, 'a'), "\"}"),
                            "tcbInfo");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->signed_text, R"({"a": "\"{"})");
}

TEST(TdxPolicyYamlTest, TheTdxSectionLoadsFromYaml) {
  const std::string yaml = absl::StrCat(R"(name: tdx-test
tee: tdx
gpu: none
enclave_measurements: [")",
                                        std::string(96, 'a'), R"("]
tdx:
  rtmr1: [")",
                                        std::string(96, 'b'), R"("]
  require_collateral: true
  accepted_tcb_statuses: [UpToDate, SWHardeningNeeded]
)");
  auto policy = ParsePolicyYaml(yaml, "tdx.yaml");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_TRUE(policy->tdx().require_collateral());
  EXPECT_EQ(policy->tdx().accepted_tcb_statuses_size(), 2);
  EXPECT_TRUE(ValidateTdxPolicy(policy->tdx()).ok());
}

}  // namespace
}  // namespace cloister::attest
