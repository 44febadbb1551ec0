// The fixture of the tamper tests (tamper_boundary_test.cc, tamper_network_test.cc; one binary):
// a real appliance (cloisterd and the real cloister-enclave) with an attacker on both untrusted
// paths, the network between the SDK and cloisterd (GrpcTamperProxy, in this process) and the
// boundary between cloisterd and the enclave (cloister-tamper-enclave, which cloisterd runs as
// its enclave binary). Every case:
//   (d) first runs its flow with no tampering, which must succeed with the reference result,
//   (a) then with one mutation, where the client must get exactly the expected error,
//   (b) never an OK carrying another result (outputs are compared with clean references),
//   (c) and a clean call right after must still work, with the reference result;
// and checks that the proxy really applied the mutation, so no case passes vacuously.
// Where a mutation is harmless by design the case asserts the correct results instead.
//
// One appliance serves the whole suite (it runs as one ctest test); each case switches plans.
// tamper_fixture.cc holds the suite's shared state and stops the appliance after the last test.
// Threading: the fixture is used by the test's thread (InferTwoAtOnce starts two of its own).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/bytes.h"
#include "host/tenants/tenant_registry.h"
#include "sdk/client.h"
#include "sdk/identity.h"
#include "sdk/npy.h"
#include "tests/support/appliance.h"
#include "tests/support/process.h"
#include "tests/support/tensor_files.h"
#include "tests/tamper/grpc_tamper_proxy.h"

namespace cloister::tamper_test {

using api::v1::Tensor;
using ::testing::HasSubstr;
using Outputs = std::vector<Tensor>;

inline const std::string kModels = std::string(CLOISTER_SHARED_DIR) + "/models";
inline const std::string kClsModel = kModels + "/ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx";
inline const std::string kClsInput =
    kModels + "/testdata/ch_ppocr_mobile_v2.0_cls/test_data_set_0/input_0.pb";
inline const std::string kClsOutput =
    kModels + "/testdata/ch_ppocr_mobile_v2.0_cls/test_data_set_0/output_0.pb";
inline constexpr char kAcmeToken[] = "acme-token-0123456789abcdef";
inline constexpr char kGlobexToken[] = "globex-token-0123456789abcdef";
inline constexpr char kModel[] = "cls";

// Messages the refusals carry (asserted as substrings, with the exact status code).
inline constexpr char kReplyDoesNotOpen[] = "cannot open the enclave's reply";
inline constexpr char kAuthFailed[] = "authentication failed";
inline constexpr char kReplayed[] = "replayed message";
inline constexpr char kMixedTenants[] = "batch mixes requests of different tenants";
inline constexpr char kUnknownSession[] = "unknown or expired session";
inline constexpr char kModelDoesNotDecrypt[] = "model upload does not decrypt";
inline constexpr char kReplyOrder[] = "enclave reply does not match the request order of the batch";

// Whether two output lists are the same tensors (names, types, shapes, and float values equal
// within 1e-4 relative, since a batch of two may round differently from a batch of one).
bool SameOutputs(const Outputs& a, const Outputs& b);

class TamperTest : public ::testing::Test {
 protected:
  // Starts the shared appliance once for every suite of this file (the Cleanup environment
  // stops it at the end).
  static void SetUpTestSuite() {
    if (appliance_ != nullptr) return;
    work_ = new std::string(testing::MakeTempDir("cloister-tamper"));
    plan_path_ = new std::string(*work_ + "/plan");
    ::setenv("CLOISTER_TAMPER_REAL_ENCLAVE", CLOISTER_ENCLAVE_BINARY, 1);
    ::setenv("CLOISTER_TAMPER_PLAN", plan_path_->c_str(), 1);
    const std::string config = *work_ + "/cloisterd.yaml";
    // Batches of up to two with a short wait, so two concurrent requests share a batch.
    std::ofstream(config) << "enclave_binary: " << TAMPER_ENCLAVE_BINARY << "\n"
                          << "scheduler:\n  max_batch_size: 2\n  max_queue_delay_ms: 40\n"
                          << "operator:\n  listen: 127.0.0.1:0\n"
                          << "tenants:\n"
                          << "  - id: acme\n    token_sha256: "
                          << HexEncode(host::TokenHash(kAcmeToken)) << "\n"
                          << "  - id: globex\n    token_sha256: "
                          << HexEncode(host::TokenHash(kGlobexToken)) << "\n";
    appliance_ = new testing::Appliance(CLOISTERD_BINARY, *work_ + "/data",
                                        std::vector<std::string>{"--config", config});
    absl::Status started = appliance_->Start();
    ASSERT_TRUE(started.ok()) << started << "\n" << appliance_->Logs();
    auto proxy = testing::GrpcTamperProxy::Start(appliance_->address());
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = proxy->release();

    acme_identity_ = new std::shared_ptr<const sdk::TenantIdentity>(
        std::make_shared<const sdk::TenantIdentity>(sdk::TenantIdentity::Generate()));
    globex_identity_ = new std::shared_ptr<const sdk::TenantIdentity>(
        std::make_shared<const sdk::TenantIdentity>(sdk::TenantIdentity::Generate()));
    auto input = testing::ReadTensorProtoFile(kClsInput);
    ASSERT_TRUE(input.ok()) << input.status();
    input_a_ = new Tensor(sdk::ToTensor("x", *std::move(input)));
    // A second input: the same image turned upside down (all floats in reverse order, which
    // also reverses the channels), which this direction classifier scores differently, so
    // swapped answers show.
    input_b_ = new Tensor(*input_a_);
    auto* values = reinterpret_cast<float*>(input_b_->mutable_raw()->data());
    std::reverse(values, values + input_b_->raw().size() / sizeof(float));

    auto acme = Connect("acme", kAcmeToken, *acme_identity_);
    auto globex = Connect("globex", kGlobexToken, *globex_identity_);
    ASSERT_TRUE(acme.ok()) << acme.status();
    ASSERT_TRUE(globex.ok()) << globex.status();
    ASSERT_TRUE((*acme)->UploadModel(kClsModel, kModel).ok());
    ASSERT_TRUE((*globex)->UploadModel(kClsModel, kModel).ok());
    auto ref_a = (*acme)->Infer(kModel, {*input_a_});
    auto ref_b = (*acme)->Infer(kModel, {*input_b_});
    ASSERT_TRUE(ref_a.ok()) << ref_a.status();
    ASSERT_TRUE(ref_b.ok()) << ref_b.status();
    ASSERT_FALSE(SameOutputs(*ref_a, *ref_b)) << "the two inputs must give different outputs";
    // The clean reference is itself checked against the model's published expected output.
    auto expected = testing::ReadTensorProtoFile(kClsOutput);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_EQ(ref_a->size(), 1u);
    auto actual = sdk::FromTensor((*ref_a)[0]);
    ASSERT_TRUE(actual.ok()) << actual.status();
    ASSERT_EQ(testing::CompareArrays(*actual, *expected), "");
    reference_a_ = new Outputs(*std::move(ref_a));
    reference_b_ = new Outputs(*std::move(ref_b));
  }

