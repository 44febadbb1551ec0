// The appliance's operator view end to end (docs/OPERATIONS.md): the real cloisterd with the
// real enclave under load from the real cloister CLI, its /metrics scraped over HTTP, `cloister
// status` over the operator port, and its audit log verified with cloister-audit. A marker
// planted in a model and in a request payload must appear in none of the metrics, the logs of
// cloisterd and the enclave, the audit log or the receipt log: the host only ever sees
// ciphertext and counts.
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cloister/ops/v1/ops.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"
#include "sdk/npy.h"
#include "tests/support/appliance.h"
#include "tests/support/http.h"
#include "tests/support/process.h"
#include "tests/support/tensor_files.h"

namespace cloister::testing {
namespace {

const std::string kShared = CLOISTER_SHARED_DIR;
const std::string kClsModel = kShared + "/models/ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx";
const std::string kClsData = kShared + "/models/testdata/ch_ppocr_mobile_v2.0_cls";
// Planted in the model (its doc string and metadata), in the model's name and in a payload.
constexpr char kMarker[] = "ZQXMARKER-4711-tenantdata";

class ObservabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = MakeTempDir("cloister-obs");
    std::string config = work_ + "/cloisterd.yaml";
    std::ofstream(config) << "operator:\n  listen: 127.0.0.1:0\n";
    appliance_ = std::make_unique<Appliance>(CLOISTERD_BINARY, work_ + "/data",
                                             std::vector<std::string>{"--config", config});
    ASSERT_TRUE(appliance_->Start().ok()) << appliance_->Logs();
    ASSERT_FALSE(appliance_->operator_address().empty()) << appliance_->Logs();
    ASSERT_FALSE(appliance_->metrics_address().empty()) << appliance_->Logs();
    key_ = work_ + "/tenant.key";
    ASSERT_EQ(Cli({"keygen", "--key", key_}).exit_code, 0);
  }

  std::map<std::string, std::string> Env() const {
    return {{"CLOISTER_SERVER", appliance_->address()},
            {"CLOISTER_POLICY", appliance_->data_dir() + "/dev-policy.yaml"},
            {"CLOISTER_TENANT", "demo"},
            {"CLOISTER_TOKEN_FILE", appliance_->data_dir() + "/demo.token"},
            {"CLOISTER_KEY", key_},
            {"CLOISTER_OPERATOR", appliance_->operator_address()}};
  }
  RunResult Cli(std::vector<std::string> args, std::map<std::string, std::string> env_over = {}) {
    args.insert(args.begin(), CLOISTER_CLI_BINARY);
    auto env = Env();
    for (auto& [k, v] : env_over) env[k] = v;
    return testing::Run(args, env, absl::Seconds(120));
  }

  // The shared classifier with the marker in its doc string and metadata.
  std::string MarkedModel() {
    onnx::ModelProto model;
    std::ifstream in(kClsModel, std::ios::binary);
    EXPECT_TRUE(model.ParseFromIstream(&in));
    model.set_doc_string(absl::StrCat("confidential model ", kMarker));
    auto* property = model.add_metadata_props();
    property->set_key(kMarker);
    property->set_value(kMarker);
    std::string path = work_ + "/marked.onnx";
    std::ofstream out(path, std::ios::binary);
    EXPECT_TRUE(model.SerializeToOstream(&out));
    return path;
  }

  // A valid input whose first bytes spell the marker.
  std::string MarkedInput() {
    absl::StatusOr<sdk::NpyArray> array =
        ReadTensorProtoFile(kClsData + "/test_data_set_0/input_0.pb");
    EXPECT_TRUE(array.ok()) << array.status();
    std::string marker = kMarker;
    EXPECT_GT(array->data.size(), marker.size());
    std::copy(marker.begin(), marker.end(), array->data.begin());
    std::string path = work_ + "/marked-input.npy";
    EXPECT_TRUE(sdk::WriteNpyFile(path, *array).ok());
    return path;
  }

  std::string work_, key_;
  std::unique_ptr<Appliance> appliance_;
};

