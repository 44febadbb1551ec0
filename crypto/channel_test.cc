#include "crypto/channel.h"

#include <algorithm>
#include <random>
#include <set>

#include "base/status.h"
#include "crypto/keys.h"
#include "crypto/random.h"
#include "gtest/gtest.h"

namespace cloister::crypto {
namespace {

Bytes ToVector(const SecretBytes& secret) {
  return Bytes(secret.span().begin(), secret.span().end());
}

// Both ends of one session: the client's HPKE sender context and the enclave's receiver
// context, and the channel keys each derives.
struct Session {
  ChannelKeys client;
  ChannelKeys enclave;
};

Session MakeSession() {
  X25519KeyPair enclave_key = GenerateX25519();
  const Bytes info = SessionHpkeInfo(Bytes(48, 0xEE));
  absl::StatusOr<HpkeSenderSetup> sender =
      HpkeSetupSender(kSessionSuite, enclave_key.public_key, info);
  CLOISTER_CHECK(sender.ok());
  absl::StatusOr<std::unique_ptr<HpkeContext>> receiver =
      HpkeSetupReceiver(kSessionSuite, sender->enc, enclave_key.private_key.span(), info);
  CLOISTER_CHECK(receiver.ok());
  absl::StatusOr<ChannelKeys> client = DeriveChannelKeys(*sender->context);
  absl::StatusOr<ChannelKeys> enclave = DeriveChannelKeys(**receiver);
  CLOISTER_CHECK(client.ok() && enclave.ok());
  return Session{*std::move(client), *std::move(enclave)};
}

ChannelSender ClientSender(const ChannelKeys& keys) {
  return ChannelSender(keys.session_id, Direction::kClientToEnclave,
                       keys.client_to_enclave_key.span(), keys.client_to_enclave_nonce.span());
}
ChannelReceiver EnclaveReceiver(const ChannelKeys& keys) {
  return ChannelReceiver(keys.session_id, Direction::kClientToEnclave,
                         keys.client_to_enclave_key.span(), keys.client_to_enclave_nonce.span());
}

const MessageHeader kInferHeader{MessageKind::kInfer, "req-1", "model-a"};

TEST(Channel, KeyDerivationIsSymmetricAndKeysAreDistinct) {
  Session session = MakeSession();
  EXPECT_EQ(session.client.session_id.size(), kSessionIdSize);
  EXPECT_EQ(session.client.session_id, session.enclave.session_id);
  EXPECT_EQ(ToVector(session.client.client_to_enclave_key),
            ToVector(session.enclave.client_to_enclave_key));
  EXPECT_EQ(ToVector(session.client.client_to_enclave_nonce),
            ToVector(session.enclave.client_to_enclave_nonce));
  EXPECT_EQ(ToVector(session.client.enclave_to_client_key),
            ToVector(session.enclave.enclave_to_client_key));
  EXPECT_EQ(ToVector(session.client.enclave_to_client_nonce),
            ToVector(session.enclave.enclave_to_client_nonce));
  EXPECT_EQ(session.client.client_to_enclave_key.size(), 32u);
  EXPECT_EQ(session.client.client_to_enclave_nonce.size(), 12u);
  EXPECT_NE(ToVector(session.client.client_to_enclave_key),
            ToVector(session.client.enclave_to_client_key));
  EXPECT_NE(ToVector(session.client.client_to_enclave_nonce),
            ToVector(session.client.enclave_to_client_nonce));
  // Another session has other keys.
  Session other = MakeSession();
  EXPECT_NE(other.client.session_id, session.client.session_id);
  EXPECT_NE(ToVector(other.client.client_to_enclave_key),
            ToVector(session.client.client_to_enclave_key));
}

TEST(Channel, RoundTripBothDirections) {
  Session session = MakeSession();
  ChannelSender client_out = ClientSender(session.client);
  ChannelReceiver enclave_in = EnclaveReceiver(session.enclave);
  ChannelSender enclave_out(session.enclave.session_id, Direction::kEnclaveToClient,
                            session.enclave.enclave_to_client_key.span(),
                            session.enclave.enclave_to_client_nonce.span());
  ChannelReceiver client_in(session.client.session_id, Direction::kEnclaveToClient,
                            session.client.enclave_to_client_key.span(),
                            session.client.enclave_to_client_nonce.span());
  for (uint64_t i = 0; i < 5; ++i) {
    const Bytes request = RandomBytes(50 + i);
    absl::StatusOr<std::pair<uint64_t, Bytes>> sealed = client_out.Seal(kInferHeader, request);
    ASSERT_TRUE(sealed.ok()) << sealed.status();
    EXPECT_EQ(sealed->first, i);
    absl::StatusOr<Bytes> opened = enclave_in.Open(sealed->first, kInferHeader, sealed->second);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(*opened, request);
    EXPECT_EQ(enclave_in.highest_sequence(), i);

    const MessageHeader reply{MessageKind::kInfer, "req-1", "model-a"};
    absl::StatusOr<std::pair<uint64_t, Bytes>> response = enclave_out.Seal(reply, ToBytes("out"));
    ASSERT_TRUE(response.ok());
    absl::StatusOr<Bytes> got = client_in.Open(response->first, reply, response->second);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, ToBytes("out"));
  }
  EXPECT_EQ(client_out.next_sequence(), 5u);
  // The same plaintext sealed twice differs (the sequence number is in the nonce).
  absl::StatusOr<std::pair<uint64_t, Bytes>> a = client_out.Seal(kInferHeader, ToBytes("x"));
  absl::StatusOr<std::pair<uint64_t, Bytes>> b = client_out.Seal(kInferHeader, ToBytes("x"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->second, b->second);
}

TEST(Channel, InPlaceSealAndOpenMatchTheCopyingOnes) {
  Session session = MakeSession();
  ChannelSender in_place = ClientSender(session.client);
  ChannelSender copying = ClientSender(session.client);
  ChannelReceiver receiver = EnclaveReceiver(session.enclave);
  for (size_t size : {size_t{0}, size_t{1}, size_t{4096}, size_t{1} << 20}) {
    const Bytes plaintext = RandomBytes(size);
    Bytes message = plaintext;
    message.resize(size + kAeadTagSize, 0xAB);  // room for the tag
    absl::StatusOr<uint64_t> sequence = in_place.SealInPlace(kInferHeader, message);
    ASSERT_TRUE(sequence.ok()) << sequence.status();
    absl::StatusOr<std::pair<uint64_t, Bytes>> sealed = copying.Seal(kInferHeader, plaintext);
    ASSERT_TRUE(sealed.ok());
    EXPECT_EQ(*sequence, sealed->first);
    EXPECT_EQ(message, sealed->second) << "size " << size;  // the same bytes on the wire

    absl::StatusOr<size_t> opened = receiver.OpenInPlace(*sequence, kInferHeader, message);
    ASSERT_TRUE(opened.ok()) << opened.status();
    ASSERT_EQ(*opened, size);
    EXPECT_TRUE(std::equal(plaintext.begin(), plaintext.end(), message.begin()));
    EXPECT_EQ(receiver.highest_sequence(), *sequence);
  }
}

TEST(Channel, InPlaceRefusalsWipeAndChangeNothing) {
  Session session = MakeSession();
  ChannelSender sender = ClientSender(session.client);
  ChannelReceiver receiver = EnclaveReceiver(session.enclave);
  // Too short to hold a tag: refused before any sequence number is used.
  Bytes tiny(kAeadTagSize - 1, 1);
  absl::StatusOr<uint64_t> refused = sender.SealInPlace(kInferHeader, tiny);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sender.next_sequence(), 0u);

