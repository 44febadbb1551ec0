// In-process tests of the operator side: the tenant API (host/server/service_test_harness.h)
// with its metrics interceptor and audit log, and the operator gRPC service, each on
// 127.0.0.1:0, with the real scheduler and blob store and the FakeEnclave.
#include "host/operator/operator_service.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "cloister/ops/v1/ops.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "host/server/service_test_harness.h"
#include "host/testing/fake_enclave.h"
#include "host/testing/fake_enclave_client.h"

namespace cloister::host {
namespace {

class OperatorServiceTest : public testing::ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    if (HasFatalFailure()) return;
    enclave_ =
        std::make_unique<testing::FakeEnclaveClient>(std::make_unique<testing::FakeEnclave>());
    auto audit = AuditLog::Open((root_ / "audit" / "audit.jsonl").string());
    ASSERT_TRUE(audit.ok()) << audit.status();
    audit_ = *std::move(audit);
    evidence_ = std::make_unique<EvidenceTracker>(1, audit_.get());
    SchedulerOptions scheduler_options;
    scheduler_options.max_queue_delay = absl::Milliseconds(1);
    scheduler_options.tenant_limits["acme"].priority = PriorityClass::kRealtime;
    metrics_.SetTenantClasses({{"acme", "realtime"}, {"globex", "standard"}});
    ServiceOptions options;
    options.audit = audit_.get();
    InterceptorFactories counting;
    counting.push_back(NewRequestMetricsInterceptorFactory(&metrics_));
    StartService({enclave_.get()}, scheduler_options, options, std::move(counting));
  }

