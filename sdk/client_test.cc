// Tests of the Client against the in-process peer (client_test_harness.h): attestation and
// sessions, the options, uploads, listing, inference and deletion, enclave errors, tampered
// replies, session replacement, retries and concurrent calls.
#include "sdk/client.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "attest/policy.h"
#include "base/clock.h"
#include "base/file.h"
#include "crypto/chunked.h"
#include "crypto/hash.h"
#include "crypto/model_handle.h"
#include "crypto/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/client_test_harness.h"
#include "sdk/model_dir.h"

namespace cloister::sdk::client_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST_F(ClientTest, ConnectsAfterAttestation) {
  attest::Verdict verdict;
  auto client = Client::Connect(Options(), &verdict);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(verdict.pass);
  EXPECT_TRUE((*client)->verdict().pass);
  EXPECT_FALSE((*client)->verdict().checks.empty());
  EXPECT_EQ((*client)->session_id().size(), crypto::kSessionIdSize);
  EXPECT_EQ(peer_->open_sessions.load(), 1);
  EXPECT_EQ(peer_->fresh_collections.load(), 0);
}

TEST_F(ClientTest, FreshEvidence) {
  ClientOptions options = Options();
  options.fresh_evidence = true;
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(peer_->fresh_collections.load(), 1);

  // A policy that requires fresh evidence makes the client ask for it unprompted.
  auto policy = attest::MakeDevPolicy(sim_dir(), measurement_);
  ASSERT_TRUE(policy.ok()) << policy.status();
  policy->set_require_fresh_evidence(true);
  options = Options();
  options.policy = *policy;
  client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(peer_->fresh_collections.load(), 2);
  auto verdict = Attest(options);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_TRUE(verdict->pass) << verdict->FailedSummary();
  EXPECT_EQ(peer_->fresh_collections.load(), 3);
}

TEST_F(ClientTest, AttestOnly) {
  auto verdict = Attest(Options());
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_TRUE(verdict->pass) << verdict->FailedSummary();
  EXPECT_EQ(peer_->open_sessions.load(), 0);
}

TEST_F(ClientTest, WrongTokenIsUnauthenticated) {
  ClientOptions options = Options();
  options.token = "wrong";
  auto client = Client::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(client.status().message()),
              HasSubstr("GetEvidence: unknown tenant or wrong API token"));
}

TEST_F(ClientTest, PolicyMismatchFailsAttestation) {
  ClientOptions options = Options();
  auto policy = attest::MakeDevPolicy(sim_dir(), Bytes(48, 0x11));  // another measurement
  ASSERT_TRUE(policy.ok()) << policy.status();
  options.policy = *policy;
  attest::Verdict verdict;
  auto client = Client::Connect(options, &verdict);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(client.status().message()), StartsWith("attestation failed: "));
  EXPECT_FALSE(verdict.pass);
  EXPECT_FALSE(verdict.FailedSummary().empty());
  EXPECT_EQ(peer_->open_sessions.load(), 0);
}

