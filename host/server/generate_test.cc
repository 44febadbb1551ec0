// In-process tests of the Generate RPC (host/server/generate_reactor.h) against the FakeEnclave,
// whose GenerateCall answer is one chunk per comma-separated part of the ciphertext ("hold"
// keeps the stream open until a CancelCall, "crash" kills the worker): chunks relayed in order,
// cancellation and deadlines reaching the enclave, a worker's death, the per-tenant limit on
// generations at once, the usage receipt, and the refusals.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "host/server/cloister_service.h"
#include "host/server/service_test_harness.h"
#include "proto/duration.h"
#include "proto/error_reason.h"

namespace cloister::host {
namespace {

using api::v1::SealedChunk;
using api::v1::SealedRequest;
using boundary::v1::HostToEnclave;
using testing::kHandle;

// One enclave worker; acme may run one generation at once and send 64-byte requests at most.
class GenerateTest : public testing::ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    if (HasFatalFailure()) return;
    enclave_ =
        std::make_unique<testing::FakeEnclaveClient>(std::make_unique<testing::FakeEnclave>());
    SchedulerOptions scheduler_options;
    scheduler_options.max_queue_delay = absl::Milliseconds(1);
    scheduler_options.tenant_limits["acme"].max_generations = 1;
    scheduler_options.tenant_limits["acme"].max_payload_size = 64;
    scheduler_options.tenant_limits["acme"].max_tokens = 300;
    scheduler_options.tenant_limits["acme"].kv_cache_tokens = 2048;
    scheduler_options.tenant_limits["acme"].tokens_per_second = 100;
    scheduler_options.tenant_limits["acme"].token_burst = 1000;
    ServiceOptions options;
    options.on_generate_receipt = [this](int worker,
                                         const boundary::v1::SignedUsageReceipt& receipt) {
      absl::MutexLock lock(&mu_);
      receipts_.emplace_back(worker, receipt);
    };
    StartService({enclave_.get()}, scheduler_options, options);
  }

  // Generate as `tenant`, reading every chunk into `chunks`.
  grpc::Status Generate(const SealedRequest& request, std::vector<SealedChunk>& chunks,
                        const std::string& tenant = "acme",
                        absl::Duration timeout = absl::InfiniteDuration()) {
    grpc::ClientContext context;
    AsTenant(context, tenant);
    if (timeout != absl::InfiniteDuration()) {
      context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    }
    std::unique_ptr<grpc::ClientReader<SealedChunk>> reader = stub_->Generate(&context, request);
    SealedChunk chunk;
    while (reader->Read(&chunk)) chunks.push_back(chunk);
    return reader->Finish();
  }

  // The GenerateCalls and CancelCalls the enclave received, in order.
  std::vector<HostToEnclave> StreamCalls() const {
    std::vector<HostToEnclave> calls;
    for (HostToEnclave& call : enclave_->History()) {
      if (call.has_generate() || call.has_cancel()) calls.push_back(std::move(call));
    }
    return calls;
  }

  // Waits until the enclave got a CancelCall for `target_call_id`.
  bool WaitForCancel(uint64_t target_call_id) {
    for (int i = 0; i < 500; ++i) {
      for (const HostToEnclave& call : enclave_->History()) {
        if (call.has_cancel() && call.cancel().target_call_id() == target_call_id) return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  absl::Mutex mu_;
  std::vector<std::pair<int, boundary::v1::SignedUsageReceipt>> receipts_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<testing::FakeEnclaveClient> enclave_;
};

TEST_F(GenerateTest, RelaysTheChunksInOrderAndEndsOk) {
  const std::string session = OpenSession("acme");
  std::vector<SealedChunk> chunks;
  grpc::Status status = Generate(Sealed(session, "g1", kHandle, "a,b,c", 7), chunks);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(chunks.size(), 3u);
  const std::vector<std::string> texts = {"chunk:a", "chunk:b", "chunk:c"};
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].chunk(), i);
    EXPECT_EQ(chunks[i].final(), i == 2);
    EXPECT_EQ(chunks[i].ciphertext(), texts[i]);
    if (i > 0) {
      EXPECT_GT(chunks[i].sequence(), chunks[i - 1].sequence());
    }
  }
  // The enclave got one GenerateCall for the authenticated tenant, with the request as sent.
  std::vector<HostToEnclave> calls = StreamCalls();
  ASSERT_EQ(calls.size(), 1u);
  const boundary::v1::GenerateCall& call = calls[0].generate();
  EXPECT_EQ(call.tenant_id(), "acme");
  EXPECT_EQ(call.request().session_id(), session);
  EXPECT_EQ(call.request().request_id(), "g1");
  EXPECT_EQ(call.request().model_handle(), kHandle);
  EXPECT_EQ(call.request().sequence(), 7u);
  EXPECT_EQ(call.request().ciphertext(), "a,b,c");
  EXPECT_FALSE(call.request().has_time_left());  // no deadline
  // The tenant's class and weight (the defaults: standard, 1) for the enclave's scheduler.
  EXPECT_EQ(call.limits().priority_class(), 2);
  EXPECT_EQ(call.limits().weight(), 1u);
  // And the token limits from its config, which the enclave enforces.
  EXPECT_EQ(call.limits().max_tokens(), 300u);
  EXPECT_EQ(call.limits().kv_cache_tokens(), 2048u);
  EXPECT_EQ(call.limits().tokens_per_second(), 100);
  EXPECT_EQ(call.limits().token_burst(), 1000);
  // The final chunk's receipt went to the receipt hook, with the worker that signed it.
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(receipts_.size(), 1u);
  EXPECT_EQ(receipts_[0].first, 0);
  boundary::v1::UsageReceipt receipt;
  ASSERT_TRUE(receipt.ParseFromString(receipts_[0].second.receipt()));
  EXPECT_EQ(receipt.tenant_id(), "acme");
  EXPECT_EQ(receipt.batch().completion_tokens(), 3u);
}

