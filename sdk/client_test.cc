// Tests of the Client and of the `cloister` commands that talk to a server, against an
// in-process gRPC peer that plays cloisterd and the enclave by the rules of docs/PROTOCOL.md:
// real simulated evidence (attest/sim), HPKE session setup, the session channel of
// crypto/channel.h, chunked decryption of uploads. The peer is deliberately small (its
// "models" echo their inputs); the real cloisterd and enclave are exercised by the lead's
// end-to-end tests. What this checks is the client's side of the wire contract.
#include "sdk/client.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "attest/binding.h"
#include "attest/policy.h"
#include "attest/sim/sim_tee.h"
#include "base/file.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "crypto/channel.h"
#include "crypto/chunked.h"
#include "crypto/hash.h"
#include "crypto/hpke.h"
#include "crypto/keys.h"
#include "crypto/model_handle.h"
#include "crypto/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/model_package.h"
#include "sdk/cli.h"
#include "sdk/model_dir.h"
#include "sdk/npy.h"

namespace cloister::sdk {
namespace {

namespace api = ::cloister::api::v1;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kTenant[] = "demo";
constexpr char kToken[] = "s3cret-token";

std::string Str(ByteSpan b) { return std::string(b.begin(), b.end()); }
ByteSpan Span(const std::string& s) {
  return ByteSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// ---- The peer. ----

class EnclavePeer final : public api::Cloister::Service {
 public:
  struct Options {
    int64_t session_lifetime_seconds = 3600;
    bool tamper_replies = false;
  };

  // The next `count` sealed calls (ListModels, DeleteModel, Infer) are refused with `code` and
  // `message`, as cloisterd refuses calls whose enclave worker died.
  void RefuseNextSealedCalls(int count, grpc::StatusCode code, std::string message) {
    absl::MutexLock lock(&mu);
    refusals_left_ = count;
    refusal_ = grpc::Status(code, std::move(message));
  }
  std::atomic<int> sealed_calls{0};

  static std::unique_ptr<EnclavePeer> Create(const std::string& sim_dir, Bytes measurement,
                                             Options options) {
    auto peer = std::unique_ptr<EnclavePeer>(new EnclavePeer());
    peer->options_ = options;
    auto collector = attest::MakeSimCollector(sim_dir, measurement);
    EXPECT_TRUE(collector.ok()) << collector.status();
    peer->collector_ = *std::move(collector);
    peer->hpke_ = crypto::GenerateX25519();
    peer->signing_ = crypto::GenerateEd25519();
    auto bundle = peer->collector_->Collect(crypto::RandomBytes(32), peer->hpke_.public_key,
                                            peer->signing_.public_key);
    EXPECT_TRUE(bundle.ok()) << bundle.status();
    peer->cached_bundle_ = bundle->SerializeAsString();
    return peer;
  }

  // Counters the tests look at.
  std::atomic<int> open_sessions{0};
  std::atomic<int> fresh_collections{0};
  absl::Mutex mu;
  std::vector<size_t> upload_message_sizes ABSL_GUARDED_BY(mu);
  Bytes last_upload_plaintext ABSL_GUARDED_BY(mu);

  grpc::Status GetEvidence(grpc::ServerContext* context, const api::GetEvidenceRequest* request,
                           api::GetEvidenceResponse* response) override {
    if (grpc::Status auth = Authenticate(*context); !auth.ok()) return auth;
    if (request->nonce().size() != 32) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "nonce must be 32 bytes");
    }
    cloister::attest::v1::ChallengeResponse challenge;
    if (request->fresh()) {
      auto bundle =
          collector_->Collect(Span(request->nonce()), hpke_.public_key, signing_.public_key);
      if (!bundle.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "collect failed");
      ++fresh_collections;
      challenge.set_bundle(bundle->SerializeAsString());
      challenge.set_fresh(true);
      absl::MutexLock lock(&mu);
      current_bundles_.insert(challenge.bundle());
    } else {
      challenge.set_bundle(cached_bundle_);
      Bytes message =
          attest::ChallengeMessage(attest::EvidenceDigest(cached_bundle_), Span(request->nonce()));
      challenge.set_nonce_signature(Str(*crypto::Ed25519Sign(signing_.seed.span(), message)));
      absl::MutexLock lock(&mu);
      current_bundles_.insert(cached_bundle_);
    }
    response->set_challenge_response(challenge.SerializeAsString());
    return grpc::Status::OK;
  }

