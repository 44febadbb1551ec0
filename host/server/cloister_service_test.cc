// In-process tests of the gRPC service (host/server/service_test_harness.h): authentication,
// evidence, sessions, the checks on sealed calls, listing and deleting models, batching and
// draining. The upload tests are in upload_reactor_test.cc, those with several workers in
// multi_worker_service_test.cc.
#include "host/server/cloister_service.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "host/server/service_test_harness.h"

namespace cloister::host {
namespace {

using testing::CloisterServiceTest;
using testing::kHandle;
using testing::kUnauthenticated;

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
      api::v1::SealedRequest call = Sealed("s", "r", kHandle, "x");
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
  AsTenant(context);
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
  AsTenant(short_context);
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
  AsTenant(context);
  api::v1::OpenSessionRequest request;
  request.set_hpke_enc(std::string(32, 'e'));
  request.set_sealed_hello("hello:globex");
  request.set_evidence_digest(std::string(32, 'd'));
  api::v1::OpenSessionResponse response;
  grpc::Status status = stub_->OpenSession(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(status.error_message(), "session hello is for another tenant");

  grpc::ClientContext bad_context;
  AsTenant(bad_context);
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
  api::v1::SealedRequest negative = Sealed(acme_session, "r1", kHandle, "x");
  negative.mutable_deadline()->set_nanos(-1);
  status = Infer(negative, reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "deadline is negative");

  // Only the two OpenSession calls reached the enclave.
  EXPECT_EQ(enclave_->History().size(), 2u);
}

TEST_F(CloisterServiceTest, ListAndDeleteModels) {
  std::string session = OpenSession("acme");
  api::v1::UploadModelResponse response;
  ASSERT_TRUE(Upload(session, kHandle, {"model"}, response).ok());

  api::v1::SealedReply reply;
  {
    grpc::ClientContext context;
    AsTenant(context);
    grpc::Status status =
        stub_->ListModels(&context, Sealed(session, "list-1", "", "list"), &reply);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(reply.ciphertext(), std::string("models:") + kHandle);
  }
  {
    grpc::ClientContext context;
    AsTenant(context);
    grpc::Status status =
        stub_->DeleteModel(&context, Sealed(session, "delete-1", kHandle, "delete"), &reply);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(reply.ciphertext(), std::string("deleted:") + kHandle);
  }
  // The stored ciphertext and wrapped key are gone once DeleteModel returns.
  EXPECT_TRUE(ModelFiles("acme").empty());
  {
    grpc::ClientContext context;
    AsTenant(context);
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

}  // namespace
}  // namespace cloister::host
