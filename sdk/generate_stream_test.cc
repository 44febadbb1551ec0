// Tests of GenerateStreamVerifier (generate_stream.h) against chunks sealed by the enclave's
// side of a real session channel: a stream in order is accepted and put together, and each
// thing a host could do to a stream (drop, reorder, replay, splice, flip the final flag, tamper,
// cut short) is refused with its own error.
#include "sdk/generate_stream.h"

#include <memory>
#include <string>
#include <vector>

#include "crypto/channel.h"
#include "crypto/hpke.h"
#include "crypto/keys.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/error_reason.h"

namespace cloister::sdk {
namespace {

namespace api = ::cloister::api::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kRequest[] = "0123456789abcdef";
constexpr char kHandle[] = "model-handle-a";

ByteSpan Span(const std::string& s) {
  return ByteSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// One session's enclave-to-client direction, both ends, keyed the way a real session is
// (HPKE setup on both sides, crypto::DeriveChannelKeys).
class GenerateStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    crypto::X25519KeyPair enclave_key = crypto::GenerateX25519();
    const Bytes info = crypto::SessionHpkeInfo(Bytes(48, 0xEE));
    auto sender = crypto::HpkeSetupSender(crypto::kSessionSuite, enclave_key.public_key, info);
    ASSERT_TRUE(sender.ok()) << sender.status();
    auto receiver = crypto::HpkeSetupReceiver(crypto::kSessionSuite, sender->enc,
                                              enclave_key.private_key.span(), info);
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    auto client_keys = crypto::DeriveChannelKeys(*sender->context);
    auto enclave_keys = crypto::DeriveChannelKeys(**receiver);
    ASSERT_TRUE(client_keys.ok() && enclave_keys.ok());
    enclave_ = std::make_unique<crypto::ChannelSender>(
        enclave_keys->session_id, crypto::Direction::kEnclaveToClient,
        enclave_keys->enclave_to_client_key.span(), enclave_keys->enclave_to_client_nonce.span());
    client_ = std::make_unique<crypto::ChannelReceiver>(
        client_keys->session_id, crypto::Direction::kEnclaveToClient,
        client_keys->enclave_to_client_key.span(), client_keys->enclave_to_client_nonce.span());
  }

  // The enclave's chunk `chunk` (final or not) carrying `plaintext`, sealed for `request_id`.
  api::SealedChunk Seal(uint64_t chunk, bool final, const api::GenerateChunk& plaintext,
                        const std::string& request_id = kRequest,
                        const std::string& handle = kHandle) {
    const crypto::MessageHeader header{crypto::MessageKind::kGenerateChunk, request_id, handle,
                                       chunk, final};
    auto sealed = enclave_->Seal(header, Span(plaintext.SerializeAsString()));
    EXPECT_TRUE(sealed.ok()) << sealed.status();
    api::SealedChunk out;
    out.set_sequence(sealed->first);
    out.set_chunk(chunk);
    out.set_final(final);
    out.set_ciphertext(std::string(sealed->second.begin(), sealed->second.end()));
    return out;
  }

  // A middle chunk: one token and its text, padded as the enclave pads.
  static api::GenerateChunk Tokens(int32_t id, const std::string& text) {
    api::GenerateChunk chunk;
    chunk.set_text(text);
    chunk.add_tokens()->set_id(id);
    chunk.set_padding(std::string(40, '\0'));
    return chunk;
  }
  static api::GenerateChunk Last(int32_t id, const std::string& text) {
    api::GenerateChunk chunk = Tokens(id, text);
    chunk.set_finish_reason("stop");
    chunk.mutable_usage()->set_prompt_tokens(5);
    chunk.mutable_usage()->set_cached_tokens(2);
    chunk.mutable_usage()->set_completion_tokens(3);
    chunk.set_receipt("receipt-bytes");
    chunk.set_receipt_signature("signature-bytes");
    return chunk;
  }

  // Feeds `sealed` (a copy: opening wipes it) to the verifier.
  absl::StatusOr<api::GenerateChunk> Feed(api::SealedChunk sealed) {
    return verifier_.Open(*client_, sealed);
  }

  // Expects `sealed` to be refused with DATA_LOSS mentioning `what`, and the refusal to stick.
  void ExpectRefused(const api::SealedChunk& sealed, const std::string& what) {
    absl::StatusOr<api::GenerateChunk> opened = Feed(sealed);
    ASSERT_FALSE(opened.ok());
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss) << opened.status();
    EXPECT_THAT(opened.status().message(), HasSubstr(what));
    EXPECT_THAT(opened.status().message(), HasSubstr(kRequest));
    EXPECT_EQ(opened.status().message().find('\n'), absl::string_view::npos);
    EXPECT_TRUE(verifier_.done());
    absl::StatusOr<GenerateResult> result = verifier_.Finish();
    EXPECT_EQ(result.status(), opened.status());
  }

