// In-process tests of UploadModel (host/server/upload_reactor.h) against one FakeEnclave: what
// is stored and loaded, the uploads that are refused, the idle and overall timeouts, and a
// worker that restarted meanwhile.
#include "host/server/upload_reactor.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "host/server/service_test_harness.h"
#include "host/supervisor/worker_supervisor.h"
#include "host/testing/fake_enclave.h"
#include "proto/error_reason.h"

namespace cloister::host {
namespace {

using testing::CloisterServiceTest;
using testing::kHandle;
using testing::kOtherHandle;
using testing::UploadOptions;

TEST_F(CloisterServiceTest, UploadStoresTheModelAndInferUsesIt) {
  std::string session = OpenSession("acme");
  api::v1::UploadModelResponse response;
  grpc::Status status =
      Upload(session, kHandle, {"cipher", "text", std::string(100000, 'z')}, response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.reply().ciphertext(), std::string("loaded:") + kHandle);
  EXPECT_EQ(response.reply().sequence(), 1u);

  // The enclave got the whole ciphertext and the sealed load request.
  auto history = enclave_->History();
  const auto& load = history.back().load_model();
  EXPECT_EQ(load.tenant_id(), "acme");
  EXPECT_EQ(load.model_ciphertext(), "ciphertext" + std::string(100000, 'z'));
  EXPECT_EQ(load.request().request_id(), "upload-1");
  EXPECT_EQ(load.request().ciphertext(), "load:model");

  std::string stem = kHandle;
  EXPECT_EQ(ModelFiles("acme"),
            (std::vector<std::string>{stem + ".blob", stem + ".key", stem + ".meta"}));
  EXPECT_EQ(*blobs_->ReadWrappedKey("acme", kHandle),
            testing::FakeEnclave::WrappedKeyFor(kHandle, load.model_ciphertext()));

  api::v1::SealedReply reply;
  api::v1::SealedRequest call = Sealed(session, "infer-1", kHandle, "input");
  call.mutable_deadline()->set_seconds(10);
  status = Infer(call, reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply.ciphertext(), "out:input;batch=1");

  // The enclave's item-level refusal (globex has no such model... its session is fine).
  std::string globex_session = OpenSession("globex");
  status = Infer(Sealed(globex_session, "infer-2", kOtherHandle, "input"), reply, "globex");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "model is not loaded");
}

TEST_F(CloisterServiceTest, ModelTheEnclaveRefusesIsNotStored) {
  std::string session = OpenSession("acme");
  api::v1::UploadModelResponse response;
  grpc::Status status = Upload(session, kHandle, {"bad model"}, response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.reply().ciphertext(), "error:cannot parse model");
  EXPECT_TRUE(ModelFiles("acme").empty());
  EXPECT_TRUE(blobs_->List()->empty());
}

TEST_F(CloisterServiceTest, BadUploadsAreRefusedAndLeaveNothing) {
  std::string session = OpenSession("acme");
  std::string globex_session = OpenSession("globex");
  struct Case {
    std::string name;
    std::string session;
    std::string handle;
    std::vector<std::string> chunks;
    UploadOptions options;
    grpc::StatusCode code;
  };
  std::vector<Case> cases = {
      {"more than declared",
       session,
       kHandle,
       {"abcdef", "gh"},
       {.declared_size = 7},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"less than declared",
       session,
       kHandle,
       {"abc"},
       {.declared_size = 7},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"over the size limit",
       session,
       kHandle,
       {"abc"},
       {.declared_size = (1 << 20) + 1},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"no start",
       session,
       kHandle,
       {"abc"},
       {.send_start = false},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"no finish",
       session,
       kHandle,
       {"abc"},
       {.send_finish = false},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"finish for another handle",
       session,
       kHandle,
       {"abc"},
       {.finish_handle = kOtherHandle},
       grpc::StatusCode::INVALID_ARGUMENT},
      {"bad handle", session, "../../x", {"abc"}, {}, grpc::StatusCode::INVALID_ARGUMENT},
      {"unknown session", "nope", kHandle, {"abc"}, {}, grpc::StatusCode::NOT_FOUND},
      {"another tenant's session",
       globex_session,
       kHandle,
       {"abc"},
       {},
       grpc::StatusCode::NOT_FOUND},
  };
  for (const Case& c : cases) {
    api::v1::UploadModelResponse response;
    grpc::Status status = Upload(c.session, c.handle, c.chunks, response, c.options);
    EXPECT_EQ(status.error_code(), c.code) << c.name << ": " << status.error_message();
    EXPECT_TRUE(ModelFiles("acme").empty()) << c.name;
  }
  for (const auto& call : enclave_->History()) EXPECT_FALSE(call.has_load_model());
}

// An upload that goes silent is ended once it has waited upload_idle_timeout for its next
// message; its staged bytes are removed and its quota is free again. (Without the watchdog the
// Finish below would only return at the client's 30 s deadline, with the client's own
// DEADLINE_EXCEEDED message.)
TEST_F(CloisterServiceTest, SilentUploadIsEndedAfterTheIdleTimeout) {
  FakeClock clock;
  ServiceOptions options;
  options.max_model_size = 1 << 20;
  options.upload_idle_timeout = absl::Seconds(2);
  options.clock = &clock;
  RestartService(options);
  std::string session = OpenSession("acme");
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  api::v1::UploadModelResponse response;
  auto writer = StartUpload(context, session, 1000, response);
  api::v1::UploadModelRequest message;
  message.set_data(std::string(100, 'x'));
  ASSERT_TRUE(writer->Write(message));
  // Time passes only on the fake clock, in steps, until the server gives up; whenever the
  // server took the chunk, it has been silent for more than 2 s a few steps later.
  std::atomic<bool> ended{false};
  std::thread ticking([&] {
    while (!ended.load()) {
      clock.Advance(absl::Seconds(1));
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  grpc::Status status = writer->Finish();
  ended = true;
  ticking.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_EQ(status.error_message(),
            "upload sent nothing for 2s (limits.upload_idle_timeout_seconds); upload again");
  ExpectNothingStoredOrLoaded();
}

// An upload that keeps sending is not ended however long it takes in all: the timeout counts
// from its last message. (Real clock: a message every 50 ms against a 1 s timeout.)
TEST_F(CloisterServiceTest, UploadThatKeepsSendingOutlastsTheIdleTimeout) {
  ServiceOptions options;
  options.max_model_size = 1 << 20;
  options.upload_idle_timeout = absl::Seconds(1);
  RestartService(options);
  std::string session = OpenSession("acme");
  grpc::ClientContext context;
  api::v1::UploadModelResponse response;
  auto writer = StartUpload(context, session, 400, response);
  api::v1::UploadModelRequest message;
  const absl::Time started = absl::Now();
  for (int i = 0; i < 40; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    message.Clear();
    message.set_data(std::string(10, static_cast<char>('a' + i % 26)));
    ASSERT_TRUE(writer->Write(message));
  }
  message.Clear();
  *message.mutable_finish() = Sealed(session, "upload-1", kHandle, "load:model");
  ASSERT_TRUE(writer->Write(message));
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  EXPECT_GT(absl::Now() - started, absl::Seconds(1.5));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(ModelFiles("acme").empty());
}

// An upload that keeps sending, but too slowly to finish, is ended once it has run for
// upload_timeout in all: DEADLINE_EXCEEDED naming the limit, and nothing stored or loaded.
TEST_F(CloisterServiceTest, TricklingUploadIsEndedAfterTheOverallTimeout) {
  ServiceOptions options;
  options.max_model_size = 1 << 20;
  options.upload_idle_timeout = absl::Seconds(1);
  options.upload_timeout = absl::Milliseconds(600);
  RestartService(options);
  std::string session = OpenSession("acme");
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  api::v1::UploadModelResponse response;
  auto writer = StartUpload(context, session, 100000, response);
  api::v1::UploadModelRequest message;
  // A byte every 50 ms: never idle for the 1 s idle timeout, never done.
  for (int i = 0; i < 200; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    message.Clear();
    message.set_data("x");
    if (!writer->Write(message)) break;  // the server ended the stream
  }
  grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_EQ(status.error_message(),
            "upload still incomplete after 600ms (limits.upload_timeout_seconds); nothing was "
            "stored");
  ExpectNothingStoredOrLoaded();
}

// The enclave worker holding the upload's session restarted while the ciphertext streamed in:
// the supervisor refuses the dead incarnation's session at LoadModel, and the upload gets one
// UNAVAILABLE saying nothing was stored (it used to pass the FAILED_PRECONDITION on).
TEST_F(CloisterServiceTest, UploadWhoseWorkerRestartedIsUnavailable) {
  class RestartedWorker : public EnclaveClient {
   public:
    explicit RestartedWorker(EnclaveClient* inner) : inner_(inner) {}
    void Call(boundary::v1::HostToEnclave call, Done done) override {
      if (call.has_load_model()) {
        done(SessionLostError());
        return;
      }
      inner_->Call(std::move(call), std::move(done));
    }
    uint64_t CallStream(boundary::v1::HostToEnclave call, OnFrame on_frame, Done done) override {
      return inner_->CallStream(std::move(call), std::move(on_frame), std::move(done));
    }
    void Cancel(uint64_t stream_id) override { inner_->Cancel(stream_id); }

   private:
    EnclaveClient* const inner_;
  };
  wrapped_enclave_ = std::make_unique<RestartedWorker>(enclave_.get());
  RestartService(ServiceOptions(), wrapped_enclave_.get());
  std::string session = OpenSession("acme");
  api::v1::UploadModelResponse response;
  grpc::Status status = Upload(session, kHandle, {"cipher", "text"}, response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_EQ(status.error_message(),
            "enclave worker 0 restarted during the upload; nothing was stored: re-attest and "
            "upload again");
  // The SDK decides by the reason in the status details, not by the words.
  EXPECT_EQ(proto::ReasonFromGrpcDetails(status.error_details()), api::v1::NOTHING_STORED);
  EXPECT_TRUE(ModelFiles("acme").empty());
}

}  // namespace
}  // namespace cloister::host