TEST_F(ClientTest, RejectsBadOptions) {
  ClientOptions options = Options();
  options.tenant_id = "has space";
  EXPECT_EQ(Client::Connect(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = Options();
  options.identity_key_path = dir_ + "/missing.key";
  EXPECT_EQ(Client::Connect(options).status().code(), absl::StatusCode::kNotFound);
  options = Options();
  options.policy_path = "";
  EXPECT_EQ(Client::Connect(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, RejectsBadTlsOptions) {
  ClientOptions options = Options();
  options.tls_ca_file = dir_ + "/missing-ca.crt";
  absl::Status status = Attest(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_NE(status.message().find("TLS CA file"), absl::string_view::npos) << status;
  // A file that holds no certificate.
  options.tls_ca_file = key_path_;
  status = Attest(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("holds no PEM CERTIFICATE"), absl::string_view::npos) << status;
  // Client certificates need a CA and come with their key.
  options = Options();
  options.tls_client_cert_file = dir_ + "/client.crt";
  EXPECT_EQ(Attest(options).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/ca.crt",
                              "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n")
                  .ok());
  options.tls_ca_file = dir_ + "/ca.crt";
  status = Attest(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("go together"), absl::string_view::npos) << status;
  // A TLS client against this plaintext test server gets no connection, not a plaintext one.
  options = Options();
  options.tls_ca_file = dir_ + "/ca.crt";
  EXPECT_EQ(Attest(options).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ClientTest, UploadListInferDelete) {
  std::unique_ptr<Client> client = MustConnect(Options());
  ASSERT_NE(client, nullptr);
  // 2.5 MiB: several chunks and several upload messages.
  Bytes contents = crypto::RandomBytes((size_t{5} << 20) / 2);
  std::string path = WriteModel("model.onnx", contents);
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  auto model = client->UploadModel(
      path, "echo", [&](uint64_t sent, uint64_t total) { progress.emplace_back(sent, total); });
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->name(), "echo");
  EXPECT_EQ(model->handle(), crypto::ModelHandle(client->identity_public_key(), "echo"));
  EXPECT_EQ(model->size(), contents.size());
  {
    absl::MutexLock lock(&peer_->mu);
    EXPECT_EQ(peer_->last_upload_plaintext, contents);
    ASSERT_EQ(peer_->upload_message_sizes.size(), 3u);
    for (size_t size : peer_->upload_message_sizes) EXPECT_LE(size, kUploadMessageSize);
    EXPECT_EQ(peer_->upload_message_sizes[0], kUploadMessageSize);
  }
  uint64_t total = crypto::ChunkedCiphertextSize(contents.size());
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), std::make_pair(total, total));
  for (size_t i = 1; i < progress.size(); ++i) EXPECT_GT(progress[i].first, progress[i - 1].first);

  auto models = client->ListModels();
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->size(), 1u);
  EXPECT_EQ((*models)[0].name(), "echo");

  auto outputs = client->Infer("echo", {Fp32Tensor("x", {1, 2, 3})});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  ASSERT_EQ(outputs->size(), 1u);
  EXPECT_EQ((*outputs)[0].name(), "x_out");
  EXPECT_EQ((*outputs)[0].raw(), Fp32Tensor("x", {1, 2, 3}).raw());

  // Asking for an output that is not produced returns none.
  auto filtered = client->Infer("echo", {Fp32Tensor("x", {1, 2, 3})}, {"other"});
  ASSERT_TRUE(filtered.ok());
  EXPECT_TRUE(filtered->empty());

  ASSERT_TRUE(client->DeleteModel("echo").ok());
  auto after = client->Infer("echo", {Fp32Tensor("x", {1, 2, 3})});
  EXPECT_EQ(after.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(after.status().message(), "no such model for this identity");
  absl::Status again = client->DeleteModel("echo");
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(again.message(), "no model named 'echo'");
}

// A checkpoint folder is packed (only its checkpoint files) and uploaded like a file: what the
// enclave decrypts is exactly the package, whose SHA-256 is the digest it reports.
TEST_F(ClientTest, UploadsACheckpointFolderAsAPackage) {
  std::unique_ptr<Client> client = MustConnect(Options());
  ASSERT_NE(client, nullptr);
  std::string folder = dir_ + "/checkpoint";
  ASSERT_TRUE(MakeDirs(folder).ok());
  WriteModel("checkpoint/config.json", ToBytes(R"({"architectures":["LlamaForCausalLM"]})"));
  WriteModel("checkpoint/tokenizer.json", ToBytes("{}"));
  WriteModel("checkpoint/model.safetensors", crypto::RandomBytes(70000));
  WriteModel("checkpoint/README.md", ToBytes("not packed"));
  auto expected = PackModelDir(folder, uint64_t{1} << 20);
  ASSERT_TRUE(expected.ok()) << expected.status();

  auto model = client->UploadModel(folder, "tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->kind(), api::MODEL_KIND_LLM);
  EXPECT_EQ(model->size(), expected->size());
  EXPECT_EQ(model->digest(), HexEncode(crypto::Sha256(*expected)));
  {
    absl::MutexLock lock(&peer_->mu);
    EXPECT_EQ(peer_->last_upload_plaintext, *expected);
  }
  // A folder that is not a checkpoint is refused before anything is sent.
  std::string empty = dir_ + "/empty";
  ASSERT_TRUE(MakeDirs(empty).ok());
  auto refused = client->UploadModel(empty, "none");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("has no config.json"));
}

TEST_F(ClientTest, EnclaveErrorsKeepTheirCode) {
  std::unique_ptr<Client> client = MustConnect(Options());
  ASSERT_NE(client, nullptr);
  std::string path = WriteModel("bad.onnx", ToBytes("not a model at all"));
  auto model = client->UploadModel(path, "bad");
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(), "model file is not a valid ONNX model");
  // The session is still usable afterwards.
  EXPECT_TRUE(client->ListModels().ok());
}

TEST_F(ClientTest, EmptyModelFileUploads) {
  std::unique_ptr<Client> client = MustConnect(Options());
  ASSERT_NE(client, nullptr);
  auto model = client->UploadModel(WriteModel("empty.onnx", {}), "empty");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->size(), 0u);
}

