#include "tests/tamper/grpc_tamper_proxy.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "crypto/chunked.h"

namespace cloister::testing {
namespace {

using api::v1::SealedRequest;
using api::v1::SealedReply;
using api::v1::UploadModelRequest;

constexpr size_t kDataMessageSize = size_t{1} << 20;

void FlipBit(std::string& bytes) {
  if (!bytes.empty()) bytes[bytes.size() / 2] ^= 0x10;
}

void Truncate(std::string& bytes) { bytes.resize(bytes.size() / 2); }

// The upstream call's context: the caller's tenant and token, and its deadline.
void CopyCallerContext(const grpc::ServerContext& from, grpc::ClientContext& to) {
  for (const char* key : {"x-cloister-tenant", "authorization"}) {
    auto [begin, end] = from.client_metadata().equal_range(key);
    for (auto it = begin; it != end; ++it) {
      to.AddMetadata(key, std::string(it->second.data(), it->second.size()));
    }
  }
  if (from.deadline() != std::chrono::system_clock::time_point::max()) {
    to.set_deadline(from.deadline());
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcTamperProxy>> GrpcTamperProxy::Start(
    const std::string& upstream) {
  std::unique_ptr<GrpcTamperProxy> proxy(new GrpcTamperProxy());
  proxy->upstream_ =
      api::v1::Cloister::NewStub(grpc::CreateChannel(upstream, grpc::InsecureChannelCredentials()));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(proxy.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  proxy->server_ = builder.BuildAndStart();
  if (proxy->server_ == nullptr || port == 0) {
    return absl::UnavailableError("tamper proxy: cannot listen on 127.0.0.1");
  }
  proxy->address_ = absl::StrCat("127.0.0.1:", port);
  return proxy;
}

GrpcTamperProxy::~GrpcTamperProxy() {
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

void GrpcTamperProxy::SetPlan(GrpcMutation mutation, const std::string& rpc) {
  absl::MutexLock lock(&mu_);
  mutation_ = mutation;
  rpc_ = rpc;
  applied_ = false;
  remembered_call_.reset();
  remembered_reply_.reset();
  remembered_open_.reset();
  remembered_evidence_.reset();
  waiting_reply_ = nullptr;
  swapped_ = false;
  call_held_ = false;
  release_held_ = false;
}

bool GrpcTamperProxy::applied() const {
  absl::MutexLock lock(&mu_);
  return applied_;
}

grpc::Status GrpcTamperProxy::GetEvidence(grpc::ServerContext* context,
                                          const api::v1::GetEvidenceRequest* request,
                                          api::v1::GetEvidenceResponse* response) {
  grpc::ClientContext upstream;
  CopyCallerContext(*context, upstream);
  grpc::Status status = upstream_->GetEvidence(&upstream, *request, response);
  if (!status.ok()) return status;
  absl::MutexLock lock(&mu_);
  if (applied_) return status;
  if (mutation_ == GrpcMutation::kFlipEvidence) {
    FlipBit(*response->mutable_challenge_response());
    applied_ = true;
  } else if (mutation_ == GrpcMutation::kReplayEvidence) {
    if (!remembered_evidence_) {
      remembered_evidence_ = *response;
    } else {
      *response = *remembered_evidence_;
      applied_ = true;
    }
  }
  return status;
}

grpc::Status GrpcTamperProxy::OpenSession(grpc::ServerContext* context,
                                          const api::v1::OpenSessionRequest* request,
                                          api::v1::OpenSessionResponse* response) {
  api::v1::OpenSessionRequest forwarded = *request;
  bool flip_welcome = false;
  bool change_session_id = false;
  {
    absl::MutexLock lock(&mu_);
    if (!applied_) {
      if (mutation_ == GrpcMutation::kFlipEvidenceDigest) {
        FlipBit(*forwarded.mutable_evidence_digest());
        applied_ = true;
      } else if (mutation_ == GrpcMutation::kChangeSessionId) {
        change_session_id = true;
      } else if (mutation_ == GrpcMutation::kFlipHello) {
        FlipBit(*forwarded.mutable_sealed_hello());
        applied_ = true;
      } else if (mutation_ == GrpcMutation::kFlipWelcome) {
        flip_welcome = true;
      } else if (mutation_ == GrpcMutation::kReplayOpenSession) {
        if (!remembered_open_) {
          remembered_open_ = *request;
        } else {
          forwarded = *remembered_open_;
          applied_ = true;
        }
      }
    }
  }
  grpc::ClientContext upstream;
  CopyCallerContext(*context, upstream);
  grpc::Status status = upstream_->OpenSession(&upstream, forwarded, response);
  if (change_session_id && status.ok()) {
    FlipBit(*response->mutable_session_id());
    absl::MutexLock lock(&mu_);
    applied_ = true;
  }
  if (flip_welcome && status.ok()) {
    FlipBit(*response->mutable_sealed_welcome());
    absl::MutexLock lock(&mu_);
    applied_ = true;
  }
  return status;
}

grpc::Status GrpcTamperProxy::UploadModel(grpc::ServerContext* context,
                                          grpc::ServerReader<UploadModelRequest>* reader,
                                          api::v1::UploadModelResponse* response) {
  // The whole stream is read first, so the data can be rearranged before any is sent.
  std::vector<UploadModelRequest> messages;
  UploadModelRequest message;
  while (reader->Read(&message)) messages.push_back(std::move(message));

  GrpcMutation mutation;
  {
    absl::MutexLock lock(&mu_);
    mutation = applied_ ? GrpcMutation::kOff : mutation_;
  }
  bool applied = false;
  std::string data;
  size_t first_data = messages.size();
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].has_data()) {
      if (first_data == messages.size()) first_data = i;
      data += messages[i].data();
    }
  }
  const bool rewrite_data = mutation == GrpcMutation::kFlipUploadData ||
                            mutation == GrpcMutation::kTruncateUploadData ||
                            mutation == GrpcMutation::kTruncateUploadAtChunk ||
                            mutation == GrpcMutation::kReorderUploadData;
  const size_t chunk = crypto::kChunkedCipherChunkSize;
  if (rewrite_data && first_data < messages.size()) {
    if (mutation == GrpcMutation::kFlipUploadData) {
      FlipBit(data);
      applied = true;
    } else if (mutation == GrpcMutation::kTruncateUploadData) {
      Truncate(data);
      applied = true;
    } else if (mutation == GrpcMutation::kTruncateUploadAtChunk) {
      // Whole chunks only, and the start declares the shorter size, so the stream looks
      // complete to cloisterd: only the format's last-chunk marking can tell.
      const size_t header = crypto::kChunkedHeaderSize;
      const size_t whole = (data.size() - header - 1) / chunk;  // chunks before the last
      if (whole >= 1) {
        data.resize(header + whole * chunk);
        for (UploadModelRequest& m : messages) {
          if (m.has_start()) m.mutable_start()->set_ciphertext_size(data.size());
        }
        applied = true;
      }
    } else if (data.size() > crypto::kChunkedHeaderSize + 2 * chunk) {
      // Header, chunk 1, chunk 2, rest  ->  header, chunk 2, chunk 1, rest.
      const size_t header = crypto::kChunkedHeaderSize;
      data = data.substr(0, header) + data.substr(header + chunk, chunk) +
             data.substr(header, chunk) + data.substr(header + 2 * chunk);
      applied = true;
    }
    // The rewritten data goes where the first data message was, in messages of at most
    // kDataMessageSize.
    std::vector<UploadModelRequest> rewritten;
    for (size_t i = 0; i < messages.size(); ++i) {
      if (i == first_data) {
        for (size_t offset = 0; offset < data.size(); offset += kDataMessageSize) {
          UploadModelRequest piece;
          piece.set_data(data.substr(offset, kDataMessageSize));
          rewritten.push_back(std::move(piece));
        }
      } else if (!messages[i].has_data()) {
        rewritten.push_back(std::move(messages[i]));
      }
    }
    messages = std::move(rewritten);
  }
  for (UploadModelRequest& m : messages) {
    if (!m.has_finish()) continue;
    if (mutation == GrpcMutation::kFlipUploadFinish) {
      FlipBit(*m.mutable_finish()->mutable_ciphertext());
      applied = true;
    } else if (mutation == GrpcMutation::kReplayUploadFinish) {
      absl::MutexLock lock(&mu_);
      if (!remembered_call_) {
        remembered_call_ = m.finish();
      } else {
        *m.mutable_finish() = *remembered_call_;
        applied = true;
      }
    }
  }
  if (applied && mutation == GrpcMutation::kReplayUploadFinish) {
    // The replayed finish names the earlier model; so does the start, or cloisterd would
    // notice the mismatch before the enclave sees the replay.
    absl::MutexLock lock(&mu_);
    for (UploadModelRequest& m : messages) {
      if (m.has_start()) m.mutable_start()->set_model_handle(remembered_call_->model_handle());
    }
  }

  grpc::ClientContext upstream;
  CopyCallerContext(*context, upstream);
  api::v1::UploadModelResponse upstream_response;
  std::unique_ptr<grpc::ClientWriter<UploadModelRequest>> writer =
      upstream_->UploadModel(&upstream, &upstream_response);
  for (const UploadModelRequest& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (status.ok() && mutation == GrpcMutation::kFlipUploadReply) {
    FlipBit(*upstream_response.mutable_reply()->mutable_ciphertext());
    applied = true;
  }
  *response = std::move(upstream_response);
  if (applied) {
    absl::MutexLock lock(&mu_);
    applied_ = true;
  }
  return status;
}

grpc::Status GrpcTamperProxy::ListModels(grpc::ServerContext* context, const SealedRequest* request,
                                         SealedReply* response) {
  return ForwardSealed("ListModels", context, *request, response);
}

grpc::Status GrpcTamperProxy::DeleteModel(grpc::ServerContext* context, const SealedRequest* request,
                                          SealedReply* response) {
  return ForwardSealed("DeleteModel", context, *request, response);
}

grpc::Status GrpcTamperProxy::Generate(grpc::ServerContext* context, const SealedRequest* request,
                                       grpc::ServerWriter<api::v1::SealedChunk>* writer) {
  grpc::ClientContext upstream;
  CopyCallerContext(*context, upstream);
  auto reader = upstream_->Generate(&upstream, *request);
  std::vector<api::v1::SealedChunk> chunks;
  api::v1::SealedChunk chunk;
  while (reader->Read(&chunk)) chunks.push_back(chunk);
  grpc::Status status = reader->Finish();
  {
    absl::MutexLock lock(&mu_);
    const bool long_enough = chunks.size() >= 3;
    if (!applied_ && long_enough) {
      switch (mutation_) {
        case GrpcMutation::kDropChunk:
          chunks.erase(chunks.begin() + 1);
          applied_ = true;
          break;
        case GrpcMutation::kReorderChunks:
          std::swap(chunks[1], chunks[2]);
          applied_ = true;
          break;
        case GrpcMutation::kReplayChunk:
          chunks.insert(chunks.begin() + 2, chunks[0]);
          applied_ = true;
          break;
        case GrpcMutation::kTruncateStream:
          chunks.pop_back();
          applied_ = true;
          break;
        case GrpcMutation::kFlipChunk:
          FlipBit(*chunks[1].mutable_ciphertext());
          applied_ = true;
          break;
        case GrpcMutation::kMarkFinal:
          chunks.resize(2);
          chunks[1].set_final(true);
          applied_ = true;
          break;
        case GrpcMutation::kSpliceChunk:
          if (!remembered_chunk_) {
            remembered_chunk_ = chunks[1];
          } else {
            chunks[1] = *remembered_chunk_;
            applied_ = true;
          }
          break;
        case GrpcMutation::kAfterFinal:
          chunks.push_back(chunks[1]);
          applied_ = true;
          break;
        default:
          break;
      }
    }
  }
  for (const api::v1::SealedChunk& out : chunks) {
    if (!writer->Write(out)) break;
  }
  return status;
}

grpc::Status GrpcTamperProxy::Infer(grpc::ServerContext* context, const SealedRequest* request,
                                    SealedReply* response) {
  return ForwardSealed("Infer", context, *request, response);
}

grpc::Status GrpcTamperProxy::ForwardSealed(const std::string& rpc, grpc::ServerContext* context,
                                            const SealedRequest& request, SealedReply* response) {
  SealedRequest forwarded = request;
  bool overtaking = false;  // kReorderCalls: this call overtakes a held one
  bool withhold = false;    // kCrossRpc: this call is kept back, never delivered
  {
    absl::MutexLock lock(&mu_);
    if (!applied_ && (rpc == rpc_ || mutation_ == GrpcMutation::kCrossRpc)) {
      switch (mutation_) {
        case GrpcMutation::kFlipCall:
          FlipBit(*forwarded.mutable_ciphertext());
          applied_ = true;
          break;
        case GrpcMutation::kTruncateCall:
          Truncate(*forwarded.mutable_ciphertext());
          applied_ = true;
          break;
        case GrpcMutation::kReplayCall:
          if (!remembered_call_) {
            remembered_call_ = request;
          } else {
            forwarded = *remembered_call_;
            applied_ = true;
          }
          break;
        case GrpcMutation::kReorderCalls:
          if (!call_held_) {
            call_held_ = true;
            mu_.AwaitWithTimeout(absl::Condition(&release_held_), absl::Seconds(5));
          } else {
            overtaking = true;
          }
          break;
        case GrpcMutation::kCrossRpc:
          if (!remembered_call_) {
            if (rpc == "Infer") {
              remembered_call_ = request;
              withhold = true;
            }
          } else if (rpc == "ListModels") {
            forwarded = *remembered_call_;
            applied_ = true;
          }
          break;
        case GrpcMutation::kSpliceSession:
          if (!remembered_call_) {
            remembered_call_ = request;
          } else if (request.session_id() != remembered_call_->session_id()) {
            forwarded.set_session_id(remembered_call_->session_id());
            applied_ = true;
          }
          break;
        default:
          break;
      }
    }
  }
  if (withhold) {
    // ABORTED, which the SDK does not retry, so the session stays and the withheld call's
    // sequence number stays unused at the enclave.
    return grpc::Status(grpc::StatusCode::ABORTED, "tamper proxy: call withheld");
  }
  grpc::ClientContext upstream;
  CopyCallerContext(*context, upstream);
  SealedReply reply;
  grpc::Status status;
  if (rpc == "Infer") {
    status = upstream_->Infer(&upstream, forwarded, &reply);
  } else if (rpc == "ListModels") {
    status = upstream_->ListModels(&upstream, forwarded, &reply);
  } else {
    status = upstream_->DeleteModel(&upstream, forwarded, &reply);
  }
  if (overtaking) {
    absl::MutexLock lock(&mu_);
    release_held_ = true;
    applied_ = true;
  }
  if (status.ok() && MutateReply(rpc, reply)) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "tamper proxy: reply withheld");
  }
  *response = std::move(reply);
  return status;
}

bool GrpcTamperProxy::MutateReply(const std::string& rpc, SealedReply& reply) {
  absl::MutexLock lock(&mu_);
  bool forged = false;
  if (applied_ || rpc != rpc_) return forged;
  switch (mutation_) {
    case GrpcMutation::kFlipReply:
      FlipBit(*reply.mutable_ciphertext());
      applied_ = true;
      break;
    case GrpcMutation::kTruncateReply:
      Truncate(*reply.mutable_ciphertext());
      applied_ = true;
      break;
    case GrpcMutation::kForgeUnavailable:
      applied_ = true;
      forged = true;
      break;
    case GrpcMutation::kReplayReply:
      if (!remembered_reply_) {
        remembered_reply_ = reply;
      } else {
        reply = *remembered_reply_;
        applied_ = true;
      }
      break;
    case GrpcMutation::kSwapReplies:
      if (waiting_reply_ == nullptr) {
        // The first reply waits (up to 5 s) for a second one to trade places with.
        waiting_reply_ = &reply;
        swapped_ = false;
        mu_.AwaitWithTimeout(absl::Condition(&swapped_), absl::Seconds(5));
        waiting_reply_ = nullptr;
      } else {
        std::swap(*waiting_reply_, reply);
        swapped_ = true;
        applied_ = true;
      }
      break;
    default:
      break;
  }
  return forged;
}

}  // namespace cloister::testing
