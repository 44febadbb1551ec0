// The harness of the Client tests (client_test.cc, client_endpoints_test.cc and
// cli_against_peer_test.cc, one binary): an in-process gRPC peer that plays cloisterd and the
// enclave by the rules of docs/PROTOCOL.md: real simulated evidence (attest/sim), HPKE session
// setup, the session channel of crypto/channel.h, chunked decryption of uploads. The peer is
// deliberately small (its "models" echo their inputs); the real cloisterd and enclave are
// exercised by the lead's end-to-end tests. What this checks is the client's side of the wire
// contract. ClientTest is the fixture: simulated roots, a policy, a key, a token and a running
// peer per test, and more nodes on request.
// Threading: the peer serves gRPC threads (its state is guarded by `mu`); the fixture is used by
// the test's thread.
#pragma once

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
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

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
#include "proto/error_reason.h"
#include "proto/model_package.h"
#include "sdk/client.h"
#include "sdk/npy.h"
#include "tests/support/temp_dir.h"

namespace cloister::sdk::client_test {

namespace api = ::cloister::api::v1;

inline constexpr char kTenant[] = "demo";
inline constexpr char kToken[] = "s3cret-token";

inline std::string Str(ByteSpan b) { return std::string(b.begin(), b.end()); }
inline ByteSpan Span(const std::string& s) {
  return ByteSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// ---- The peer. ----

class EnclavePeer final : public api::Cloister::Service {
 public:
  struct Options {
    int64_t session_lifetime_seconds = 3600;
    bool tamper_replies = false;
  };

  // What the peer does to its next Generate streams, as a host could (the chunks themselves are
  // sealed correctly).
  enum class StreamFault {
    kNone,
    kDropChunk1,       // chunk 1 is never sent
    kSwapChunks1And2,  // chunks 1 and 2 are sent the other way round
    kReplayChunk0,     // chunk 0 is sent twice
    kTamperChunk1,     // a bit of chunk 1's ciphertext is flipped
    kNoFinal,          // the stream ends (OK) without its final chunk
    kChunkAfterFinal,  // one more chunk, sealed properly, follows the final one
    kFailAfterChunk0,  // the RPC fails UNAVAILABLE after chunk 0, as when a worker dies
  };
  void SetStreamFault(StreamFault fault) {
    absl::MutexLock lock(&mu);
    stream_fault_ = fault;
  }
  // The plaintext of the last Generate request that opened.
  api::GenerateRequest last_generate_request() {
    absl::MutexLock lock(&mu);
    return last_generate_request_;
  }

  // The next `count` sealed calls (ListModels, DeleteModel, Infer, Generate) are refused with
  // `code` and `message` (and `reason` in the status details), as cloisterd refuses calls whose
  // enclave worker died.
  void RefuseNextSealedCalls(int count, grpc::StatusCode code, std::string message,
                             api::ErrorReason reason = api::ERROR_REASON_UNSPECIFIED) {
    absl::MutexLock lock(&mu);
    refusals_left_ = count;
    std::string details = proto::GrpcErrorDetails(
        proto::WithReason(absl::Status(static_cast<absl::StatusCode>(code), message), reason));
    refusal_ = grpc::Status(code, std::move(message), std::move(details));
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

  grpc::Status ListModels(grpc::ServerContext* context, const api::SealedRequest* call,
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

  grpc::Status DeleteModel(grpc::ServerContext* context, const api::SealedRequest* call,
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
  grpc::Status Infer(grpc::ServerContext* context, const api::SealedRequest* call,
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

  // The peer's LLMs echo the prompt: each character of a text prompt is one token (its byte as
  // the id), sent one token per chunk; token ids come back as they were sent, text "[id]"; a
  // chat answers with its last message's content. max_tokens cuts the echo ("length"); a stop
  // string ends it before the stop ("stop"). An unknown model is an error chunk.
  grpc::Status Generate(grpc::ServerContext* context, const api::SealedRequest* call,
                        grpc::ServerWriter<api::SealedChunk>* writer) override {
    if (grpc::Status auth = Authenticate(*context); !auth.ok()) return auth;
    ++sealed_calls;
    std::vector<api::SealedChunk> chunks;
    StreamFault fault;
    {
      absl::MutexLock lock(&mu);
      if (refusals_left_ > 0) {
        --refusals_left_;
        return refusal_;
      }
      fault = stream_fault_;
      auto it = sessions_.find(call->session_id());
      if (it == sessions_.end()) return Refuse("unknown session");
      PeerSession& session = *it->second;
      crypto::MessageHeader header{crypto::MessageKind::kGenerate, call->request_id(),
                                   call->model_handle()};
      auto plaintext = session.receiver->Open(call->sequence(), header, Span(call->ciphertext()));
      if (!plaintext.ok()) return Refuse(std::string(plaintext.status().message()));
      api::GenerateRequest request;
      if (!request.ParseFromArray(plaintext->data(), plaintext->size())) return Refuse("request");
      last_generate_request_ = request;
      std::vector<api::GenerateChunk> plain = EchoChunks(session.identity, *call, request);
      auto seal = [&](uint64_t number, bool final, const api::GenerateChunk& plaintext) {
        crypto::MessageHeader chunk_header{crypto::MessageKind::kGenerateChunk, call->request_id(),
                                           call->model_handle(), number, final};
        auto sealed = session.sender->Seal(chunk_header, Span(plaintext.SerializeAsString()));
        api::SealedChunk& chunk = chunks.emplace_back();
        chunk.set_sequence(sealed->first);
        chunk.set_chunk(number);
        chunk.set_final(final);
        chunk.set_ciphertext(Str(sealed->second));
      };
      for (size_t i = 0; i < plain.size(); ++i) seal(i, i + 1 == plain.size(), plain[i]);
      // One more chunk, sealed properly, after the final one.
      if (fault == StreamFault::kChunkAfterFinal) seal(plain.size(), false, plain.front());
    }
    switch (fault) {
      case StreamFault::kDropChunk1:
        if (chunks.size() > 1) chunks.erase(chunks.begin() + 1);
        break;
      case StreamFault::kSwapChunks1And2:
        if (chunks.size() > 2) std::swap(chunks[1], chunks[2]);
        break;
      case StreamFault::kReplayChunk0:
        chunks.insert(chunks.begin() + 1, chunks.front());
        break;
      case StreamFault::kTamperChunk1:
        if (chunks.size() > 1) (*chunks[1].mutable_ciphertext())[0] ^= 1;
        break;
      case StreamFault::kNoFinal:
        chunks.pop_back();
        break;
      case StreamFault::kFailAfterChunk0:
        writer->Write(chunks.front());
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "enclave worker 0 exited");
      default:
        break;
    }
    for (const api::SealedChunk& chunk : chunks) {
      if (!writer->Write(chunk)) break;
    }
    return grpc::Status::OK;
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
    api::SealedRequest finish;
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

  // The plaintext chunks of one echo generation (see Generate), the final one last.
  std::vector<api::GenerateChunk> EchoChunks(const Bytes& identity, const api::SealedRequest& call,
                                             const api::GenerateRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = models_.find(call.model_handle());
    if (it == models_.end() || it->second.first != identity) {
      api::GenerateChunk error;
      error.set_code(static_cast<int>(absl::StatusCode::kNotFound));
      error.set_message("model not found");
      return {error};
    }
    std::vector<std::pair<int32_t, std::string>> tokens;
    if (request.has_ids()) {
      for (int32_t id : request.ids().ids()) tokens.emplace_back(id, absl::StrCat("[", id, "]"));
    } else {
      std::string text = request.has_chat() && request.chat().messages_size() > 0
                             ? request.chat().messages().rbegin()->content()
                             : request.text();
      for (char c : text) tokens.emplace_back(static_cast<uint8_t>(c), std::string(1, c));
    }
    std::string finish = "stop";
    std::string so_far;
    std::vector<api::GenerateChunk> chunks;
    for (const auto& [id, text] : tokens) {
      if (request.max_tokens() > 0 && chunks.size() >= request.max_tokens()) {
        finish = "length";
        break;
      }
      so_far += text;
      bool stopped = false;
      for (const std::string& stop : request.stop()) {
        stopped = stopped || so_far.find(stop) != std::string::npos;
      }
      if (stopped) break;
      api::GenerateChunk& chunk = chunks.emplace_back();
      chunk.set_text(text);
      chunk.add_tokens()->set_id(id);
      chunk.set_padding(std::string(16, '\0'));
    }
    api::GenerateChunk& last = chunks.emplace_back();
    last.set_finish_reason(finish);
    last.mutable_usage()->set_prompt_tokens(tokens.size());
    last.mutable_usage()->set_completion_tokens(chunks.size() - 1);
    last.set_receipt("peer receipt");
    last.set_receipt_signature("peer signature");
    return chunks;
  }

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
  grpc::Status Sealed(const grpc::ServerContext& context, const api::SealedRequest& call,
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
  StreamFault stream_fault_ ABSL_GUARDED_BY(mu) = StreamFault::kNone;
  api::GenerateRequest last_generate_request_ ABSL_GUARDED_BY(mu);
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
    suite_dir_ = new std::string(cloister::testing::MakeTempDir("client-test"));
    ASSERT_FALSE(suite_dir_->empty());
    ASSERT_TRUE(attest::EnsureSimRoots(*suite_dir_ + "/sim").ok());
  }
  static void TearDownTestSuite() { delete suite_dir_; }

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

  static inline std::string* suite_dir_ = nullptr;
  Bytes measurement_ = Bytes(48, 0x5a);
  std::unique_ptr<EnclavePeer> peer_;
  std::unique_ptr<grpc::Server> server_;
  std::string server_address_;
  std::string dir_, policy_path_, key_path_, token_path_;
};

inline api::Tensor Fp32Tensor(const std::string& name, std::vector<float> values) {
  Bytes raw(values.size() * 4);
  std::memcpy(raw.data(), values.data(), raw.size());
  return ToTensor(name, NpyArray{"FP32", {1, static_cast<int64_t>(values.size())}, raw});
}

}  // namespace cloister::sdk::client_test
