#include "crypto/channel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/secret_bytes.h"
#include "base/status.h"

namespace cloister::crypto {
namespace {

constexpr std::string_view kSessionIdLabel = "cloister/v1 session id";
constexpr std::string_view kC2eKeyLabel = "cloister/v1 c2e key";
constexpr std::string_view kC2eNonceLabel = "cloister/v1 c2e nonce";
constexpr std::string_view kE2cKeyLabel = "cloister/v1 e2c key";
constexpr std::string_view kE2cNonceLabel = "cloister/v1 e2c nonce";
constexpr std::string_view kTranscriptLabel = "cloister/v1 session transcript";
constexpr std::string_view kHpkeInfoLabel = "cloister/v1 session hpke info";
constexpr std::string_view kMessageLabel = "cloister/v1 message";

constexpr size_t kTrafficKeySize = 32;
constexpr size_t kNonceBaseSize = kAeadNonceSize;
constexpr uint64_t kSequenceLimit = uint64_t{1} << 63;
constexpr size_t kWindowWordCount = kReplayWindow / 64;
static_assert(kReplayWindow % 64 == 0);

std::unique_ptr<Aead> TrafficAead(ByteSpan session_id, ByteSpan key, ByteSpan nonce_base) {
  // The keys come from DeriveChannelKeys, never from a peer, so a wrong size is a bug here.
  CLOISTER_CHECK(session_id.size() == kSessionIdSize);
  CLOISTER_CHECK(key.size() == kTrafficKeySize);
  CLOISTER_CHECK(nonce_base.size() == kNonceBaseSize);
  absl::StatusOr<std::unique_ptr<Aead>> aead = Aead::Create(AeadAlg::kAes256Gcm, key);
  CLOISTER_CHECK(aead.ok());
  return std::move(*aead);
}

}  // namespace

absl::StatusOr<ChannelKeys> DeriveChannelKeys(const HpkeContext& context) {
  ChannelKeys keys;
  ASSIGN_OR_RETURN(SecretBytes session_id,
                   context.Export(AsBytes(kSessionIdLabel), kSessionIdSize));
  keys.session_id.assign(session_id.span().begin(), session_id.span().end());
  ASSIGN_OR_RETURN(keys.client_to_enclave_key,
                   context.Export(AsBytes(kC2eKeyLabel), kTrafficKeySize));
  ASSIGN_OR_RETURN(keys.client_to_enclave_nonce,
                   context.Export(AsBytes(kC2eNonceLabel), kNonceBaseSize));
  ASSIGN_OR_RETURN(keys.enclave_to_client_key,
                   context.Export(AsBytes(kE2cKeyLabel), kTrafficKeySize));
  ASSIGN_OR_RETURN(keys.enclave_to_client_nonce,
                   context.Export(AsBytes(kE2cNonceLabel), kNonceBaseSize));
  return keys;
}

Bytes SessionTranscript(ByteSpan evidence_digest, ByteSpan enclave_hpke_public_key,
                        ByteSpan enclave_signing_public_key, ByteSpan client_identity_public_key,
                        ByteSpan hpke_enc, ByteSpan client_nonce, std::string_view tenant_id) {
  Bytes out = ToBytes(kTranscriptLabel);
  AppendLengthPrefixed(out, evidence_digest);
  AppendLengthPrefixed(out, enclave_hpke_public_key);
  AppendLengthPrefixed(out, enclave_signing_public_key);
  AppendLengthPrefixed(out, client_identity_public_key);
  AppendLengthPrefixed(out, hpke_enc);
  AppendLengthPrefixed(out, client_nonce);
  AppendLengthPrefixed(out, AsBytes(tenant_id));
  return out;
}

Bytes SessionHpkeInfo(ByteSpan evidence_digest) {
  Bytes out = ToBytes(kHpkeInfoLabel);
  AppendLengthPrefixed(out, evidence_digest);
  return out;
}

Bytes MessageAad(ByteSpan session_id, Direction direction, uint64_t sequence,
                 const MessageHeader& header) {
  Bytes out = ToBytes(kMessageLabel);
  AppendLengthPrefixed(out, session_id);
  out.push_back(static_cast<uint8_t>(direction));
  AppendBigEndian(out, sequence, 8);
  out.push_back(static_cast<uint8_t>(header.kind));
  AppendLengthPrefixed(out, AsBytes(header.request_id));
  AppendLengthPrefixed(out, AsBytes(header.model_handle));
  if (header.kind == MessageKind::kGenerateChunk) {
    AppendBigEndian(out, header.chunk, 8);
    out.push_back(header.final ? 1 : 0);
  }
  return out;
}

Bytes SequenceNonce(ByteSpan nonce_base, uint64_t sequence) {
  CLOISTER_CHECK(nonce_base.size() == kNonceBaseSize);
  Bytes nonce(nonce_base.begin(), nonce_base.end());
  for (size_t i = 0; i < 8; ++i) {
    nonce[kNonceBaseSize - 1 - i] ^= static_cast<uint8_t>(sequence >> (8 * i));
  }
  return nonce;
}

ChannelSender::ChannelSender(ByteSpan session_id, Direction direction, ByteSpan key,
                             ByteSpan nonce_base)
    : session_id_(session_id.begin(), session_id.end()),
      direction_(direction),
      aead_(TrafficAead(session_id, key, nonce_base)),
      nonce_base_(nonce_base) {}

absl::StatusOr<std::pair<uint64_t, Bytes>> ChannelSender::Seal(const MessageHeader& header,
                                                               ByteSpan plaintext) {
  Bytes message(plaintext.size() + kAeadTagSize);
  std::copy(plaintext.begin(), plaintext.end(), message.begin());
  absl::StatusOr<uint64_t> sequence = SealInPlace(header, message);
  if (!sequence.ok()) {
    SecureWipe(message.data(), message.size());  // still the plaintext
    return sequence.status();
  }
  return std::make_pair(*sequence, std::move(message));
}

absl::StatusOr<uint64_t> ChannelSender::SealInPlace(const MessageHeader& header,
                                                    std::span<uint8_t> message) {
  if (message.size() < kAeadTagSize) {
    return absl::InvalidArgumentError(absl::StrCat("in-place seal needs room for the ",
                                                   kAeadTagSize, "-byte tag"));
  }
  if (next_sequence_ >= kSequenceLimit) {
    return absl::ResourceExhaustedError(
        "session channel sequence numbers are used up: open a new session");
  }
  const uint64_t sequence = next_sequence_;
  const ByteSpan plaintext(message.data(), message.size() - kAeadTagSize);
  RETURN_IF_ERROR(aead_->SealInto(SequenceNonce(nonce_base_.span(), sequence),
                                  MessageAad(session_id_, direction_, sequence, header),
                                  plaintext, message));
  ++next_sequence_;
  return sequence;
}

ChannelReceiver::ChannelReceiver(ByteSpan session_id, Direction direction, ByteSpan key,
                                 ByteSpan nonce_base)
    : session_id_(session_id.begin(), session_id.end()),
      direction_(direction),
      aead_(TrafficAead(session_id, key, nonce_base)),
      nonce_base_(nonce_base),
      window_(kWindowWordCount, 0) {}

absl::Status ChannelReceiver::CheckSequence(uint64_t sequence) const {
  if (sequence >= kSequenceLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence number ", sequence, " is out of range (must be below 2^63)"));
  }
  if (!any_ || sequence > highest_) return absl::OkStatus();
  const uint64_t age = highest_ - sequence;
  if (age >= kReplayWindow) {
    return absl::PermissionDeniedError(absl::StrCat(
        "replayed message refused: sequence ", sequence, " is older than the replay window (",
        kReplayWindow, " below the highest seen, ", highest_, ")"));
  }
  if ((window_[age / 64] >> (age % 64)) & 1) {
    return absl::PermissionDeniedError(
        absl::StrCat("replayed message refused: sequence ", sequence, " was already received"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Bytes> ChannelReceiver::Peek(uint64_t sequence, const MessageHeader& header,
                                            ByteSpan ciphertext) const {
  RETURN_IF_ERROR(CheckSequence(sequence));
  return aead_->Open(SequenceNonce(nonce_base_.span(), sequence),
                     MessageAad(session_id_, direction_, sequence, header), ciphertext);
}

absl::StatusOr<Bytes> ChannelReceiver::Open(uint64_t sequence, const MessageHeader& header,
                                            ByteSpan ciphertext) {
  ASSIGN_OR_RETURN(Bytes plaintext, Peek(sequence, header, ciphertext));
  MarkReceived(sequence);
  return plaintext;
}

absl::StatusOr<size_t> ChannelReceiver::OpenInPlace(uint64_t sequence,
                                                    const MessageHeader& header,
                                                    std::span<uint8_t> message) {
  absl::Status checked = CheckSequence(sequence);
  if (checked.ok() && message.size() < kAeadTagSize) {
    checked = absl::InvalidArgumentError(absl::StrCat("sealed message of ", message.size(),
                                                      " bytes is shorter than the ",
                                                      kAeadTagSize, "-byte tag"));
  }
  if (!checked.ok()) {
    SecureWipe(message.data(), message.size());
    return checked;
  }
  const size_t size = message.size() - kAeadTagSize;
  RETURN_IF_ERROR(aead_->OpenInto(SequenceNonce(nonce_base_.span(), sequence),
                                  MessageAad(session_id_, direction_, sequence, header),
                                  ByteSpan(message.data(), message.size()),
                                  message.first(size)));
  MarkReceived(sequence);
  return size;
}

void ChannelReceiver::MarkReceived(uint64_t sequence) {
  if (!any_ || sequence > highest_) {
    const uint64_t shift = any_ ? sequence - highest_ : kReplayWindow;
    if (shift >= kReplayWindow) {
      std::fill(window_.begin(), window_.end(), 0);
    } else {
      // Bit `age` of the window moves to bit `age + shift`.
      const size_t word_shift = shift / 64;
      const unsigned bit_shift = shift % 64;
      for (size_t i = kWindowWordCount; i-- > 0;) {
        uint64_t word = 0;
        if (i >= word_shift) {
          word = window_[i - word_shift] << bit_shift;
          if (bit_shift != 0 && i > word_shift) {
            word |= window_[i - word_shift - 1] >> (64 - bit_shift);
          }
        }
        window_[i] = word;
      }
    }
    any_ = true;
    highest_ = sequence;
    window_[0] |= 1;
    return;
  }
  const uint64_t age = highest_ - sequence;
  window_[age / 64] |= uint64_t{1} << (age % 64);
}

}  // namespace cloister::crypto