  static void StopAppliance() {
    delete proxy_;
    proxy_ = nullptr;
    delete appliance_;
    appliance_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(appliance_, nullptr);
    ASSERT_NE(reference_a_, nullptr);
    SetBoundaryPlan("off");
    proxy_->SetPlan(testing::GrpcMutation::kOff);
    auto acme = Connect("acme", kAcmeToken, *acme_identity_);
    auto acme2 = Connect("acme", kAcmeToken, *acme_identity_);
    auto globex = Connect("globex", kGlobexToken, *globex_identity_);
    ASSERT_TRUE(acme.ok()) << acme.status();
    ASSERT_TRUE(acme2.ok()) << acme2.status();
    ASSERT_TRUE(globex.ok()) << globex.status();
    acme_ = *std::move(acme);
    acme2_ = *std::move(acme2);
    globex_ = *std::move(globex);
  }

  void TearDown() override {
    SetBoundaryPlan("off");
    proxy_->SetPlan(testing::GrpcMutation::kOff);
  }

  // A client for `tenant` that goes through the gRPC tamper proxy; by default without
  // retries, so every error shows.
  static absl::StatusOr<std::unique_ptr<sdk::Client>> Connect(
      const std::string& tenant, const std::string& token,
      std::shared_ptr<const sdk::TenantIdentity> identity, int max_attempts = 1) {
    sdk::ClientOptions options = appliance_->TenantOptions(tenant, token);
    options.server = proxy_->address();  // through the network tamper proxy
    options.identity = std::move(identity);
    options.max_attempts = max_attempts;
    options.retry_backoff = absl::Milliseconds(20);
    options.call_timeout = absl::Seconds(20);
    return sdk::Client::Connect(options);
  }

  // Writes the boundary proxy's plan (atomically: a new file renamed over the old one).
  void SetBoundaryPlan(const std::string& mutation, const std::string& kind = "infer",
                       const std::string& argument = "") {
    plan_id_ = absl::StrCat("plan", ++plan_counter_);
    plan_mutation_ = mutation;
    const std::string temporary = *plan_path_ + ".new";
    std::ofstream(temporary) << plan_id_ << " " << mutation << " " << kind << " " << argument
                             << "\n";
    ASSERT_EQ(std::rename(temporary.c_str(), plan_path_->c_str()), 0);
  }

  // Whether the boundary proxy logged the current plan's mutation as applied.
  bool BoundaryApplied() {
    const std::string log = testing::ReadWholeFile(*plan_path_ + ".log");
    return log.find(absl::StrCat(plan_id_, " ", plan_mutation_, " applied")) != std::string::npos;
  }

