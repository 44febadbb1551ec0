// End-to-end tests of the appliance as a user runs it: the real cloisterd (which spawns the
// real cloister-enclave) on a loopback port, driven by the real cloister CLI.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"
#include "sdk/npy.h"
#include "tests/support/process.h"
#include "tests/support/tensor_files.h"

namespace cloister::testing {
namespace {

namespace fs = std::filesystem;

const std::string kShared = CLOISTER_SHARED_DIR;
const std::string kClsModel = kShared + "/models/ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx";
const std::string kClsData = kShared + "/models/testdata/ch_ppocr_mobile_v2.0_cls";

// A running cloisterd with its own data dir.
class Appliance {
 public:
  explicit Appliance(std::string data_dir) : data_dir_(std::move(data_dir)) {}
  ~Appliance() { Stop(); }

  ::testing::AssertionResult Start() {
    log_dir_ = MakeTempDir("cloisterd-log");
    // Free operator and metrics ports: two appliances run side by side below.
    const std::string config = log_dir_ + "/cloisterd.yaml";
    std::ofstream(config) << "operator:\n  listen: 127.0.0.1:0\n";
    process_ = std::make_unique<Process>(
        std::vector<std::string>{CLOISTERD_BINARY, "--listen", "127.0.0.1:0", "--data-dir", data_dir_,
                                 "--config", config},
        log_dir_);
    std::string line = process_->WaitForStdout("cloisterd listening on ", absl::Seconds(60));
    if (line.empty()) {
      return ::testing::AssertionFailure() << "cloisterd did not start: " << process_->Stderr();
    }
    address_ = line.substr(line.rfind(' ') + 1);
    return ::testing::AssertionSuccess();
  }
  int Stop() { return process_ ? process_->Stop(SIGTERM) : 0; }

  const std::string& address() const { return address_; }
  const std::string& data_dir() const { return data_dir_; }
  std::string Logs() const { return process_->Stdout() + process_->Stderr(); }

 private:
  std::string data_dir_, log_dir_, address_;
  std::unique_ptr<Process> process_;
};

class ApplianceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = MakeTempDir("cloister-e2e");
    appliance_ = std::make_unique<Appliance>(work_ + "/data");
    ASSERT_TRUE(appliance_->Start());
    key_ = work_ + "/tenant.key";
    RunResult keygen = Cli({"keygen", "--key", key_});
    ASSERT_EQ(keygen.exit_code, 0) << keygen.err;
  }
  void TearDown() override {
    if (appliance_) appliance_->Stop();
  }

  std::map<std::string, std::string> Env() const {
    return {{"CLOISTER_SERVER", appliance_->address()},
            {"CLOISTER_POLICY", appliance_->data_dir() + "/dev-policy.yaml"},
            {"CLOISTER_TENANT", "demo"},
            {"CLOISTER_TOKEN_FILE", appliance_->data_dir() + "/demo.token"},
            {"CLOISTER_KEY", key_}};
  }
  RunResult Cli(std::vector<std::string> args, std::map<std::string, std::string> extra_env = {}) {
    args.insert(args.begin(), CLOISTER_CLI_BINARY);
    auto env = Env();
    for (auto& [k, v] : extra_env) env[k] = v;
    return testing::Run(args, env, absl::Seconds(120));
  }
  // Writes the reference input of set N as .npy and returns its path.
  std::string InputNpy(int set) {
    std::string path = absl::StrCat(work_, "/input", set, ".npy");
    auto array = ReadTensorProtoFile(absl::StrCat(kClsData, "/test_data_set_", set, "/input_0.pb"));
    EXPECT_TRUE(array.ok()) << array.status();
    EXPECT_TRUE(sdk::WriteNpyFile(path, *array).ok());
    return path;
  }
  // Runs infer on set N and compares with the reference output.
  void ExpectInferMatches(int set, const std::string& model_name) {
    std::string out_dir = absl::StrCat(work_, "/out", set, "-", counter_++);
    RunResult infer = Cli({"infer", "--model", model_name, "--input", "x=" + InputNpy(set),
                           "--output-dir", out_dir});
    ASSERT_EQ(infer.exit_code, 0) << infer.err;
    std::string expected_name;
    auto expected = ReadTensorProtoFile(
        absl::StrCat(kClsData, "/test_data_set_", set, "/output_0.pb"), &expected_name);
    ASSERT_TRUE(expected.ok());
    auto actual = sdk::ReadNpyFile(out_dir + "/" + expected_name + ".npy");
    ASSERT_TRUE(actual.ok()) << actual.status();
    EXPECT_EQ(CompareArrays(*actual, *expected), "") << "set " << set;
  }

