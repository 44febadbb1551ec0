// In-process tests of the gRPC service: a real server on 127.0.0.1:0, the real scheduler and
// file blob store, and the FakeEnclave behind a FakeEnclaveClient.
#include "host/server/cloister_service.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "host/server/grpc_server.h"
#include "host/storage/file_blob_store.h"
#include "host/supervisor/worker_supervisor.h"
#include "host/testing/fake_enclave.h"
#include "host/testing/fake_enclave_client.h"

namespace cloister::host {
namespace {

namespace fs = std::filesystem;
using api::v1::Cloister;

constexpr char kHandle[] = "0123456789abcdef0123456789abcdef";
constexpr char kOtherHandle[] = "fedcba9876543210fedcba9876543210";
constexpr char kUnauthenticated[] = "unknown tenant or wrong API token";

struct UploadOptions {
  uint64_t declared_size = 0;  // 0: the real size
  bool send_start = true;
  bool send_finish = true;
  std::string finish_handle;  // empty: the same handle
};

class CloisterServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("service_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    auto registry = TenantRegistry::Create(
        {{"acme", TokenHash("acme-token")}, {"globex", TokenHash("globex-token")}});
    ASSERT_TRUE(registry.ok());
    registry_ = *std::move(registry);
    enclave_ =
        std::make_unique<testing::FakeEnclaveClient>(std::make_unique<testing::FakeEnclave>());
    auto blobs = FileBlobStore::Open((root_ / "models").string());
    ASSERT_TRUE(blobs.ok());
    blobs_ = *std::move(blobs);
    SchedulerOptions scheduler_options;
    scheduler_options.max_queue_delay = absl::Milliseconds(1);
    auto scheduler = Scheduler::Create(enclave_.get(), scheduler_options);
    ASSERT_TRUE(scheduler.ok());
    scheduler_ = *std::move(scheduler);
    ServiceOptions options;
    options.max_model_size = 1 << 20;
    service_ = std::make_unique<CloisterService>(registry_.get(), enclave_.get(), scheduler_.get(),
                                                 blobs_.get(), options);
    auto server = StartGrpcServer(service_.get(), "127.0.0.1:0", 8 << 20);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = Cloister::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_.port),
                                                  grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    server_.server->Shutdown();
    server_.server.reset();
    scheduler_->Stop();
    service_.reset();
    fs::remove_all(root_);
  }

  // Replaces the service (and its server) with one built from `options`, in front of
  // `worker` (nullptr: the fixture's enclave).
  void RestartService(ServiceOptions options, EnclaveClient* worker = nullptr) {
    server_.server->Shutdown();
    server_.server.reset();
    service_.reset();
    service_ = std::make_unique<CloisterService>(registry_.get(),
                                                 worker != nullptr ? worker : enclave_.get(),
                                                 scheduler_.get(), blobs_.get(), options);
    auto server = StartGrpcServer(service_.get(), "127.0.0.1:0", 8 << 20);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = Cloister::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_.port),
                                                  grpc::InsecureChannelCredentials()));
  }

  static void Authorize(grpc::ClientContext& context, const std::string& tenant,
                        const std::string& token) {
    context.AddMetadata("x-cloister-tenant", tenant);
    context.AddMetadata("authorization", "Bearer " + token);
  }
  static void AsAcme(grpc::ClientContext& context) { Authorize(context, "acme", "acme-token"); }

  // Opens a session for `tenant` (token "<tenant>-token").
  std::string OpenSession(const std::string& tenant) {
    grpc::ClientContext context;
    Authorize(context, tenant, tenant + "-token");
    api::v1::OpenSessionRequest request;
    request.set_hpke_enc(std::string(32, 'e'));
    request.set_sealed_hello("hello:" + tenant);
    request.set_evidence_digest(std::string(32, 'd'));
    api::v1::OpenSessionResponse response;
    grpc::Status status = stub_->OpenSession(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.session_id();
  }

  api::v1::SealedCall Sealed(const std::string& session, const std::string& request_id,
                             const std::string& handle, const std::string& ciphertext) {
    api::v1::SealedCall call;
    call.set_session_id(session);
    call.set_request_id(request_id);
    call.set_model_handle(handle);
    call.set_sequence(1);
    call.set_ciphertext(ciphertext);
    return call;
  }

  // Uploads `chunks` as one model; returns the RPC status and fills `response`.
  grpc::Status Upload(const std::string& session, const std::string& handle,
                      const std::vector<std::string>& chunks,
                      api::v1::UploadModelResponse& response, UploadOptions options = {}) {
    grpc::ClientContext context;
    AsAcme(context);
    auto writer = stub_->UploadModel(&context, &response);
    uint64_t size = 0;
    for (const std::string& chunk : chunks) size += chunk.size();
    api::v1::UploadModelRequest message;
    if (options.send_start) {
      auto* start = message.mutable_start();
      start->set_session_id(session);
      start->set_model_handle(handle);
      start->set_ciphertext_size(options.declared_size ? options.declared_size : size);
      writer->Write(message);
    }
    for (const std::string& chunk : chunks) {
      message.Clear();
      message.set_data(chunk);
      if (!writer->Write(message)) break;
    }
    if (options.send_finish) {
      message.Clear();
      *message.mutable_finish() =
          Sealed(session, "upload-1",
                 options.finish_handle.empty() ? handle : options.finish_handle, "load:model");
      writer->Write(message);
    }
    writer->WritesDone();
    return writer->Finish();
  }

  // Opens an upload stream as acme and sends its start for `declared_size` bytes of kHandle,
  // for tests that pace the rest themselves.
  std::unique_ptr<grpc::ClientWriter<api::v1::UploadModelRequest>> StartUpload(
      grpc::ClientContext& context, const std::string& session, uint64_t declared_size,
      api::v1::UploadModelResponse& response) {
    AsAcme(context);
    auto writer = stub_->UploadModel(&context, &response);
    api::v1::UploadModelRequest message;
    message.mutable_start()->set_session_id(session);
    message.mutable_start()->set_model_handle(kHandle);
    message.mutable_start()->set_ciphertext_size(declared_size);
    EXPECT_TRUE(writer->Write(message));
    return writer;
  }

  // Once the service is idle: acme has no stored model and the enclave was never asked to load
  // one.
  void ExpectNothingStoredOrLoaded() {
    ASSERT_TRUE(service_->WaitUntilIdle(absl::Seconds(10)));
    EXPECT_TRUE(ModelFiles("acme").empty());
    for (const auto& call : enclave_->History()) EXPECT_FALSE(call.has_load_model());
  }

  grpc::Status Infer(const api::v1::SealedCall& call, api::v1::SealedReply& reply,
                     const std::string& tenant = "acme") {
    grpc::ClientContext context;
    Authorize(context, tenant, tenant + "-token");
    return stub_->Infer(&context, call, &reply);
  }

  std::vector<std::string> ModelFiles(const std::string& tenant) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root_ / "models" / tenant, ec)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path root_;
  std::unique_ptr<TenantRegistry> registry_;
  std::unique_ptr<testing::FakeEnclaveClient> enclave_;
  std::unique_ptr<EnclaveClient> wrapped_enclave_;  // in front of enclave_, for some tests
  std::unique_ptr<FileBlobStore> blobs_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<CloisterService> service_;
  RunningServer server_;
  std::unique_ptr<Cloister::Stub> stub_;
};