  Bytes message = ToBytes("secret payload");
  message.resize(message.size() + kAeadTagSize);
  absl::StatusOr<uint64_t> sequence = sender.SealInPlace(kInferHeader, message);
  ASSERT_TRUE(sequence.ok());
  const Bytes sealed = message;

  // A flipped bit: DataLoss, the buffer wiped, and the genuine message still opens after.
  Bytes tampered = sealed;
  tampered[3] ^= 1;
  absl::StatusOr<size_t> bad = receiver.OpenInPlace(*sequence, kInferHeader, tampered);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(std::all_of(tampered.begin(), tampered.end() - kAeadTagSize,
                          [](uint8_t b) { return b == 0; }));
  // The wrong header: refused the same way.
  Bytes other = sealed;
  const MessageHeader list{MessageKind::kListModels, "req-1", "model-a"};
  EXPECT_EQ(receiver.OpenInPlace(*sequence, list, other).status().code(),
            absl::StatusCode::kDataLoss);
  // Shorter than a tag.
  Bytes short_message(kAeadTagSize - 1, 7);
  EXPECT_EQ(receiver.OpenInPlace(*sequence, kInferHeader, short_message).status().code(),
            absl::StatusCode::kInvalidArgument);

  Bytes genuine = sealed;
  absl::StatusOr<size_t> opened = receiver.OpenInPlace(*sequence, kInferHeader, genuine);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(Bytes(genuine.begin(), genuine.begin() + *opened), ToBytes("secret payload"));
  // A replay of it is refused and wiped.
  Bytes replay = sealed;
  absl::StatusOr<size_t> replayed = receiver.OpenInPlace(*sequence, kInferHeader, replay);
  EXPECT_EQ(replayed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(std::all_of(replay.begin(), replay.end(), [](uint8_t b) { return b == 0; }));
}

TEST(Channel, TamperedMessagesAreRefusedAndChangeNothing) {
  Session session = MakeSession();
  ChannelSender sender = ClientSender(session.client);
  ChannelReceiver receiver = EnclaveReceiver(session.enclave);
  absl::StatusOr<std::pair<uint64_t, Bytes>> first = sender.Seal(kInferHeader, ToBytes("first"));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(receiver.Open(first->first, kInferHeader, first->second).ok());
  absl::StatusOr<std::pair<uint64_t, Bytes>> sealed = sender.Seal(kInferHeader, ToBytes("payload"));
  ASSERT_TRUE(sealed.ok());
  const uint64_t seq = sealed->first;
  const Bytes& ciphertext = sealed->second;

  auto expect_refused = [&](ChannelReceiver& r, uint64_t s, const MessageHeader& h, ByteSpan c) {
    absl::StatusOr<Bytes> result = r.Open(s, h, c);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
  };
  Bytes flipped = ciphertext;
  flipped[0] ^= 1;
  expect_refused(receiver, seq, kInferHeader, flipped);
  Bytes flipped_tag = ciphertext;
  flipped_tag.back() ^= 0x80;
  expect_refused(receiver, seq, kInferHeader, flipped_tag);
  expect_refused(receiver, seq, kInferHeader, ByteSpan(ciphertext).first(ciphertext.size() - 1));
  expect_refused(receiver, seq, MessageHeader{MessageKind::kLoadModel, "req-1", "model-a"},
                 ciphertext);
  expect_refused(receiver, seq, MessageHeader{MessageKind::kInfer, "req-2", "model-a"}, ciphertext);
  expect_refused(receiver, seq, MessageHeader{MessageKind::kInfer, "req-1", "model-b"}, ciphertext);
  // Moving bytes between the length-prefixed fields changes the AAD too.
  expect_refused(receiver, seq, MessageHeader{MessageKind::kInfer, "req-1m", "odel-a"}, ciphertext);
  expect_refused(receiver, seq + 1, kInferHeader, ciphertext);  // claimed sequence number
  // A failed open with a far higher sequence number did not move the window.
  EXPECT_EQ(receiver.highest_sequence(), 0u);
  expect_refused(receiver, seq + 5000, kInferHeader, ciphertext);
  EXPECT_EQ(receiver.highest_sequence(), 0u);

  // Other session id, other direction (same key, so only the AAD differs).
  Bytes other_session = session.enclave.session_id;
  other_session[0] ^= 1;
  ChannelReceiver wrong_session(other_session, Direction::kClientToEnclave,
                                session.enclave.client_to_enclave_key.span(),
                                session.enclave.client_to_enclave_nonce.span());
  expect_refused(wrong_session, seq, kInferHeader, ciphertext);
  ChannelReceiver wrong_direction(session.enclave.session_id, Direction::kEnclaveToClient,
                                  session.enclave.client_to_enclave_key.span(),
                                  session.enclave.client_to_enclave_nonce.span());
  expect_refused(wrong_direction, seq, kInferHeader, ciphertext);
  // The receiver for the other direction's key does not open it either.
  ChannelReceiver other_key(session.enclave.session_id, Direction::kClientToEnclave,
                            session.enclave.enclave_to_client_key.span(),
                            session.enclave.enclave_to_client_nonce.span());
  expect_refused(other_key, seq, kInferHeader, ciphertext);

  // After all that, the genuine message still opens, exactly once.
  absl::StatusOr<Bytes> opened = receiver.Open(seq, kInferHeader, ciphertext);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(*opened, ToBytes("payload"));
  EXPECT_EQ(receiver.Open(seq, kInferHeader, ciphertext).status().code(),
            absl::StatusCode::kPermissionDenied);
}

// A stream chunk's seal binds its chunk number and final flag: a host that renumbers, marks a
// middle chunk final or a final chunk not final gets a chunk that does not open. Other kinds'
// associated data ignore the two fields, so their encoding is what it was.
TEST(Channel, StreamChunksBindTheirPlaceInTheStream) {
  Session session = MakeSession();
  ChannelSender sender(session.enclave.session_id, Direction::kEnclaveToClient,
                       session.enclave.enclave_to_client_key.span(),
                       session.enclave.enclave_to_client_nonce.span());
  ChannelReceiver receiver(session.client.session_id, Direction::kEnclaveToClient,
                           session.client.enclave_to_client_key.span(),
                           session.client.enclave_to_client_nonce.span());
  const MessageHeader chunk{MessageKind::kGenerateChunk, "req-1", "model-a", 3, false};
  absl::StatusOr<std::pair<uint64_t, Bytes>> sealed = sender.Seal(chunk, ToBytes("tokens"));
  ASSERT_TRUE(sealed.ok());
  for (const MessageHeader& wrong :
       {MessageHeader{MessageKind::kGenerateChunk, "req-1", "model-a", 2, false},
        MessageHeader{MessageKind::kGenerateChunk, "req-1", "model-a", 4, false},
        MessageHeader{MessageKind::kGenerateChunk, "req-1", "model-a", 3, true},
        MessageHeader{MessageKind::kGenerateChunk, "req-2", "model-a", 3, false},
        MessageHeader{MessageKind::kGenerate, "req-1", "model-a", 3, false}}) {
    EXPECT_EQ(receiver.Open(sealed->first, wrong, sealed->second).status().code(),
              absl::StatusCode::kDataLoss)
        << wrong.chunk << " " << wrong.final;
  }
  absl::StatusOr<Bytes> opened = receiver.Open(sealed->first, chunk, sealed->second);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(*opened, ToBytes("tokens"));

  const Bytes id(16, 0x11);
  const Bytes base = MessageAad(id, Direction::kEnclaveToClient, 7,
                                MessageHeader{MessageKind::kGenerateChunk, "r", "m", 0, false});
  const Bytes last = MessageAad(id, Direction::kEnclaveToClient, 7,
                                MessageHeader{MessageKind::kGenerateChunk, "r", "m", 0x0102, true});
  ASSERT_EQ(last.size(), base.size());
  EXPECT_EQ(HexEncode(ByteSpan(last).last(9)), "000000000000010201");
  EXPECT_EQ(HexEncode(ByteSpan(base).last(9)), "000000000000000000");
  EXPECT_EQ(MessageAad(id, Direction::kClientToEnclave, 7, kInferHeader),
            MessageAad(id, Direction::kClientToEnclave, 7,
                       MessageHeader{MessageKind::kInfer, "req-1", "model-a", 9, true}));
}

TEST(Channel, ReplayWindow) {
  Session session = MakeSession();
  ChannelSender sender = ClientSender(session.client);
  ChannelReceiver receiver = EnclaveReceiver(session.enclave);
  std::vector<Bytes> sealed;
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<std::pair<uint64_t, Bytes>> s = sender.Seal(kInferHeader, ToBytes("m"));
    ASSERT_TRUE(s.ok());
    sealed.push_back(s->second);
  }
  // Out of order within the window: each accepted once.
  for (uint64_t seq : {5, 3, 9, 0, 4}) {
    EXPECT_TRUE(receiver.Open(seq, kInferHeader, sealed[seq]).ok()) << seq;
  }
  EXPECT_EQ(receiver.highest_sequence(), 9u);
  for (uint64_t seq : {5, 3, 9, 0, 4}) {
    absl::StatusOr<Bytes> again = receiver.Open(seq, kInferHeader, sealed[seq]);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kPermissionDenied) << seq;
    EXPECT_NE(again.status().message().find("replayed message"), std::string::npos);
  }
  // Peek authenticates without consuming; CheckSequence answers without crypto.
  EXPECT_TRUE(receiver.CheckSequence(7).ok());
  ASSERT_TRUE(receiver.Peek(7, kInferHeader, sealed[7]).ok());
  EXPECT_TRUE(receiver.Open(7, kInferHeader, sealed[7]).ok());
  EXPECT_EQ(receiver.Peek(7, kInferHeader, sealed[7]).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(receiver.CheckSequence(7).code(), absl::StatusCode::kPermissionDenied);

  // Jump ahead: sequence 1100 moves the window, so 1 (never received, but 1099 behind) and
  // everything older than 1100 - 1023 are refused; 77 (age 1023) is still inside.
  sender.SetNextSequenceForTest(1100);
  absl::StatusOr<std::pair<uint64_t, Bytes>> far = sender.Seal(kInferHeader, ToBytes("far"));
  ASSERT_TRUE(far.ok());
  ASSERT_TRUE(receiver.Open(1100, kInferHeader, far->second).ok());
  EXPECT_EQ(receiver.Open(1, kInferHeader, sealed[1]).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(receiver.CheckSequence(1100 - kReplayWindow).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(receiver.CheckSequence(1100 - kReplayWindow + 1).ok());
  EXPECT_EQ(receiver.CheckSequence(uint64_t{1} << 63).code(), absl::StatusCode::kInvalidArgument);
}

// The window against a plain model (a set of accepted numbers), over random arrivals that
// cross word boundaries of the bitmap.
TEST(Channel, ReplayWindowMatchesModel) {
  Session session = MakeSession();
  ChannelSender sender = ClientSender(session.client);
  ChannelReceiver receiver = EnclaveReceiver(session.enclave);
  std::mt19937_64 random(12345);
  std::set<uint64_t> accepted;
  uint64_t highest = 0;
  for (int step = 0; step < 3000; ++step) {
    // Mostly near the top, sometimes far ahead or far behind.
    const uint64_t jitter = random() % 1200;
    uint64_t seq = step % 97 == 0 ? highest + 500 + random() % 800
                                  : (highest + 100 > jitter ? highest + 100 - jitter : 0);
    sender.SetNextSequenceForTest(seq);
    absl::StatusOr<std::pair<uint64_t, Bytes>> sealed = sender.Seal(kInferHeader, {});
    ASSERT_TRUE(sealed.ok());
    const bool fresh = !accepted.count(seq) &&
                       (accepted.empty() || seq > highest || highest - seq < kReplayWindow);
    absl::StatusOr<Bytes> opened = receiver.Open(seq, kInferHeader, sealed->second);
    ASSERT_EQ(opened.ok(), fresh) << "step " << step << " seq " << seq << " highest " << highest;
    if (fresh) {
      accepted.insert(seq);
      highest = std::max(highest, seq);
    }
  }
  EXPECT_EQ(receiver.highest_sequence(), highest);
}

TEST(Channel, SenderStopsAtTheSequenceLimit) {
  Session session = MakeSession();
  ChannelSender sender = ClientSender(session.client);
  sender.SetNextSequenceForTest((uint64_t{1} << 63) - 1);
  EXPECT_TRUE(sender.Seal(kInferHeader, {}).ok());
  EXPECT_EQ(sender.Seal(kInferHeader, {}).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(Channel, WireEncodings) {
  const Bytes base(12, 0xF0);
  EXPECT_EQ(HexEncode(SequenceNonce(base, 0)), "f0f0f0f0f0f0f0f0f0f0f0f0");
  EXPECT_EQ(HexEncode(SequenceNonce(base, 0x0102)), "f0f0f0f0f0f0f0f0f0f0f1f2");
  EXPECT_EQ(HexEncode(SequenceNonce(base, ~uint64_t{0})), "f0f0f0f00f0f0f0f0f0f0f0f");

  const Bytes session_id(16, 0x11);
  const Bytes aad = MessageAad(session_id, Direction::kClientToEnclave, 7, kInferHeader);
  EXPECT_EQ(ToString(ByteSpan(aad).first(19)), "cloister/v1 message");
  EXPECT_NE(aad, MessageAad(session_id, Direction::kEnclaveToClient, 7, kInferHeader));
  EXPECT_NE(aad, MessageAad(session_id, Direction::kClientToEnclave, 8, kInferHeader));

  const Bytes transcript = SessionTranscript(Bytes(48, 1), Bytes(32, 2), Bytes(32, 3), Bytes(32, 4),
                                             Bytes(32, 5), Bytes(32, 6), "tenant");
  EXPECT_EQ(ToString(ByteSpan(transcript).first(30)), "cloister/v1 session transcript");
  EXPECT_EQ(transcript.size(), 30u + 7 * 4 + 48 + 5 * 32 + 6);
  // Field boundaries are unambiguous.
  EXPECT_NE(SessionTranscript(Bytes(2, 1), {}, {}, {}, {}, {}, ""),
            SessionTranscript(Bytes(1, 1), Bytes(1, 1), {}, {}, {}, {}, ""));
  EXPECT_NE(SessionHpkeInfo(Bytes(48, 1)), SessionHpkeInfo(Bytes(48, 2)));
}

}  // namespace
}  // namespace cloister::crypto
