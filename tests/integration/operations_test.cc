// The operator's side of cloisterd as a process: config reload by SIGHUP while requests are in
// flight, a refused bad reload, and TLS (and mutual TLS) on the tenant port with certificates
// made for the test. The fast cases use the fake enclave worker from host/testing; the last one
// runs the real cloister-enclave and the `cloister` CLI with --ca.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/bytes.h"
#include "base/file.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "host/tenants/tenant_registry.h"
#include "host/testing/test_certificates.h"
#include "tests/support/process.h"

namespace cloister {
namespace {

namespace fs = std::filesystem;
using api::v1::Cloister;

constexpr char kHandle[] = "0123456789abcdef0123456789abcdef";

// The token hash the config holds, computed as cloisterd does.
std::string HashOf(const std::string& token) { return HexEncode(host::TokenHash(token)); }

std::string TenantYaml(const std::string& id, const std::string& token,
                       const std::string& extra = "") {
  return absl::StrCat("  - id: ", id, "\n    token_sha256: ", HashOf(token), "\n", extra);
}

// A client of the tenant API for one tenant.
class TenantClient {
 public:
  TenantClient(std::shared_ptr<grpc::Channel> channel, std::string tenant, std::string token)
      : stub_(Cloister::NewStub(std::move(channel))),
        tenant_(std::move(tenant)),
        token_(std::move(token)) {}

  void Authorize(grpc::ClientContext& context) const {
    context.AddMetadata("x-cloister-tenant", tenant_);
    // No token: a tenant bound to client certificates is admitted by its certificate alone.
    if (!token_.empty()) context.AddMetadata("authorization", "Bearer " + token_);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }

  grpc::Status GetEvidence() {
    grpc::ClientContext context;
    Authorize(context);
    api::v1::GetEvidenceRequest request;
    request.set_nonce(std::string(32, 'n'));
    api::v1::GetEvidenceResponse response;
    return stub_->GetEvidence(&context, request, &response);
  }

  // Opens a session and uploads a model with the fake worker's conventions.
  std::string OpenSessionWithModel() {
    grpc::ClientContext context;
    Authorize(context);
    api::v1::OpenSessionRequest request;
    request.set_hpke_enc(std::string(32, 'e'));
    request.set_sealed_hello("hello:" + tenant_);
    request.set_evidence_digest(std::string(32, 'd'));
    api::v1::OpenSessionResponse response;
    grpc::Status status = stub_->OpenSession(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    grpc::ClientContext upload_context;
    Authorize(upload_context);
    api::v1::UploadModelResponse upload_response;
    auto writer = stub_->UploadModel(&upload_context, &upload_response);
    api::v1::UploadModelRequest message;
    message.mutable_start()->set_session_id(response.session_id());
    message.mutable_start()->set_model_handle(kHandle);
    message.mutable_start()->set_ciphertext_size(5);
    writer->Write(message);
    message.Clear();
    message.set_data("model");
    writer->Write(message);
    message.Clear();
    message.mutable_finish()->set_session_id(response.session_id());
    message.mutable_finish()->set_request_id("upload");
    message.mutable_finish()->set_model_handle(kHandle);
    message.mutable_finish()->set_ciphertext("load:model");
    writer->Write(message);
    writer->WritesDone();
    status = writer->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.session_id();
  }

  grpc::Status Infer(const std::string& session, const std::string& request_id) {
    grpc::ClientContext context;
    Authorize(context);
    api::v1::SealedRequest call;
    call.set_session_id(session);
    call.set_request_id(request_id);
    call.set_model_handle(kHandle);
    call.set_sequence(1);
    call.set_ciphertext(request_id);
    api::v1::SealedReply reply;
    grpc::Status status = stub_->Infer(&context, call, &reply);
    if (status.ok() && !absl::StartsWith(reply.ciphertext(), "out:" + request_id)) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "wrong reply " + reply.ciphertext());
    }
    return status;
  }