TEST_F(CloisterServiceTest, EveryRpcNeedsTheRightTenantAndToken) {
  struct Credentials {
    const char* tenant;
    const char* authorization;
  };
  for (Credentials credentials :
       {Credentials{nullptr, nullptr}, Credentials{"acme", nullptr},
        Credentials{"acme", "Bearer wrong"}, Credentials{"acme", "acme-token"},  // no "Bearer "
        Credentials{"acme", "Bearer globex-token"}, Credentials{"nobody", "Bearer acme-token"}}) {
    auto setup = [&](grpc::ClientContext& context) {
      if (credentials.tenant) context.AddMetadata("x-cloister-tenant", credentials.tenant);
      if (credentials.authorization) {
        context.AddMetadata("authorization", credentials.authorization);
      }
    };
    std::vector<grpc::Status> statuses;
    {
      grpc::ClientContext context;
      setup(context);
      api::v1::GetEvidenceRequest request;
      request.set_nonce(std::string(32, 'n'));
      api::v1::GetEvidenceResponse response;
      statuses.push_back(stub_->GetEvidence(&context, request, &response));
    }
    {
      grpc::ClientContext context;
      setup(context);
      api::v1::OpenSessionResponse response;
      statuses.push_back(stub_->OpenSession(&context, api::v1::OpenSessionRequest(), &response));
    }
    {
      grpc::ClientContext context;
      setup(context);
      api::v1::UploadModelResponse response;
      auto writer = stub_->UploadModel(&context, &response);
      writer->WritesDone();
      statuses.push_back(writer->Finish());
    }
    for (int method = 0; method < 3; ++method) {
      grpc::ClientContext context;
      setup(context);
      api::v1::SealedReply reply;
      api::v1::SealedCall call = Sealed("s", "r", kHandle, "x");
      statuses.push_back(method == 0   ? stub_->ListModels(&context, call, &reply)
                         : method == 1 ? stub_->DeleteModel(&context, call, &reply)
                                       : stub_->Infer(&context, call, &reply));
    }
    for (const grpc::Status& status : statuses) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_EQ(status.error_message(), kUnauthenticated);
    }
  }
  EXPECT_TRUE(enclave_->History().empty());  // nothing reached the enclave

  // The scheme name is case-insensitive (RFC 6750); the token is not.
  grpc::ClientContext context;
  context.AddMetadata("x-cloister-tenant", "acme");
  context.AddMetadata("authorization", "bearer acme-token");
  api::v1::GetEvidenceRequest request;
  request.set_nonce(std::string(32, 'n'));
  api::v1::GetEvidenceResponse response;
  EXPECT_TRUE(stub_->GetEvidence(&context, request, &response).ok());
}