  grpc::Status OpenSession(grpc::ServerContext* context, const api::OpenSessionRequest* request,
                           api::OpenSessionResponse* response) override {
    if (grpc::Status auth = Authenticate(*context); !auth.ok()) return auth;
    Bytes digest(request->evidence_digest().begin(), request->evidence_digest().end());
    std::string bundle_bytes;
    {
      absl::MutexLock lock(&mu);
      for (const std::string& bundle : current_bundles_) {
        if (attest::EvidenceDigest(bundle) == digest) bundle_bytes = bundle;
      }
    }
    if (bundle_bytes.empty()) return Refuse("unknown evidence digest");
    auto context_or =
        crypto::HpkeSetupReceiver(crypto::kSessionSuite, Span(request->hpke_enc()),
                                  hpke_.private_key.span(), crypto::SessionHpkeInfo(digest));
    if (!context_or.ok()) return Refuse("bad encapsulation");
    std::unique_ptr<crypto::HpkeContext> hpke = *std::move(context_or);
    auto hello_bytes = hpke->Open(AsBytes(kTenant), Span(request->sealed_hello()));
    if (!hello_bytes.ok()) return Refuse("cannot open hello");
    api::SessionHello hello;
    if (!hello.ParseFromArray(hello_bytes->data(), hello_bytes->size())) return Refuse("hello");
    if (hello.tenant_id() != kTenant) return Refuse("tenant mismatch");
    Bytes transcript = crypto::SessionTranscript(
        digest, hpke_.public_key, signing_.public_key, Span(hello.identity_public_key()),
        Span(request->hpke_enc()), Span(hello.client_nonce()), hello.tenant_id());
    if (!crypto::Ed25519Verify(Span(hello.identity_public_key()), transcript,
                               Span(hello.transcript_signature()))
             .ok()) {
      return Refuse("bad transcript signature");
    }
    auto keys = crypto::DeriveChannelKeys(*hpke);
    if (!keys.ok()) return Refuse("keys");
    auto session = std::make_unique<PeerSession>();
    session->identity =
        Bytes(hello.identity_public_key().begin(), hello.identity_public_key().end());
    session->receiver = std::make_unique<crypto::ChannelReceiver>(
        keys->session_id, crypto::Direction::kClientToEnclave, keys->client_to_enclave_key.span(),
        keys->client_to_enclave_nonce.span());
    session->sender = std::make_unique<crypto::ChannelSender>(
        keys->session_id, crypto::Direction::kEnclaveToClient, keys->enclave_to_client_key.span(),
        keys->enclave_to_client_nonce.span());
    api::Welcome welcome;
    welcome.set_session_id(Str(keys->session_id));
    welcome.set_expires_at_unix(absl::ToUnixSeconds(absl::Now()) +
                                options_.session_lifetime_seconds);
    welcome.set_max_messages(uint64_t{1} << 32);
    auto sealed = session->sender->Seal({crypto::MessageKind::kWelcome, "", ""},
                                        Span(welcome.SerializeAsString()));
    response->set_session_id(Str(keys->session_id));
    response->set_sequence(sealed->first);
    response->set_sealed_welcome(Str(sealed->second));
    absl::MutexLock lock(&mu);
    sessions_[Str(keys->session_id)] = std::move(session);
    ++open_sessions;
    return grpc::Status::OK;
  }

  grpc::Status ListModels(grpc::ServerContext* context, const api::SealedCall* call,
                          api::SealedReply* reply) override {
    return Sealed(*context, *call, crypto::MessageKind::kListModels, reply,
                  [&](const Bytes& identity, const std::string&) -> absl::StatusOr<std::string> {
                    api::ListModelsReply list;
                    for (const auto& [handle, model] : models_) {
                      if (model.first == identity) *list.add_models() = model.second;
                    }
                    return list.SerializeAsString();
                  });
  }

  grpc::Status DeleteModel(grpc::ServerContext* context, const api::SealedCall* call,
                           api::SealedReply* reply) override {
    return Sealed(
        *context, *call, crypto::MessageKind::kDeleteModel, reply,
        [&](const Bytes& identity, const std::string& plaintext) -> absl::StatusOr<std::string> {
          api::DeleteModelRequest request;
          request.ParseFromString(plaintext);
          if (crypto::ModelHandle(identity, request.name()) != call->model_handle()) {
            return absl::InvalidArgumentError("handle does not match the name");
          }
          if (models_.erase(call->model_handle()) == 0) {
            return absl::NotFoundError(absl::StrCat("no model named '", request.name(), "'"));
          }
          return api::DeleteModelReply().SerializeAsString();
        });
  }

  // The peer's models echo their inputs as outputs named "<input>_out".
  grpc::Status Infer(grpc::ServerContext* context, const api::SealedCall* call,
                     api::SealedReply* reply) override {
    return Sealed(
        *context, *call, crypto::MessageKind::kInfer, reply,
        [&](const Bytes& identity, const std::string& plaintext) -> absl::StatusOr<std::string> {
          auto it = models_.find(call->model_handle());
          if (it == models_.end() || it->second.first != identity) {
            return absl::NotFoundError("no such model for this identity");
          }
          api::InferRequestPayload request;
          request.ParseFromString(plaintext);
          api::InferReplyPayload out;
          for (const api::Tensor& input : request.inputs()) {
            std::string name = absl::StrCat(input.name(), "_out");
            if (request.outputs_size() > 0 &&
                std::find(request.outputs().begin(), request.outputs().end(), name) ==
                    request.outputs().end()) {
              continue;
            }
            api::Tensor& tensor = *out.add_outputs();
            tensor = input;
            tensor.set_name(name);
          }
          return out.SerializeAsString();
        });
  }

