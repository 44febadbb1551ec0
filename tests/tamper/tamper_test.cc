// Tamper tests: a real appliance (cloisterd and the real cloister-enclave) with an attacker on
// both untrusted paths, the network between the SDK and cloisterd (GrpcTamperProxy, in this
// process) and the boundary between cloisterd and the enclave (cloister-tamper-enclave, which
// cloisterd runs as its enclave binary). Every case:
//   (d) first runs its flow with no tampering, which must succeed with the reference result,
//   (a) then with one mutation, where the client must get exactly the expected error,
//   (b) never an OK carrying another result (outputs are compared with clean references),
//   (c) and a clean call right after must still work, with the reference result;
// and checks that the proxy really applied the mutation, so no case passes vacuously.
// Where a mutation is harmless by design the case asserts the correct results instead.
//
// One appliance serves the whole suite (it runs as one ctest test); each case switches plans.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
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

namespace cloister {
namespace {

using api::v1::Tensor;
using ::testing::HasSubstr;
using Outputs = std::vector<Tensor>;

const std::string kModels = std::string(CLOISTER_SHARED_DIR) + "/models";
const std::string kClsModel = kModels + "/ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx";
const std::string kClsInput =
    kModels + "/testdata/ch_ppocr_mobile_v2.0_cls/test_data_set_0/input_0.pb";
const std::string kClsOutput =
    kModels + "/testdata/ch_ppocr_mobile_v2.0_cls/test_data_set_0/output_0.pb";
constexpr char kAcmeToken[] = "acme-token-0123456789abcdef";
constexpr char kGlobexToken[] = "globex-token-0123456789abcdef";
constexpr char kModel[] = "cls";

// Messages the refusals carry (asserted as substrings, with the exact status code).
constexpr char kReplyDoesNotOpen[] = "cannot open the enclave's reply";
constexpr char kAuthFailed[] = "authentication failed";
constexpr char kReplayed[] = "replayed message";
constexpr char kMixedTenants[] = "batch mixes requests of different tenants";
constexpr char kUnknownSession[] = "unknown or expired session";
constexpr char kModelDoesNotDecrypt[] = "model upload does not decrypt";
constexpr char kReplyOrder[] = "enclave reply does not match the request order of the batch";

// Whether two output lists are the same tensors (names, types, shapes, and float values equal
// within 1e-4 relative, since a batch of two may round differently from a batch of one).
bool SameOutputs(const Outputs& a, const Outputs& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name() != b[i].name() || a[i].datatype() != b[i].datatype() ||
        a[i].raw().size() != b[i].raw().size() ||
        std::vector<int64_t>(a[i].shape().begin(), a[i].shape().end()) !=
            std::vector<int64_t>(b[i].shape().begin(), b[i].shape().end())) {
      return false;
    }
    if (a[i].datatype() != "FP32") {
      if (a[i].raw() != b[i].raw()) return false;
      continue;
    }
    const size_t count = a[i].raw().size() / sizeof(float);
    const auto* x = reinterpret_cast<const float*>(a[i].raw().data());
    const auto* y = reinterpret_cast<const float*>(b[i].raw().data());
    for (size_t k = 0; k < count; ++k) {
      if (std::abs(x[k] - y[k]) > 1e-4f * std::max(1.0f, std::abs(y[k]))) return false;
    }
  }
  return true;
}

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

std::string* TamperTest::work_ = nullptr;
std::string* TamperTest::plan_path_ = nullptr;
testing::Appliance* TamperTest::appliance_ = nullptr;
testing::GrpcTamperProxy* TamperTest::proxy_ = nullptr;
std::shared_ptr<const sdk::TenantIdentity>* TamperTest::acme_identity_ = nullptr;
std::shared_ptr<const sdk::TenantIdentity>* TamperTest::globex_identity_ = nullptr;
Tensor* TamperTest::input_a_ = nullptr;
Tensor* TamperTest::input_b_ = nullptr;
Outputs* TamperTest::reference_a_ = nullptr;
Outputs* TamperTest::reference_b_ = nullptr;
int TamperTest::plan_counter_ = 0;