TEST_F(ObservabilityTest, MetricsStatusAndAuditUnderLoadShowNoTenantData) {
  const std::string model_name = absl::StrCat("m-", kMarker);
  RunResult upload = Cli({"upload", "--model", MarkedModel(), "--name", model_name});
  ASSERT_EQ(upload.exit_code, 0) << upload.err;
  const std::string input = MarkedInput();

  // Load: several CLI processes inferring at once, while /metrics is scraped.
  constexpr int kClients = 4, kCallsEach = 3;
  std::vector<std::thread> clients;
  std::vector<int> failures(kClients, 0);
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < kCallsEach; ++i) {
        RunResult infer = Cli({"infer", "--model", model_name, "--input", "x=" + input,
                               "--output-dir", absl::StrCat(work_, "/out-", c, "-", i)});
        if (infer.exit_code != 0) ++failures[c];
      }
    });
  }
  std::string during = HttpGet(appliance_->metrics_address(), "/metrics");
  for (std::thread& client : clients) client.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(failures[c], 0) << "client " << c;
  EXPECT_TRUE(absl::StartsWith(during, "HTTP/1.1 200")) << during;

  // One refused call, so that an error is counted.
  std::string wrong_token = work_ + "/wrong.token";
  std::ofstream(wrong_token) << "not-the-token\n";
  RunResult refused = Cli({"models"}, {{"CLOISTER_TOKEN_FILE", wrong_token}});
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "unknown tenant or wrong API token")) << refused.err;

  std::string metrics = HttpGet(appliance_->metrics_address(), "/metrics");
  ASSERT_TRUE(absl::StartsWith(metrics, "HTTP/1.1 200")) << metrics;
  for (const char* name :
       {"cloister_requests_total{method=\"Infer\",priority=\"standard\",tenant=\"demo\"}",
        "cloister_request_errors_total{code=\"UNAUTHENTICATED\"",
        "cloister_batch_size_bucket{priority=\"standard\",tenant=\"demo\"",
        "cloister_queue_latency_seconds_bucket{priority=\"standard\",tenant=\"demo\"",
        "cloister_execution_latency_seconds_bucket{priority=\"standard\",tenant=\"demo\"",
        "cloister_pcie_bytes_total{mode=", "cloister_pcie_transfer_seconds_total{mode=",
        "cloister_queue_depth{priority=\"standard\",tenant=\"demo\"}",
        "cloister_sessions{priority=\"standard\",tenant=\"demo\"}",
        "cloister_models{priority=\"standard\",tenant=\"demo\"} 1", "cloister_model_memory_bytes{",
        "cloister_workers 1", "cloister_batches_in_flight{worker=\"0\"}",
        "cloister_evidence_age_seconds{worker=\"0\"}", "cloister_audit_entries ",
        "cloister_audit_signed_entries ",
        "cloister_enclave_model_memory_bytes{priority=\"standard\",tenant=\"demo\"}"}) {
    EXPECT_TRUE(absl::StrContains(metrics, name)) << name << "\n" << metrics;
  }
  // The workers report their model memory to a periodic probe (every few seconds): the uploaded
  // model shows up in the enclave's memory by tenant, without its name.
  const std::string kEnclaveMemory =
      "cloister_enclave_model_memory_bytes{priority=\"standard\",tenant=\"demo\"} ";
  std::string enclave_memory = "0";
  for (int attempt = 0; attempt < 60 && enclave_memory == "0"; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(250));
    std::string scraped = HttpGet(appliance_->metrics_address(), "/metrics");
    size_t at = scraped.find(kEnclaveMemory);
    if (at == std::string::npos) continue;
    at += kEnclaveMemory.size();
    enclave_memory = scraped.substr(at, scraped.find('\n', at) - at);
  }
  uint64_t enclave_memory_size = 0;
  EXPECT_TRUE(absl::SimpleAtoi(enclave_memory, &enclave_memory_size)) << enclave_memory;
  EXPECT_GT(enclave_memory_size, 0u);
  // A worker whose models run on a GPU also reports the device memory, total and used.
  if (absl::StrContains(metrics, "cloister_device_memory_bytes{kind=\"total\",worker=\"0\"}")) {
    EXPECT_TRUE(
        absl::StrContains(metrics, "cloister_device_memory_bytes{kind=\"used\",worker=\"0\"}"));
  }
  // Every Infer call (kClients * kCallsEach) is counted once.
  EXPECT_TRUE(absl::StrContains(
      metrics, absl::StrCat("cloister_requests_total{method=\"Infer\",priority=\"standard\","
                            "tenant=\"demo\"} ",
                            kClients * kCallsEach, "\n")))
      << metrics;

  // `cloister status` over the operator port.
  RunResult status = Cli({"status"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_TRUE(absl::StrContains(status.out, "WORKER")) << status.out;
  EXPECT_TRUE(absl::StrContains(status.out, "EVIDENCE AGE")) << status.out;
  EXPECT_TRUE(absl::StrContains(status.out, "demo")) << status.out;
  RunResult status_json = Cli({"status", "--json"});
  ASSERT_EQ(status_json.exit_code, 0) << status_json.err;
  std::string key_marker = "\"signing_public_key_hex\":\"";
  size_t key_at = status_json.out.find(key_marker);
  ASSERT_NE(key_at, std::string::npos) << status_json.out;
  std::string enclave_key = status_json.out.substr(key_at + key_marker.size(), 64);
  RunResult unreachable = Cli({"status", "--operator", "127.0.0.1:1", "--timeout", "2"});
  EXPECT_EQ(unreachable.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(unreachable.err, "cannot get status from the operator port"));

  // The operator API's Reload re-reads the config file, like SIGHUP, and is audited.
  {
    auto stub = ops::v1::Operator::NewStub(
        grpc::CreateChannel(appliance_->operator_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    ops::v1::ReloadResponse response;
    grpc::Status reloaded = stub->Reload(&context, ops::v1::ReloadRequest(), &response);
    EXPECT_TRUE(reloaded.ok()) << reloaded.error_message();
    EXPECT_TRUE(absl::StartsWith(response.summary(), "reloaded ")) << response.summary();
  }

  // A clean stop writes a last signed checkpoint: the whole audit log verifies under the
  // enclave's key and is signed to the end.
  std::string logs_before_stop = appliance_->Logs();
  EXPECT_EQ(appliance_->Stop(), 0);
  std::string audit_path = appliance_->data_dir() + "/audit/audit.jsonl";
  RunResult verify = testing::Run(
      {CLOISTER_AUDIT_BINARY, "verify", audit_path, "--key", enclave_key, "--require-signed"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  std::string audit = ReadWholeFile(audit_path);
  for (const char* event : {"daemon_started", "evidence_refreshed", "session_opened",
                            "model_uploaded", "refused", "policy_reloaded", "checkpoint",
                            "daemon_stopped"}) {
    EXPECT_TRUE(absl::StrContains(audit, absl::StrCat("\"event\":\"", event, "\""))) << event;
  }

  // The marker is nowhere the operator can look.
  std::string logs = appliance_->Logs();
  std::string receipts = ReadWholeFile(appliance_->data_dir() + "/receipts/receipts.jsonl");
  EXPECT_FALSE(absl::StrContains(metrics, kMarker));
  EXPECT_FALSE(absl::StrContains(during, kMarker));
  EXPECT_FALSE(absl::StrContains(logs, kMarker));
  EXPECT_FALSE(absl::StrContains(audit, kMarker));
  EXPECT_FALSE(absl::StrContains(receipts, kMarker));
  EXPECT_FALSE(absl::StrContains(status_json.out, kMarker));
  EXPECT_FALSE(absl::StrContains(metrics, "m-ZQX"));

  // An edited entry is found and named.
  std::vector<std::string> lines = absl::StrSplit(audit, '\n', absl::SkipEmpty());
  ASSERT_GT(lines.size(), 3u);
  size_t at = lines[1].find("\"tenant\":\"");
  ASSERT_NE(at, std::string::npos);
  lines[1].insert(at + 10, "x");
  std::ofstream(audit_path, std::ios::trunc) << absl::StrJoin(lines, "\n") << "\n";
  RunResult tampered = testing::Run({CLOISTER_AUDIT_BINARY, "verify", audit_path});
  EXPECT_EQ(tampered.exit_code, 1) << tampered.out;
  EXPECT_TRUE(absl::StrContains(tampered.err, "entry 2: was changed")) << tampered.err;
}

}  // namespace
}  // namespace cloister::testing
