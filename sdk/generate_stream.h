// The client's side of a Generate stream (docs/PROTOCOL.md, "Generation streams"): the checks
// every SealedChunk passes before the client uses it, and the assembled answer. The host relays
// the chunks and could drop, reorder, replay, splice or cut short a stream; the chunk number and
// the final flag are in each seal's associated data, so the verifier catches each of those and
// names it. Client::Generate runs one verifier per call; it needs no server, so tests drive it
// with chunks sealed by a crypto::ChannelSender.
// Threading: a GenerateStreamVerifier belongs to one stream and one thread. The receiver passed
// to Open is the session's (shared with the session's other replies): the caller holds its lock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cloister/api/v1/api.pb.h"
#include "crypto/channel.h"

namespace cloister::sdk {

// A finished generation: what its chunks carried, put together.
struct GenerateResult {
  std::vector<int32_t> ids;   // the sampled token ids, in order
  std::string text;           // the generated text (a stop string is cut off)
  std::string finish_reason;  // "stop", "length" or "cancelled"
  cloister::api::v1::GenerateUsage usage;
  // The enclave's signed account of the request: a serialized cloister.boundary.v1.UsageReceipt
  // and its Ed25519 signature (crypto::VerifyUsageReceipt with the attested signing key).
  std::string receipt;
  std::string receipt_signature;
  uint64_t chunk_count = 0;  // chunks in the stream, the final one included
};

class GenerateStreamVerifier {
 public:
  // For the stream answering `request_id`, sealed for `model_handle`.
  GenerateStreamVerifier(std::string request_id, std::string model_handle);

  // Checks the next chunk of the stream and opens it in place (its ciphertext is wiped), then
  // adds it to the result. Returns the opened chunk (padding removed) on success. Errors, each
  // one DATA_LOSS naming the chunk: its number is not the next one (a gap, or chunks out of
  // order), a chunk number that was already received (replayed), a sequence number the
  // session's window refuses (replayed), a chunk that does not open (tampered, or sealed for
  // another request, model, place in the stream or final flag), a plaintext that is not a
  // GenerateChunk, anything after the final chunk. A chunk that opens with a non-zero code is
  // the enclave's error for the call: that status, with its code, message and reason. The first
  // error is the stream's: every later call returns it again.
  absl::StatusOr<cloister::api::v1::GenerateChunk> Open(crypto::ChannelReceiver& receiver,
                                                        cloister::api::v1::SealedChunk& sealed);

  // Whether the final chunk has been accepted, or the stream has failed: nothing more is wanted.
  bool done() const { return final_seen_ || error_.has_value(); }
  uint64_t next_chunk() const { return next_chunk_; }

  // At the end of the stream: the result when the final chunk was accepted, the stream's error
  // when it failed, and otherwise DATA_LOSS("generation stream ended without its final chunk").
  // Moves the result out: call once.
  absl::StatusOr<GenerateResult> Finish();

 private:
  // Records `status` as the stream's error and returns it.
  absl::Status Fail(absl::Status status);

  const std::string request_id_;
  const std::string model_handle_;
  uint64_t next_chunk_ = 0;
  bool final_seen_ = false;
  std::optional<absl::Status> error_;
  GenerateResult result_;
};

}  // namespace cloister::sdk