// Stops the shared appliance after the last test.
class Cleanup : public ::testing::Environment {
 public:
  void TearDown() override { TamperTestAccess::Stop(); }
  struct TamperTestAccess : TamperTest {
    static void Stop() { StopAppliance(); }
  };
};
const ::testing::Environment* const kCleanup = ::testing::AddGlobalTestEnvironment(new Cleanup);

using testing::GrpcMutation;
using Boundary = TamperTest;
using Network = TamperTest;

// ---------------------------------------------------------------------------------------------
// The boundary between cloisterd and the enclave.

// A sealed request that does not authenticate is refused by the enclave, unsealed (there is no
// key it could answer under), and cloisterd relays that status.
TEST_F(Boundary, FlippedInferRequest) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("flip-request", "infer");
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

TEST_F(Boundary, TruncatedInferRequest) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("truncate-request", "infer");
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

TEST_F(Boundary, FlippedInferReply) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("flip-reply", "infer");
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

TEST_F(Boundary, TruncatedInferReply) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("truncate-reply", "infer");
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

// Two requests of one session in one batch; the host swaps the rows' sealed replies (keeping
// the request ids it checks). Each reply is bound to its request id, so neither opens.
TEST_F(Boundary, SwappedReplyRowsInOneBatch) {
  ExpectBothClean(*acme_, *acme_);
  SetBoundaryPlan("swap-reply-rows");
  TamperOneSharedBatch(absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  SetBoundaryPlan("off");
  ExpectBothClean(*acme_, *acme_);
}

// The sealed replies of two tenants' requests (two batches) trade places.
TEST_F(Boundary, SwappedRepliesBetweenTenants) {
  ExpectBothClean(*acme_, *globex_);
  SetBoundaryPlan("swap-replies");
  auto [a, b] = InferTwoAtOnce(*acme_, *globex_);
  ASSERT_TRUE(BoundaryApplied());
  ExpectRefused(a, absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  ExpectRefused(b, absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  SetBoundaryPlan("off");
  ExpectBothClean(*acme_, *globex_);
}

// An earlier sealed request resent in a later batch (in place of that batch's request): the
// enclave's replay window refuses it, and the displaced request is not run either.
TEST_F(Boundary, ReplayedRequestInALaterBatch) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("replay-request");
  ExpectCleanInfer(*acme_);  // remembered by the proxy, passes untouched
  ExpectRefused(acme_->Infer(kModel, {*input_b_}), absl::StatusCode::kPermissionDenied, kReplayed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_, /*input_a=*/false);
}

// A request of one session relabelled as another session's (same tenant): it does not
// authenticate under that session's key.
TEST_F(Boundary, RequestSplicedIntoAnotherSession) {
  ExpectCleanInfer(*acme2_);
  SetBoundaryPlan("splice-session");
  ExpectCleanInfer(*acme_);  // its session is remembered
  ExpectRefused(acme2_->Infer(kModel, {*input_b_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme2_);
  ExpectCleanInfer(*acme_);
}

// A batch of globex's relabelled as acme's: the enclave checks the sessions' tenants.
TEST_F(Boundary, BatchSplicedIntoAnotherTenant) {
  ExpectCleanInfer(*globex_);
  SetBoundaryPlan("splice-tenant");
  ExpectCleanInfer(*acme_);  // its tenant is remembered
  ExpectRefused(globex_->Infer(kModel, {*input_a_}), absl::StatusCode::kPermissionDenied,
                kMixedTenants);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*globex_);
  ExpectCleanInfer(*acme_);
}

// One row each of acme's and globex's batches trade places: both batches are refused whole.
TEST_F(Boundary, RowSwappedBetweenTenantsBatches) {
  ExpectBothClean(*acme_, *globex_);
  SetBoundaryPlan("swap-tenant-rows");
  auto [a, b] = InferTwoAtOnce(*acme_, *globex_);
  ASSERT_TRUE(BoundaryApplied());
  ExpectRefused(a, absl::StatusCode::kPermissionDenied, kMixedTenants);
  ExpectRefused(b, absl::StatusCode::kPermissionDenied, kMixedTenants);
  SetBoundaryPlan("off");
  ExpectBothClean(*acme_, *globex_);
}

// A row whose sealed request was emptied on the way in.
TEST_F(Boundary, EmptiedInferRequest) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("empty-request");
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kInvalidArgument,
                "shorter than the 16-byte tag");
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

// Harmless by design: two rows of one batch reordered on the way in, and their replies put
// back in the original order on the way out. Each row is sealed and answered on its own, so
// each request gets its own correct answer.
TEST_F(Boundary, ReorderedRowsInOneBatchEachGetTheirOwnAnswer) {
  ExpectBothClean(*acme_, *acme_);
  SetBoundaryPlan("reorder-rows");
  TamperOneSharedBatch(absl::StatusCode::kOk);
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

// The same reordering left in place: cloisterd notices that the replies do not follow its
// batch's order and fails both requests rather than hand either the other's reply.
TEST_F(Boundary, ReorderedRowsNotRestoredFailBoth) {
  ExpectBothClean(*acme_, *acme_);
  SetBoundaryPlan("reorder-rows-unrestored");
  TamperOneSharedBatch(absl::StatusCode::kInternal, kReplyOrder);
  SetBoundaryPlan("off");
  ExpectBothClean(*acme_, *acme_);
}

// globex's request pointed at acme's model (batch and row model handles rewritten): the model
// handle is in the associated data, so the request does not open.
TEST_F(Boundary, RequestPointedAtAnotherTenantsModel) {
  ExpectCleanInfer(*globex_);
  SetBoundaryPlan("swap-model");
  ExpectCleanInfer(*acme_);  // its model handle is remembered
  ExpectRefused(globex_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*globex_);
  ExpectCleanInfer(*acme_);
}

// cloisterd hands a restarted worker another model's wrapped key and ciphertext under
// globex's (or acme's) model handle. The wrapped key is bound to its handle, so that model is
// not loaded at all (its owner gets NotFound), never loaded as the other tenant's model.
TEST_F(Boundary, StoredModelsSwappedOnReload) {
  // Control: a clean restart brings both models back.
  RestartWorker();
  auto acme = Connect("acme", kAcmeToken, *acme_identity_);
  auto globex = Connect("globex", kGlobexToken, *globex_identity_);
  ASSERT_TRUE(acme.ok() && globex.ok());
  ExpectCleanInfer(**acme);
  ExpectCleanInfer(**globex);

  SetBoundaryPlan("swap-reload");
  RestartWorker();
  ASSERT_TRUE(BoundaryApplied());
  acme = Connect("acme", kAcmeToken, *acme_identity_);
  globex = Connect("globex", kGlobexToken, *globex_identity_);
  ASSERT_TRUE(acme.ok() && globex.ok());
  auto acme_result = (*acme)->Infer(kModel, {*input_a_});
  auto globex_result = (*globex)->Infer(kModel, {*input_a_});
  // Exactly one of the two models was swapped (the second one reloaded).
  ASSERT_NE(acme_result.ok(), globex_result.ok())
      << acme_result.status() << " / " << globex_result.status();
  const auto& refused = acme_result.ok() ? globex_result : acme_result;
  const auto& served = acme_result.ok() ? acme_result : globex_result;
  ExpectRefused(refused, absl::StatusCode::kNotFound, "model not found");
  EXPECT_TRUE(SameOutputs(*served, *reference_a_));
  // cloisterd logged why the enclave refused the swapped model.
  EXPECT_THAT(appliance_->Logs(), HasSubstr("wrapped model key does not open"));

  // Another clean restart: the stored models were left alone, so both come back.
  SetBoundaryPlan("off");
  RestartWorker();
  acme = Connect("acme", kAcmeToken, *acme_identity_);
  globex = Connect("globex", kGlobexToken, *globex_identity_);
  ASSERT_TRUE(acme.ok() && globex.ok());
  ExpectCleanInfer(**acme);
  ExpectCleanInfer(**globex);
}

TEST_F(Boundary, FlippedListModelsRequestAndReply) {
  ASSERT_TRUE(Lists(*acme_, kModel));
  SetBoundaryPlan("flip-request", "list");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("flip-reply", "list");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_TRUE(Lists(*acme_, kModel));
}

// A tampered delete request deletes nothing.
TEST_F(Boundary, FlippedDeleteRequestDeletesNothing) {
  ASSERT_TRUE(acme_->UploadModel(kClsModel, "doomed").ok());
  SetBoundaryPlan("flip-request", "delete");
  ExpectRefused(acme_->DeleteModel("doomed"), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_TRUE(Lists(*acme_, "doomed"));
  EXPECT_TRUE(acme_->DeleteModel("doomed").ok());
  EXPECT_FALSE(Lists(*acme_, "doomed"));
}

// acme's list, delete and load calls presented as globex's: the enclave checks who owns the
// session and refuses exactly as for a session that does not exist; nothing is deleted or
// stored.
TEST_F(Boundary, CallsRelabelledAsAnotherTenant) {
  ASSERT_TRUE(Lists(*acme_, kModel));
  SetBoundaryPlan("relabel-tenant", "list", "globex");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kNotFound, kUnknownSession);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("relabel-tenant", "delete", "globex");
  ExpectRefused(acme_->DeleteModel(kModel), absl::StatusCode::kNotFound, kUnknownSession);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("relabel-tenant", "load", "globex");
  ExpectRefused(acme_->UploadModel(kClsModel, "relabelled").status(), absl::StatusCode::kNotFound,
                kUnknownSession);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_TRUE(Lists(*acme_, kModel));
  EXPECT_FALSE(Lists(*acme_, "relabelled"));
  EXPECT_FALSE(Lists(*globex_, "relabelled"));
  ExpectCleanInfer(*acme_);
}

// The delete reply tampered on its way back: the request was authentic, so the model is gone,
// and the client, which cannot open the reply, gets DataLoss (not a false "deleted" or "not
// deleted"); ListModels tells it the truth.
TEST_F(Boundary, FlippedDeleteReply) {
  ASSERT_TRUE(acme_->UploadModel(kClsModel, "doomed").ok());
  SetBoundaryPlan("flip-reply", "delete");
  ExpectRefused(acme_->DeleteModel("doomed"), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_FALSE(Lists(*acme_, "doomed"));
  ExpectCleanInfer(*acme_);
}

// A tampered sealed load request (the upload's finish) stores and loads nothing.
TEST_F(Boundary, FlippedLoadRequestLoadsNothing) {
  SetBoundaryPlan("flip-request", "load");
  ExpectRefused(acme_->UploadModel(kClsModel, "tampered").status(), absl::StatusCode::kDataLoss,
                kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_FALSE(Lists(*acme_, "tampered"));
  ASSERT_TRUE(acme_->UploadModel(kClsModel, "tampered").ok());
  EXPECT_TRUE(acme_->DeleteModel("tampered").ok());
}

// Model ciphertext changed on its way into the enclave: the enclave refuses the model (in its
// sealed reply) and the host stores nothing.
TEST_F(Boundary, FlippedModelCiphertextLoadsNothing) {
  SetBoundaryPlan("flip-model", "load");
  ExpectRefused(acme_->UploadModel(kClsModel, "tampered").status(),
                absl::StatusCode::kDataLoss, kModelDoesNotDecrypt);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_FALSE(Lists(*acme_, "tampered"));
  ASSERT_TRUE(acme_->UploadModel(kClsModel, "tampered").ok());
  EXPECT_TRUE(acme_->DeleteModel("tampered").ok());
}

TEST_F(Boundary, FlippedHelloAndWelcome) {
  SetBoundaryPlan("flip-request", "open");
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(),
                absl::StatusCode::kPermissionDenied, "sealed hello does not authenticate");
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("flip-reply", "open");
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(),
                absl::StatusCode::kDataLoss, "cannot open the enclave's welcome");
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  auto fresh = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
}

// ---------------------------------------------------------------------------------------------
// The network between the SDK and cloisterd.

TEST_F(Network, FlippedInferCall) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kFlipCall);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

TEST_F(Network, TruncatedInferCall) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kTruncateCall);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

TEST_F(Network, FlippedInferReply) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kFlipReply);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