  // The operator service with `reload` as its reload entry point (empty: none).
  void StartOperator(std::function<absl::StatusOr<std::string>()> reload) {
    OperatorSources sources;
    sources.scheduler = scheduler_.get();
    sources.service = service_.get();
    sources.blobs = blobs_.get();
    sources.evidence = evidence_.get();
    sources.audit = audit_.get();
    sources.worker_kinds = {{"sim", "sim"}};
    sources.tenant_ids = [] { return std::vector<std::string>{"acme", "globex"}; };
    sources.reload = std::move(reload);
    operator_service_ = std::make_unique<OperatorService>(std::move(sources));
    auto running = StartOperatorServer(operator_service_.get(), "127.0.0.1:0");
    ASSERT_TRUE(running.ok()) << running.status();
    operator_server_ = std::move(running->server);
    operator_stub_ = ops::v1::Operator::NewStub(
        grpc::CreateChannel(running->address, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (operator_server_) operator_server_->Shutdown();
    operator_server_.reset();
    operator_service_.reset();
    ServiceTest::TearDown();
  }

  std::string AuditText() {
    absl::StatusOr<std::string> text = ReadFile(audit_->path());
    return text.ok() ? *text : "";
  }

  std::unique_ptr<testing::FakeEnclaveClient> enclave_;
  std::unique_ptr<AuditLog> audit_;
  std::unique_ptr<EvidenceTracker> evidence_;
  Metrics metrics_;
  std::unique_ptr<OperatorService> operator_service_;
  std::unique_ptr<grpc::Server> operator_server_;
  std::unique_ptr<ops::v1::Operator::Stub> operator_stub_;
};

TEST_F(OperatorServiceTest, StatusCountsSessionsPerTenantAndNamesTheWorkers) {
  StartOperator(nullptr);
  ASSERT_TRUE(TryOpenSession("acme", "acme-token").ok());
  ASSERT_TRUE(TryOpenSession("acme", "acme-token").ok());
  ASSERT_TRUE(TryOpenSession("globex", "globex-token").ok());

  grpc::ClientContext context;
  ops::v1::StatusResponse status;
  ASSERT_TRUE(operator_stub_->Status(&context, ops::v1::StatusRequest(), &status).ok());
  ASSERT_EQ(status.workers_size(), 1);
  EXPECT_EQ(status.workers(0).tee(), "sim");
  EXPECT_EQ(status.workers(0).evidence_age_seconds(), -1);  // the fake shows no real evidence
  EXPECT_EQ(status.sessions(), 3);
  ASSERT_EQ(status.tenants_size(), 2);
  EXPECT_EQ(status.tenants(0).id(), "acme");
  EXPECT_EQ(status.tenants(0).priority(), "realtime");
  EXPECT_EQ(status.tenants(0).sessions(), 2);
  EXPECT_EQ(status.tenants(1).id(), "globex");
  EXPECT_EQ(status.tenants(1).sessions(), 1);
  EXPECT_EQ(status.audit_entries(), audit_->entry_count());
  EXPECT_EQ(status.audit_log_path(), audit_->path());

  GaugeSnapshot gauges = operator_service_->Gauges();
  ASSERT_EQ(gauges.tenants.size(), 2u);
  EXPECT_EQ(gauges.tenants[0].sessions, 2);
  ASSERT_EQ(gauges.workers.size(), 1u);
}

TEST_F(OperatorServiceTest, ReloadIsUnimplementedWithoutAnEntryPoint) {
  StartOperator(nullptr);
  grpc::ClientContext context;
  ops::v1::ReloadResponse response;
  grpc::Status status = operator_stub_->Reload(&context, ops::v1::ReloadRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "no reload entry point"));
}

TEST_F(OperatorServiceTest, ReloadAnswersWithTheSummaryOrTheError) {
  int calls = 0;
  StartOperator([&calls]() -> absl::StatusOr<std::string> {
    if (++calls == 1) return std::string("reloaded cloisterd.yaml: 2 tenants");
    return absl::InvalidArgumentError("cloisterd.yaml:3: tenants[0].id: missing");
  });
  {
    grpc::ClientContext context;
    ops::v1::ReloadResponse response;
    ASSERT_TRUE(operator_stub_->Reload(&context, ops::v1::ReloadRequest(), &response).ok());
    EXPECT_EQ(response.summary(), "reloaded cloisterd.yaml: 2 tenants");
  }
  grpc::ClientContext context;
  ops::v1::ReloadResponse response;
  grpc::Status status = operator_stub_->Reload(&context, ops::v1::ReloadRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "cloisterd.yaml:3: tenants[0].id: missing");
}

TEST_F(OperatorServiceTest, AuditAndMetricsSeeSessionsAndRefusals) {
  std::string session;
  ASSERT_TRUE(TryOpenSession("acme", "acme-token", &session).ok());
  EXPECT_EQ(TryOpenSession("acme", "wrong-token").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(TryOpenSession("nobody", "x").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  {
    // globex names acme's session: refused before anything is queued, and audited.
    api::v1::SealedReply reply;
    // Answered as an unknown session would be, so nothing tells globex the session exists.
    EXPECT_EQ(Infer(Sealed(session, "r1", testing::kHandle, "c"), reply, "globex").error_code(),
              grpc::StatusCode::NOT_FOUND);
  }

  std::string audit = AuditText();
  EXPECT_TRUE(absl::StrContains(audit, "\"event\":\"session_opened\"")) << audit;
  EXPECT_TRUE(absl::StrContains(audit, "\"claimed_tenant\":\"nobody\"")) << audit;
  EXPECT_TRUE(absl::StrContains(audit, "\"reason\":\"another tenant's session\"")) << audit;
  EXPECT_TRUE(VerifyAuditLog(audit_->path()).ok());

  // The interceptor runs when the status is sent; the client may see it first.
  std::string text;
  for (int i = 0; i < 100; ++i) {
    text = metrics_.Text();
    if (absl::StrContains(text, "method=\"Infer\"")) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(absl::StrContains(text,
                                "cloister_requests_total{method=\"OpenSession\","
                                "priority=\"realtime\",tenant=\"acme\"} 1"))
      << text;
  EXPECT_TRUE(absl::StrContains(text,
                                "cloister_request_errors_total{code=\"UNAUTHENTICATED\","
                                "method=\"OpenSession\",priority=\"-\",tenant=\"-\"} 2"))
      << text;
  EXPECT_TRUE(absl::StrContains(text,
                                "cloister_request_errors_total{code=\"NOT_FOUND\","
                                "method=\"Infer\",priority=\"standard\",tenant=\"globex\"} 1"))
      << text;
  EXPECT_FALSE(absl::StrContains(text, "nobody")) << text;
}

}  // namespace
}  // namespace cloister::host
