// Client (client.h): Generate, one sealed GenerateRequest answered by a stream of sealed chunks
// (docs/PROTOCOL.md, "Generation streams"), each checked by a GenerateStreamVerifier.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "base/status.h"
#include "crypto/model_handle.h"
#include "proto/duration.h"
#include "proto/sealing.h"
#include "sdk/client.h"
#include "sdk/client_internal.h"
#include "sdk/generate_stream.h"

namespace cloister::sdk {

namespace api = ::cloister::api::v1;

using client_internal::FromGrpc;
using client_internal::NewRequestId;
using client_internal::PrepareContext;
using client_internal::StringOf;
using client_internal::WipeString;

absl::StatusOr<GenerateResult> Client::Generate(const std::string& name,
                                                const api::GenerateRequest& request,
                                                const GenerateChunkCallback& on_chunk,
                                                absl::Duration timeout,
                                                const GenerateCancelled& cancelled) {
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  if (cancelled && cancelled()) return absl::CancelledError("generation cancelled by the caller");
  if (request.prompt_case() == api::GenerateRequest::PROMPT_NOT_SET) {
    return absl::InvalidArgumentError("the generate request has no prompt (text, ids or chat)");
  }
  const std::string handle = ModelHandleFor(name);
  // With a fixed seed the enclave samples the same tokens again, so a generation that failed
  // before any of it arrived may be sent again; without one a retry would be a new answer.
  const bool seeded = request.sampling().has_seed();
  bool delivered = false;
  std::optional<GenerateResult> result;
  absl::Status status = CallWithRetries(
      [&](std::shared_ptr<Session>& used) {
        absl::StatusOr<GenerateResult> once =
            GenerateOnce(handle, request, on_chunk, timeout, cancelled, used, delivered);
        if (!once.ok()) return once.status();
        result = *std::move(once);
        return absl::OkStatus();
      },
      [&] { return seeded && !delivered; }, /*names_model=*/true);
  if (!status.ok()) return status;
  return *std::move(result);
}

absl::StatusOr<GenerateResult> Client::GenerateOnce(const std::string& model_handle,
                                                    const api::GenerateRequest& request,
                                                    const GenerateChunkCallback& on_chunk,
                                                    absl::Duration timeout,
                                                    const GenerateCancelled& cancelled,
                                                    std::shared_ptr<Session>& used,
                                                    bool& delivered) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, CurrentSession());
  used = session;
  const crypto::MessageHeader header{crypto::MessageKind::kGenerate, NewRequestId(), model_handle};
  api::SealedRequest call;
  {
    // Serialized straight into the call's ciphertext field and sealed there (as Infer).
    std::string& buffer = *call.mutable_ciphertext();
    ASSIGN_OR_RETURN(std::span<uint8_t> message, proto::SerializeForSealing(request, buffer));
    absl::MutexLock lock(&session->mu);
    absl::StatusOr<uint64_t> sequence = session->sender->SealInPlace(header, message);
    if (!sequence.ok()) {
      WipeString(buffer);
      return sequence.status();
    }
    call.set_sequence(*sequence);
  }
  call.set_session_id(StringOf(session->id));
  call.set_request_id(header.request_id);
  call.set_model_handle(model_handle);
  const absl::Duration limit = timeout > absl::ZeroDuration() ? timeout : options_.call_timeout;
  *call.mutable_deadline() = proto::ToProtoDuration(limit);

  const std::string& server = endpoints_[session->endpoint].address;
  grpc::ClientContext context;
  PrepareContext(context, options_, /*with_deadline=*/true, timeout);
  std::unique_ptr<grpc::ClientReader<api::SealedChunk>> reader =
      endpoints_[session->endpoint].stub->Generate(&context, call);
  GenerateStreamVerifier verifier(header.request_id, model_handle);
  api::SealedChunk sealed;
  while (reader->Read(&sealed)) {
    absl::StatusOr<api::GenerateChunk> chunk;
    {
      absl::MutexLock lock(&session->mu);
      chunk = verifier.Open(*session->receiver, sealed);
    }
    if (!chunk.ok()) {
      // The stream is refused as a whole: nothing more of it is read or used.
      context.TryCancel();
      reader->Finish();  // its status says nothing more than the refusal
      return chunk.status();
    }
    delivered = true;
    if (on_chunk) on_chunk(*chunk);
    if (cancelled && !verifier.done() && cancelled()) {
      context.TryCancel();
      reader->Finish();
      return absl::CancelledError("generation cancelled by the caller");
    }
  }
  grpc::Status finished = reader->Finish();
  // After its final chunk the answer is whole and checked, whatever the RPC's ending says.
  if (!finished.ok() && !verifier.done()) {
    return FromGrpc(finished, "Generate", server, options_, timeout);
  }
  return verifier.Finish();
}

}  // namespace cloister::sdk