 private:
  std::unique_ptr<Cloister::Stub> stub_;
  std::string tenant_;
  std::string token_;
};

class OperationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("operations");
    config_path_ = dir_ + "/cloisterd.yaml";
  }
  void TearDown() override {
    if (daemon_ != nullptr) daemon_->Stop(SIGTERM);
    fs::remove_all(dir_);
  }

  // `text` with free operator and metrics ports after it (so the line numbers stay).
  void WriteConfig(const std::string& text) {
    // Written beside and renamed over, as an operator's editor or config management would.
    ASSERT_TRUE(
        WriteFileAtomic(config_path_, text + "operator:\n  listen: 127.0.0.1:0\n", 0600).ok());
  }

  // Starts cloisterd on the config file; returns its port (0 on failure).
  int Start(const std::string& enclave_binary = FAKE_ENCLAVE_WORKER) {
    daemon_ = std::make_unique<testing::Process>(
        std::vector<std::string>{CLOISTERD_BINARY, "--config", config_path_, "--listen",
                                 "127.0.0.1:0", "--data-dir", dir_ + "/data", "--enclave-binary",
                                 enclave_binary},
        dir_);
    std::string line = daemon_->WaitForStdout("cloisterd listening on", absl::Seconds(120));
    int port = 0;
    size_t colon = line.rfind(':');
    if (colon == std::string::npos || !absl::SimpleAtoi(line.substr(colon + 1), &port)) {
      ADD_FAILURE() << "cloisterd did not start: " << daemon_->Stderr();
      return 0;
    }
    return port;
  }

  // Waits until the log has `count` lines with `event`.
  bool WaitForLog(const std::string& event, int count = 1) {
    absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (absl::Now() < give_up) {
      std::string log = daemon_->Stderr();
      int seen = 0;
      for (size_t at = log.find("\"event\":\"" + event + "\""); at != std::string::npos;
           at = log.find("\"event\":\"" + event + "\"", at + 1)) {
        ++seen;
      }
      if (seen >= count) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  std::shared_ptr<grpc::Channel> Plaintext(int port) {
    return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                               grpc::InsecureChannelCredentials());
  }
  std::shared_ptr<grpc::Channel> Tls(int port, const host::testing::TestCertificates& certs,
                                     bool with_client_cert) {
    return with_client_cert ? TlsAs(port, certs, certs.client_cert, certs.client_key)
                            : TlsAs(port, certs, "", "");
  }
  // TLS presenting the client certificate `cert_file` (none when empty).
  std::shared_ptr<grpc::Channel> TlsAs(int port, const host::testing::TestCertificates& certs,
                                       const std::string& cert_file, const std::string& key_file) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *ReadFile(certs.ca_cert, 1 << 20);
    if (!cert_file.empty()) {
      ssl.pem_cert_chain = *ReadFile(cert_file, 1 << 20);
      ssl.pem_private_key = *ReadFile(key_file, 1 << 20);
    }
    return grpc::CreateChannel(absl::StrCat("localhost:", port), grpc::SslCredentials(ssl));
  }

  std::string dir_;
  std::string config_path_;
  std::unique_ptr<testing::Process> daemon_;
};

TEST_F(OperationsTest, ReloadUnderLoadLosesNoRequest) {
  WriteConfig(absl::StrCat("workers: 2\ntenants:\n", TenantYaml("acme", "acme-token")));
  int port = Start();
  ASSERT_NE(port, 0);

  // Four clients keep inference requests in flight through every reload below.
  constexpr int kClients = 4;
  std::atomic<bool> stop{false};
  std::atomic<int> completed{0};
  std::vector<std::string> failures(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      TenantClient acme(Plaintext(port), "acme", "acme-token");
      std::string session = acme.OpenSessionWithModel();
      for (int n = 0; !stop.load(); ++n) {
        grpc::Status status = acme.Infer(session, absl::StrCat("c", i, "-", n));
        if (!status.ok() && failures[i].empty()) {
          failures[i] = absl::StrCat(status.error_code(), " ", status.error_message());
        }
        completed.fetch_add(1);
      }
    });
  }
  auto wait_for_progress = [&](int more) {
    int target = completed.load() + more;
    absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (completed.load() < target && absl::Now() < give_up)
      absl::SleepFor(absl::Milliseconds(5));
  };
  wait_for_progress(50);

  // A good reload: globex arrives, acme's limits stay.
  TenantClient globex(Plaintext(port), "globex", "globex-token");
  EXPECT_EQ(globex.GetEvidence().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  WriteConfig(absl::StrCat("workers: 2\ntenants:\n", TenantYaml("acme", "acme-token"),
                           TenantYaml("globex", "globex-token")));
  ::kill(daemon_->pid(), SIGHUP);
  ASSERT_TRUE(WaitForLog("config_reloaded")) << daemon_->Stderr();
  EXPECT_TRUE(globex.GetEvidence().ok());
  wait_for_progress(50);

  // A bad reload: refused, said so in the log, and the running tenants stay.
  WriteConfig(absl::StrCat("workers: 2\ntenants:\n", TenantYaml("acme", "acme-token"),
                           "  - id: globex\n    priority: urgent\n"));
  ::kill(daemon_->pid(), SIGHUP);
  ASSERT_TRUE(WaitForLog("config_reload_refused")) << daemon_->Stderr();
  std::string log = daemon_->Stderr();
  EXPECT_TRUE(absl::StrContains(log, config_path_ + ":6: tenants[1].priority")) << log;
  EXPECT_TRUE(globex.GetEvidence().ok());
  wait_for_progress(50);

  // Many reloads back to back while requests run.
  for (int round = 0; round < 10; ++round) {
    WriteConfig(absl::StrCat("workers: 2\ntenants:\n", TenantYaml("acme", "acme-token"),
                             round % 2 == 0 ? "" : TenantYaml("globex", "globex-token")));
    ::kill(daemon_->pid(), SIGHUP);
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(WaitForLog("config_reloaded", 11)) << daemon_->Stderr();
  wait_for_progress(50);
  stop.store(true);
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(failures[i], "") << "client " << i;
  EXPECT_GT(completed.load(), 200);
  // The last file listed globex (round 9).
  EXPECT_TRUE(globex.GetEvidence().ok());
  // The tokens never reach the log.
  log = daemon_->Stderr();
  EXPECT_FALSE(absl::StrContains(log, "acme-token"));
  EXPECT_FALSE(absl::StrContains(log, "globex-token"));
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0);
  daemon_.reset();
}