  std::unique_ptr<crypto::ChannelSender> enclave_;
  std::unique_ptr<crypto::ChannelReceiver> client_;
  GenerateStreamVerifier verifier_{kRequest, kHandle};
};

TEST_F(GenerateStreamTest, InOrderStreamIsAcceptedAndPutTogether) {
  std::vector<std::string> seen;
  for (const api::SealedChunk& sealed :
       {Seal(0, false, Tokens(11, "Hel")), Seal(1, false, Tokens(12, "lo")),
        Seal(2, true, Last(13, "!"))}) {
    absl::StatusOr<api::GenerateChunk> chunk = Feed(sealed);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    EXPECT_TRUE(chunk->padding().empty());
    seen.push_back(chunk->text());
  }
  EXPECT_THAT(seen, ElementsAre("Hel", "lo", "!"));
  EXPECT_TRUE(verifier_.done());
  absl::StatusOr<GenerateResult> result = verifier_.Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->ids, ElementsAre(11, 12, 13));
  EXPECT_EQ(result->text, "Hello!");
  EXPECT_EQ(result->finish_reason, "stop");
  EXPECT_EQ(result->usage.prompt_tokens(), 5u);
  EXPECT_EQ(result->usage.cached_tokens(), 2u);
  EXPECT_EQ(result->usage.completion_tokens(), 3u);
  EXPECT_EQ(result->receipt, "receipt-bytes");
  EXPECT_EQ(result->receipt_signature, "signature-bytes");
  EXPECT_EQ(result->chunk_count, 3u);
}

TEST_F(GenerateStreamTest, SequenceNumbersMayRiseWithGapsForTheSessionsOtherReplies) {
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  // Another reply of the same session takes the next sequence numbers.
  ASSERT_TRUE(
      enclave_->Seal({crypto::MessageKind::kInfer, "other-request", kHandle}, Bytes(3)).ok());
  ASSERT_TRUE(
      enclave_->Seal({crypto::MessageKind::kInfer, "other-request", kHandle}, Bytes(3)).ok());
  ASSERT_TRUE(Feed(Seal(1, true, Last(2, "b"))).ok());
  absl::StatusOr<GenerateResult> result = verifier_.Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->text, "ab");
}

TEST_F(GenerateStreamTest, OneChunkStream) {
  ASSERT_TRUE(Feed(Seal(0, true, Last(7, "x"))).ok());
  absl::StatusOr<GenerateResult> result = verifier_.Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->ids, ElementsAre(7));
}

TEST_F(GenerateStreamTest, DroppedChunkIsAGap) {
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  Seal(1, false, Tokens(2, "b"));  // sealed, then dropped by the host
  ExpectRefused(Seal(2, true, Last(3, "c")),
                "chunk 2 (marked final) arrived where chunk 1 was due: chunk 1 is missing (a gap)");
}

TEST_F(GenerateStreamTest, SeveralDroppedChunksAreNamed) {
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  ExpectRefused(Seal(4, false, Tokens(5, "e")), "chunks 1 to 3 are missing (a gap)");
}

TEST_F(GenerateStreamTest, FirstChunkMissing) {
  Seal(0, false, Tokens(1, "a"));
  ExpectRefused(Seal(1, false, Tokens(2, "b")), "arrived where chunk 0 was due");
}

TEST_F(GenerateStreamTest, ReorderedPairIsRefused) {
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  api::SealedChunk one = Seal(1, false, Tokens(2, "b"));
  api::SealedChunk two = Seal(2, false, Tokens(3, "c"));
  ExpectRefused(two, "chunk 2 arrived where chunk 1 was due");
  EXPECT_THAT(Feed(two).status().message(), HasSubstr("out of order"));
  // The late one is refused too: the stream has failed.
  EXPECT_FALSE(Feed(one).ok());
}

TEST_F(GenerateStreamTest, ReplayedChunkIsRefused) {
  api::SealedChunk zero = Seal(0, false, Tokens(1, "a"));
  ASSERT_TRUE(Feed(zero).ok());
  ASSERT_TRUE(Feed(Seal(1, false, Tokens(2, "b"))).ok());
  ExpectRefused(zero, "chunk 0 was already received: a replayed chunk");
}

TEST_F(GenerateStreamTest, ReplayedSequenceNumberIsRefusedByTheWindow) {
  // A chunk that would open but reuses a sequence number already received.
  enclave_->SetNextSequenceForTest(5);
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  enclave_->SetNextSequenceForTest(5);
  ExpectRefused(Seal(1, false, Tokens(2, "b")), "chunk 1 was refused as a replay by the session's window");
}

TEST_F(GenerateStreamTest, ChunkOfAnotherRequestDoesNotOpen) {
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  ExpectRefused(Seal(1, false, Tokens(2, "b"), "fedcba9876543210"), "chunk 1 does not open");
}

