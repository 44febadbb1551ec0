// The session channel of DESIGN.md section 4: traffic keys derived from an HPKE context,
// per-message AES-256-GCM with a 64-bit sequence number in the nonce, associated data that
// binds session id, direction, sequence number, message kind, request id and model handle,
// and an anti-replay window on the receiving side.
//
// Both ends (the SDK and the enclave) use this file, so the wire rules live in one place.
// Not thread-safe: a ChannelSender or ChannelReceiver has one owner; callers lock.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"
#include "crypto/aead.h"
#include "crypto/hpke.h"

namespace cloister::crypto {

enum class Direction : uint8_t { kClientToEnclave = 1, kEnclaveToClient = 2 };

// What a sealed message is for; part of the associated data, so a message sealed for one
// call cannot be replayed as another.
enum class MessageKind : uint8_t {
  kWelcome = 1,
  kInfer = 2,
  kLoadModel = 3,
  kListModels = 4,
  kDeleteModel = 5,
  kGenerate = 6,       // a GenerateRequest (client to enclave)
  kGenerateChunk = 7,  // one chunk of its stream (enclave to client): chunk number, final flag
};

inline constexpr size_t kSessionIdSize = 16;
inline constexpr size_t kReplayWindow = 1024;

struct ChannelKeys {
  Bytes session_id;                                            // 16 bytes, public
  SecretBytes client_to_enclave_key, client_to_enclave_nonce;  // 32 + 12
  SecretBytes enclave_to_client_key, enclave_to_client_nonce;  // 32 + 12
};

// Derives the traffic keys from the HPKE exporter (labels "cloister/v1 session id",
// "cloister/v1 c2e key", "cloister/v1 c2e nonce", "cloister/v1 e2c key", "cloister/v1 e2c nonce").
absl::StatusOr<ChannelKeys> DeriveChannelKeys(const HpkeContext& context);

// The handshake transcript that the tenant's identity key signs (length-prefixed fields
// after the label "cloister/v1 session transcript").
Bytes SessionTranscript(ByteSpan evidence_digest, ByteSpan enclave_hpke_public_key,
                        ByteSpan enclave_signing_public_key, ByteSpan client_identity_public_key,
                        ByteSpan hpke_enc, ByteSpan client_nonce, std::string_view tenant_id);

// The HPKE info string for opening a session to attested evidence: the label
// "cloister/v1 session hpke info" followed by the length-prefixed digest.
Bytes SessionHpkeInfo(ByteSpan evidence_digest);

struct MessageHeader {
  MessageKind kind;
  std::string request_id;
  std::string model_handle;
  // kGenerateChunk only: the chunk's place in its stream and whether it is the last.
  uint64_t chunk = 0;
  bool final = false;
};

// Associated data: the label "cloister/v1 message" || session id (length-prefixed) ||
// direction (1 byte) || seq (8 bytes, big-endian) || kind (1 byte) || request id and model
// handle (each length-prefixed), and for kGenerateChunk || chunk (8 bytes, big-endian) ||
// final (1 byte: 1 or 0). Length prefixes are 4-byte big-endian (AppendLengthPrefixed).
Bytes MessageAad(ByteSpan session_id, Direction direction, uint64_t sequence,
                 const MessageHeader& header);

// Seals messages in one direction; sequence numbers start at 0 and never repeat.
class ChannelSender {
 public:
  // `session_id` (16 bytes), `key` (32) and `nonce_base` (12) come from DeriveChannelKeys;
  // other sizes are a programming error (CLOISTER_CHECK).
  ChannelSender(ByteSpan session_id, Direction direction, ByteSpan key, ByteSpan nonce_base);
  // Returns the ciphertext and the sequence number used. ResourceExhausted once the
  // sequence space (2^63) is used up.
  absl::StatusOr<std::pair<uint64_t, Bytes>> Seal(const MessageHeader& header, ByteSpan plaintext);
  // Seals in place, with no allocation and no second copy of the plaintext: `message` holds the
  // plaintext in its first message.size() - kAeadTagSize bytes and room for the tag after it;
  // on return it holds ciphertext || tag, the same bytes Seal returns. Returns the sequence
  // number used. InvalidArgument when `message` is shorter than a tag (nothing is sealed and
  // no sequence number is used).
  absl::StatusOr<uint64_t> SealInPlace(const MessageHeader& header, std::span<uint8_t> message);
  uint64_t next_sequence() const { return next_sequence_; }
  void SetNextSequenceForTest(uint64_t sequence) { next_sequence_ = sequence; }

 private:
  Bytes session_id_;
  Direction direction_;
  std::unique_ptr<Aead> aead_;
  SecretBytes nonce_base_;
  uint64_t next_sequence_ = 0;
};

// Opens messages in one direction and refuses replays: a sequence number seen before, or
// older than the window, is refused with PermissionDenied("replayed message ...").
// A message that fails authentication changes no state.
class ChannelReceiver {
 public:
  // Same preconditions as ChannelSender.
  ChannelReceiver(ByteSpan session_id, Direction direction, ByteSpan key, ByteSpan nonce_base);
  // Checks the sequence number against the window, authenticates and decrypts, and only then
  // records the sequence number as received. Errors: PermissionDenied for a replay,
  // InvalidArgument for a sequence number >= 2^63, DataLoss when authentication fails.
  absl::StatusOr<Bytes> Open(uint64_t sequence, const MessageHeader& header, ByteSpan ciphertext);
  // Opens in place: on success the first message.size() - kAeadTagSize bytes of `message` hold
  // the plaintext (the caller wipes them when done) and that size is returned. The same checks,
  // errors and replay bookkeeping as Open; on any failure `message` is wiped and no state
  // changes.
  absl::StatusOr<size_t> OpenInPlace(uint64_t sequence, const MessageHeader& header,
                                     std::span<uint8_t> message);
  // Opens without consuming the sequence number (used to check before queueing): the same
  // checks and result as Open, but no state changes, so a later Open still accepts it.
  absl::StatusOr<Bytes> Peek(uint64_t sequence, const MessageHeader& header,
                             ByteSpan ciphertext) const;
  // OK if `sequence` would not be refused as a replay; no crypto, no state change.
  absl::Status CheckSequence(uint64_t sequence) const;
  // The highest sequence number accepted so far (0 before the first message).
  uint64_t highest_sequence() const { return highest_; }

 private:
  void MarkReceived(uint64_t sequence);

  Bytes session_id_;
  Direction direction_;
  std::unique_ptr<Aead> aead_;
  SecretBytes nonce_base_;
  bool any_ = false;  // whether any message has been accepted
  uint64_t highest_ = 0;
  // kReplayWindow bits: bit i (word i / 64, bit i % 64) is set when sequence highest_ - i has
  // been accepted; bit 0 is set whenever any_ is.
  std::vector<uint64_t> window_;
};

// Nonce for sequence `seq`: nonce_base XOR (seq as 96-bit big-endian).
Bytes SequenceNonce(ByteSpan nonce_base, uint64_t sequence);

}  // namespace cloister::crypto