  std::string work_, key_;
  int counter_ = 0;
  std::unique_ptr<Appliance> appliance_;
};

TEST_F(ApplianceTest, AttestUploadInferAndServeAgainAfterRestart) {
  RunResult attest = Cli({"attest"});
  ASSERT_EQ(attest.exit_code, 0) << attest.out << attest.err;

  RunResult upload = Cli({"upload", "--model", kClsModel, "--name", "cls"});
  ASSERT_EQ(upload.exit_code, 0) << upload.err;
  // The enclave proved at load that the classifier keeps rows apart, so the tenant's requests
  // may share model runs.
  EXPECT_NE(upload.out.find("batching: requests coalesce"), std::string::npos) << upload.out;
  RunResult models = Cli({"models", "--json"});
  ASSERT_EQ(models.exit_code, 0) << models.err;
  EXPECT_NE(models.out.find("\"cls\""), std::string::npos) << models.out;
  EXPECT_NE(models.out.find("\"rows_coalesce\":true"), std::string::npos) << models.out;

  ExpectInferMatches(0, "cls");
  ExpectInferMatches(1, "cls");

  // Each batch came back with a usage receipt that cloisterd verified and kept, one JSON line
  // each; they name the tenant and count requests, never data.
  std::string receipts = ReadWholeFile(appliance_->data_dir() + "/receipts/receipts.jsonl");
  EXPECT_GE(std::count(receipts.begin(), receipts.end(), '\n'), 2) << receipts;
  EXPECT_NE(receipts.find("demo"), std::string::npos) << receipts;

  // The host keeps only ciphertext and a wrapped key; a restart serves the model again.
  ASSERT_EQ(appliance_->Stop(), 0);
  ASSERT_TRUE(appliance_->Start());
  ExpectInferMatches(0, "cls");
  RunResult again = Cli({"models", "--json"});
  EXPECT_NE(again.out.find("\"cls\""), std::string::npos) << again.out;

  // An auditor checks the receipts of both enclave runs (a restarted enclave signs with a new
  // key) and reads what the tenant was metered: the three requests that ran.
  const std::string receipt_log = appliance_->data_dir() + "/receipts/receipts.jsonl";
  RunResult audit = testing::Run({CLOISTER_AUDIT_BINARY, "receipts", receipt_log, "--json"}, {},
                                 absl::Seconds(60));
  ASSERT_EQ(audit.exit_code, 0) << audit.out << audit.err;
  EXPECT_NE(audit.out.find("\"verdict\":\"pass\",\"receipts\":3,"), std::string::npos) << audit.out;
  const size_t keys = audit.out.find("\"keys\":[");
  ASSERT_NE(keys, std::string::npos) << audit.out;
  const std::string key_list = audit.out.substr(keys, audit.out.find(']', keys) - keys);
  EXPECT_EQ(std::count(key_list.begin(), key_list.end(), '"'), 2 + 2 * 2) << key_list;
  EXPECT_NE(audit.out.find("\"tenant_id\":\"demo\""), std::string::npos) << audit.out;
  EXPECT_NE(audit.out.find("\"requests\":3,\"failed_requests\":0"), std::string::npos) << audit.out;
  // A receipt the host drops is named.
  std::vector<std::string> lines =
      absl::StrSplit(ReadWholeFile(receipt_log), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  {
    std::ofstream out(receipt_log, std::ios::trunc);
    out << lines[1] << "\n" << lines[2] << "\n";
  }
  audit = testing::Run({CLOISTER_AUDIT_BINARY, "receipts", receipt_log}, {}, absl::Seconds(60));
  EXPECT_EQ(audit.exit_code, 1) << audit.out << audit.err;
  EXPECT_NE(audit.err.find("line 1: the first receipt of enclave key"), std::string::npos)
      << audit.err;
}

TEST_F(ApplianceTest, JsonInferOutput) {
  ASSERT_EQ(Cli({"upload", "--model", kClsModel, "--name", "cls"}).exit_code, 0);
  RunResult infer = Cli({"infer", "--model", "cls", "--input", "x=" + InputNpy(0), "--json"});
  ASSERT_EQ(infer.exit_code, 0) << infer.err;
  EXPECT_NE(infer.out.find("softmax_0.tmp_0"), std::string::npos) << infer.out;
  EXPECT_NE(infer.out.find("FP32"), std::string::npos) << infer.out;
}

TEST_F(ApplianceTest, PolicyTrustingOtherRootsFailsAttestation) {
  // A second appliance has its own simulated roots; its policy must not accept this one.
  Appliance other(work_ + "/other-data");
  ASSERT_TRUE(other.Start());
  ASSERT_EQ(other.Stop(), 0);
  RunResult attest = Cli({"attest"}, {{"CLOISTER_POLICY", work_ + "/other-data/dev-policy.yaml"}});
  EXPECT_EQ(attest.exit_code, 1) << attest.out << attest.err;
  EXPECT_NE((attest.out + attest.err).find("certs.chain"), std::string::npos)
      << attest.out << attest.err;
  // And the refusal stops everything else too: no upload without attestation.
  RunResult upload = Cli({"upload", "--model", kClsModel, "--name", "cls"},
                         {{"CLOISTER_POLICY", work_ + "/other-data/dev-policy.yaml"}});
  EXPECT_EQ(upload.exit_code, 1);
  EXPECT_NE(upload.err.find("attestation failed"), std::string::npos) << upload.err;
}

TEST_F(ApplianceTest, WrongApiTokenIsRefused) {
  std::string bad_token = work_ + "/bad.token";
  std::ofstream(bad_token) << "0000000000000000000000000000000000000000000000000000000000000000\n";
  ::chmod(bad_token.c_str(), 0600);
  RunResult models = Cli({"models"}, {{"CLOISTER_TOKEN_FILE", bad_token}});
  EXPECT_EQ(models.exit_code, 1);
  EXPECT_NE(models.err.find("token"), std::string::npos) << models.err;
  EXPECT_EQ(std::count(models.err.begin(), models.err.end(), '\n'), 1) << models.err;
}

TEST_F(ApplianceTest, AnotherIdentityKeyCannotUseOrDeleteTheModel) {
  ASSERT_EQ(Cli({"upload", "--model", kClsModel, "--name", "cls"}).exit_code, 0);
  std::string other_key = work_ + "/other.key";
  ASSERT_EQ(Cli({"keygen", "--key", other_key}).exit_code, 0);
  std::map<std::string, std::string> as_other = {{"CLOISTER_KEY", other_key}};

  RunResult infer = Cli({"infer", "--model", "cls", "--input", "x=" + InputNpy(0), "--json"}, as_other);
  EXPECT_EQ(infer.exit_code, 1);
  EXPECT_EQ(infer.err,
            "cloister: model not found: no model 'cls' uploaded with this identity key "
            "(`cloister models` lists yours)\n");
  RunResult del = Cli({"delete", "--model", "cls"}, as_other);
  EXPECT_EQ(del.exit_code, 1);
  EXPECT_EQ(del.err,
            "cloister: model not found: no model 'cls' uploaded with this identity key "
            "(`cloister models` lists yours)\n");
  RunResult models = Cli({"models", "--json"}, as_other);
  EXPECT_EQ(models.out.find("\"cls\""), std::string::npos) << models.out;

  // The owner still has it, and can delete it.
  ExpectInferMatches(0, "cls");
  ASSERT_EQ(Cli({"delete", "--model", "cls"}).exit_code, 0);
  RunResult after = Cli({"infer", "--model", "cls", "--input", "x=" + InputNpy(0), "--json"});
  EXPECT_EQ(after.exit_code, 1);
}

TEST_F(ApplianceTest, TruncatedModelIsRefusedAndNothingIsStored) {
  std::string truncated = work_ + "/truncated.onnx";
  {
    std::ifstream in(kClsModel, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  RunResult upload = Cli({"upload", "--model", truncated, "--name", "broken"});
  EXPECT_EQ(upload.exit_code, 1);
  EXPECT_FALSE(upload.err.empty());
  RunResult models = Cli({"models", "--json"});
  EXPECT_EQ(models.out.find("\"broken\""), std::string::npos) << models.out;
  // No blob or wrapped key was kept for the refused model.
  for (const auto& entry : fs::recursive_directory_iterator(appliance_->data_dir() + "/models")) {
    EXPECT_FALSE(entry.is_regular_file()) << "left behind: " << entry.path();
  }
}

TEST_F(ApplianceTest, MalformedNpyInputIsRefused) {
  ASSERT_EQ(Cli({"upload", "--model", kClsModel, "--name", "cls"}).exit_code, 0);
  std::string bad = work_ + "/bad.npy";
  std::ofstream(bad, std::ios::binary) << "\x93NUMPY\x01\x00garbage";
  RunResult infer = Cli({"infer", "--model", "cls", "--input", "x=" + bad, "--json"});
  EXPECT_EQ(infer.exit_code, 2);
  EXPECT_NE(infer.err.find("bad.npy"), std::string::npos) << infer.err;
  EXPECT_EQ(std::count(infer.err.begin(), infer.err.end(), '\n'), 1) << infer.err;
}

// Plants a marker in a model and in an input, runs a whole session, and searches the data dir
// and the appliance's logs for it: only ciphertext may be found.
TEST_F(ApplianceTest, NoPlaintextReachesDataDirOrLogs) {
  const std::string marker = "CLOISTER-CANARY-7f3a9c1e5b";
  onnx::ModelProto model;
  {
    std::ifstream in(kClsModel, std::ios::binary);
    ASSERT_TRUE(model.ParseFromIstream(&in));
  }
  model.set_doc_string(marker);
  auto* prop = model.add_metadata_props();
  prop->set_key("note");
  prop->set_value(marker);
  std::string marked_model = work_ + "/marked.onnx";
  {
    std::ofstream out(marked_model, std::ios::binary);
    ASSERT_TRUE(model.SerializeToOstream(&out));
  }
  ASSERT_EQ(Cli({"upload", "--model", marked_model, "--name", "marked"}).exit_code, 0);

  auto input = ReadTensorProtoFile(kClsData + "/test_data_set_0/input_0.pb");
  ASSERT_TRUE(input.ok());
  std::memcpy(input->data.data() + 64, marker.data(), marker.size());
  std::string input_path = work_ + "/marked.npy";
  ASSERT_TRUE(sdk::WriteNpyFile(input_path, *input).ok());
  RunResult infer = Cli({"infer", "--model", "marked", "--input", "x=" + input_path, "--json"});
  ASSERT_EQ(infer.exit_code, 0) << infer.err;
  ASSERT_EQ(appliance_->Stop(), 0);

  size_t files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(appliance_->data_dir())) {
    if (!entry.is_regular_file()) continue;
    ++files;
    std::string content = ReadWholeFile(entry.path());
    EXPECT_EQ(content.find(marker), std::string::npos) << "marker found in " << entry.path();
  }
  EXPECT_GT(files, 3u);  // the scan saw the stored model, its wrapped key and the keys
  std::string logs = appliance_->Logs();
  EXPECT_FALSE(logs.empty());
  EXPECT_EQ(logs.find(marker), std::string::npos) << "marker found in the logs";
}

// The operator asks for NVIDIA GPU evidence on a machine where NVML cannot give any (no
// driver here): cloisterd refuses to start and says why in one line, and stores nothing.
TEST(ApplianceStartTest, GpuEvidenceWithoutNvmlRefusesToStart) {
  std::string work = MakeTempDir("cloister-nvcc");
  RunResult run = testing::Run({CLOISTERD_BINARY, "--listen", "127.0.0.1:0", "--data-dir", work + "/data",
                       "--tee", "sev-snp", "--gpu", "nvidia-cc"},
                      {{"LD_LIBRARY_PATH", work}}, absl::Seconds(60));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.err.find("--gpu nvidia-cc: NVML not available"), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(work + "/data/models") && !fs::is_empty(work + "/data/models"));
  EXPECT_FALSE(fs::exists(work + "/data/dev-policy.yaml"));

  // A combination that cannot work is refused before anything starts.
  run = testing::Run({CLOISTERD_BINARY, "--listen", "127.0.0.1:0", "--data-dir", work + "/data2",
             "--tee", "sim", "--gpu", "nvidia-cc"});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("gpu nvidia-cc needs tee sev-snp or tdx"), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(work + "/data2"));
  fs::remove_all(work);
}

}  // namespace
}  // namespace cloister::testing
