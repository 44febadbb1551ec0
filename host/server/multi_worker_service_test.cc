// In-process tests of the service in front of two enclave workers, each with its own evidence:
// where sessions open and their calls go, the fan-out of uploads, the model-memory quota, and a
// cancelled request leaving the queue.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "host/server/cloister_service.h"
#include "host/server/service_test_harness.h"
#include "host/testing/fake_enclave.h"
#include "host/testing/fake_enclave_client.h"

namespace cloister::host {
namespace {

using testing::kHandle;
using testing::kOtherHandle;

// Passes calls on to another client and, like the real enclave for an LLM, reports a loaded
// model's memory size in its LoadModelResult (the FakeEnclave reports none, like for ONNX).
class MemoryReportingClient : public EnclaveClient {
 public:
  explicit MemoryReportingClient(EnclaveClient* inner) : inner_(inner) {}
  // For the loads from now on; 0: none reported.
  void ReportMemorySize(uint64_t size) { memory_size_ = size; }

  void Call(boundary::v1::HostToEnclave call, Done done) override {
    const uint64_t size = memory_size_.load();
    inner_->Call(std::move(call), [size, done = std::move(done)](Reply reply) {
      if (reply.ok() && reply->has_load_model() &&
          !reply->load_model().wrapped_model_key().empty()) {
        reply->mutable_load_model()->set_model_memory_size(size);
      }
      done(std::move(reply));
    });
  }
  uint64_t CallStream(boundary::v1::HostToEnclave call, OnFrame on_frame, Done done) override {
    return inner_->CallStream(std::move(call), std::move(on_frame), std::move(done));
  }
  void Cancel(uint64_t stream_id) override { inner_->Cancel(stream_id); }

 private:
  EnclaveClient* const inner_;
  std::atomic<uint64_t> memory_size_{0};
};

// Two enclave workers, each with its own evidence, behind one service; acme has a small
// model-memory quota and one batch in flight per worker.
class MultiWorkerServiceTest : public testing::ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    if (HasFatalFailure()) return;
    for (int i = 0; i < 2; ++i) {
      workers_.push_back(std::make_unique<testing::FakeEnclaveClient>(
          std::make_unique<testing::FakeEnclave>(absl::StrCat("w", i), Digest(i))));
      reporting_.push_back(std::make_unique<MemoryReportingClient>(workers_.back().get()));
    }
    SchedulerOptions scheduler_options;
    scheduler_options.max_queue_delay = absl::ZeroDuration();
    scheduler_options.max_batches_in_flight = 1;
    scheduler_options.tenant_limits["acme"].model_memory_quota = 100;
    StartService({workers_[0].get(), workers_[1].get()}, scheduler_options, ServiceOptions(), {},
                 {reporting_[0].get(), reporting_[1].get()});
  }

  static std::string Digest(int worker) { return std::string(32, static_cast<char>('A' + worker)); }

  std::string OpenSessionOn(int worker) { return OpenSession("acme", Digest(worker)); }

  grpc::Status Infer(const std::string& session, const std::string& request_id,
                     const std::string& input, api::v1::SealedReply& reply,
                     absl::Duration timeout = absl::Seconds(30)) {
    return ServiceTest::Infer(Sealed(session, request_id, kHandle, input, /*sequence=*/2), reply,
                              "acme", timeout);
  }

  static int CountCalls(const std::vector<boundary::v1::HostToEnclave>& history,
                        boundary::v1::HostToEnclave::CallCase call_case) {
    int count = 0;
    for (const auto& call : history) count += call.call_case() == call_case;
    return count;
  }

  std::vector<std::unique_ptr<testing::FakeEnclaveClient>> workers_;
  std::vector<std::unique_ptr<MemoryReportingClient>> reporting_;  // the service's view of them
};

TEST_F(MultiWorkerServiceTest, SessionsOpenWhereTheEvidenceCameFromAndStayThere) {
  std::string on_second = OpenSessionOn(1);
  EXPECT_EQ(on_second.substr(0, 3), "w1-");
  std::string on_first = OpenSessionOn(0);
  EXPECT_EQ(on_first.substr(0, 3), "w0-");

  // The upload loads on the session's worker and is reloaded into the other one.
  grpc::Status status = Upload(on_second, kHandle, std::string(40, 'm'));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(CountCalls(workers_[1]->History(), boundary::v1::HostToEnclave::kLoadModel), 1);
  EXPECT_EQ(CountCalls(workers_[0]->History(), boundary::v1::HostToEnclave::kReloadModel), 1);

  // Each session's requests run on its own worker, and the model is there on both.
  api::v1::SealedReply reply;
  status = Infer(on_first, "infer-0", "x", reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  status = Infer(on_second, "infer-1", "y", reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(CountCalls(workers_[0]->History(), boundary::v1::HostToEnclave::kInferBatch), 1);
  EXPECT_EQ(CountCalls(workers_[1]->History(), boundary::v1::HostToEnclave::kInferBatch), 1);
  EXPECT_EQ(workers_[1]->History().back().infer_batch().items(0).request_id(), "infer-1");

  // GetEvidence alternates between the workers.
  std::vector<std::string> evidence;
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext context;
    AsTenant(context);
    api::v1::GetEvidenceRequest request;
    request.set_nonce(std::string(32, 'n'));
    api::v1::GetEvidenceResponse response;
    ASSERT_TRUE(stub_->GetEvidence(&context, request, &response).ok());
    evidence.push_back(response.challenge_response().substr(0, 2));
  }
  std::sort(evidence.begin(), evidence.end());
  EXPECT_EQ(evidence, (std::vector<std::string>{"w0", "w1"}));
}

TEST_F(MultiWorkerServiceTest, ModelMemoryQuotaIsCheckedAtUpload) {
  std::string session = OpenSessionOn(0);
  ASSERT_TRUE(Upload(session, kHandle, std::string(60, 'm')).ok());
  grpc::Status status = Upload(session, kOtherHandle, std::string(41, 'm'));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(),
            "tenant acme: model memory quota of 100 bytes exceeded (60 bytes stored, 0 being "
            "uploaded, this model 41 bytes)");
  EXPECT_EQ(blobs_->List()->size(), 1u) << "nothing of the refused upload is stored";
  // Replacing the stored model under the same handle counts only the new size.
  status = Upload(session, kHandle, std::string(100, 'n'));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Upload(session, kOtherHandle, std::string(1, 'm')).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
}

