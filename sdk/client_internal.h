// Internals of Client (client.h) shared by its source files: client.cc (options, channels, gRPC
// errors, Connect), client_session.cc (attestation, sessions, failover), client_sealed_call.cc
// (sealed unary calls and the retries of every call), client_upload.cc (UploadModel),
// client_calls.cc (ListModels, DeleteModel, Infer) and client_generate.cc (Generate); also
// generate_stream.cc. Not for use outside the SDK.
// Threading: the functions keep no state; a Session's channel is guarded by its own mutex.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/bytes.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "cloister/api/v1/api.pb.h"
#include "cloister/attest/v1/evidence.pb.h"
#include "crypto/channel.h"
#include "google/protobuf/message.h"
#include "sdk/client.h"

namespace cloister::sdk {

struct Client::Session {
  size_t endpoint = 0;  // index into Client::endpoints_: the node that holds this session
  Bytes id;
  absl::Time expires_at = absl::InfiniteFuture();
  uint64_t max_messages = 0;  // 0: no limit announced
  absl::Mutex mu;
  std::unique_ptr<crypto::ChannelSender> sender ABSL_GUARDED_BY(mu);
  std::unique_ptr<crypto::ChannelReceiver> receiver ABSL_GUARDED_BY(mu);
};

namespace client_internal {

// The checks on ClientOptions that both Attest and Connect make before any connection:
// InvalidArgument naming the missing or malformed setting.
absl::Status CheckConnectionOptions(const ClientOptions& options);

// ClientOptions::policy when set, else the policy file it names.
absl::StatusOr<cloister::attest::v1::Policy> ResolvePolicy(const ClientOptions& options);

// A stub for one endpoint of options.server, over TLS or plaintext as the options say.
absl::StatusOr<std::unique_ptr<cloister::api::v1::Cloister::Stub>> MakeStub(
    const ClientOptions& options, const std::string& server);

// Adds the tenant's metadata to `context`, and a deadline when `with_deadline` (`timeout`
// above zero replaces options.call_timeout).
void PrepareContext(grpc::ClientContext& context, const ClientOptions& options, bool with_deadline,
                    absl::Duration timeout = absl::ZeroDuration());

// Converts a gRPC failure into an absl::Status with the same code and a message that names
// the call and the server (one endpoint of options.server).
absl::Status FromGrpc(const grpc::Status& status, absl::string_view rpc, absl::string_view server,
                      const ClientOptions& options, absl::Duration timeout = absl::ZeroDuration());

std::string NewRequestId();

ByteSpan SpanOf(const std::string& s);

std::string StringOf(ByteSpan b);

// Wipes a std::string that held plaintext or a key.
void WipeString(std::string& s);

// The status of an error the enclave decided (a ReplyEnvelope's or a GenerateChunk's code,
// message and reason): that code (UNKNOWN when it is not an absl::StatusCode), the message (a
// stock one when it is empty) and the reason.
absl::Status EnclaveError(int code, const std::string& message,
                          cloister::api::v1::ErrorReason reason);

// Opens a sealed reply to `header` and unpacks its ReplyEnvelope into `reply`.
// The reply is opened in place, in its own ciphertext field.
absl::Status OpenReply(crypto::ChannelReceiver& receiver, const crypto::MessageHeader& header,
                       cloister::api::v1::SealedReply& sealed, google::protobuf::Message& reply);

// Whether a failed idempotent call may be tried again through a new session: cloisterd or the
// enclave worker is unavailable (the worker died and is restarting), or the session's keys died
// with its worker, or the evidence changed between attesting and opening (a restart between).
bool IsRetryable(const absl::Status& status);

}  // namespace client_internal
}  // namespace cloister::sdk