TEST_F(GenerateTest, TheEarlierDeadlineGoesToTheEnclaveAsTimeLeft) {
  const std::string session = OpenSession("acme");
  SealedRequest request = Sealed(session, "g1", kHandle, "a");
  *request.mutable_deadline() = proto::ToProtoDuration(absl::Seconds(10));
  std::vector<SealedChunk> chunks;
  ASSERT_TRUE(Generate(request, chunks, "acme", absl::Seconds(60)).ok());
  std::vector<HostToEnclave> calls = StreamCalls();
  ASSERT_EQ(calls.size(), 1u);
  ASSERT_TRUE(calls[0].generate().request().has_time_left());
  absl::Duration time_left = proto::FromProtoDuration(calls[0].generate().request().time_left());
  EXPECT_LE(time_left, absl::Seconds(10));
  EXPECT_GT(time_left, absl::Seconds(5));

  // The RPC's deadline when it is the earlier one.
  request.clear_deadline();
  chunks.clear();
  ASSERT_TRUE(Generate(request, chunks, "acme", absl::Seconds(20)).ok());
  calls = StreamCalls();
  ASSERT_EQ(calls.size(), 2u);
  time_left = proto::FromProtoDuration(calls[1].generate().request().time_left());
  EXPECT_LE(time_left, absl::Seconds(21));  // gRPC rounds the timeout it sends up
  EXPECT_GT(time_left, absl::Seconds(15));
}