TEST_F(Network, TruncatedInferReply) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kTruncateReply);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

// Two concurrent calls of one session get each other's replies: neither opens.
TEST_F(Network, SwappedRepliesOfConcurrentCalls) {
  ExpectBothClean(*acme_, *acme_);
  proxy_->SetPlan(GrpcMutation::kSwapReplies);
  auto [a, b] = InferTwoAtOnce(*acme_, *acme_);
  ASSERT_TRUE(proxy_->applied());
  ExpectRefused(a, absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  ExpectRefused(b, absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectBothClean(*acme_, *acme_);
}

// Harmless by design: two independent calls delivered out of order (the later sequence number
// first) are both inside the replay window, so each runs and gets its own correct answer.
TEST_F(Network, ReorderedCallsEachGetTheirOwnAnswer) {
  ExpectBothClean(*acme_, *acme_);
  proxy_->SetPlan(GrpcMutation::kReorderCalls);
  ExpectBothClean(*acme_, *acme_);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

// Harmless by design (with a cost): the call ran, but the network answers UNAVAILABLE instead
// of the sealed reply. A client with retries attests again, opens a new session and sends the
// call again, so it runs twice (Infer is idempotent) and the client gets the correct answer;
// a client without retries gets UNAVAILABLE.
TEST_F(Network, ForgedUnavailableAfterTheCallRan) {
  auto retrying = Connect("acme", kAcmeToken, *acme_identity_, /*max_attempts=*/3);
  ASSERT_TRUE(retrying.ok()) << retrying.status();
  ExpectCleanInfer(**retrying);
  proxy_->SetPlan(GrpcMutation::kForgeUnavailable);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kUnavailable,
                "reply withheld");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kForgeUnavailable);
  const Bytes session_before = (*retrying)->session_id();
  ExpectCleanInfer(**retrying);
  EXPECT_TRUE(proxy_->applied());
  EXPECT_NE((*retrying)->session_id(), session_before);
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

// An earlier call sent again in place of a new one: the enclave refuses the replay (and the
// new call never reaches it).
TEST_F(Network, ReplayedCall) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kReplayCall);
  ExpectCleanInfer(*acme_);  // remembered
  ExpectRefused(acme_->Infer(kModel, {*input_b_}), absl::StatusCode::kPermissionDenied, kReplayed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_, /*input_a=*/false);
}

