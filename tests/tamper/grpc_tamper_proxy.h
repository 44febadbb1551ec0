// A hostile network between the SDK and cloisterd, for the tamper tests: a gRPC server that
// implements cloister.v1.Cloister on a loopback port and forwards every call to the real
// cloisterd through a stub (with the caller's tenant and authorization metadata), changing
// what passes the way an attacker on the path could: bit flips and truncation of sealed calls
// and replies, swapping the replies of two concurrent calls, replaying an earlier call or
// reply, splicing a call into another session (of the same or another tenant), and the same
// family on OpenSession and on UploadModel's start, data and finish messages.
//
// A plan (SetPlan) applies its mutation once, to the first call that qualifies, then relays
// unchanged until the next SetPlan; applied() says whether it happened.
//
// Threading: thread-safe; calls are served on gRPC's sync server threads, and SetPlan may be
// called from any thread. Ownership: owns its server and its stub's channel.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cloister/api/v1/api.grpc.pb.h"

namespace cloister::testing {

enum class GrpcMutation {
  kOff,
  // Sealed unary calls (the rpc named in the plan: Infer, ListModels or DeleteModel).
  kFlipCall,          // flip one bit of the call's ciphertext
  kTruncateCall,      // cut the call's ciphertext to half
  kFlipReply,         // flip one bit of the reply's ciphertext
  kTruncateReply,     // cut the reply's ciphertext to half
  kSwapReplies,       // two concurrent calls: each gets the other's reply
  kForgeUnavailable,  // deliver the call, then answer UNAVAILABLE instead of the reply
  kReplayCall,        // remember the first call; send it again in place of the next one
  kReplayReply,       // remember the first reply; answer the next call with it
  kReorderCalls,      // hold the first call until the next one has been answered, then send it
                      // (harmless: both are inside the replay window and each gets its answer)
  kCrossRpc,          // withhold the first Infer call (answer ABORTED), then send it in place of
                      // the next ListModels call
  kSpliceSession,     // remember the first call's session; move the next call from another
                      // session (same or other tenant, kept with its own credentials) under it
  // GetEvidence and OpenSession.
  kFlipEvidence,        // flip one bit of the evidence (the challenge response)
  kReplayEvidence,      // remember the first evidence; answer the next GetEvidence with it
  kFlipEvidenceDigest,  // flip one bit of the evidence digest the client sends to OpenSession
  kChangeSessionId,     // answer OpenSession with another session id
  kFlipHello,           // flip one bit of the sealed hello
  kFlipWelcome,         // flip one bit of the sealed welcome
  kReplayOpenSession,   // remember the first OpenSession; send it in place of the next one
                        // (from the same or another tenant)
  // UploadModel.
  kFlipUploadData,         // flip one bit of the model ciphertext
  kTruncateUploadData,     // drop the second half of the model ciphertext
  kTruncateUploadAtChunk,  // drop the model's last ciphertext chunk and declare the shorter size
  kReorderUploadData,      // send the model's second ciphertext chunk before its first
  kFlipUploadFinish,       // flip one bit of the sealed load request
  kReplayUploadFinish,     // remember the first upload's finish; use it in the next upload
  kFlipUploadReply,        // flip one bit of the sealed load reply
  // Generate streams (the whole stream is read from cloisterd, then relayed changed).
  kDropChunk,          // leave out chunk 1
  kReorderChunks,      // send chunk 2 before chunk 1
  kReplayChunk,        // send chunk 0 again after chunk 1
  kTruncateStream,     // leave out the final chunk and end the RPC with OK
  kFlipChunk,          // flip one bit of chunk 1's ciphertext
  kMarkFinal,          // mark chunk 1 final and end the stream there
  kSpliceChunk,        // remember chunk 1 of the first stream; put it in place of the next one's
  kAfterFinal,         // send chunk 1 again after the final chunk
};

class GrpcTamperProxy final : public api::v1::Cloister::Service {
 public:
  // Listens on 127.0.0.1 (a free port) and forwards to `upstream` (HOST:PORT, plaintext).
  static absl::StatusOr<std::unique_ptr<GrpcTamperProxy>> Start(const std::string& upstream);
  ~GrpcTamperProxy() override;

  // HOST:PORT to point clients at.
  const std::string& address() const { return address_; }
  // Switches to `mutation` for `rpc` (for the sealed unary calls) and forgets what the last
  // plan remembered.
  void SetPlan(GrpcMutation mutation, const std::string& rpc = "Infer");
  // Whether the current plan's mutation has been applied.
  bool applied() const;

  grpc::Status GetEvidence(grpc::ServerContext* context, const api::v1::GetEvidenceRequest* request,
                           api::v1::GetEvidenceResponse* response) override;
  grpc::Status OpenSession(grpc::ServerContext* context, const api::v1::OpenSessionRequest* request,
                           api::v1::OpenSessionResponse* response) override;
  grpc::Status UploadModel(grpc::ServerContext* context,
                           grpc::ServerReader<api::v1::UploadModelRequest>* reader,
                           api::v1::UploadModelResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* context, const api::v1::SealedRequest* request,
                          api::v1::SealedReply* response) override;
  grpc::Status DeleteModel(grpc::ServerContext* context, const api::v1::SealedRequest* request,
                           api::v1::SealedReply* response) override;
  grpc::Status Infer(grpc::ServerContext* context, const api::v1::SealedRequest* request,
                     api::v1::SealedReply* response) override;
  grpc::Status Generate(grpc::ServerContext* context, const api::v1::SealedRequest* request,
                        grpc::ServerWriter<api::v1::SealedChunk>* writer) override;

 private:
  GrpcTamperProxy() = default;

  // Forwards one sealed unary call named `rpc`, mutated as the plan says.
  grpc::Status ForwardSealed(const std::string& rpc, grpc::ServerContext* context,
                             const api::v1::SealedRequest& request, api::v1::SealedReply* response);
  // Applies the plan's reply-side mutation (swap waits for a partner, up to 5 seconds); true
  // when the reply is to be replaced by a forged UNAVAILABLE.
  bool MutateReply(const std::string& rpc, api::v1::SealedReply& reply);

  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<api::v1::Cloister::Stub> upstream_;

  mutable absl::Mutex mu_;
  GrpcMutation mutation_ ABSL_GUARDED_BY(mu_) = GrpcMutation::kOff;
  std::string rpc_ ABSL_GUARDED_BY(mu_);
  bool applied_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<api::v1::SealedRequest> remembered_call_ ABSL_GUARDED_BY(mu_);
  std::optional<api::v1::SealedReply> remembered_reply_ ABSL_GUARDED_BY(mu_);
  std::optional<api::v1::OpenSessionRequest> remembered_open_ ABSL_GUARDED_BY(mu_);
  std::optional<api::v1::GetEvidenceResponse> remembered_evidence_ ABSL_GUARDED_BY(mu_);
  std::optional<api::v1::SealedChunk> remembered_chunk_ ABSL_GUARDED_BY(mu_);
  // kSwapReplies: the reply of the first call, waiting for a partner to swap with.
  api::v1::SealedReply* waiting_reply_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool swapped_ ABSL_GUARDED_BY(mu_) = false;
  // kReorderCalls: whether a first call is being held, and whether it may go now.
  bool call_held_ ABSL_GUARDED_BY(mu_) = false;
  bool release_held_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace cloister::testing