TEST_F(CloisterServiceTest, GetEvidence) {
  grpc::ClientContext context;
  AsAcme(context);
  api::v1::GetEvidenceRequest request;
  request.set_nonce(std::string(32, 'n'));
  request.set_fresh(true);
  api::v1::GetEvidenceResponse response;
  grpc::Status status = stub_->GetEvidence(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.challenge_response(), "evidence:" + std::string(32, 'n'));
  ASSERT_EQ(enclave_->History().size(), 1u);
  EXPECT_TRUE(enclave_->History()[0].get_evidence().fresh());

  grpc::ClientContext short_context;
  AsAcme(short_context);
  request.set_nonce("short");
  status = stub_->GetEvidence(&short_context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "nonce must be 32 bytes, got 5");
}

TEST_F(CloisterServiceTest, OpenSessionPassesTheAuthenticatedTenant) {
  std::string session = OpenSession("acme");
  EXPECT_EQ(session, "session-00000001");
  auto history = enclave_->History();
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].open_session().tenant_id(), "acme");

  // A hello sealed for another tenant: the enclave refuses, the status comes through.
  grpc::ClientContext context;
  AsAcme(context);
  api::v1::OpenSessionRequest request;
  request.set_hpke_enc(std::string(32, 'e'));
  request.set_sealed_hello("hello:globex");
  request.set_evidence_digest(std::string(32, 'd'));
  api::v1::OpenSessionResponse response;
  grpc::Status status = stub_->OpenSession(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(status.error_message(), "session hello is for another tenant");

  grpc::ClientContext bad_context;
  AsAcme(bad_context);
  request.set_hpke_enc("short");
  status = stub_->OpenSession(&bad_context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CloisterServiceTest, SealedCallsCheckShapeAndSessionOwner) {
  std::string acme_session = OpenSession("acme");
  std::string globex_session = OpenSession("globex");
  api::v1::SealedReply reply;

  grpc::Status status = Infer(Sealed("no-such-session", "r1", kHandle, "x"), reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "unknown session; open a new session");

  // Another tenant's session: the same answer as no session at all.
  status = Infer(Sealed(globex_session, "r1", kHandle, "x"), reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "unknown session; open a new session");

  status = Infer(Sealed(acme_session, "r1", "ABCDEF", "x"), reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  status = Infer(Sealed(acme_session, "r1", "", "x"), reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  status = Infer(Sealed(acme_session, "", kHandle, "x"), reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  status = Infer(Sealed(acme_session, std::string(129, 'r'), kHandle, "x"), reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  status = Infer(Sealed(acme_session, "r1", kHandle, ""), reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  api::v1::SealedCall negative = Sealed(acme_session, "r1", kHandle, "x");
  negative.set_deadline_ms(-1);
  status = Infer(negative, reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // Only the two OpenSession calls reached the enclave.
  EXPECT_EQ(enclave_->History().size(), 2u);
}

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
  api::v1::SealedCall call = Sealed(session, "infer-1", kHandle, "input");
  call.set_deadline_ms(10000);
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

TEST_F(CloisterServiceTest, ListAndDeleteModels) {
  std::string session = OpenSession("acme");
  api::v1::UploadModelResponse response;
  ASSERT_TRUE(Upload(session, kHandle, {"model"}, response).ok());

  api::v1::SealedReply reply;
  {
    grpc::ClientContext context;
    AsAcme(context);
    grpc::Status status =
        stub_->ListModels(&context, Sealed(session, "list-1", "", "list"), &reply);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(reply.ciphertext(), std::string("models:") + kHandle);
  }
  {
    grpc::ClientContext context;
    AsAcme(context);
    grpc::Status status =
        stub_->DeleteModel(&context, Sealed(session, "delete-1", kHandle, "delete"), &reply);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(reply.ciphertext(), std::string("deleted:") + kHandle);
  }
  // The stored ciphertext and wrapped key are gone once DeleteModel returns.
  EXPECT_TRUE(ModelFiles("acme").empty());
  {
    grpc::ClientContext context;
    AsAcme(context);
    grpc::Status status =
        stub_->DeleteModel(&context, Sealed(session, "delete-2", kHandle, "delete"), &reply);
    ASSERT_TRUE(status.ok());
    EXPECT_EQ(reply.ciphertext(), "error:no such model");
  }
}

TEST_F(CloisterServiceTest, ConcurrentInfersAreBatchedPerTenantAndModel) {
  std::string session = OpenSession("acme");
  api::v1::UploadModelResponse response;
  ASSERT_TRUE(Upload(session, kHandle, {"model"}, response).ok());
  const int kCount = 16;
  std::vector<std::thread> threads;
  std::vector<grpc::Status> statuses(kCount);
  std::vector<api::v1::SealedReply> replies(kCount);
  for (int i = 0; i < kCount; ++i) {
    threads.emplace_back([&, i] {
      statuses[i] =
          Infer(Sealed(session, absl::StrCat("r", i), kHandle, absl::StrCat("in", i)), replies[i]);
    });
  }
  for (auto& thread : threads) thread.join();
  int batches = 0;
  for (const auto& call : enclave_->History()) {
    if (!call.has_infer_batch()) continue;
    ++batches;
    EXPECT_LE(call.infer_batch().items_size(), 8);
  }
  for (int i = 0; i < kCount; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message();
    EXPECT_EQ(replies[i].ciphertext().rfind(absl::StrCat("out:in", i, ";batch="), 0), 0u);
  }
  EXPECT_GE(batches, 2);
  EXPECT_LE(batches, kCount);
}

TEST_F(CloisterServiceTest, DeadWorkerIsUnavailable) {
  std::string session = OpenSession("acme");
  enclave_->SetDead();
  api::v1::SealedReply reply;
  grpc::Status status = Infer(Sealed(session, "r1", kHandle, "x"), reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(status.error_message(), "enclave worker exited");
  api::v1::UploadModelResponse response;
  status = Upload(session, kHandle, {"model"}, response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(ModelFiles("acme").empty());
}

TEST_F(CloisterServiceTest, DrainRefusesNewCallsAndWaitsForRunningOnes) {
  std::string session = OpenSession("acme");
  api::v1::UploadModelResponse response;
  ASSERT_TRUE(Upload(session, kHandle, {"model"}, response).ok());
  // gRPC may still be finishing the upload; start from no active RPC.
  ASSERT_TRUE(service_->WaitUntilIdle(absl::Seconds(10)));
  grpc::Status slow_status;
  api::v1::SealedReply slow_reply;
  std::thread slow(
      [&] { slow_status = Infer(Sealed(session, "slow", kHandle, "sleep:300"), slow_reply); });
  for (int i = 0; i < 1000 && service_->active_rpcs() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(service_->active_rpcs(), 1);
  service_->BeginDrain();
  api::v1::SealedReply reply;
  grpc::Status refused = Infer(Sealed(session, "late", kHandle, "x"), reply);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(refused.error_message(), "cloisterd is shutting down");
  EXPECT_FALSE(service_->WaitUntilIdle(absl::Milliseconds(20)));
  EXPECT_TRUE(service_->WaitUntilIdle(absl::Seconds(10)));
  slow.join();
  ASSERT_TRUE(slow_status.ok()) << slow_status.error_message();
  EXPECT_EQ(slow_reply.ciphertext(), "out:sleep:300;batch=1");
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
        done(absl::FailedPreconditionError(kReattestMessage));
        return;
      }
      inner_->Call(std::move(call), std::move(done));
    }

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
  EXPECT_TRUE(ModelFiles("acme").empty());
}

// Two enclave workers, each with its own evidence, behind one service; acme has a small
// model-memory quota and one batch in flight per worker.
class MultiWorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("multi_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    auto registry = TenantRegistry::Create({{"acme", TokenHash("acme-token")}});
    ASSERT_TRUE(registry.ok());
    registry_ = *std::move(registry);
    for (int i = 0; i < 2; ++i) {
      workers_.push_back(std::make_unique<testing::FakeEnclaveClient>(
          std::make_unique<testing::FakeEnclave>(absl::StrCat("w", i), Digest(i))));
    }
    auto blobs = FileBlobStore::Open((root_ / "models").string());
    ASSERT_TRUE(blobs.ok());
    blobs_ = *std::move(blobs);
    SchedulerOptions scheduler_options;
    scheduler_options.max_queue_delay = absl::ZeroDuration();
    scheduler_options.max_batches_in_flight = 1;
    scheduler_options.tenant_limits["acme"].model_memory_quota = 100;
    auto scheduler = Scheduler::Create({workers_[0].get(), workers_[1].get()}, scheduler_options);
    ASSERT_TRUE(scheduler.ok());
    scheduler_ = *std::move(scheduler);
    service_ = std::make_unique<CloisterService>(
        registry_.get(), std::vector<EnclaveClient*>{workers_[0].get(), workers_[1].get()},
        scheduler_.get(), blobs_.get(), ServiceOptions());
    auto server = StartGrpcServer(service_.get(), "127.0.0.1:0", 8 << 20);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = Cloister::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_.port),
                                                  grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    server_.server->Shutdown();
    server_.server.reset();
    scheduler_->Stop();
    service_.reset();
    fs::remove_all(root_);
  }

  static std::string Digest(int worker) { return std::string(32, static_cast<char>('A' + worker)); }

  std::string OpenSessionOn(int worker) {
    grpc::ClientContext context;
    context.AddMetadata("x-cloister-tenant", "acme");
    context.AddMetadata("authorization", "Bearer acme-token");
    api::v1::OpenSessionRequest request;
    request.set_hpke_enc(std::string(32, 'e'));
    request.set_sealed_hello("hello:acme");
    request.set_evidence_digest(Digest(worker));
    api::v1::OpenSessionResponse response;
    grpc::Status status = stub_->OpenSession(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.session_id();
  }

  grpc::Status Upload(const std::string& session, const std::string& handle,
                      const std::string& ciphertext,
                      api::v1::UploadModelResponse* response_out = nullptr) {
    grpc::ClientContext context;
    context.AddMetadata("x-cloister-tenant", "acme");
    context.AddMetadata("authorization", "Bearer acme-token");
    api::v1::UploadModelResponse local_response;
    api::v1::UploadModelResponse& response = response_out ? *response_out : local_response;
    auto writer = stub_->UploadModel(&context, &response);
    api::v1::UploadModelRequest message;
    message.mutable_start()->set_session_id(session);
    message.mutable_start()->set_model_handle(handle);
    message.mutable_start()->set_ciphertext_size(ciphertext.size());
    writer->Write(message);
    message.Clear();
    message.set_data(ciphertext);
    writer->Write(message);
    message.Clear();
    auto* finish = message.mutable_finish();
    finish->set_session_id(session);
    finish->set_request_id("upload-1");
    finish->set_model_handle(handle);
    finish->set_sequence(1);
    finish->set_ciphertext("load:model");
    writer->Write(message);
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status Infer(const std::string& session, const std::string& request_id,
                     const std::string& input, api::v1::SealedReply& reply,
                     absl::Duration timeout = absl::Seconds(30)) {
    grpc::ClientContext context;
    context.AddMetadata("x-cloister-tenant", "acme");
    context.AddMetadata("authorization", "Bearer acme-token");
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    api::v1::SealedCall call;
    call.set_session_id(session);
    call.set_request_id(request_id);
    call.set_model_handle(kHandle);
    call.set_sequence(2);
    call.set_ciphertext(input);
    return stub_->Infer(&context, call, &reply);
  }

  static int CountCalls(const std::vector<boundary::v1::HostToEnclave>& history,
                        boundary::v1::HostToEnclave::CallCase call_case) {
    int count = 0;
    for (const auto& call : history) count += call.call_case() == call_case;
    return count;
  }

  fs::path root_;
  std::unique_ptr<TenantRegistry> registry_;
  std::vector<std::unique_ptr<testing::FakeEnclaveClient>> workers_;
  std::unique_ptr<FileBlobStore> blobs_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<CloisterService> service_;
  RunningServer server_;
  std::unique_ptr<Cloister::Stub> stub_;
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
    context.AddMetadata("x-cloister-tenant", "acme");
    context.AddMetadata("authorization", "Bearer acme-token");
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

// An upload holds its declared size against the quota from its start on. cloisterd sends its
// initial metadata once the start is accepted, so a client (here the test) can know when that
// is: a second upload that would not fit beside it is then refused, and fits once it ends.
TEST_F(MultiWorkerServiceTest, AnUploadHoldsItsDeclaredSizeFromTheMomentItsStartIsAccepted) {
  std::string session = OpenSessionOn(0);
  grpc::ClientContext context;
  context.AddMetadata("x-cloister-tenant", "acme");
  context.AddMetadata("authorization", "Bearer acme-token");
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