  grpc::Status UploadModel(grpc::ServerContext* context,
                           grpc::ServerReader<api::UploadModelRequest>* reader,
                           api::UploadModelResponse* response) override {
    if (grpc::Status auth = Authenticate(*context); !auth.ok()) return auth;
    api::UploadModelRequest message;
    if (!reader->Read(&message) || !message.has_start()) return Refuse("no start");
    api::UploadModelRequest::Start start = message.start();
    std::string ciphertext;
    std::vector<size_t> sizes;
    api::SealedCall finish;
    bool finished = false;
    while (reader->Read(&message)) {
      if (message.has_finish()) {
        finish = message.finish();
        finished = true;
        break;
      }
      sizes.push_back(message.data().size());
      ciphertext += message.data();
    }
    if (!finished) return Refuse("no finish");
    if (ciphertext.size() != start.ciphertext_size()) return Refuse("size mismatch");
    {
      absl::MutexLock lock(&mu);
      upload_message_sizes = sizes;
    }
    if (finish.session_id() != start.session_id() ||
        finish.model_handle() != start.model_handle()) {
      return Refuse("finish does not match start");
    }
    return Sealed(
        *context, finish, crypto::MessageKind::kLoadModel, response->mutable_reply(),
        [&](const Bytes& identity, const std::string& plaintext) -> absl::StatusOr<std::string> {
          api::LoadModelRequest load;
          load.ParseFromString(plaintext);
          std::string handle = crypto::ModelHandle(identity, load.name());
          if (handle != finish.model_handle()) {
            return absl::InvalidArgumentError("handle does not match the name");
          }
          auto model = crypto::ChunkedDecrypt(
              Span(load.model_key()), crypto::ModelEncryptionContext(handle), Span(ciphertext));
          if (!model.ok()) return absl::InvalidArgumentError("cannot decrypt");
          if (model->size() != load.plaintext_size() ||
              Str(crypto::Sha256(*model)) != load.plaintext_sha256()) {
            return absl::InvalidArgumentError("digest mismatch");
          }
          if (Str(*model).rfind("not a model", 0) == 0) {
            return absl::InvalidArgumentError("model file is not a valid ONNX model");
          }
          last_upload_plaintext = *model;  // Sealed() holds mu
          api::LoadModelReply loaded;
          api::ModelInfo& info = *loaded.mutable_model();
          info.set_name(load.name());
          info.set_handle(handle);
          info.set_size(load.plaintext_size());
          info.set_digest(HexEncode(crypto::Sha256(*model)));
          if (package::IsModelPackage(*model)) {
            // A checkpoint package: the peer checks it the enclave's way, then describes it.
            auto members = package::ReadModelPackage(*model);
            if (!members.ok()) return members.status();
            info.set_kind(api::MODEL_KIND_LLM);
            models_[handle] = {identity, info};
            return loaded.SerializeAsString();
          }
          info.set_kind(api::MODEL_KIND_ONNX);
          api::TensorInfo* input = info.add_inputs();
          input->set_name("x");
          input->set_datatype("FP32");
          input->add_shape(-1);
          input->add_shape(3);
          api::TensorInfo* output = info.add_outputs();
          output->set_name("x_out");
          output->set_datatype("FP32");
          output->add_shape(-1);
          output->add_shape(3);
          models_[handle] = {identity, info};
          return loaded.SerializeAsString();
        });
  }

 private:
  struct PeerSession {
    Bytes identity;
    std::unique_ptr<crypto::ChannelReceiver> receiver;
    std::unique_ptr<crypto::ChannelSender> sender;
  };
  using Handler =
      std::function<absl::StatusOr<std::string>(const Bytes& identity, const std::string&)>;

  EnclavePeer() = default;

