// Tests of cloister-verify: the built binary is run as a subprocess (exit status, stdout,
// stderr), with the real evidence in shared/testdata and policies written per test.
#include "attest/cli/verify_cli.h"

#include <filesystem>
#include <sys/wait.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attest/binding.h"
#include "attest/sim/sim_tee.h"
#include "attest/test_util.h"
#include "base/file.h"
#include "crypto/hash.h"
#include "crypto/keys.h"
#include "crypto/random.h"
#include "gtest/gtest.h"

namespace cloister::attest {
namespace {

using ::cloister::attest::testing::ReadTestText;
using ::cloister::attest::testing::ScopedTempDir;
using ::cloister::attest::testing::TestDataPath;
using Json = nlohmann::json;

constexpr char kSnpVirtee[] = "sev-snp/milan-v2-virtee/";
constexpr char kSnpGoSevGuest[] = "sev-snp/milan-v2-go-sev-guest/";
constexpr char kSnpTime[] = "2024-06-01T00:00:00Z";
constexpr char kTdxTime[] = "2023-06-20T00:00:00Z";

struct ProcessResult {
  int status = -1;
  std::string out;
  std::string err;
};

std::string Quote(const std::string& arg) {
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

class VerifyCliTest : public ::testing::Test {
 protected:
  // Runs the cloister-verify binary with `args`.
  ProcessResult RunBinary(const std::vector<std::string>& args) {
    std::vector<std::string> quoted = {Quote(CLOISTER_VERIFY_BINARY)};
    for (const std::string& arg : args) quoted.push_back(Quote(arg));
    const std::string out_path = dir_.path() + "/stdout";
    const std::string err_path = dir_.path() + "/stderr";
    std::string command =
        absl::StrCat(absl::StrJoin(quoted, " "), " >", Quote(out_path), " 2>", Quote(err_path));
    int raw = std::system(command.c_str());
    ProcessResult run;
    run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    run.out = ReadFile(out_path).value_or("");
    run.err = ReadFile(err_path).value_or("");
    return run;
  }

  std::string Write(const std::string& name, std::string_view contents) {
    std::string path = dir_.path() + "/" + name;
    EXPECT_TRUE(WriteFileAtomic(path, contents, 0644).ok());
    return path;
  }

  // A policy file for one CVM measurement.
  std::string PolicyFile(const std::string& tee, const std::string& measurement,
                         const std::string& extra = "") {
    return Write(absl::StrCat("policy_", tee, ".yaml"),
                 absl::StrCat("name: cli-test\ntee: ", tee, "\ngpu: none\n",
                              "enclave_measurements: [\"", measurement, "\"]\n", extra));
  }

  static Json Expected(const std::string& dir) {
    return Json::parse(ReadTestText(dir + "expected.json"));
  }

  // The --json document, checked for exactly the documented shape.
  static Json ParseJsonOutput(const ProcessResult& run) {
    Json json = Json::parse(run.out, nullptr, false);
    EXPECT_FALSE(json.is_discarded()) << run.out;
    if (json.is_discarded()) return Json::object();
    EXPECT_EQ(json.size(), 3u);
    EXPECT_TRUE(json["verdict"] == "pass" || json["verdict"] == "fail");
    EXPECT_TRUE(json["checks"].is_array());
    for (const Json& check : json["checks"]) {
      EXPECT_EQ(check.size(), 3u) << check.dump();
      EXPECT_TRUE(check["name"].is_string());
      EXPECT_TRUE(check["result"] == "pass" || check["result"] == "fail" ||
                  check["result"] == "skipped")
          << check.dump();
      EXPECT_TRUE(check["detail"].is_string());
    }
    EXPECT_TRUE(json["claims"].is_object());
    for (const auto& [key, value] : json["claims"].items()) EXPECT_TRUE(value.is_string()) << key;
    return json;
  }

  static std::string ResultOf(const Json& json, const std::string& name) {
    for (const Json& check : json["checks"]) {
      if (check["name"] == name) return check["result"];
    }
    return "(missing)";
  }

  std::vector<std::string> SnpArgs(const std::string& dir, const std::string& policy) {
    return {"sev-snp",
            "--report",
            TestDataPath(dir + (dir == kSnpVirtee ? "report.hex" : "report.bin")),
            "--vcek",
            TestDataPath(dir + "vcek.der"),
            "--ask-ark",
            TestDataPath(dir + "ask_ark_milan.pem"),
            "--policy",
            policy,
            "--at",
            kSnpTime};
  }

  ScopedTempDir dir_;
};

TEST_F(VerifyCliTest, SevSnpHexReportPassesWithText) {
  Json e = Expected(kSnpVirtee);
  std::vector<std::string> args = SnpArgs(kSnpVirtee, PolicyFile("sev-snp", e["measurement"]));
  args.push_back("--nonce");
  args.push_back(e["report_data"]);
  ProcessResult run = RunBinary(args);
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_EQ(run.err, "");
  EXPECT_NE(run.out.find("sev-snp at 2024-06-01T00:00:00Z: PASS"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("  PASS  report.signature"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("  SKIP  host_data"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("  PASS  report_data"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find(absl::StrCat("  measurement = ", e["measurement"].get<std::string>())),
            std::string::npos)
      << run.out;
}

TEST_F(VerifyCliTest, SevSnpJsonShape) {
  Json e = Expected(kSnpVirtee);
  std::vector<std::string> args = SnpArgs(kSnpVirtee, PolicyFile("sev-snp", e["measurement"]));
  args.push_back("--json");
  ProcessResult run = RunBinary(args);
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  Json json = ParseJsonOutput(run);
  EXPECT_EQ(json["verdict"], "pass");
  EXPECT_EQ(ResultOf(json, "certs.chain"), "pass");
  EXPECT_EQ(ResultOf(json, "report_data"), "skipped");
  EXPECT_EQ(json["claims"]["chip_id"], e["chip_id"]);
  // The keys come in the documented order.
  EXPECT_EQ(run.out.find("\"verdict\""), run.out.find('"'));
}

TEST_F(VerifyCliTest, SevSnpWrongNonceFailsWithExitOne) {
  Json e = Expected(kSnpVirtee);
  std::vector<std::string> args = SnpArgs(kSnpVirtee, PolicyFile("sev-snp", e["measurement"]));
  args.insert(args.end(), {"--nonce", "0102", "--json"});
  ProcessResult run = RunBinary(args);
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  Json json = ParseJsonOutput(run);
  EXPECT_EQ(json["verdict"], "fail");
  EXPECT_EQ(ResultOf(json, "report_data"), "fail");
}

TEST_F(VerifyCliTest, SevSnpDebugGuestNeedsAllowDebug) {
  Json e = Expected(kSnpGoSevGuest);
  // REPORT_DATA is 01 02 03 04 05 then zeros: a short nonce is padded.
  std::vector<std::string> args =
      SnpArgs(kSnpGoSevGuest, PolicyFile("sev-snp", e["measurement"], "allow_debug: true\n"));
  args.insert(args.end(), {"--nonce", "0102030405", "--json"});
  ProcessResult run = RunBinary(args);
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_EQ(ResultOf(ParseJsonOutput(run), "report_data"), "pass");

  args = SnpArgs(kSnpGoSevGuest, PolicyFile("sev-snp", e["measurement"]));
  args.push_back("--json");
  run = RunBinary(args);
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_EQ(ResultOf(ParseJsonOutput(run), "policy"), "fail");
}

TEST_F(VerifyCliTest, SevSnpCertChainFileAndNoPolicy) {
  auto vcek = Certificate::FromDer(ToBytes(ReadTestText(std::string(kSnpVirtee) + "vcek.der")));
  ASSERT_TRUE(vcek.ok());
  std::string chain = Write(
      "chain.pem", vcek->ToPem() + ReadTestText(std::string(kSnpVirtee) + "ask_ark_milan.pem"));
  Json e = Expected(kSnpVirtee);
  ProcessResult run = RunBinary(
      {"sev-snp", "--report", TestDataPath(std::string(kSnpVirtee) + "report.hex"), "--cert-chain",
       chain, "--at", kSnpTime, "--policy", PolicyFile("sev-snp", e["measurement"]), "--json"});
  EXPECT_EQ(run.status, 0) << run.out << run.err;

  // Without a policy every cryptographic check still runs, but nothing vouches for the code.
  run = RunBinary({"sev-snp", "--report", TestDataPath(std::string(kSnpVirtee) + "report.hex"),
                   "--cert-chain", chain, "--at=2024-06-01T00:00:00Z", "--json"});
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  Json json = ParseJsonOutput(run);
  EXPECT_EQ(ResultOf(json, "report.signature"), "pass");
  EXPECT_EQ(ResultOf(json, "measurement"), "fail");
}

TEST_F(VerifyCliTest, TdxQuotePassesAndCollateralIsSorted) {
  Json e = Json::parse(ReadTestText("tdx/expected_tdx_prod_quote_SPR_E4.json"));
  std::string policy = PolicyFile("tdx", e["td_quote_body"]["mr_td"]);
  std::vector<std::string> args = {
      "tdx",      "--quote", TestDataPath("tdx/tdx_prod_quote_SPR_E4.dat"),
      "--policy", policy,    "--at",
      kTdxTime,   "--nonce", e["td_quote_body"]["report_data"],
      "--json"};
  ProcessResult run = RunBinary(args);
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  Json json = ParseJsonOutput(run);
  EXPECT_EQ(ResultOf(json, "report.signature"), "pass");
  EXPECT_EQ(ResultOf(json, "tcb"), "skipped");
  EXPECT_EQ(json["claims"]["mr_td"], e["td_quote_body"]["mr_td"]);
  EXPECT_EQ(json["claims"]["rtmr0"], e["td_quote_body"]["rtmr0"]);

  // With the PCS collateral (in any order) the CRLs and the QE pass, and the old platform TCB
  // is below every level of the 2023 TCB info.
  for (const char* file :
       {"sample_qeIdentity_response", "pckcrl", "rootcrl.der", "sample_tcbInfo_response"}) {
    args.push_back("--collateral");
    args.push_back(TestDataPath(std::string("tdx/") + file));
  }
  args.push_back("--collateral");
  args.push_back(std::string(CLOISTER_TDX_LOCAL_TESTDATA_DIR) + "/tcb_info_issuer_chain.pem");
  run = RunBinary(args);
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  json = ParseJsonOutput(run);
  EXPECT_EQ(ResultOf(json, "certs.revocation"), "pass");
  EXPECT_EQ(ResultOf(json, "qe.identity"), "pass");
  EXPECT_EQ(ResultOf(json, "tcb"), "fail");

  // The same collateral twice is a usage error.
  args.push_back("--collateral");
  args.push_back(TestDataPath("tdx/pckcrl"));
  run = RunBinary(args);
  EXPECT_EQ(run.status, 2);
  EXPECT_NE(run.err.find("second PCK CRL"), std::string::npos) << run.err;
}

TEST_F(VerifyCliTest, TdxHexQuoteAndV5) {
  Bytes quote = ToBytes(ReadTestText("tdx/quote_v5_sample.dat"));
  std::string hex_path = Write("quote.hex", HexEncode(quote) + "\n");
  auto parsed = ReadEvidenceFile(hex_path);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, quote);
  ProcessResult run =
      RunBinary({"tdx", "--report", hex_path, "--at", "2026-02-15T00:00:00Z", "--json"});
  EXPECT_EQ(run.status, 1) << run.out << run.err;  // no policy: the MRTD is not accepted
  Json json = ParseJsonOutput(run);
  EXPECT_EQ(ResultOf(json, "report.parse"), "pass");
  EXPECT_EQ(ResultOf(json, "certs.chain"), "pass");
  EXPECT_EQ(ResultOf(json, "report.signature"), "pass");
  EXPECT_EQ(ResultOf(json, "measurement"), "fail");
  EXPECT_EQ(json["claims"]["tdx_version"], "TDX 1.5");
}

TEST_F(VerifyCliTest, NvidiaGpuEndToEndVector) {
  const std::string dir = "nvidia-cc/hopper-545.00-e2e/";
  std::string policy =
      Write("gpu.yaml", "name: gpu\ntee: sev-snp\ngpu: nvidia-cc\nenclave_measurements: [\"" +
                            std::string(96, 'a') + "\"]\n");
  std::vector<std::string> args = {
      "nvidia-gpu",
      "--report",
      TestDataPath(dir + "attestation_report.hex"),
      "--cert-chain",
      TestDataPath(dir + "cert_chain.pem"),
      "--driver-rim",
      TestDataPath(dir + "driver_rim_545.00_test.swidtag"),
      "--vbios-rim",
      TestDataPath(dir + "vbios_rim_96005E0001_test.swidtag"),
      "--nonce",
      "4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e",
      "--policy",
      policy,
      "--at",
      "2024-06-01T00:00:00Z",
      "--json"};
  ProcessResult run = RunBinary(args);
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  Json json = ParseJsonOutput(run);
  EXPECT_EQ(json["verdict"], "pass");
  EXPECT_EQ(ResultOf(json, "report.signature"), "pass");
  EXPECT_EQ(json["claims"]["driver_version"], "545.00");

  // Another nonce: the nonce check fails.
  args[10] = std::string(64, '0');
  run = RunBinary(args);
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_EQ(ResultOf(ParseJsonOutput(run), "nonce"), "fail");

  // A 16-byte nonce is unusable input.
  args[10] = std::string(32, '0');
  run = RunBinary(args);
  EXPECT_EQ(run.status, 2);
}

TEST_F(VerifyCliTest, NvidiaGpuTakesRimsAndOcspFromThePolicy) {
  const std::string dir = "nvidia-cc/hopper-545.00-e2e/";
  std::filesystem::create_directories(dir_.path() + "/rims");
  Write("rims/driver.xml", ReadTestText(dir + "driver_rim_545.00_test.swidtag"));
  Write("rims/vbios.xml", ReadTestText(dir + "vbios_rim_96005E0001_test.swidtag"));
  std::string policy = Write(
      "gpu_rims.yaml", "name: gpu\ntee: sev-snp\ngpu: nvidia-cc\nenclave_measurements: [\"" +
                           std::string(96, 'a') + "\"]\nnvidia:\n  rim_dir: rims\n");
  std::vector<std::string> args = {"nvidia-gpu",
                                   "--report",
                                   TestDataPath(dir + "attestation_report.hex"),
                                   "--cert-chain",
                                   TestDataPath(dir + "cert_chain.pem"),
                                   "--nonce",
                                   "4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e",
                                   "--policy",
                                   policy,
                                   "--at",
                                   "2024-06-01T00:00:00Z",
                                   "--json"};
  ProcessResult run = RunBinary(args);
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  Json json = ParseJsonOutput(run);
  EXPECT_EQ(ResultOf(json, "rim.driver.signature"), "pass");
  EXPECT_EQ(ResultOf(json, "measurements"), "pass");
  EXPECT_EQ(ResultOf(json, "certs.ocsp"), "skipped");

  // A saved OCSP response that is not one fails the OCSP check instead of being skipped.
  args.insert(args.end() - 1, {"--ocsp", Write("bad.der", "not DER")});
  run = RunBinary(args);
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_EQ(ResultOf(ParseJsonOutput(run), "certs.ocsp"), "fail");

  // A policy naming a RIM directory that is not there is unusable input.
  std::string missing = Write(
      "gpu_missing.yaml", "name: gpu\ntee: sev-snp\ngpu: nvidia-cc\nenclave_measurements: [\"" +
                              std::string(96, 'a') + "\"]\nnvidia:\n  rim_dir: nowhere\n");
  args.resize(args.size() - 3);
  args[8] = missing;
  args.push_back("--json");
  run = RunBinary(args);
  EXPECT_EQ(run.status, 2) << run.out << run.err;
  EXPECT_NE(run.err.find("policy nvidia.rim_dir: the RIM directory"), std::string::npos) << run.err;
}

TEST_F(VerifyCliTest, NvidiaEvidenceJsonItemsGetGpuPrefixes) {
  ProcessResult run = RunBinary(
      {"nvidia-gpu", "--evidence-json",
       TestDataPath(
           "nvidia-cc/attestation-sdk-samples/hopper-570.86.10-cert-hold/gpu_evidence.json"),
       "--at", "2025-06-01T00:00:00Z", "--json"});
  EXPECT_NE(run.status, 2) << run.err;
  Json json = ParseJsonOutput(run);
  EXPECT_EQ(ResultOf(json, "gpu0.report.parse"), "pass") << run.out;
  EXPECT_NE(run.err.find("no --nonce"), std::string::npos);
}

class BundleCliTest : public VerifyCliTest {
 protected:
  void SetUp() override {
    sim_dir_ = dir_.path() + "/sim";
    ASSERT_TRUE(EnsureSimRoots(sim_dir_).ok());
    measurement_ = crypto::Sha384(AsBytes("enclave"));
    auto collector = MakeSimCollector(sim_dir_, measurement_);
    ASSERT_TRUE(collector.ok()) << collector.status();
    nonce_ = crypto::RandomBytes(32);
    signing_ = crypto::GenerateEd25519();
    auto bundle = (*collector)->Collect(nonce_, crypto::RandomBytes(32), signing_.public_key);
    ASSERT_TRUE(bundle.ok()) << bundle.status();
    bundle_ = *bundle;
    policy_ = dir_.path() + "/dev.yaml";
    ASSERT_TRUE(WriteDevPolicy(policy_, sim_dir_, measurement_).ok());
  }
  std::string sim_dir_;
  Bytes measurement_;
  Bytes nonce_;
  crypto::Ed25519KeyPair signing_;
  EvidenceBundle bundle_;
  std::string policy_;
};

TEST_F(BundleCliTest, EvidenceBundlePassesAndFailsOnAnotherNonce) {
  std::string path = Write("bundle.bin", bundle_.SerializeAsString());
  ProcessResult run =
      RunBinary({"bundle", path, "--policy", policy_, "--nonce", HexEncode(nonce_)});
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("bundle at "), std::string::npos);
  EXPECT_NE(run.out.find("  PASS  cvm.report_data"), std::string::npos) << run.out;

  run = RunBinary({"bundle", path, "--policy", policy_, "--json", "--nonce", std::string(64, 'a')});
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_EQ(ResultOf(ParseJsonOutput(run), "evidence.nonce"), "fail");

  // Without --nonce the bundle's own nonce is used (no freshness, but the binding holds).
  run = RunBinary({"bundle", path, "--policy", policy_, "--json"});
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.err.find("does not show freshness"), std::string::npos) << run.err;

  // The policy is required, and a hex-encoded bundle works too.
  run = RunBinary({"bundle", path});
  EXPECT_EQ(run.status, 2);
  std::string hex_path = Write("bundle.hex", HexEncode(AsBytes(bundle_.SerializeAsString())));
  run = RunBinary({"bundle", hex_path, "--policy", policy_, "--nonce", HexEncode(nonce_)});
  EXPECT_EQ(run.status, 0) << run.out << run.err;
}

TEST_F(BundleCliTest, ChallengeResponses) {
  const std::string serialized = bundle_.SerializeAsString();
  ChallengeResponse fresh;
  fresh.set_bundle(serialized);
  fresh.set_fresh(true);
  std::string path = Write("fresh.bin", fresh.SerializeAsString());
  ProcessResult run =
      RunBinary({"bundle", path, "--policy", policy_, "--nonce", HexEncode(nonce_)});
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("PASS  challenge.nonce"), std::string::npos) << run.out;
  run = RunBinary({"bundle", path, "--policy", policy_});
  EXPECT_EQ(run.status, 2);
  EXPECT_NE(run.err.find("give --nonce"), std::string::npos);

  // Cached evidence answered for another client nonce, signed by the enclave key.
  Bytes client_nonce = crypto::RandomBytes(32);
  ChallengeResponse cached;
  cached.set_bundle(serialized);
  auto signature = crypto::Ed25519Sign(signing_.seed.span(),
                                       ChallengeMessage(EvidenceDigest(serialized), client_nonce));
  ASSERT_TRUE(signature.ok());
  cached.set_nonce_signature(ToString(*signature));
  path = Write("cached.bin", cached.SerializeAsString());
  run = RunBinary({"bundle", path, "--policy", policy_, "--nonce", HexEncode(client_nonce)});
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  run = RunBinary({"bundle", path, "--policy", policy_, "--nonce", HexEncode(nonce_), "--json"});
  EXPECT_EQ(run.status, 1) << run.out << run.err;
  EXPECT_EQ(ResultOf(ParseJsonOutput(run), "challenge.signature"), "fail");
}

TEST_F(VerifyCliTest, UsageErrorsExitTwoWithOneLine) {
  Json e = Expected(kSnpVirtee);
  std::string good_policy = PolicyFile("sev-snp", e["measurement"]);
  std::string bad_policy = Write("bad.yaml", "name: x\ntee: sev-snp\nbogus: 1\n");
  std::string tdx_policy = PolicyFile("tdx", e["measurement"]);
  const std::string report = TestDataPath(std::string(kSnpVirtee) + "report.hex");
  const std::string vcek = TestDataPath(std::string(kSnpVirtee) + "vcek.der");
  const std::string ask = TestDataPath(std::string(kSnpVirtee) + "ask_ark_milan.pem");
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"frobnicate"},
      {"sev-snp", "--bogus", "1"},
      {"sev-snp", "--report"},
      {"sev-snp", "--vcek", vcek, "--ask-ark", ask},
      {"sev-snp", "--report", report},
      {"sev-snp", "--report", "/nonexistent/report", "--vcek", vcek, "--ask-ark", ask},
      {"sev-snp", "--report", report, "--vcek", vcek, "--ask-ark", ask, "--at", "yesterday"},
      {"sev-snp", "--report", report, "--vcek", vcek, "--ask-ark", ask, "--policy", bad_policy},
      {"sev-snp", "--report", report, "--vcek", vcek, "--ask-ark", ask, "--policy", tdx_policy},
      {"sev-snp", "--report", report, "--vcek", vcek, "--ask-ark", ask, "--nonce",
       std::string(130, 'a')},
      {"sev-snp", "--report", report, "--vcek", vcek, "--ask-ark", ask, "--nonce", "xyz"},
      {"sev-snp", "--report", report, "--report", report},
      {"sev-snp", "--quote", report},
      {"tdx"},
      {"tdx", "--quote", report, "--collateral", report},
      {"nvidia-gpu", "--report", report},
      {"bundle"},
      {"bundle", report, "--policy", good_policy},  // not a bundle
      {"sev-snp", "extra", "--report", report},
  };
  for (const auto& args : cases) {
    SCOPED_TRACE(absl::StrJoin(args, " "));
    ProcessResult run = RunBinary(args);
    EXPECT_EQ(run.status, 2) << run.out;
    EXPECT_EQ(run.out, "");
    ASSERT_FALSE(run.err.empty());
    EXPECT_EQ(run.err.find('\n'), run.err.size() - 1) << run.err;  // exactly one line
    EXPECT_EQ(run.err.rfind("cloister-verify: ", 0), 0u) << run.err;
  }
  ProcessResult help = RunBinary({"--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("usage: cloister-verify"), std::string::npos);
}

TEST(VerifyCliUnitTest, NonceFlag) {
  auto padded = ParseNonceFlag("0x0102", 64, 0);
  ASSERT_TRUE(padded.ok());
  EXPECT_EQ(padded->size(), 64u);
  EXPECT_EQ((*padded)[1], 2);
  EXPECT_EQ((*padded)[2], 0);
  EXPECT_FALSE(ParseNonceFlag("01", 0, 32).ok());
  EXPECT_TRUE(ParseNonceFlag(std::string(64, 'f'), 0, 32).ok());
  EXPECT_FALSE(ParseNonceFlag("", 64, 0).ok());
}

TEST(VerifyCliUnitTest, InProcessRunMatchesTheContract) {
  std::ostringstream out, err;
  EXPECT_EQ(RunVerifyCli(
                {"tdx", "--quote", TestDataPath("tdx/tdx_prod_quote_SPR_E4.dat"), "--at", kTdxTime},
                out, err),
            kExitFail);  // no policy
  EXPECT_NE(out.str().find("tdx at 2023-06-20T00:00:00Z: FAIL"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("  FAIL  measurement"), std::string::npos) << out.str();
  EXPECT_EQ(err.str(), "");
}

// Each bad command line gets its own one-line usage error.
TEST(VerifyCliUnitTest, FlagErrorsAreWordedExactly) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"sev-snp", "--bogus"}, "unknown flag --bogus for sev-snp"},
      {{"sev-snp", "--report"}, "--report needs a value"},
      {{"sev-snp", "--report", "a", "--report=b"}, "--report is given twice"},
      {{"sev-snp", "--json=yes"}, "--json takes no value"},
      {{"sev-snp", "-h"}, "unexpected argument '-h' (flags take the form --name VALUE)"},
      {{"bundle", "a", "b"}, "bundle takes exactly one evidence file"},
  };
  for (const auto& [args, message] : cases) {
    std::ostringstream out, err;
    EXPECT_EQ(RunVerifyCli(args, out, err), kExitUsage);
    EXPECT_EQ(err.str(),
              "cloister-verify: " + message + " (cloister-verify --help for usage)\n");
  }
}

}  // namespace
}  // namespace cloister::attest