  // (a) and (b): the tampered call failed with exactly `code` and a message containing
  // `message`; it never returned OK (with whatever outputs).
  static void ExpectRefused(const absl::StatusOr<Outputs>& result, absl::StatusCode code,
                            const std::string& message) {
    ASSERT_FALSE(result.ok()) << "a tampered call returned OK; outputs match reference A: "
                              << SameOutputs(*result, *reference_a_)
                              << ", reference B: " << SameOutputs(*result, *reference_b_);
    ExpectStatus(result.status(), code, message);
  }
  static void ExpectRefused(const absl::Status& status, absl::StatusCode code,
                            const std::string& message) {
    ASSERT_FALSE(status.ok()) << "a tampered call returned OK";
    ExpectStatus(status, code, message);
  }
  static void ExpectStatus(const absl::Status& status, absl::StatusCode code,
                           const std::string& message) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(message));
    std::printf("  refused: %s\n", status.ToString().c_str());
  }

  // (c) and (d): a clean inference through `client` gives the reference result.
  static void ExpectCleanInfer(sdk::Client& client, bool input_a = true) {
    auto result = client.Infer(kModel, {input_a ? *input_a_ : *input_b_});
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_TRUE(SameOutputs(*result, input_a ? *reference_a_ : *reference_b_));
  }

  // Runs two inferences at once (first on input A, second on input B).
  static std::pair<absl::StatusOr<Outputs>, absl::StatusOr<Outputs>> InferTwoAtOnce(
      sdk::Client& first, sdk::Client& second) {
    absl::StatusOr<Outputs> a = absl::UnknownError("not run");
    absl::StatusOr<Outputs> b = absl::UnknownError("not run");
    std::atomic<int> ready{0};
    auto run = [&ready](sdk::Client& client, const Tensor& input, absl::StatusOr<Outputs>& out) {
      ready.fetch_add(1);
      while (ready.load() < 2) std::this_thread::yield();
      out = client.Infer(kModel, {input});
    };
    std::thread ta(run, std::ref(first), std::cref(*input_a_), std::ref(a));
    std::thread tb(run, std::ref(second), std::cref(*input_b_), std::ref(b));
    ta.join();
    tb.join();
    return {std::move(a), std::move(b)};
  }
  static void ExpectBothClean(sdk::Client& first, sdk::Client& second) {
    auto [a, b] = InferTwoAtOnce(first, second);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(SameOutputs(*a, *reference_a_));
    EXPECT_TRUE(SameOutputs(*b, *reference_b_));
  }

  // For the plans that act on two rows of one batch: sends two of acme's requests at once until
  // they shared a batch and the plan applied (at most 5 tries). A try the plan did not reach
  // must give both requests their right answers. In the try it reached, both are refused with
  // `code` and `message`, or, for a harmless plan (`code` OK), both still get their right
  // answers.
  void TamperOneSharedBatch(absl::StatusCode code, const std::string& message = "") {
    for (int attempt = 0; attempt < 5 && !BoundaryApplied(); ++attempt) {
      auto [a, b] = InferTwoAtOnce(*acme_, *acme_);
      if (!BoundaryApplied() || code == absl::StatusCode::kOk) {
        ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " / " << b.status();
        EXPECT_TRUE(SameOutputs(*a, *reference_a_) && SameOutputs(*b, *reference_b_));
        continue;
      }
      ExpectRefused(a, code, message);
      ExpectRefused(b, code, message);
    }
    ASSERT_TRUE(BoundaryApplied()) << "the two requests never shared a batch";
  }

  // Kills the real enclave worker (the last one the boundary proxy started), so that cloisterd
  // restarts it and reloads the stored models through the proxy, then waits until acme can
  // connect and list its models again.
  static void RestartWorker() {
    const std::string workers = testing::ReadWholeFile(*plan_path_ + ".workers");
    const size_t end = workers.find_last_not_of('\n');
    ASSERT_NE(end, std::string::npos) << "the boundary proxy recorded no worker";
    const size_t begin = workers.find_last_of('\n', end);
    const pid_t pid = std::stoi(workers.substr(begin == std::string::npos ? 0 : begin + 1));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(100));
      if (testing::ReadWholeFile(*plan_path_ + ".workers") == workers) continue;
      auto client = Connect("acme", kAcmeToken, *acme_identity_);
      if (client.ok() && (*client)->ListModels().ok()) return;
    }
    FAIL() << "the enclave worker did not come back";
  }

  // Whether `client` lists a model called `name`.
  static bool Lists(sdk::Client& client, const std::string& name) {
    auto models = client.ListModels();
    EXPECT_TRUE(models.ok()) << models.status();
    if (!models.ok()) return false;
    for (const auto& model : *models) {
      if (model.name() == name) return true;
    }
    return false;
  }

  static std::string* work_;
  static std::string* plan_path_;
  static testing::Appliance* appliance_;
  static testing::GrpcTamperProxy* proxy_;
  static std::shared_ptr<const sdk::TenantIdentity>* acme_identity_;
  static std::shared_ptr<const sdk::TenantIdentity>* globex_identity_;
  static Tensor* input_a_;
  static Tensor* input_b_;
  static Outputs* reference_a_;
  static Outputs* reference_b_;
  static int plan_counter_;

  std::string plan_id_, plan_mutation_;
  // acme and acme2 are two sessions of one tenant and identity; globex is another tenant.
  std::unique_ptr<sdk::Client> acme_, acme2_, globex_;
};

}  // namespace cloister::tamper_test