// An earlier reply returned for a new call: the SDK refuses it (other request id, and its
// sequence number was already received).
TEST_F(Network, ReplayedReply) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kReplayReply);
  ExpectCleanInfer(*acme_);  // remembered
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

// A call of acme2's session moved under acme's session (same tenant): it reaches the enclave,
// which cannot authenticate it under that session's key.
TEST_F(Network, CallSplicedIntoAnotherSessionOfTheSameTenant) {
  ExpectCleanInfer(*acme2_);
  proxy_->SetPlan(GrpcMutation::kSpliceSession);
  ExpectCleanInfer(*acme_);  // its session is remembered
  ExpectRefused(acme2_->Infer(kModel, {*input_b_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme2_);
  ExpectCleanInfer(*acme_);
}

// globex's call moved under acme's session (with globex's own credentials): refused as an
// unknown session, exactly like a session that does not exist.
TEST_F(Network, CallSplicedIntoAnotherTenantsSession) {
  ExpectCleanInfer(*globex_);
  proxy_->SetPlan(GrpcMutation::kSpliceSession);
  ExpectCleanInfer(*acme_);  // its session is remembered
  ExpectRefused(globex_->Infer(kModel, {*input_a_}), absl::StatusCode::kNotFound,
                "unknown session");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*globex_);
  ExpectCleanInfer(*acme_);
}

// An Infer call withheld, then delivered as a ListModels call: the message kind is in the
// associated data, so it does not open as another kind of call.
TEST_F(Network, InferCallDeliveredAsListModels) {
  ASSERT_TRUE(Lists(*acme_, kModel));
  proxy_->SetPlan(GrpcMutation::kCrossRpc);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kAborted, "withheld");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  EXPECT_TRUE(Lists(*acme_, kModel));
  ExpectCleanInfer(*acme_);
}

