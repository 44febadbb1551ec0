#include "host/server/service_test_harness.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "host/testing/fake_enclave.h"
#include "tests/support/temp_dir.h"

namespace cloister::host::testing {

namespace fs = std::filesystem;

void ServiceTest::SetUp() {
  root_ = fs::path(cloister::testing::MakeTempDir("service-test")) / "root";
  auto registry = TenantRegistry::Create(
      {{"acme", TokenHash("acme-token")}, {"globex", TokenHash("globex-token")}});
  ASSERT_TRUE(registry.ok()) << registry.status();
  registry_ = *std::move(registry);
}

void ServiceTest::TearDown() {
  if (server_.server != nullptr) {
    server_.server->Shutdown();
    server_.server.reset();
  }
  if (scheduler_ != nullptr) scheduler_->Stop();
  service_.reset();
  // Before the tests' own members (their enclave clients) go.
  scheduler_.reset();
  fs::remove_all(root_);
}

void ServiceTest::StartService(std::vector<EnclaveClient*> workers,
                               SchedulerOptions scheduler_options, ServiceOptions options,
                               InterceptorFactories interceptors,
                               std::vector<EnclaveClient*> service_workers) {
  auto blobs = FileBlobStore::Open((root_ / "models").string());
  ASSERT_TRUE(blobs.ok()) << blobs.status();
  blobs_ = *std::move(blobs);
  auto scheduler = Scheduler::Create(workers, scheduler_options);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  scheduler_ = *std::move(scheduler);
  service_workers_ = service_workers.empty() ? workers : std::move(service_workers);
  service_ = std::make_unique<CloisterService>(registry_.get(), service_workers_, scheduler_.get(),
                                               blobs_.get(), std::move(options));
  Serve(std::move(interceptors));
}

void ServiceTest::RestartService(ServiceOptions options, std::vector<EnclaveClient*> workers) {
  server_.server->Shutdown();
  server_.server.reset();
  service_.reset();
  if (!workers.empty()) service_workers_ = std::move(workers);
  service_ = std::make_unique<CloisterService>(registry_.get(), service_workers_, scheduler_.get(),
                                               blobs_.get(), std::move(options));
  Serve({});
}

void ServiceTest::Serve(InterceptorFactories interceptors) {
  auto server =
      StartGrpcServer(service_.get(), "127.0.0.1:0", 8 << 20, nullptr, std::move(interceptors));
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  stub_ = api::v1::Cloister::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_.port),
                                                         grpc::InsecureChannelCredentials()));
}

void ServiceTest::Authorize(grpc::ClientContext& context, const std::string& tenant,
                            const std::string& token) {
  context.AddMetadata("x-cloister-tenant", tenant);
  context.AddMetadata("authorization", "Bearer " + token);
}

void ServiceTest::AsTenant(grpc::ClientContext& context, const std::string& tenant) {
  Authorize(context, tenant, tenant + "-token");
}

grpc::Status ServiceTest::TryOpenSession(const std::string& tenant, const std::string& token,
                                         std::string* session_id,
                                         const std::string& evidence_digest) {
  grpc::ClientContext context;
  Authorize(context, tenant, token);
  api::v1::OpenSessionRequest request;
  request.set_hpke_enc(std::string(32, 'e'));
  request.set_sealed_hello("hello:" + tenant);
  request.set_evidence_digest(evidence_digest);
  api::v1::OpenSessionResponse response;
  grpc::Status status = stub_->OpenSession(&context, request, &response);
  if (session_id != nullptr) *session_id = response.session_id();
  return status;
}

std::string ServiceTest::OpenSession(const std::string& tenant,
                                     const std::string& evidence_digest) {
  std::string session;
  grpc::Status status = TryOpenSession(tenant, tenant + "-token", &session, evidence_digest);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return session;
}

api::v1::SealedRequest ServiceTest::Sealed(const std::string& session, const std::string& request_id,
                                        const std::string& handle, const std::string& ciphertext,
                                        uint64_t sequence) {
  api::v1::SealedRequest call;
  call.set_session_id(session);
  call.set_request_id(request_id);
  call.set_model_handle(handle);
  call.set_sequence(sequence);
  call.set_ciphertext(ciphertext);
  return call;
}

grpc::Status ServiceTest::Upload(const std::string& session, const std::string& handle,
                                 const std::vector<std::string>& chunks,
                                 api::v1::UploadModelResponse& response, UploadOptions options) {
  grpc::ClientContext context;
  AsTenant(context);
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
        Sealed(session, "upload-1", options.finish_handle.empty() ? handle : options.finish_handle,
               "load:model");
    writer->Write(message);
  }
  writer->WritesDone();
  return writer->Finish();
}

grpc::Status ServiceTest::Upload(const std::string& session, const std::string& handle,
                                 const std::string& ciphertext,
                                 api::v1::UploadModelResponse* response) {
  api::v1::UploadModelResponse local_response;
  return Upload(session, handle, std::vector<std::string>{ciphertext},
                response != nullptr ? *response : local_response);
}

std::unique_ptr<grpc::ClientWriter<api::v1::UploadModelRequest>> ServiceTest::StartUpload(
    grpc::ClientContext& context, const std::string& session, uint64_t declared_size,
    api::v1::UploadModelResponse& response) {
  AsTenant(context);
  auto writer = stub_->UploadModel(&context, &response);
  api::v1::UploadModelRequest message;
  message.mutable_start()->set_session_id(session);
  message.mutable_start()->set_model_handle(kHandle);
  message.mutable_start()->set_ciphertext_size(declared_size);
  EXPECT_TRUE(writer->Write(message));
  return writer;
}

grpc::Status ServiceTest::Infer(const api::v1::SealedRequest& call, api::v1::SealedReply& reply,
                                const std::string& tenant, absl::Duration timeout) {
  grpc::ClientContext context;
  AsTenant(context, tenant);
  if (timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  return stub_->Infer(&context, call, &reply);
}

std::vector<std::string> ServiceTest::ModelFiles(const std::string& tenant) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_ / "models" / tenant, ec)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

void CloisterServiceTest::SetUp() {
  ServiceTest::SetUp();
  if (HasFatalFailure()) return;
  enclave_ = std::make_unique<FakeEnclaveClient>(std::make_unique<FakeEnclave>());
  SchedulerOptions scheduler_options;
  scheduler_options.max_queue_delay = absl::Milliseconds(1);
  ServiceOptions options;
  options.max_model_size = 1 << 20;
  StartService({enclave_.get()}, scheduler_options, options);
}

void CloisterServiceTest::RestartService(ServiceOptions options, EnclaveClient* worker) {
  ServiceTest::RestartService(std::move(options), {worker != nullptr ? worker : enclave_.get()});
}

void CloisterServiceTest::ExpectNothingStoredOrLoaded() {
  ASSERT_TRUE(service_->WaitUntilIdle(absl::Seconds(10)));
  EXPECT_TRUE(ModelFiles("acme").empty());
  for (const auto& call : enclave_->History()) EXPECT_FALSE(call.has_load_model());
}

}  // namespace cloister::host::testing