TEST_F(GenerateTest, ACancelledRpcCancelsTheGenerationInTheEnclave) {
  const std::string session = OpenSession("acme");
  {
    grpc::ClientContext context;
    AsTenant(context);
    auto reader = stub_->Generate(&context, Sealed(session, "g1", kHandle, "a,hold"));
    SealedChunk chunk;
    ASSERT_TRUE(reader->Read(&chunk));
    EXPECT_EQ(chunk.ciphertext(), "chunk:a");
    context.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  std::vector<HostToEnclave> calls = StreamCalls();
  ASSERT_FALSE(calls.empty());
  ASSERT_TRUE(calls[0].has_generate());
  EXPECT_TRUE(WaitForCancel(calls[0].call_id()));
  // The stream ended in the enclave ("cancelled"), so the tenant may generate again.
  ASSERT_TRUE(service_->WaitUntilIdle(absl::Seconds(10)));
  EXPECT_EQ(enclave_->open_stream_count(), 0u);
  std::vector<SealedChunk> chunks;
  grpc::Status status = Generate(Sealed(session, "g2", kHandle, "b"), chunks);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(chunks.size(), 1u);
}

TEST_F(GenerateTest, APassedDeadlineCancelsTheGenerationInTheEnclave) {
  const std::string session = OpenSession("acme");
  std::vector<SealedChunk> chunks;
  grpc::Status status =
      Generate(Sealed(session, "g1", kHandle, "a,hold"), chunks, "acme", absl::Milliseconds(300));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  ASSERT_EQ(chunks.size(), 1u);
  std::vector<HostToEnclave> calls = StreamCalls();
  ASSERT_FALSE(calls.empty());
  EXPECT_TRUE(WaitForCancel(calls[0].call_id()));
  ASSERT_TRUE(service_->WaitUntilIdle(absl::Seconds(10)));
}

TEST_F(GenerateTest, AWorkerDeathMidStreamEndsTheRpcUnavailable) {
  const std::string session = OpenSession("acme");
  std::vector<SealedChunk> chunks;
  grpc::Status status = Generate(Sealed(session, "g1", kHandle, "a,b,crash"), chunks);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_EQ(status.error_message(), "enclave worker exited");
  EXPECT_EQ(proto::ReasonFromGrpcDetails(status.error_details()), api::v1::WORKER_EXITED);
  EXPECT_LE(chunks.size(), 2u);  // the ones written before the end; never a final one
  for (const SealedChunk& chunk : chunks) EXPECT_FALSE(chunk.final());
  ASSERT_TRUE(service_->WaitUntilIdle(absl::Seconds(10)));
}

TEST_F(GenerateTest, TheTenantsLimitOfGenerationsAtOnceRefusesTheNext) {
  const std::string session = OpenSession("acme");
  grpc::ClientContext context;
  AsTenant(context);
  auto running = stub_->Generate(&context, Sealed(session, "g1", kHandle, "a,hold"));
  SealedChunk chunk;
  ASSERT_TRUE(running->Read(&chunk));  // admitted and streaming

  std::vector<SealedChunk> chunks;
  grpc::Status refused = Generate(Sealed(session, "g2", kHandle, "b"), chunks);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(),
            "tenant acme: at its limit of 1 generation at once (max_generations); retry "
            "later");
  EXPECT_EQ(proto::ReasonFromGrpcDetails(refused.error_details()), api::v1::OVERLOADED);
  EXPECT_TRUE(chunks.empty());
  // Another tenant is not held back by acme's generations.
  const std::string globex_session = OpenSession("globex");
  grpc::Status other = Generate(Sealed(globex_session, "g3", kHandle, "c"), chunks, "globex");
  EXPECT_TRUE(other.ok()) << other.error_message();
  EXPECT_EQ(StreamCalls().size(), 2u);  // the refused one never reached the enclave

  context.TryCancel();
  EXPECT_EQ(running->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(GenerateTest, RefusesWhatIsWrongWithOneLine) {
  const std::string session = OpenSession("acme");
  struct Case {
    SealedRequest request;
    std::string tenant;
    grpc::StatusCode code;
    std::string message;
  };
  SealedRequest negative = Sealed(session, "g1", kHandle, "a");
  *negative.mutable_deadline() = proto::ToProtoDuration(absl::Seconds(-1));
  SealedRequest zero = Sealed(session, "g1", kHandle, "a");
  *zero.mutable_deadline() = proto::ToProtoDuration(absl::ZeroDuration());
  std::vector<Case> cases = {
      {Sealed("", "g1", kHandle, "a"), "acme", grpc::StatusCode::INVALID_ARGUMENT,
       "sealed call needs a session id"},
      {Sealed("session-99999999", "g1", kHandle, "a"), "acme", grpc::StatusCode::NOT_FOUND,
       "unknown session; open a new session"},
      // Another tenant's session looks like an unknown one.
      {Sealed(session, "g1", kHandle, "a"), "globex", grpc::StatusCode::NOT_FOUND,
       "unknown session; open a new session"},
      {Sealed(session, "g1", kHandle, ""), "acme", grpc::StatusCode::INVALID_ARGUMENT,
       "sealed call is empty"},
      {negative, "acme", grpc::StatusCode::INVALID_ARGUMENT, "deadline is negative"},
      {zero, "acme", grpc::StatusCode::DEADLINE_EXCEEDED,
       "generation deadline passed before it started"},
      {Sealed(session, "g1", kHandle, std::string(65, 'x')), "acme",
       grpc::StatusCode::RESOURCE_EXHAUSTED,
       "tenant acme: payload of 65 bytes exceeds the limit of 64 bytes"},
  };
  for (const Case& c : cases) {
    std::vector<SealedChunk> chunks;
    grpc::Status status = Generate(c.request, chunks, c.tenant);
    EXPECT_EQ(status.error_code(), c.code) << c.message;
    EXPECT_EQ(status.error_message(), c.message);
    EXPECT_TRUE(chunks.empty());
  }
  // No model handle.
  std::vector<SealedChunk> chunks;
  EXPECT_EQ(Generate(Sealed(session, "g1", "", "a"), chunks).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // The wrong token.
  grpc::ClientContext context;
  Authorize(context, "acme", "globex-token");
  auto reader = stub_->Generate(&context, Sealed(session, "g1", kHandle, "a"));
  SealedChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status.error_message(), testing::kUnauthenticated);
  EXPECT_TRUE(StreamCalls().empty());  // nothing reached the enclave
}

}  // namespace
}  // namespace cloister::host