  static grpc::Status Refuse(const std::string& why) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, why);
  }

  static grpc::Status Authenticate(const grpc::ServerContext& context) {
    const auto& metadata = context.client_metadata();
    auto tenant = metadata.find("x-cloister-tenant");
    auto auth = metadata.find("authorization");
    if (tenant == metadata.end() || auth == metadata.end() ||
        std::string(tenant->second.data(), tenant->second.size()) != kTenant ||
        std::string(auth->second.data(), auth->second.size()) != absl::StrCat("Bearer ", kToken)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown tenant or wrong API token");
    }
    return grpc::Status::OK;
  }

  // Opens a sealed call, runs `handler` under the lock, and seals its result or error in a
  // ReplyEnvelope with the call's request id and model handle.
  grpc::Status Sealed(const grpc::ServerContext& context, const api::SealedCall& call,
                      crypto::MessageKind kind, api::SealedReply* reply, const Handler& handler) {
    if (grpc::Status auth = Authenticate(context); !auth.ok()) return auth;
    ++sealed_calls;
    {
      absl::MutexLock lock(&mu);
      if (refusals_left_ > 0) {
        --refusals_left_;
        return refusal_;
      }
    }
    // Request ids are 16 lowercase hex characters (8 random bytes).
    if (call.request_id().size() != 16 ||
        call.request_id().find_first_not_of("0123456789abcdef") != std::string::npos) {
      return Refuse("malformed request id");
    }
    absl::MutexLock lock(&mu);
    auto it = sessions_.find(call.session_id());
    if (it == sessions_.end()) return Refuse("unknown session");
    PeerSession& session = *it->second;
    crypto::MessageHeader header{kind, call.request_id(), call.model_handle()};
    auto plaintext = session.receiver->Open(call.sequence(), header, Span(call.ciphertext()));
    if (!plaintext.ok()) return Refuse(std::string(plaintext.status().message()));
    api::ReplyEnvelope envelope;
    auto body = handler(session.identity, Str(*plaintext));
    if (body.ok()) {
      envelope.set_body(*body);
    } else {
      envelope.set_code(static_cast<int>(body.status().code()));
      envelope.set_message(std::string(body.status().message()));
    }
    auto sealed = session.sender->Seal(header, Span(envelope.SerializeAsString()));
    reply->set_sequence(sealed->first);
    std::string ciphertext = Str(sealed->second);
    if (options_.tamper_replies) ciphertext[0] ^= 1;
    reply->set_ciphertext(ciphertext);
    return grpc::Status::OK;
  }

  Options options_;
  int refusals_left_ ABSL_GUARDED_BY(mu) = 0;
  grpc::Status refusal_ ABSL_GUARDED_BY(mu);
  std::unique_ptr<attest::EvidenceCollector> collector_;
  crypto::X25519KeyPair hpke_;
  crypto::Ed25519KeyPair signing_;
  std::string cached_bundle_;
  std::set<std::string> current_bundles_ ABSL_GUARDED_BY(mu);
  std::map<std::string, std::unique_ptr<PeerSession>> sessions_ ABSL_GUARDED_BY(mu);
  std::map<std::string, std::pair<Bytes, api::ModelInfo>> models_ ABSL_GUARDED_BY(mu);
};

// ---- Fixture: a temp dir with simulated roots, a policy, a key, and a running peer. ----

class ClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = ::testing::TempDir() + "client_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    suite_dir_ = new std::string(pattern);
    ASSERT_TRUE(attest::EnsureSimRoots(*suite_dir_ + "/sim").ok());
  }
  static void TearDownTestSuite() {
    std::string command = "rm -rf '" + *suite_dir_ + "'";
    ASSERT_EQ(std::system(command.c_str()), 0);
    delete suite_dir_;
  }

  void SetUp() override {
    StartPeer({});
    dir_ = *suite_dir_ + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_TRUE(MakeDirs(dir_).ok());
    policy_path_ = dir_ + "/policy.yaml";
    ASSERT_TRUE(attest::WriteDevPolicy(policy_path_, sim_dir(), measurement_).ok());
    key_path_ = dir_ + "/tenant.key";
    ASSERT_TRUE(TenantIdentity::Generate().Save(key_path_).ok());
    token_path_ = dir_ + "/token";
    ASSERT_TRUE(WriteFileAtomic(token_path_, absl::StrCat(kToken, "\n")).ok());
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  void StartPeer(EnclavePeer::Options options) {
    if (server_ != nullptr) server_->Shutdown();
    peer_ = EnclavePeer::Create(sim_dir(), measurement_, options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(peer_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    server_address_ = absl::StrCat("127.0.0.1:", port);
  }

  std::string sim_dir() const { return *suite_dir_ + "/sim"; }

  // A second node: its own peer (own enclave keys and model store) behind its own server.
  struct Node {
    std::unique_ptr<EnclavePeer> peer;
    std::unique_ptr<grpc::Server> server;
    std::string address;
  };
  Node StartNode(const Bytes& measurement) {
    Node node;
    node.peer = EnclavePeer::Create(sim_dir(), measurement, {});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(node.peer.get());
    node.server = builder.BuildAndStart();
    EXPECT_NE(node.server, nullptr);
    EXPECT_GT(port, 0);
    node.address = absl::StrCat("127.0.0.1:", port);
    return node;
  }
  // An address where nothing listens: a port the kernel just handed out, closed again.
  static std::string ClosedAddress() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), length), 0);
    EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
    ::close(fd);
    return absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
  }

  ClientOptions Options() const {
    ClientOptions options;
    options.server = server_address_;
    options.tenant_id = kTenant;
    options.token = kToken;
    options.policy_path = policy_path_;
    options.identity_key_path = key_path_;
    options.call_timeout = absl::Seconds(20);
    return options;
  }

  std::unique_ptr<Client> MustConnect(const ClientOptions& options) {
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::string WriteModel(const std::string& name, const Bytes& contents) {
    std::string path = dir_ + "/" + name;
    EXPECT_TRUE(WriteFileAtomic(path, Str(contents)).ok());
    return path;
  }

  static std::string* suite_dir_;
  Bytes measurement_ = Bytes(48, 0x5a);
  std::unique_ptr<EnclavePeer> peer_;
  std::unique_ptr<grpc::Server> server_;
  std::string server_address_;
  std::string dir_, policy_path_, key_path_, token_path_;
};

