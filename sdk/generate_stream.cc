// GenerateStreamVerifier (generate_stream.h): the checks on each chunk of a Generate stream.
#include "sdk/generate_stream.h"

#include <span>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "sdk/client_internal.h"

namespace cloister::sdk {

namespace api = ::cloister::api::v1;

GenerateStreamVerifier::GenerateStreamVerifier(std::string request_id, std::string model_handle)
    : request_id_(std::move(request_id)), model_handle_(std::move(model_handle)) {}

absl::Status GenerateStreamVerifier::Fail(absl::Status status) {
  error_ = status;
  return status;
}

absl::StatusOr<api::GenerateChunk> GenerateStreamVerifier::Open(crypto::ChannelReceiver& receiver,
                                                                api::SealedChunk& sealed) {
  std::string& buffer = *sealed.mutable_ciphertext();
  if (error_.has_value()) {
    client_internal::WipeString(buffer);
    return *error_;
  }
  const uint64_t chunk = sealed.chunk();
  const std::string what = absl::StrCat("generation stream of request ", request_id_, ": chunk ",
                                        chunk, sealed.final() ? " (marked final)" : "");
  auto refuse = [&](absl::string_view why) {
    client_internal::WipeString(buffer);
    return Fail(absl::DataLossError(absl::StrCat(what, " ", why)));
  };
  if (final_seen_) {
    return refuse(absl::StrCat("arrived after the final chunk (", next_chunk_ - 1, ")"));
  }
  if (chunk < next_chunk_) {
    return refuse(
        absl::StrCat("was already received: a replayed chunk (chunk ", next_chunk_, " was due)"));
  }
  if (chunk > next_chunk_) {
    return refuse(absl::StrCat(
        "arrived where chunk ", next_chunk_, " was due: ",
        chunk == next_chunk_ + 1 ? absl::StrCat("chunk ", next_chunk_, " is")
                                 : absl::StrCat("chunks ", next_chunk_, " to ", chunk - 1, " are"),
        " missing (a gap) or the chunks are out of order"));
  }

  const crypto::MessageHeader header{crypto::MessageKind::kGenerateChunk, request_id_,
                                     model_handle_, chunk, sealed.final()};
  auto* data = reinterpret_cast<uint8_t*>(buffer.data());
  absl::StatusOr<size_t> size =
      receiver.OpenInPlace(sealed.sequence(), header, std::span<uint8_t>(data, buffer.size()));
  if (!size.ok()) {
    if (absl::IsPermissionDenied(size.status())) {
      return refuse(absl::StrCat("was refused as a replay by the session's window (",
                                 size.status().message(), ")"));
    }
    return refuse(absl::StrCat(
        "does not open (tampered with, or sealed for another request, model, place in the "
        "stream or final flag): ",
        size.status().message()));
  }
  api::GenerateChunk opened;
  bool parsed = opened.ParseFromArray(data, static_cast<int>(*size));
  client_internal::WipeString(buffer);
  if (!parsed) return refuse("opens but is not a GenerateChunk");
  ++next_chunk_;
  final_seen_ = sealed.final();
  opened.clear_padding();
  if (opened.code() != 0) {
    return Fail(client_internal::EnclaveError(opened.code(), opened.message(), opened.reason()));
  }
  for (const api::SampledTokenInfo& token : opened.tokens()) result_.ids.push_back(token.id());
  result_.text += opened.text();
  result_.chunk_count = next_chunk_;
  if (final_seen_) {
    result_.finish_reason = opened.finish_reason();
    result_.usage = opened.usage();
    result_.receipt = opened.receipt();
    result_.receipt_signature = opened.receipt_signature();
  }
  return opened;
}

absl::StatusOr<GenerateResult> GenerateStreamVerifier::Finish() {
  if (error_.has_value()) return *error_;
  if (!final_seen_) {
    return Fail(absl::DataLossError(
        absl::StrCat("generation stream ended without its final chunk (request ", request_id_, ", ",
                     next_chunk_, next_chunk_ == 1 ? " chunk" : " chunks", " received)")));
  }
  return std::move(result_);
}

}  // namespace cloister::sdk
