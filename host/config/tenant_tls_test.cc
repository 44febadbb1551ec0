#include "host/config/tenant_tls.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

#include "base/file.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "host/testing/test_certificates.h"
#include "tests/support/temp_dir.h"

namespace cloister::host {
namespace {

namespace fs = std::filesystem;

TenantConfig TenantWith(const std::string& id, std::vector<std::string> identities) {
  TenantConfig tenant;
  tenant.tenant_id = id;
  tenant.token_sha256 = Bytes(32, 1);
  tenant.mtls_identities = std::move(identities);
  return tenant;
}

TEST(TenantIdentityCheckTest, BoundTenantsNeedOneOfTheirIdentities) {
  TenantIdentityCheck check(
      {TenantWith("acme", {"acme-client", "spiffe://x/acme"}), TenantWith("globex", {})});
  EXPECT_TRUE(check.Check("acme", {"acme-client"}).ok());
  EXPECT_TRUE(check.Check("acme", {"someone", "spiffe://x/acme"}).ok());
  absl::Status refused = check.Check("acme", {"globex-client"});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(refused.message().find("tenant acme"), absl::string_view::npos) << refused;
  EXPECT_FALSE(check.Check("acme", {}).ok());
  // Unbound tenants (and unknown ids: the service refuses those) pass this check.
  EXPECT_TRUE(check.Check("globex", {}).ok());
  EXPECT_TRUE(check.Check("nobody", {}).ok());

  check.Replace({TenantWith("acme", {"new-acme"})});
  EXPECT_FALSE(check.Check("acme", {"acme-client"}).ok());
  EXPECT_TRUE(check.Check("acme", {"new-acme"}).ok());
}

// A callback service that answers every method with an empty message, so the server has a
// service of cloisterd's kind (callback API) beside gRPC's health service.
class AnswerEverything : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { StartRead(&request_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        StartWriteAndFinish(&reply_, grpc::WriteOptions(), grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      grpc::ByteBuffer request_;
      grpc::ByteBuffer reply_;
    };
    return new Reactor;
  }
};

class TenantTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cloister::testing::MakeTempDir("tenant-tls");
    ASSERT_FALSE(dir_.empty());
    absl::StatusOr<testing::TestCertificates> made = testing::MakeTestCertificates(dir_);
    ASSERT_TRUE(made.ok()) << made.status();
    certs_ = *made;
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    fs::remove_all(dir_);
  }

  // A server with only gRPC's health service, on `credentials`; returns its port.
  int Serve(std::shared_ptr<grpc::ServerCredentials> credentials) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", credentials, &port);
    builder.RegisterCallbackGenericService(&generic_);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    return port;
  }

  // One health check as `tenant` over TLS trusting the test CA, with an optional client
  // certificate. Returns the gRPC status code.
  grpc::StatusCode HealthCheck(int port, const std::string& tenant, const std::string& cert_file,
                               const std::string& key_file, const std::string& ca_file = "") {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *ReadFile(ca_file.empty() ? certs_.ca_cert : ca_file, 1 << 20);
    if (!cert_file.empty()) {
      ssl.pem_cert_chain = *ReadFile(cert_file, 1 << 20);
      ssl.pem_private_key = *ReadFile(key_file, 1 << 20);
    }
    auto channel =
        grpc::CreateChannel("localhost:" + std::to_string(port), grpc::SslCredentials(ssl));
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!tenant.empty()) context.AddMetadata("x-cloister-tenant", tenant);
    grpc::Slice empty_message("", 0);  // an empty HealthCheckRequest: the whole server
    grpc::ByteBuffer request(&empty_message, 1);
    grpc::ByteBuffer response;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status result;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &response, [&](grpc::Status status) {
                     std::lock_guard<std::mutex> lock(mu);
                     result = status;
                     done = true;
                     cv.notify_all();
                   });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return result.error_code();
  }

  fs::path dir_;
  testing::TestCertificates certs_;
  AnswerEverything generic_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(TenantTlsTest, PlaintextWithoutTlsSection) {
  auto credentials = TenantPortCredentials(TlsConfig(), nullptr);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_NE(*credentials, nullptr);
}