std::string* ClientTest::suite_dir_ = nullptr;

api::Tensor Fp32Tensor(const std::string& name, std::vector<float> values) {
  Bytes raw(values.size() * 4);
  std::memcpy(raw.data(), values.data(), raw.size());
  return ToTensor(name, NpyArray{"FP32", {1, static_cast<int64_t>(values.size())}, raw});
}

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
                               "and open a new session");
  EXPECT_TRUE(client->ListModels().ok());
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

// ---- Several endpoints. ----

TEST(ServerListTest, ParsesCommaSeparatedEndpoints) {
  auto one = ParseServerList("127.0.0.1:7700");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, std::vector<std::string>{"127.0.0.1:7700"});
  auto several = ParseServerList("a.example:7700,[::1]:7701,unix:/run/cloister.sock");
  ASSERT_TRUE(several.ok()) << several.status();
  EXPECT_EQ(*several,
            (std::vector<std::string>{"a.example:7700", "[::1]:7701", "unix:/run/cloister.sock"}));
}

TEST(ServerListTest, BadListsAreInvalidArguments) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "no server address given"},
      {"a:1,,b:2", "has an empty entry"},
      {"a:1,", "has an empty entry"},
      {",a:1", "has an empty entry"},
      {"a:1, b:2", "contains whitespace"},
      {"a.example", "is not HOST:PORT"},
      {"a:0", "is not HOST:PORT"},
      {"a:65536", "is not HOST:PORT"},
      {"a:7x", "is not HOST:PORT"},
      {"a:+7", "is not HOST:PORT"},
      {":7700", "is not HOST:PORT"},
      {"::1:7700", "IPv6 address in brackets"},
      {"a:1,b:2,a:1", "\"a:1\" is listed twice"},
  };
  for (const auto& [list, reason] : cases) {
    auto parsed = ParseServerList(list);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << list;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(reason)) << list;
  }
}