TEST_F(Network, FlippedListAndDeleteCalls) {
  ASSERT_TRUE(Lists(*acme_, kModel));
  proxy_->SetPlan(GrpcMutation::kFlipCall, "ListModels");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kFlipReply, "ListModels");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kFlipCall, "DeleteModel");
  ExpectRefused(acme_->DeleteModel(kModel), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  EXPECT_TRUE(Lists(*acme_, kModel));  // the tampered delete deleted nothing
  ExpectCleanInfer(*acme_);
}

// Connecting through a tampered exchange fails; a clean connection right after works.
struct ConnectCase {
  GrpcMutation mutation;
  absl::StatusCode code;
  const char* message;
};
class NetworkConnect : public TamperTest, public ::testing::WithParamInterface<ConnectCase> {};

TEST_P(NetworkConnect, Refused) {
  auto control = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(control.ok()) << control.status();
  proxy_->SetPlan(GetParam().mutation);
  if (GetParam().mutation == GrpcMutation::kReplayEvidence) {
    // The first evidence is remembered; the next connection gets it again.
    ASSERT_TRUE(Connect("acme", kAcmeToken, *acme_identity_).ok());
  }
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(), GetParam().code,
                GetParam().message);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  auto fresh = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
  ExpectCleanInfer(**control);
}