TEST_F(OperationsTest, ReloadNeedsRestartForListenAndSaysSo) {
  WriteConfig(absl::StrCat("scheduler:\n  max_batch_size: 8\ntenants:\n", TenantYaml("acme", "a")));
  ASSERT_NE(Start(), 0);
  WriteConfig(absl::StrCat("scheduler:\n  max_batch_size: 4\ntenants:\n", TenantYaml("acme", "a")));
  ::kill(daemon_->pid(), SIGHUP);
  ASSERT_TRUE(WaitForLog("config_reload_needs_restart")) << daemon_->Stderr();
  EXPECT_TRUE(absl::StrContains(daemon_->Stderr(), "scheduler.max_batch_size"));
}

TEST_F(OperationsTest, TlsTenantPortWithClientIdentities) {
  std::string pki = dir_ + "/pki";
  fs::create_directories(pki);
  auto certs = host::testing::MakeTestCertificates(pki);
  ASSERT_TRUE(certs.ok()) << certs.status();
  WriteConfig(
      absl::StrCat("tls:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n",
                   "  client_ca_file: pki/ca.crt\n", "tenants:\n",
                   TenantYaml("acme", "acme-token",
                              "    mtls_identities: [spiffe://cloister.test/tenant/acme]\n"),
                   TenantYaml("globex", "globex-token")));
  ASSERT_EQ(testing::Run({CLOISTERD_BINARY, "--check-config", config_path_}).exit_code, 0);
  int port = Start();
  ASSERT_NE(port, 0);
  EXPECT_TRUE(absl::StrContains(daemon_->Stderr(), "\"tls\":\"on\""));

  // Plaintext clients get no connection.
  EXPECT_EQ(TenantClient(Plaintext(port), "globex", "globex-token").GetEvidence().error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // TLS without a client certificate: fine for globex, not for acme.
  EXPECT_TRUE(TenantClient(Tls(port, *certs, false), "globex", "globex-token").GetEvidence().ok());
  grpc::Status refused = TenantClient(Tls(port, *certs, false), "acme", "acme-token").GetEvidence();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // acme's certificate (and its token) gets through; the token is still checked.
  EXPECT_TRUE(TenantClient(Tls(port, *certs, true), "acme", "acme-token").GetEvidence().ok());
  EXPECT_EQ(TenantClient(Tls(port, *certs, true), "acme", "wrong").GetEvidence().error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // Reloading a different identity for acme locks its certificate out on the next call.
  WriteConfig(
      absl::StrCat("tls:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n",
                   "  client_ca_file: pki/ca.crt\n", "tenants:\n",
                   TenantYaml("acme", "acme-token", "    mtls_identities: [someone-else]\n"),
                   TenantYaml("globex", "globex-token")));
  ::kill(daemon_->pid(), SIGHUP);
  ASSERT_TRUE(WaitForLog("config_reloaded")) << daemon_->Stderr();
  EXPECT_EQ(TenantClient(Tls(port, *certs, true), "acme", "acme-token").GetEvidence().error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(OperationsTest, CertificateAloneAdmitsATenantBoundToIt) {
  std::string pki = dir_ + "/pki";
  fs::create_directories(pki);
  auto certs = host::testing::MakeTestCertificates(pki);
  ASSERT_TRUE(certs.ok()) << certs.status();
  // acme has no token at all; globex has a token and no identities.
  WriteConfig(absl::StrCat("tls:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n",
                           "  client_ca_file: pki/ca.crt\n", "tenants:\n", "  - id: acme\n",
                           "    mtls_identities: [spiffe://cloister.test/tenant/acme]\n",
                           TenantYaml("globex", "globex-token")));
  ASSERT_EQ(testing::Run({CLOISTERD_BINARY, "--check-config", config_path_}).exit_code, 0);
  int port = Start();
  ASSERT_NE(port, 0);

  // acme's certificate without a token: evidence, a session, an upload and an inference.
  TenantClient acme(TlsAs(port, *certs, certs->client_cert, certs->client_key), "acme", "");
  EXPECT_TRUE(acme.GetEvidence().ok());
  std::string session = acme.OpenSessionWithModel();
  ASSERT_FALSE(session.empty());
  grpc::Status inferred = acme.Infer(session, "by-certificate");
  EXPECT_TRUE(inferred.ok()) << inferred.error_message();
  // A token that is sent must be right, even with the right certificate.
  EXPECT_EQ(TenantClient(TlsAs(port, *certs, certs->client_cert, certs->client_key), "acme",
                         "guessed-token")
                .GetEvidence()
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // Another tenant's certificate (same CA) or none: refused, saying what is missing.
  grpc::Status wrong_cert =
      TenantClient(TlsAs(port, *certs, certs->other_client_cert, certs->other_client_key), "acme",
                   "")
          .GetEvidence();
  EXPECT_EQ(wrong_cert.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(wrong_cert.error_message(), "mtls_identities"))
      << wrong_cert.error_message();
  EXPECT_EQ(TenantClient(TlsAs(port, *certs, "", ""), "acme", "").GetEvidence().error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // acme's name from a CA the daemon does not trust gets no connection.
  EXPECT_NE(TenantClient(TlsAs(port, *certs, certs->rogue_client_cert, certs->rogue_client_key),
                         "acme", "")
                .GetEvidence()
                .error_code(),
            grpc::StatusCode::OK);

  // A tenant without identities still needs its token, whatever certificate comes with it.
  grpc::Status no_token =
      TenantClient(TlsAs(port, *certs, certs->client_cert, certs->client_key), "globex", "")
          .GetEvidence();
  EXPECT_EQ(no_token.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(no_token.error_message(), "unknown tenant or wrong API token");
  EXPECT_TRUE(TenantClient(TlsAs(port, *certs, certs->other_client_cert, certs->other_client_key),
                           "globex", "globex-token")
                  .GetEvidence()
                  .ok());
}

TEST_F(OperationsTest, BadCertificateStopsStartup) {
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/server.crt", "not a certificate\n", 0644).ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/server.key", "not a key\n", 0600).ok());
  WriteConfig("tls:\n  cert_file: server.crt\n  key_file: server.key\n");
  testing::RunResult run =
      testing::Run({CLOISTERD_BINARY, "--config", config_path_, "--listen", "127.0.0.1:0",
                    "--data-dir", dir_ + "/data", "--enclave-binary", FAKE_ENCLAVE_WORKER},
                   {}, absl::Seconds(30));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(run.err, config_path_ + ":2: tls.cert_file:")) << run.err;
  EXPECT_TRUE(absl::StrContains(run.err, "holds no PEM CERTIFICATE")) << run.err;
}

// The real enclave and the `cloister` CLI over TLS: --ca makes the difference.
TEST_F(OperationsTest, CliAttestsOverTls) {
  std::string pki = dir_ + "/pki";
  fs::create_directories(pki);
  auto certs = host::testing::MakeTestCertificates(pki);
  ASSERT_TRUE(certs.ok()) << certs.status();
  WriteConfig("tls:\n  cert_file: pki/server.crt\n  key_file: pki/server.key\n");
  int port = Start(CLOISTER_ENCLAVE_BINARY);
  ASSERT_NE(port, 0);
  std::string data = dir_ + "/data";
  std::vector<std::string> attest = {CLOISTER_CLI_BINARY,
                                     "attest",
                                     "--json",
                                     "--server",
                                     absl::StrCat("127.0.0.1:", port),
                                     "--tenant",
                                     "demo",
                                     "--token-file",
                                     data + "/demo.token",
                                     "--policy",
                                     data + "/dev-policy.yaml"};
  testing::RunResult plaintext = testing::Run(attest);
  EXPECT_NE(plaintext.exit_code, 0) << plaintext.out;
  attest.insert(attest.end(), {"--ca", certs->ca_cert});
  testing::RunResult tls = testing::Run(attest);
  EXPECT_EQ(tls.exit_code, 0) << tls.out << tls.err;
  EXPECT_TRUE(absl::StrContains(tls.out, "\"verdict\":\"pass\"") ||
              absl::StrContains(tls.out, "\"verdict\": \"pass\""))
      << tls.out;
  // A CA file that is not one is an error naming the option.
  std::vector<std::string> bad = attest;
  bad.back() = certs->server_key;
  testing::RunResult wrong = testing::Run(bad);
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(wrong.err, "TLS CA file")) << wrong.err;
}

}  // namespace
}  // namespace cloister