TEST_F(ClientTest, BadServerListIsInvalidArgument) {
  ClientOptions options = Options();
  options.server = absl::StrCat(server_address_, ",,", server_address_);
  absl::Status connect = Client::Connect(options).status();
  EXPECT_EQ(connect.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(connect.message()), HasSubstr("empty entry"));
  EXPECT_EQ(Attest(options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(peer_->open_sessions.load(), 0);
}

TEST_F(ClientTest, ConnectsToTheSecondEndpointWhenTheFirstIsDown) {
  ClientOptions options = Options();
  std::string closed = ClosedAddress();
  options.server = absl::StrCat(closed, ",", server_address_);
  attest::Verdict verdict;
  auto client = Client::Connect(options, &verdict);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(verdict.pass);
  EXPECT_EQ((*client)->current_server(), server_address_);
  EXPECT_EQ(peer_->open_sessions.load(), 1);
  EXPECT_TRUE((*client)->ListModels().ok());
  auto attested = Attest(options);
  ASSERT_TRUE(attested.ok()) << attested.status();
  EXPECT_TRUE(attested->pass);
}

TEST_F(ClientTest, SkipsAnEndpointThatFailsAttestation) {
  Node impostor = StartNode(Bytes(48, 0x11));  // not the measurement the policy expects
  ClientOptions options = Options();
  options.server = absl::StrCat(impostor.address, ",", server_address_);
  attest::Verdict verdict;
  auto client = Client::Connect(options, &verdict);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(verdict.pass);
  EXPECT_EQ((*client)->current_server(), server_address_);
  EXPECT_EQ(impostor.peer->open_sessions.load(), 0);
  EXPECT_EQ(peer_->open_sessions.load(), 1);
  impostor.server->Shutdown();
}

TEST_F(ClientTest, NoUsableEndpointNamesEachFailure) {
  Node impostor = StartNode(Bytes(48, 0x11));
  std::string closed = ClosedAddress();
  ClientOptions options = Options();
  options.server = absl::StrCat(closed, ",", impostor.address);
  absl::Status status = Client::Connect(options).status();
  // The code of the endpoint that answered; the message names both.
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), StartsWith("no endpoint could be used: "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot reach cloisterd at " + closed));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr(impostor.address + ": attestation failed: "));
  options.server = absl::StrCat(closed, ",", ClosedAddress());
  EXPECT_EQ(Client::Connect(options).status().code(), absl::StatusCode::kUnavailable);
  impostor.server->Shutdown();
}

TEST_F(ClientTest, ASessionStaysOnItsNode) {
  Node second = StartNode(measurement_);
  FakeClock clock(absl::Now());
  ClientOptions options = Options();
  options.clock = &clock;
  options.server = absl::StrCat(server_address_, ",", second.address);
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->current_server(), server_address_);
  ASSERT_TRUE(client->UploadModel(WriteModel("m.onnx", Bytes(10, 1)), "echo").ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(client->Infer("echo", {Fp32Tensor("x", {1, 2})}).ok());
  }
  ASSERT_TRUE(client->ListModels().ok());
  // A session replaced because it expires is replaced on the same node.
  clock.Advance(absl::Minutes(59) + absl::Seconds(30));
  ASSERT_TRUE(client->Infer("echo", {Fp32Tensor("x", {1, 2})}).ok());
  EXPECT_EQ(client->current_server(), server_address_);
  EXPECT_EQ(peer_->open_sessions.load(), 2);
  EXPECT_EQ(peer_->sealed_calls.load(), 8);  // the upload's load, 6 infers, 1 list
  EXPECT_EQ(second.peer->open_sessions.load(), 0);
  EXPECT_EQ(second.peer->sealed_calls.load(), 0);
  second.server->Shutdown();
}

TEST_F(ClientTest, FailsOverWhenItsNodeStopsMidRun) {
  Node second = StartNode(measurement_);
  ClientOptions options = Options();
  options.retry_backoff = absl::Milliseconds(1);
  // Models are per node: the tenant uploads to each node (same identity key, same model).
  {
    ClientOptions only_second = options;
    only_second.server = second.address;
    std::unique_ptr<Client> uploader = MustConnect(only_second);
    ASSERT_NE(uploader, nullptr);
    ASSERT_TRUE(uploader->UploadModel(WriteModel("m.onnx", Bytes(10, 1)), "echo").ok());
  }
  options.server = absl::StrCat(server_address_, ",", second.address);
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->UploadModel(WriteModel("m.onnx", Bytes(10, 1)), "echo").ok());
  ASSERT_TRUE(client->UploadModel(WriteModel("n.onnx", Bytes(10, 2)), "only-first").ok());
  Bytes first_session = client->session_id();

  std::atomic<int> done{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        float value = static_cast<float>(t * 100 + i);
        auto outputs = client->Infer("echo", {Fp32Tensor("x", {value, value, value})});
        if (!outputs.ok() || outputs->size() != 1 ||
            (*outputs)[0].raw() != Fp32Tensor("x", {value, value, value}).raw()) {
          ADD_FAILURE() << (outputs.ok() ? "wrong output" : outputs.status().ToString());
          ++failures;
        }
        ++done;
      }
    });
  }
  while (done.load() < 20) absl::SleepFor(absl::Milliseconds(1));
  server_->Shutdown();  // the first node goes away while calls are running
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(client->current_server(), second.address);
  EXPECT_NE(client->session_id(), first_session);
  EXPECT_TRUE(client->verdict().pass);
  EXPECT_EQ(second.peer->open_sessions.load(), 2);  // the uploader's, then the failover's
  EXPECT_GT(second.peer->sealed_calls.load(), 0);

  // A model uploaded only to the first node is not on the second, and the error says so.
  auto missing = client->Infer("only-first", {Fp32Tensor("x", {1, 2})});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("(on " + second.address + "; each node keeps its own models"));
  second.server->Shutdown();
}