INSTANTIATE_TEST_SUITE_P(
    Mutations, NetworkConnect,
    ::testing::Values(
        ConnectCase{GrpcMutation::kFlipEvidence, absl::StatusCode::kFailedPrecondition,
                    "attestation failed"},
        // Old evidence is signed over another nonce.
        ConnectCase{GrpcMutation::kReplayEvidence, absl::StatusCode::kFailedPrecondition,
                    "attestation failed: challenge.signature: the signature over the client's "
                    "nonce does not verify"},
        ConnectCase{GrpcMutation::kFlipEvidenceDigest, absl::StatusCode::kFailedPrecondition,
                    "evidence digest is not this enclave's current evidence"},
        ConnectCase{GrpcMutation::kChangeSessionId, absl::StatusCode::kDataLoss,
                    "names a session id other than the one derived from our keys"}));

TEST_F(Network, FlippedHello) {
  proxy_->SetPlan(GrpcMutation::kFlipHello);
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(),
                absl::StatusCode::kPermissionDenied, "sealed hello does not authenticate");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  auto fresh = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
}

TEST_F(Network, FlippedWelcome) {
  proxy_->SetPlan(GrpcMutation::kFlipWelcome);
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(),
                absl::StatusCode::kDataLoss, "cannot open the enclave's welcome");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  auto fresh = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
}

// A recorded OpenSession sent again (same tenant): the enclave will not open the same session
// twice.
TEST_F(Network, ReplayedOpenSession) {
  proxy_->SetPlan(GrpcMutation::kReplayOpenSession);
  auto first = Connect("acme", kAcmeToken, *acme_identity_);  // remembered
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(),
                absl::StatusCode::kAlreadyExists, "session already open");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(**first);
  auto fresh = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
}