// The enclave is told how much of the quota the model may take in its memory (an LLM's weights
// are checked against it): the quota less the tenant's other stored models and uploads.
TEST_F(MultiWorkerServiceTest, TheLoadCallCarriesTheQuotaLeftForTheModel) {
  std::string session = OpenSessionOn(0);
  ASSERT_TRUE(Upload(session, kHandle, std::string(60, 'm')).ok());
  api::v1::UploadModelResponse response;
  ASSERT_TRUE(Upload(session, kOtherHandle, "budget?", &response).ok());
  EXPECT_EQ(response.reply().ciphertext(), "budget:40");
  // Under the stored model's own handle, the model it replaces does not count.
  ASSERT_TRUE(Upload(session, kHandle, "budget?", &response).ok());
  EXPECT_EQ(response.reply().ciphertext(), "budget:100");
}

// A stored model counts what the enclave reported it takes in memory (an LLM's weights), not its
// ciphertext; one the enclave reports nothing for (an ONNX model) counts its stored size.
TEST_F(MultiWorkerServiceTest, StoredModelsCountTheMemoryTheEnclaveReports) {
  std::string session = OpenSessionOn(0);
  reporting_[0]->ReportMemorySize(70);
  ASSERT_TRUE(Upload(session, kHandle, std::string(10, 'm')).ok());
  reporting_[0]->ReportMemorySize(0);
  api::v1::UploadModelResponse response;
  ASSERT_TRUE(Upload(session, kOtherHandle, "budget?", &response).ok());
  EXPECT_EQ(response.reply().ciphertext(), "budget:30");
  grpc::Status status = Upload(session, kOtherHandle, std::string(31, 'm'));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(),
            "tenant acme: model memory quota of 100 bytes exceeded (70 bytes stored, 0 being "
            "uploaded, this model 31 bytes)");
  ASSERT_TRUE(Upload(session, kOtherHandle, std::string(30, 'm')).ok());
  // Replaced by a model the enclave reports nothing for: its stored size counts again.
  ASSERT_TRUE(Upload(session, kHandle, std::string(10, 'n')).ok());
  ASSERT_TRUE(Upload(session, kOtherHandle, "budget?", &response).ok());
  EXPECT_EQ(response.reply().ciphertext(), "budget:90");
}

// An upload holds its declared size against the quota from its start on. cloisterd sends its
// initial metadata once the start is accepted, so a client (here the test) can know when that
// is: a second upload that would not fit beside it is then refused, and fits once it ends.
TEST_F(MultiWorkerServiceTest, AnUploadHoldsItsDeclaredSizeFromTheMomentItsStartIsAccepted) {
  std::string session = OpenSessionOn(0);
  grpc::ClientContext context;
  AsTenant(context);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  api::v1::UploadModelResponse response;
  auto writer = stub_->UploadModel(&context, &response);
  api::v1::UploadModelRequest start;
  start.mutable_start()->set_session_id(session);
  start.mutable_start()->set_model_handle(kHandle);
  start.mutable_start()->set_ciphertext_size(60);
  ASSERT_TRUE(writer->Write(start));
  writer->WaitForInitialMetadata();
  grpc::Status refused = Upload(session, kOtherHandle, std::string(41, 'm'));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(),
            "tenant acme: model memory quota of 100 bytes exceeded (0 bytes stored, 60 being "
            "uploaded, this model 41 bytes)");
  writer->WritesDone();
  grpc::Status ended = writer->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ended.error_message(), "upload stream ended before its finish message");
  // The quota is given back before the status goes out.
  EXPECT_TRUE(Upload(session, kOtherHandle, std::string(41, 'm')).ok());
}

TEST_F(MultiWorkerServiceTest, ACancelledRequestLeavesTheQueueUnexecuted) {
  std::string session = OpenSessionOn(0);
  ASSERT_TRUE(Upload(session, kHandle, std::string(10, 'm')).ok());
  // The worker's only slot is busy for a while; a second request queues behind it.
  std::thread busy([&] {
    api::v1::SealedReply reply;
    grpc::Status status = Infer(session, "busy", "sleep:400", reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
  });
  for (int i = 0; i < 1000 && scheduler_->batches_in_flight() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  api::v1::SealedReply reply;
  grpc::Status status = Infer(session, "impatient", "x", reply, absl::Milliseconds(100));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  busy.join();
  absl::SleepFor(absl::Milliseconds(50));
  TenantStats stats = scheduler_->StatsFor("acme");
  EXPECT_EQ(stats.cancelled + stats.expired, 1u);
  EXPECT_EQ(stats.dispatched, 1u);
  for (const auto& call : workers_[0]->History()) {
    if (call.call_case() != boundary::v1::HostToEnclave::kInferBatch) continue;
    for (const auto& item : call.infer_batch().items()) EXPECT_NE(item.request_id(), "impatient");
  }
}

}  // namespace
}  // namespace cloister::host