TEST_F(ClientTest, LocalInputErrors) {
  std::unique_ptr<Client> client = MustConnect(Options());
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->UploadModel(dir_ + "/none.onnx", "m").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client->UploadModel(WriteModel("m.onnx", Bytes(10)), "").status().code(),
            absl::StatusCode::kInvalidArgument);
  api::Tensor broken = Fp32Tensor("x", {1, 2, 3});
  broken.set_raw("short");
  EXPECT_EQ(client->Infer("echo", {broken}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Infer("echo", {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, TamperedReplyIsDetected) {
  StartPeer({.tamper_replies = true});
  std::unique_ptr<Client> client = MustConnect(Options());
  ASSERT_NE(client, nullptr);
  auto models = client->ListModels();
  EXPECT_EQ(models.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(models.status().message()), HasSubstr("cannot open the enclave's reply"));
}

TEST_F(ClientTest, ReplacesAnExpiringSession) {
  FakeClock clock(absl::Now());
  ClientOptions options = Options();
  options.clock = &clock;
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  Bytes first = client->session_id();
  ASSERT_TRUE(client->ListModels().ok());
  EXPECT_EQ(peer_->open_sessions.load(), 1);
  clock.Advance(absl::Minutes(59) + absl::Seconds(30));  // within the margin of the 1 h expiry
  ASSERT_TRUE(client->ListModels().ok());
  EXPECT_EQ(peer_->open_sessions.load(), 2);
  EXPECT_NE(client->session_id(), first);
}

TEST_F(ClientTest, RetriesIdempotentCallsThroughANewSessionAfterAWorkerRestart) {
  ClientOptions options = Options();
  options.retry_backoff = absl::Milliseconds(1);
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->UploadModel(WriteModel("m.onnx", Bytes(10, 1)), "echo").ok());
  Bytes first = client->session_id();
  // The worker died with the call (UNAVAILABLE), then the old session is refused.
  peer_->sealed_calls = 0;
  peer_->RefuseNextSealedCalls(1, grpc::StatusCode::UNAVAILABLE,
                               "enclave worker 0 exited while holding this call; retry");
  auto outputs = client->Infer("echo", {Fp32Tensor("x", {1, 2})});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_EQ(peer_->sealed_calls.load(), 2);
  EXPECT_EQ(peer_->open_sessions.load(), 2);  // attested again before the retry
  EXPECT_NE(client->session_id(), first);
  peer_->RefuseNextSealedCalls(2, grpc::StatusCode::FAILED_PRECONDITION,
                               "the enclave worker holding this session restarted; re-attest "
                               "and open a new session",
                               api::SESSION_LOST);
  EXPECT_TRUE(client->ListModels().ok());
  EXPECT_EQ(peer_->open_sessions.load(), 4);
  // The client decides by the reason, not by the words: the same refusal without its reason
  // is an ordinary FAILED_PRECONDITION, returned as it is.
  peer_->RefuseNextSealedCalls(1, grpc::StatusCode::FAILED_PRECONDITION,
                               "the enclave worker holding this session restarted; re-attest "
                               "and open a new session");
  absl::StatusOr<std::vector<api::ModelInfo>> listed = client->ListModels();
  EXPECT_TRUE(absl::IsFailedPrecondition(listed.status())) << listed.status();
  EXPECT_EQ(peer_->open_sessions.load(), 4);
}

TEST_F(ClientTest, RetriesAreBoundedAndOnlyForIdempotentCalls) {
  ClientOptions options = Options();
  options.retry_backoff = absl::Milliseconds(1);
  options.max_attempts = 3;
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->UploadModel(WriteModel("m.onnx", Bytes(10, 1)), "echo").ok());
  peer_->sealed_calls = 0;
  peer_->RefuseNextSealedCalls(10, grpc::StatusCode::UNAVAILABLE, "enclave worker 0 is restarting");
  auto listed = client->ListModels();
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(peer_->sealed_calls.load(), 3);
  // Deleting is not idempotent: one attempt only.
  peer_->sealed_calls = 0;
  EXPECT_EQ(client->DeleteModel("echo").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(peer_->sealed_calls.load(), 1);
  // Other refusals are not retried either.
  peer_->sealed_calls = 0;
  peer_->RefuseNextSealedCalls(1, grpc::StatusCode::FAILED_PRECONDITION, "something else");
  EXPECT_EQ(client->ListModels().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(peer_->sealed_calls.load(), 1);
  peer_->RefuseNextSealedCalls(0, grpc::StatusCode::OK, "");
  EXPECT_TRUE(client->ListModels().ok());
}

TEST_F(ClientTest, ConcurrentInfer) {
  std::unique_ptr<Client> client = MustConnect(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->UploadModel(WriteModel("m.onnx", Bytes(100, 7)), "echo").ok());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        float value = static_cast<float>(t * 100 + i);
        auto outputs = client->Infer("echo", {Fp32Tensor("x", {value, value, value})});
        if (!outputs.ok() || outputs->size() != 1 ||
            (*outputs)[0].raw() != Fp32Tensor("x", {value, value, value}).raw()) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace cloister::sdk::client_test