TEST_F(TenantTlsTest, ServerTlsAcceptsClientsThatTrustTheCa) {
  TlsConfig tls{.cert_file = certs_.server_cert, .key_file = certs_.server_key};
  auto credentials = TenantPortCredentials(tls, nullptr);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  int port = Serve(*credentials);
  EXPECT_EQ(HealthCheck(port, "", "", ""), grpc::StatusCode::OK);
  // A client that trusts another CA refuses the server.
  EXPECT_EQ(HealthCheck(port, "", "", "", dir_ / "rogue-ca.crt"), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TenantTlsTest, MutualTlsBindsTenantsToTheirCertificates) {
  TlsConfig tls{.cert_file = certs_.server_cert,
                .key_file = certs_.server_key,
                .client_ca_file = certs_.ca_cert,
                .require_client_cert = false};
  auto identities = std::make_shared<TenantIdentityCheck>(std::vector<TenantConfig>{
      TenantWith("acme", {"spiffe://cloister.test/tenant/acme"}), TenantWith("globex", {})});
  auto credentials = TenantPortCredentials(tls, identities);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  int port = Serve(*credentials);
  // acme's own certificate (matched by its URI SAN).
  EXPECT_EQ(HealthCheck(port, "acme", certs_.client_cert, certs_.client_key), grpc::StatusCode::OK);
  // Another tenant's certificate, or none, cannot act for acme.
  EXPECT_EQ(HealthCheck(port, "acme", certs_.other_client_cert, certs_.other_client_key),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(HealthCheck(port, "acme", "", ""), grpc::StatusCode::UNAUTHENTICATED);
  // globex has no identities bound: certificates are optional for it.
  EXPECT_EQ(HealthCheck(port, "globex", "", ""), grpc::StatusCode::OK);
  // A certificate with acme's name from another CA does not even get a connection.
  EXPECT_EQ(HealthCheck(port, "acme", certs_.rogue_client_cert, certs_.rogue_client_key),
            grpc::StatusCode::UNAVAILABLE);
  // Reloaded identities apply to the next call.
  identities->Replace({TenantWith("acme", {"acme-client"})});  // the CN this time
  EXPECT_EQ(HealthCheck(port, "acme", certs_.client_cert, certs_.client_key), grpc::StatusCode::OK);
  identities->Replace({TenantWith("acme", {"globex-client"})});
  EXPECT_EQ(HealthCheck(port, "acme", certs_.client_cert, certs_.client_key),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(TenantTlsTest, RequiredClientCertificatesRefuseBareClients) {
  TlsConfig tls{.cert_file = certs_.server_cert,
                .key_file = certs_.server_key,
                .client_ca_file = certs_.ca_cert,
                .require_client_cert = true};
  auto credentials = TenantPortCredentials(tls, nullptr);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  int port = Serve(*credentials);
  EXPECT_EQ(HealthCheck(port, "globex", certs_.other_client_cert, certs_.other_client_key),
            grpc::StatusCode::OK);
  EXPECT_EQ(HealthCheck(port, "globex", "", ""), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TenantTlsTest, BadFilesNameTheField) {
  TlsConfig tls{.cert_file = (dir_ / "missing.crt").string(), .key_file = certs_.server_key};
  auto credentials = TenantPortCredentials(tls, nullptr);
  ASSERT_FALSE(credentials.ok());
  EXPECT_NE(credentials.status().message().find("tls.cert_file"), absl::string_view::npos)
      << credentials.status();
  // A certificate where the key should be.
  tls = {.cert_file = certs_.server_cert, .key_file = certs_.server_cert};
  credentials = TenantPortCredentials(tls, nullptr);
  ASSERT_FALSE(credentials.ok());
  EXPECT_NE(credentials.status().message().find("tls.key_file"), absl::string_view::npos)
      << credentials.status();
  EXPECT_NE(credentials.status().message().find("PRIVATE KEY"), absl::string_view::npos);
  tls = {.cert_file = certs_.server_cert,
         .key_file = certs_.server_key,
         .client_ca_file = certs_.server_key};
  credentials = TenantPortCredentials(tls, nullptr);
  ASSERT_FALSE(credentials.ok());
  EXPECT_NE(credentials.status().message().find("tls.client_ca_file"), absl::string_view::npos)
      << credentials.status();
}

}  // namespace
}  // namespace cloister::host
