#include "crypto/chunked.h"

#include <algorithm>

#include "crypto/hash.h"
#include "crypto/random.h"
#include "crypto/testing/test_vectors.h"
#include "gtest/gtest.h"

namespace cloister::crypto {
namespace {

using testing::HasFlag;
using testing::HexField;
using testing::LoadVectors;
using testing::TestLabel;
using testing::ZlibInflate;

struct StreamResult {
  absl::Status status;
  Bytes released;  // everything the decryptor handed out, even when it failed later
};

// Feeds `ciphertext` in pieces of `piece_size` bytes (0: all at once) and finishes.
StreamResult StreamDecrypt(ChunkedDecryptor& decryptor, ByteSpan ciphertext, size_t piece_size) {
  StreamResult result;
  if (piece_size == 0) piece_size = std::max<size_t>(ciphertext.size(), 1);
  for (size_t offset = 0; offset < ciphertext.size() && result.status.ok(); offset += piece_size) {
    result.status = decryptor.Update(
        ciphertext.subspan(offset, std::min(piece_size, ciphertext.size() - offset)),
        result.released);
  }
  if (result.status.ok()) result.status = decryptor.Finish(result.released);
  if (!result.status.ok()) {
    // Sticky: every later call reports the same error and releases nothing.
    const size_t size = result.released.size();
    EXPECT_EQ(decryptor.Update(Bytes(10), result.released), result.status);
    EXPECT_EQ(decryptor.Finish(result.released), result.status);
    EXPECT_EQ(result.released.size(), size);
  }
  return result;
}

// C2SP chunked encryption, Cobblestone-256: all 35 vectors through the checks of
// shared/specs/chunked-encryption.md section 9.2.
TEST(ChunkedVectors, WycheproofCobblestone256) {
  absl::StatusOr<nlohmann::json> vectors =
      LoadVectors("wycheproof/testvectors_v1/c2sp_chunked_encryption_aes_256_gcm_test.json");
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  int main_checks = 0, derived_checks = 0, prefix_checks = 0, raw_checks = 0, encrypt_checks = 0;
  for (const auto& group : (*vectors)["testGroups"]) {
    ASSERT_EQ(group["aead"], "AEAD_AES_256_GCM");
    for (const auto& test : group["tests"]) {
      SCOPED_TRACE(TestLabel(test));
      const Bytes key = HexField(test, "key");
      const Bytes context = HexField(test, "ctx");
      absl::StatusOr<Bytes> ciphertext = ZlibInflate(HexField(test, "ct"));
      ASSERT_TRUE(ciphertext.ok()) << ciphertext.status();
      const bool valid = test["result"] == "valid";
      // Valid and PartialPlaintext vectors describe the releasable plaintext.
      const size_t msg_length = test.value("msgLength", size_t{0});
      const std::string msg_sha512 = test.value("msgSha512", std::string());
      EXPECT_EQ(test.contains("msgLength"), valid || HasFlag(test, "PartialPlaintext"));

      // Main check: the one-shot decryption.
      absl::StatusOr<Bytes> plaintext = ChunkedDecrypt(key, context, *ciphertext);
      if (valid) {
        ASSERT_TRUE(plaintext.ok()) << plaintext.status();
        EXPECT_EQ(plaintext->size(), msg_length);
        EXPECT_EQ(HexEncode(Sha512(*plaintext)), msg_sha512);
      } else {
        EXPECT_FALSE(plaintext.ok());
      }
      if (HasFlag(test, "InvalidKeySize")) {
        EXPECT_EQ(ChunkedDecryptor::Create(key, context).status().code(),
                  absl::StatusCode::kInvalidArgument);
        EXPECT_EQ(plaintext.status().code(), absl::StatusCode::kInvalidArgument);
        ++main_checks;
        continue;
      }
      ++main_checks;

      // Streaming: whole, in odd pieces and byte-sized pieces at the start. The released
      // prefix is the whole message (valid), the PartialPlaintext prefix, or nothing.
      for (size_t piece : {size_t{0}, size_t{4099}, size_t{16400}, size_t{1}}) {
        if (piece == 1 && ciphertext->size() > 40000) continue;  // keep the run short
        SCOPED_TRACE("piece size " + std::to_string(piece));
        absl::StatusOr<std::unique_ptr<ChunkedDecryptor>> decryptor =
            ChunkedDecryptor::Create(key, context);
        ASSERT_TRUE(decryptor.ok());
        StreamResult stream = StreamDecrypt(**decryptor, *ciphertext, piece);
        EXPECT_EQ(stream.status.ok(), valid) << stream.status;
        if (valid || HasFlag(test, "PartialPlaintext")) {
          EXPECT_EQ(stream.released.size(), msg_length);
          EXPECT_EQ(HexEncode(Sha512(stream.released)), msg_sha512);
        } else {
          EXPECT_TRUE(stream.released.empty()) << stream.released.size() << " bytes released";
        }
      }
      ++prefix_checks;

      if (HasFlag(test, "HeaderFailure")) {
        EXPECT_FALSE(test.contains("aeadKey"));
        continue;
      }
      // Derived values (section 3).
      const Bytes aead_key = HexField(test, "aeadKey");
      const Bytes base_nonce = HexField(test, "baseNonce");
      ASSERT_GE(ciphertext->size(), kChunkedHeaderSize);
      const ByteSpan salt = ByteSpan(*ciphertext).first(kChunkedSaltSize);
      absl::StatusOr<std::pair<SecretBytes, Bytes>> derived =
          ChunkedDeriveForTest(key, salt, context);
      ASSERT_TRUE(derived.ok()) << derived.status();
      EXPECT_EQ(HexEncode(derived->first.span()), HexEncode(aead_key));
      EXPECT_EQ(HexEncode(derived->second), HexEncode(base_nonce));
      ++derived_checks;

      // Raw mode: the same result without the header.
      absl::StatusOr<std::unique_ptr<ChunkedDecryptor>> raw =
          ChunkedDecryptor::CreateRaw(aead_key, base_nonce);
      ASSERT_TRUE(raw.ok()) << raw.status();
      StreamResult raw_result =
          StreamDecrypt(**raw, ByteSpan(*ciphertext).subspan(kChunkedHeaderSize), 0);
      EXPECT_EQ(raw_result.status.ok(), valid) << raw_result.status;
      if (valid) {
        EXPECT_EQ(raw_result.released, *plaintext);
      }
      ++raw_checks;

      // Encryption with the vector's salt reproduces the ciphertext byte for byte, fed in
      // uneven pieces to exercise buffering.
      if (valid) {
        absl::StatusOr<std::unique_ptr<ChunkedEncryptor>> encryptor =
            ChunkedEncryptor::Create(key, context, salt);
        ASSERT_TRUE(encryptor.ok()) << encryptor.status();
        Bytes out;
        const ByteSpan message = *plaintext;
        size_t offset = 0;
        for (size_t piece = 1; offset < message.size(); piece = piece * 3 + 7) {
          const size_t take = std::min(piece, message.size() - offset);
          ASSERT_TRUE((*encryptor)->Update(message.subspan(offset, take), out).ok());
          offset += take;
        }
        ASSERT_TRUE((*encryptor)->Finish(out).ok());
        EXPECT_EQ(out.size(), ChunkedCiphertextSize(message.size()));
        EXPECT_TRUE(out == *ciphertext) << "re-encryption differs";
        ++encrypt_checks;
      }
    }
  }
  EXPECT_EQ(main_checks, 35);
  EXPECT_EQ(prefix_checks, 33);  // all but the two InvalidKeySize vectors
  EXPECT_EQ(derived_checks, 25);
  EXPECT_EQ(raw_checks, 25);
  EXPECT_EQ(encrypt_checks, 10);
  std::printf("c2sp chunked: %d main, %d derived, %d streaming, %d raw, %d re-encryptions\n",
              main_checks, derived_checks, prefix_checks, raw_checks, encrypt_checks);
}

TEST(Chunked, RoundTripAtChunkBoundaries) {
  const Bytes key = RandomBytes(kChunkedKeySize);
  const Bytes context = ToBytes("model:resnet");
  for (size_t size : {size_t{0}, size_t{1}, kChunkedPlainChunkSize - 1, kChunkedPlainChunkSize,
                      kChunkedPlainChunkSize + 1, 3 * kChunkedPlainChunkSize, size_t{100000}}) {
    SCOPED_TRACE(size);
    const Bytes message = RandomBytes(size);
    absl::StatusOr<Bytes> sealed = ChunkedEncrypt(key, context, message);
    ASSERT_TRUE(sealed.ok()) << sealed.status();
    EXPECT_EQ(sealed->size(), ChunkedCiphertextSize(size));
    absl::StatusOr<Bytes> opened = ChunkedDecrypt(key, context, *sealed);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(*opened, message);
    // Every truncation fails, and so does one extra byte.
    for (size_t cut : {size_t{1}, size_t{16}, size_t{17}}) {
      if (cut > sealed->size()) continue;
      EXPECT_FALSE(
          ChunkedDecrypt(key, context, ByteSpan(*sealed).first(sealed->size() - cut)).ok());
    }
    Bytes longer = *sealed;
    longer.push_back(0);
    EXPECT_FALSE(ChunkedDecrypt(key, context, longer).ok());
    EXPECT_FALSE(ChunkedDecrypt(key, ToBytes("model:resnex"), *sealed).ok());
  }
  // Two encryptions of the same message differ (fresh salt).
  absl::StatusOr<Bytes> a = ChunkedEncrypt(key, {}, ToBytes("same"));
  absl::StatusOr<Bytes> b = ChunkedEncrypt(key, {}, ToBytes("same"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
}

TEST(Chunked, ChunkSwapIsRefusedAfterReleasingTheGoodPrefix) {
  const Bytes key = RandomBytes(kChunkedKeySize);
  const Bytes message = RandomBytes(3 * kChunkedPlainChunkSize + 5);
  absl::StatusOr<Bytes> sealed = ChunkedEncrypt(key, {}, message);
  ASSERT_TRUE(sealed.ok());
  Bytes swapped = *sealed;
  const size_t chunk1 = kChunkedHeaderSize + kChunkedCipherChunkSize;
  std::swap_ranges(swapped.begin() + chunk1, swapped.begin() + chunk1 + kChunkedCipherChunkSize,
                   swapped.begin() + chunk1 + kChunkedCipherChunkSize);
  absl::StatusOr<std::unique_ptr<ChunkedDecryptor>> decryptor = ChunkedDecryptor::Create(key, {});
  ASSERT_TRUE(decryptor.ok());
  StreamResult result = StreamDecrypt(**decryptor, swapped, 0);
  EXPECT_EQ(result.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(result.released, Bytes(message.begin(), message.begin() + kChunkedPlainChunkSize));
  absl::StatusOr<Bytes> one_shot = ChunkedDecrypt(key, {}, swapped);
  EXPECT_EQ(one_shot.status().code(), absl::StatusCode::kDataLoss);
}

TEST(Chunked, RefusesBadKeysSaltsAndCallsAfterFinish) {
  EXPECT_EQ(ChunkedEncryptor::Create(Bytes(31), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChunkedEncryptor::Create(Bytes(32), {}, Bytes(23)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChunkedDecryptor::Create(Bytes(33), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChunkedDecryptor::CreateRaw(Bytes(32), Bytes(11)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChunkedDecryptor::CreateRaw(Bytes(16), Bytes(12)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChunkedEncrypt(Bytes(16), {}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChunkedDeriveForTest(Bytes(32), Bytes(24), {}).status().ok(), true);
  EXPECT_EQ(ChunkedDeriveForTest(Bytes(32), Bytes(25), {}).status().code(),
            absl::StatusCode::kInvalidArgument);

  absl::StatusOr<std::unique_ptr<ChunkedEncryptor>> encryptor =
      ChunkedEncryptor::Create(Bytes(32, 1), {});
  ASSERT_TRUE(encryptor.ok());
  Bytes out;
  ASSERT_TRUE((*encryptor)->Finish(out).ok());
  EXPECT_EQ(out.size(), ChunkedCiphertextSize(0));
  EXPECT_EQ((*encryptor)->Update(ToBytes("x"), out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*encryptor)->Finish(out).code(), absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<std::unique_ptr<ChunkedDecryptor>> decryptor =
      ChunkedDecryptor::Create(Bytes(32, 1), {});
  ASSERT_TRUE(decryptor.ok());
  Bytes plain;
  ASSERT_TRUE((*decryptor)->Update(out, plain).ok());
  ASSERT_TRUE((*decryptor)->Finish(plain).ok());
  EXPECT_TRUE(plain.empty());
  EXPECT_EQ((*decryptor)->Update(Bytes(1), plain).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ChunkedCiphertextSize(16384), 56u + 16384 + 32);
}

}  // namespace
}  // namespace cloister::crypto