// acme's recorded OpenSession presented with globex's credentials: the hello is sealed to
// acme's tenant id, so it does not authenticate for globex.
TEST_F(Network, OpenSessionSplicedIntoAnotherTenant) {
  proxy_->SetPlan(GrpcMutation::kReplayOpenSession);
  auto first = Connect("acme", kAcmeToken, *acme_identity_);  // remembered
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectRefused(Connect("globex", kGlobexToken, *globex_identity_).status(),
                absl::StatusCode::kPermissionDenied, "sealed hello does not authenticate");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  auto fresh = Connect("globex", kGlobexToken, *globex_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
}

// Upload tampering: the model is refused and nothing is stored; a clean upload right after
// works and the model it stores gives the reference result.
class NetworkUpload : public TamperTest, public ::testing::WithParamInterface<GrpcMutation> {};

TEST_P(NetworkUpload, RefusedAndNothingStored) {
  const std::string name = "uploaded";
  ASSERT_TRUE(acme_->UploadModel(kClsModel, name).ok());  // control
  ASSERT_TRUE(acme_->DeleteModel(name).ok());
  proxy_->SetPlan(GetParam());
  if (GetParam() == GrpcMutation::kReplayUploadFinish) {
    ASSERT_TRUE(acme_->UploadModel(kClsModel, "first").ok());  // remembered
    ASSERT_TRUE(acme_->DeleteModel("first").ok());
  }
  absl::Status status = acme_->UploadModel(kClsModel, name).status();
  EXPECT_TRUE(proxy_->applied());
  switch (GetParam()) {
    case GrpcMutation::kFlipUploadData:
    case GrpcMutation::kReorderUploadData:
      ExpectRefused(status, absl::StatusCode::kDataLoss, kModelDoesNotDecrypt);
      break;
    case GrpcMutation::kTruncateUploadData:
      ExpectRefused(status, absl::StatusCode::kInvalidArgument, "of the declared");
      break;
    case GrpcMutation::kTruncateUploadAtChunk:
      // The sealed load request carries the plaintext size, which the shortened ciphertext
      // no longer matches.
      ExpectRefused(status, absl::StatusCode::kInvalidArgument, "truncated or padded upload");
      break;
    case GrpcMutation::kFlipUploadFinish:
      ExpectRefused(status, absl::StatusCode::kDataLoss, kAuthFailed);
      break;
    case GrpcMutation::kReplayUploadFinish:
      ExpectRefused(status, absl::StatusCode::kPermissionDenied, kReplayed);
      break;
    default:
      FAIL() << "not an upload mutation";
  }
  proxy_->SetPlan(GrpcMutation::kOff);
  EXPECT_FALSE(Lists(*acme_, name));
  EXPECT_FALSE(Lists(*acme_, "first"));
  ASSERT_TRUE(acme_->UploadModel(kClsModel, name).ok());
  auto result = acme_->Infer(name, {*input_a_});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(SameOutputs(*result, *reference_a_));
  EXPECT_TRUE(acme_->DeleteModel(name).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Mutations, NetworkUpload,
    ::testing::Values(GrpcMutation::kFlipUploadData, GrpcMutation::kTruncateUploadData,
                      GrpcMutation::kTruncateUploadAtChunk, GrpcMutation::kReorderUploadData,
                      GrpcMutation::kFlipUploadFinish, GrpcMutation::kReplayUploadFinish));

// The load reply tampered on its way back: the client cannot tell whether the model loaded,
// so it gets DataLoss; the model did load (the request was authentic), which ListModels shows.
TEST_F(Network, FlippedUploadReply) {
  proxy_->SetPlan(GrpcMutation::kFlipUploadReply);
  ExpectRefused(acme_->UploadModel(kClsModel, "loaded").status(), absl::StatusCode::kDataLoss,
                kReplyDoesNotOpen);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  EXPECT_TRUE(Lists(*acme_, "loaded"));
  auto result = acme_->Infer("loaded", {*input_a_});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(SameOutputs(*result, *reference_a_));
  EXPECT_TRUE(acme_->DeleteModel("loaded").ok());
}

}  // namespace
}  // namespace cloister