TEST_F(ClientTest, FailsOverWhenTheRetryBudgetOnItsNodeIsSpent) {
  Node second = StartNode(measurement_);
  ClientOptions options = Options();
  options.retry_backoff = absl::Milliseconds(1);
  options.max_attempts = 2;
  options.server = absl::StrCat(server_address_, ",", second.address);
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  // The first node answers, but its worker keeps failing.
  peer_->sealed_calls = 0;
  peer_->RefuseNextSealedCalls(10, grpc::StatusCode::UNAVAILABLE, "enclave worker 0 is restarting");
  auto listed = client->ListModels();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(peer_->sealed_calls.load(), 2);  // the budget on the first node
  EXPECT_EQ(second.peer->open_sessions.load(), 1);
  EXPECT_EQ(second.peer->sealed_calls.load(), 1);
  EXPECT_EQ(client->current_server(), second.address);
  // It stays on the second node from now on.
  EXPECT_TRUE(client->ListModels().ok());
  EXPECT_EQ(peer_->sealed_calls.load(), 2);
  // When every node is down, the call fails with UNAVAILABLE.
  second.server->Shutdown();
  server_->Shutdown();
  server_.reset();
  EXPECT_EQ(client->ListModels().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ClientTest, CallsThatAreNotRetriedLeaveADownNodeForTheNextCall) {
  Node second = StartNode(measurement_);
  ClientOptions options = Options();
  options.server = absl::StrCat(server_address_, ",", second.address);
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  server_->Shutdown();
  server_.reset();
  // A delete is not retried, so it fails with the node; the upload after it moves on.
  absl::Status deleted = client->DeleteModel("echo");
  EXPECT_EQ(deleted.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(deleted.message()), HasSubstr(server_address_));
  auto uploaded = client->UploadModel(WriteModel("m.onnx", Bytes(10, 1)), "echo");
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(client->current_server(), second.address);
  EXPECT_EQ(second.peer->open_sessions.load(), 1);
  EXPECT_TRUE(client->Infer("echo", {Fp32Tensor("x", {1, 2})}).ok());
  second.server->Shutdown();
}

// ---- The CLI against the peer. ----

struct CliRun {
  int exit_code;
  std::string out;
  std::string err;
};

class CliAgainstPeerTest : public ClientTest {
 protected:
  CliRun Run(std::vector<std::string> args) {
    std::ostringstream out, err;
    CliIo io{out, err, env_, false};
    int code = RunCli(args, io);
    return {code, out.str(), err.str()};
  }
  void SetUp() override {
    ClientTest::SetUp();
    env_ = {{"CLOISTER_SERVER", server_address_},
            {"CLOISTER_TENANT", kTenant},
            {"CLOISTER_TOKEN_FILE", token_path_},
            {"CLOISTER_POLICY", policy_path_},
            {"CLOISTER_KEY", key_path_}};
  }
  std::map<std::string, std::string> env_;
};

TEST_F(CliAgainstPeerTest, Attest) {
  CliRun json = Run({"attest", "--json"});
  ASSERT_EQ(json.exit_code, kExitOk) << json.err;
  EXPECT_THAT(json.out, StartsWith("{\"verdict\":\"pass\",\"checks\":[{\"name\":"));
  EXPECT_EQ(std::count(json.out.begin(), json.out.end(), '\n'), 1);

  CliRun human = Run({"attest", "--fresh"});
  ASSERT_EQ(human.exit_code, kExitOk) << human.err;
  EXPECT_THAT(human.out, StartsWith("attestation: PASS\n  [pass] "));

  ASSERT_TRUE(attest::WriteDevPolicy(policy_path_, sim_dir(), Bytes(48, 0x11)).ok());
  CliRun failed = Run({"attest", "--json"});
  EXPECT_EQ(failed.exit_code, kExitRefused);
  EXPECT_THAT(failed.out, StartsWith("{\"verdict\":\"fail\""));
  EXPECT_THAT(failed.out, HasSubstr("\"result\":\"fail\""));
  EXPECT_THAT(failed.err, StartsWith("cloister: attestation failed: "));

  CliRun upload = Run({"upload", "--model", token_path_, "--name", "m"});
  EXPECT_EQ(upload.exit_code, kExitRefused);
  EXPECT_THAT(upload.err, StartsWith("cloister: attestation failed: "));
}

TEST_F(CliAgainstPeerTest, UploadModelsInferDelete) {
  std::string model = WriteModel("model.onnx", Bytes(5000, 1));
  CliRun upload = Run({"upload", "--model", model, "--name", "echo", "--json"});
  ASSERT_EQ(upload.exit_code, kExitOk) << upload.err;
  EXPECT_THAT(upload.out, StartsWith("{\"name\":\"echo\",\"handle\":\""));
  EXPECT_THAT(upload.out,
              HasSubstr(absl::StrCat("\"size\":5000,\"kind\":\"onnx\",\"digest\":\"",
                                     HexEncode(crypto::Sha256(Bytes(5000, 1))),
                                     "\",\"inputs\":[{\"name\":\"x\",\"datatype\":"
                                     "\"FP32\",\"shape\":[-1,3]}]")));

  CliRun models = Run({"models"});
  ASSERT_EQ(models.exit_code, kExitOk) << models.err;
  EXPECT_THAT(models.out, StartsWith("echo  (onnx, handle "));
  EXPECT_THAT(models.out,
              HasSubstr("\n  digest  sha256:" + HexEncode(crypto::Sha256(Bytes(5000, 1))) + "\n"));
  EXPECT_THAT(models.out, HasSubstr("  input   x  FP32 [?, 3]\n"));
  CliRun models_json = Run({"models", "--json"});
  EXPECT_THAT(models_json.out, StartsWith("{\"models\":[{\"name\":\"echo\""));

  std::string input = dir_ + "/x.npy";
  ASSERT_TRUE(WriteNpyFile(input, NpyArray{"INT32", {1, 2}, Bytes{1, 0, 0, 0, 2, 0, 0, 0}}).ok());
  std::string out_dir = dir_ + "/out";
  CliRun infer =
      Run({"infer", "--model", "echo", "--input", "x=" + input, "--output-dir", out_dir});
  ASSERT_EQ(infer.exit_code, kExitOk) << infer.err;
  auto written = ReadNpyFile(out_dir + "/x_out.npy");
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->datatype, "INT32");
  EXPECT_EQ(written->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(written->data, (Bytes{1, 0, 0, 0, 2, 0, 0, 0}));

  CliRun infer_json = Run({"infer", "--model", "echo", "--input", "x=" + input, "--json"});
  ASSERT_EQ(infer_json.exit_code, kExitOk) << infer_json.err;
  EXPECT_EQ(infer_json.out,
            "{\"outputs\":[{\"name\":\"x_out\",\"datatype\":\"INT32\",\"shape\":[1,2],"
            "\"data\":[1,2]}]}\n");

  CliRun deleted = Run({"delete", "--model", "echo", "--json"});
  ASSERT_EQ(deleted.exit_code, kExitOk) << deleted.err;
  EXPECT_EQ(deleted.out, "{\"deleted\":\"echo\"}\n");
  CliRun missing = Run({"infer", "--model", "echo", "--input", "x=" + input, "--json"});
  EXPECT_EQ(missing.exit_code, kExitRefused);
  EXPECT_EQ(missing.err, "cloister: no such model for this identity\n");
  EXPECT_EQ(missing.out, "");
  CliRun none = Run({"models"});
  EXPECT_EQ(none.out, "no models\n");
}

TEST_F(CliAgainstPeerTest, UploadsACheckpointFolder) {
  std::string folder = dir_ + "/tiny";
  ASSERT_TRUE(MakeDirs(folder).ok());
  WriteModel("tiny/config.json", ToBytes("{}"));
  WriteModel("tiny/tokenizer.json", ToBytes("{}"));
  WriteModel("tiny/model.safetensors", Bytes(100, 7));
  auto package = PackModelDir(folder, uint64_t{1} << 20);
  ASSERT_TRUE(package.ok()) << package.status();
  std::string digest = HexEncode(crypto::Sha256(*package));
  CliRun upload = Run({"upload", "--model", folder, "--name", "tiny"});
  ASSERT_EQ(upload.exit_code, kExitOk) << upload.err;
  EXPECT_THAT(upload.out, StartsWith("uploaded tiny  (llm, handle "));
  EXPECT_THAT(upload.out, HasSubstr("\n  digest  sha256:" + digest + "\n"));
  EXPECT_THAT(upload.out, HasSubstr("generative model"));
  CliRun models = Run({"models", "--json"});
  ASSERT_EQ(models.exit_code, kExitOk) << models.err;
  EXPECT_THAT(models.out, HasSubstr("\"kind\":\"llm\",\"digest\":\"" + digest + "\""));
}

TEST_F(CliAgainstPeerTest, SeveralServers) {
  std::string closed = ClosedAddress();
  CliRun flag = Run({"attest", "--json", "--server", closed + "," + server_address_});
  ASSERT_EQ(flag.exit_code, kExitOk) << flag.err;
  EXPECT_THAT(flag.out, StartsWith("{\"verdict\":\"pass\""));
  env_["CLOISTER_SERVER"] = closed + "," + server_address_;
  CliRun models = Run({"models"});
  ASSERT_EQ(models.exit_code, kExitOk) << models.err;
  EXPECT_EQ(models.out, "no models\n");
  EXPECT_EQ(peer_->open_sessions.load(), 1);
  env_["CLOISTER_SERVER"] = server_address_ + ",";
  CliRun bad = Run({"models"});
  EXPECT_EQ(bad.exit_code, kExitUsage);
  EXPECT_THAT(bad.err, HasSubstr("has an empty entry"));
}

TEST_F(CliAgainstPeerTest, WrongTokenIsARefusal) {
  env_["CLOISTER_TOKEN_FILE"] = dir_ + "/bad-token";
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/bad-token", "nope\n").ok());
  CliRun run = Run({"models"});
  EXPECT_EQ(run.exit_code, kExitRefused);
  EXPECT_EQ(run.err, "cloister: GetEvidence: unknown tenant or wrong API token\n");
}

}  // namespace
}  // namespace cloister::sdk