TEST_F(GenerateStreamTest, ChunkForAnotherModelDoesNotOpen) {
  ExpectRefused(Seal(0, false, Tokens(1, "a"), kRequest, "model-handle-b"),
                "chunk 0 does not open");
}

TEST_F(GenerateStreamTest, MiddleChunkClaimingFinalDoesNotOpen) {
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  api::SealedChunk middle = Seal(1, false, Tokens(2, "b"));
  middle.set_final(true);  // the host cuts the stream short and calls this chunk the last
  ExpectRefused(middle, "chunk 1 (marked final) does not open");
}

TEST_F(GenerateStreamTest, FinalChunkPassedOffAsAMiddleOneDoesNotOpen) {
  api::SealedChunk last = Seal(0, true, Last(1, "a"));
  last.set_final(false);
  ExpectRefused(last, "chunk 0 does not open");
}

TEST_F(GenerateStreamTest, RenumberedChunkDoesNotOpen) {
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  api::SealedChunk two = Seal(2, false, Tokens(3, "c"));
  two.set_chunk(1);  // the host fills the gap it made
  ExpectRefused(two, "chunk 1 does not open");
}

TEST_F(GenerateStreamTest, ChunkAfterFinalIsRefused) {
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  ASSERT_TRUE(Feed(Seal(1, true, Last(2, "b"))).ok());
  ExpectRefused(Seal(2, false, Tokens(3, "c")), "chunk 2 arrived after the final chunk (1)");
}

TEST_F(GenerateStreamTest, FinalChunkAgainIsRefused) {
  api::SealedChunk last = Seal(0, true, Last(1, "a"));
  ASSERT_TRUE(Feed(last).ok());
  ExpectRefused(last, "arrived after the final chunk");
}

TEST_F(GenerateStreamTest, TamperedCiphertextDoesNotOpen) {
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  api::SealedChunk tampered = Seal(1, false, Tokens(2, "b"));
  (*tampered.mutable_ciphertext())[3] ^= 0x01;
  ExpectRefused(tampered, "chunk 1 does not open (tampered with");
  // A tampered chunk spends nothing: the untampered one would still open on a fresh verifier
  // (the window did not record its sequence number).
  EXPECT_TRUE(client_->CheckSequence(tampered.sequence()).ok());
}

TEST_F(GenerateStreamTest, PlaintextThatIsNoGenerateChunkIsRefused) {
  const crypto::MessageHeader header{crypto::MessageKind::kGenerateChunk, kRequest, kHandle, 0,
                                     false};
  auto sealed = enclave_->Seal(header, Bytes{0xff, 0xff, 0xff});
  ASSERT_TRUE(sealed.ok());
  api::SealedChunk chunk;
  chunk.set_sequence(sealed->first);
  chunk.set_ciphertext(std::string(sealed->second.begin(), sealed->second.end()));
  ExpectRefused(chunk, "chunk 0 opens but is not a GenerateChunk");
}

TEST_F(GenerateStreamTest, StreamEndingWithoutFinalIsDataLoss) {
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  ASSERT_TRUE(Feed(Seal(1, false, Tokens(2, "b"))).ok());
  EXPECT_FALSE(verifier_.done());
  absl::StatusOr<GenerateResult> result = verifier_.Finish();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(result.status().message(),
              HasSubstr("generation stream ended without its final chunk"));
  EXPECT_THAT(result.status().message(), HasSubstr("2 chunks received"));
}

TEST_F(GenerateStreamTest, EmptyStreamIsDataLoss) {
  absl::StatusOr<GenerateResult> result = verifier_.Finish();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(result.status().message(),
              HasSubstr("generation stream ended without its final chunk"));
}

TEST_F(GenerateStreamTest, ErrorChunkIsTheCallsError) {
  ASSERT_TRUE(Feed(Seal(0, false, Tokens(1, "a"))).ok());
  api::GenerateChunk error;
  error.set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  error.set_message("the prompt is longer than the model's context");
  error.set_reason(api::QUOTA_EXCEEDED);
  absl::StatusOr<api::GenerateChunk> opened = Feed(Seal(1, true, error));
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(opened.status().message(), "the prompt is longer than the model's context");
  EXPECT_EQ(proto::ReasonOf(opened.status()), api::QUOTA_EXCEEDED);
  EXPECT_TRUE(verifier_.done());
  EXPECT_EQ(verifier_.Finish().status(), opened.status());
}

TEST_F(GenerateStreamTest, ErrorChunkWithAnUnknownCodeOrNoMessage) {
  api::GenerateChunk error;
  error.set_code(99);
  absl::StatusOr<api::GenerateChunk> opened = Feed(Seal(0, true, error));
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kUnknown);
  EXPECT_THAT(opened.status().message(), HasSubstr("code 99"));
}

}  // namespace
}  // namespace cloister::sdk
