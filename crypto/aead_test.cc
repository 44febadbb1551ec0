#include "crypto/aead.h"

#include <algorithm>

#include <thread>
#include <vector>

#include "base/status.h"
#include "crypto/random.h"
#include "crypto/testing/test_vectors.h"
#include "gtest/gtest.h"

namespace cloister::crypto {
namespace {

using testing::HexField;
using testing::LoadVectors;
using testing::TestLabel;

Bytes Concat(ByteSpan a, ByteSpan b) {
  Bytes out(a.begin(), a.end());
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// Runs one Wycheproof AEAD file against `alg_for_key_size`. Groups whose parameters the API does
// not support (key sizes without an algorithm, nonces other than 96 bits) must be refused with
// InvalidArgument before any crypto runs; the rest must match exactly.
struct AeadFileCounts {
  int valid_matched = 0;
  int invalid_refused = 0;
  int refused_by_api = 0;
};

void RunWycheproofAeadFile(const std::string& relative, bool chacha, AeadFileCounts& counts) {
  absl::StatusOr<nlohmann::json> vectors = LoadVectors(relative);
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  for (const auto& group : (*vectors)["testGroups"]) {
    const int key_bits = group["keySize"];
    const int iv_bits = group["ivSize"];
    const int tag_bits = group["tagSize"];
    for (const auto& test : group["tests"]) {
      SCOPED_TRACE(TestLabel(test) + " key " + std::to_string(key_bits) + " iv " +
                   std::to_string(iv_bits));
      const Bytes key = HexField(test, "key");
      const Bytes iv = HexField(test, "iv");
      const Bytes aad = HexField(test, "aad");
      const Bytes msg = HexField(test, "msg");
      const Bytes sealed = Concat(HexField(test, "ct"), HexField(test, "tag"));
      const bool valid = test["result"] == "valid";
      AeadAlg alg = chacha ? AeadAlg::kChaCha20Poly1305
                           : (key_bits == 128 ? AeadAlg::kAes128Gcm : AeadAlg::kAes256Gcm);
      absl::StatusOr<std::unique_ptr<Aead>> aead = Aead::Create(alg, key);
      if (!chacha && key_bits == 192) {
        // No AES-192 in the API: both AES algorithms refuse a 24-byte key.
        EXPECT_EQ(aead.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_EQ(Aead::Create(AeadAlg::kAes128Gcm, key).status().code(),
                  absl::StatusCode::kInvalidArgument);
        ++counts.refused_by_api;
        continue;
      }
      ASSERT_TRUE(aead.ok()) << aead.status();
      if (iv_bits != 96 || tag_bits != 128) {
        EXPECT_EQ((*aead)->Seal(iv, aad, msg).status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_EQ((*aead)->Open(iv, aad, sealed).status().code(),
                  absl::StatusCode::kInvalidArgument);
        ++counts.refused_by_api;
        continue;
      }
      absl::StatusOr<Bytes> opened = (*aead)->Open(iv, aad, sealed);
      if (valid) {
        absl::StatusOr<Bytes> seal = (*aead)->Seal(iv, aad, msg);
        ASSERT_TRUE(seal.ok()) << seal.status();
        EXPECT_EQ(HexEncode(*seal), HexEncode(sealed));
        ASSERT_TRUE(opened.ok()) << opened.status();
        EXPECT_EQ(HexEncode(*opened), HexEncode(msg));
        ++counts.valid_matched;
      } else {
        EXPECT_FALSE(opened.ok()) << "an invalid vector opened";
        if (!opened.ok()) {
          EXPECT_TRUE(opened.status().code() == absl::StatusCode::kDataLoss ||
                      opened.status().code() == absl::StatusCode::kInvalidArgument)
              << opened.status();
        }
        ++counts.invalid_refused;
      }
    }
  }
  EXPECT_EQ(counts.valid_matched + counts.invalid_refused + counts.refused_by_api,
            (*vectors)["numberOfTests"].get<int>());
}

TEST(AeadVectors, WycheproofAesGcm) {
  AeadFileCounts counts;
  RunWycheproofAeadFile("wycheproof/testvectors_v1/aes_gcm_test.json", /*chacha=*/false, counts);
  // Pinned: the 96-bit-nonce vectors for 128- and 256-bit keys run; every group with another
  // nonce size or a 192-bit key is refused by the API.
  EXPECT_GT(counts.valid_matched, 0);
  EXPECT_GT(counts.invalid_refused, 0);
  EXPECT_GT(counts.refused_by_api, 0);
  std::printf("aes_gcm_test.json: %d valid matched, %d invalid refused, %d refused by API\n",
              counts.valid_matched, counts.invalid_refused, counts.refused_by_api);
}

TEST(AeadVectors, WycheproofChaCha20Poly1305) {
  AeadFileCounts counts;
  RunWycheproofAeadFile("wycheproof/testvectors_v1/chacha20_poly1305_test.json", /*chacha=*/true,
                        counts);
  EXPECT_GT(counts.valid_matched, 0);
  EXPECT_GT(counts.invalid_refused, 0);
  std::printf(
      "chacha20_poly1305_test.json: %d valid matched, %d invalid refused, %d refused by "
      "API\n",
      counts.valid_matched, counts.invalid_refused, counts.refused_by_api);
}

void RunCavpFile(const std::string& relative, AeadAlg alg) {
  absl::StatusOr<nlohmann::json> vectors = LoadVectors(relative);
  ASSERT_TRUE(vectors.ok()) << vectors.status();
  int encrypt = 0, decrypt_ok = 0, decrypt_refused = 0;
  for (const auto& test : (*vectors)["encrypt"]) {
    SCOPED_TRACE("encrypt count " + std::to_string(test["count"].get<int>()));
    absl::StatusOr<std::unique_ptr<Aead>> aead = Aead::Create(alg, HexField(test, "key"));
    ASSERT_TRUE(aead.ok()) << aead.status();
    absl::StatusOr<Bytes> sealed =
        (*aead)->Seal(HexField(test, "iv"), HexField(test, "aad"), HexField(test, "pt"));
    ASSERT_TRUE(sealed.ok()) << sealed.status();
    EXPECT_EQ(HexEncode(*sealed), HexEncode(Concat(HexField(test, "ct"), HexField(test, "tag"))));
    ++encrypt;
  }
  for (const auto& test : (*vectors)["decrypt"]) {
    SCOPED_TRACE("decrypt count " + std::to_string(test["count"].get<int>()));
    absl::StatusOr<std::unique_ptr<Aead>> aead = Aead::Create(alg, HexField(test, "key"));
    ASSERT_TRUE(aead.ok()) << aead.status();
    absl::StatusOr<Bytes> opened =
        (*aead)->Open(HexField(test, "iv"), HexField(test, "aad"),
                      Concat(HexField(test, "ct"), HexField(test, "tag")));
    if (test["valid"].get<bool>()) {
      ASSERT_TRUE(opened.ok()) << opened.status();
      EXPECT_EQ(HexEncode(*opened), HexEncode(HexField(test, "pt")));
      ++decrypt_ok;
    } else {
      EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss);
      ++decrypt_refused;
    }
  }
  EXPECT_EQ(encrypt, 375);
  EXPECT_EQ(decrypt_ok + decrypt_refused, 375);
}

TEST(AeadVectors, NistCavpAes128Gcm) {
  RunCavpFile("nist_cavp/aes_128_gcm_iv96_tag128.json", AeadAlg::kAes128Gcm);
}
TEST(AeadVectors, NistCavpAes256Gcm) {
  RunCavpFile("nist_cavp/aes_256_gcm_iv96_tag128.json", AeadAlg::kAes256Gcm);
}

class AeadTest : public ::testing::TestWithParam<AeadAlg> {
 protected:
  std::unique_ptr<Aead> MakeAead() {
    absl::StatusOr<std::unique_ptr<Aead>> aead =
        Aead::Create(GetParam(), RandomBytes(AeadKeySize(GetParam())));
    CLOISTER_CHECK(aead.ok());
    return *std::move(aead);
  }
};

TEST_P(AeadTest, RefusesBadSizesBeforeCrypto) {
  EXPECT_EQ(Aead::Create(GetParam(), Bytes(AeadKeySize(GetParam()) - 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Aead::Create(GetParam(), Bytes(AeadKeySize(GetParam()) + 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto aead = MakeAead();
  EXPECT_EQ(aead->alg(), GetParam());
  const Bytes msg = ToBytes("message");
  for (size_t nonce_size : {0, 8, 11, 13, 16, 24}) {
    EXPECT_EQ(aead->Seal(Bytes(nonce_size), {}, msg).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(aead->Open(Bytes(nonce_size), {}, Bytes(32)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  const Bytes nonce(12, 1);
  EXPECT_EQ(aead->Open(nonce, {}, Bytes(15)).status().code(), absl::StatusCode::kInvalidArgument);
  Bytes wrong(msg.size() + 15);
  EXPECT_EQ(aead->SealInto(nonce, {}, msg, wrong).code(), absl::StatusCode::kInvalidArgument);
  Bytes too_big(msg.size() + 17);
  EXPECT_EQ(aead->SealInto(nonce, {}, msg, too_big).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(AeadTest, RoundTripAndTamperDetection) {
  auto aead = MakeAead();
  const Bytes nonce = RandomBytes(kAeadNonceSize);
  const Bytes aad = ToBytes("header");
  for (size_t size : {0, 1, 15, 16, 17, 1000, 65536 + 3}) {
    SCOPED_TRACE(size);
    const Bytes msg = RandomBytes(size);
    absl::StatusOr<Bytes> sealed = aead->Seal(nonce, aad, msg);
    ASSERT_TRUE(sealed.ok()) << sealed.status();
    ASSERT_EQ(sealed->size(), size + kAeadTagSize);
    absl::StatusOr<Bytes> opened = aead->Open(nonce, aad, *sealed);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(*opened, msg);
    Bytes flipped = *sealed;
    flipped[flipped.size() / 2] ^= 0x01;
    EXPECT_EQ(aead->Open(nonce, aad, flipped).status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(aead->Open(nonce, ToBytes("headex"), *sealed).status().code(),
              absl::StatusCode::kDataLoss);
    Bytes other_nonce = nonce;
    other_nonce[0] ^= 0x80;
    EXPECT_EQ(aead->Open(other_nonce, aad, *sealed).status().code(), absl::StatusCode::kDataLoss);
  }
}

TEST_P(AeadTest, InPlaceAndFailedOpenIntoWipesOutput) {
  auto aead = MakeAead();
  const Bytes nonce = RandomBytes(kAeadNonceSize);
  const Bytes msg = RandomBytes(4096);
  Bytes buffer(msg.size() + kAeadTagSize);
  std::copy(msg.begin(), msg.end(), buffer.begin());
  ASSERT_TRUE(aead->SealInto(nonce, {}, ByteSpan(buffer).first(msg.size()), buffer).ok());
  absl::StatusOr<Bytes> reference = aead->Seal(nonce, {}, msg);
  ASSERT_TRUE(reference.ok());
  EXPECT_EQ(buffer, *reference);
  std::span<uint8_t> plain_out(buffer.data(), msg.size());
  ASSERT_TRUE(aead->OpenInto(nonce, {}, buffer, plain_out).ok());
  EXPECT_EQ(Bytes(plain_out.begin(), plain_out.end()), msg);

  Bytes tampered = *reference;
  tampered.back() ^= 1;
  Bytes out(msg.size(), 0xAA);
  EXPECT_EQ(aead->OpenInto(nonce, {}, tampered, out).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(out, Bytes(msg.size(), 0));
}

TEST_P(AeadTest, InPiecesMatchesTheOneStepFormsAndReportsProgress) {
  auto aead = MakeAead();
  const Bytes nonce = RandomBytes(kAeadNonceSize);
  const Bytes aad = ToBytes("header");
  for (size_t size : {size_t{0}, size_t{1}, size_t{1000}, size_t{300000}}) {
    SCOPED_TRACE(size);
    const Bytes msg = RandomBytes(size);
    absl::StatusOr<Bytes> reference = aead->Seal(nonce, aad, msg);
    ASSERT_TRUE(reference.ok());
    Bytes sealed(size + kAeadTagSize);
    std::vector<size_t> ready;
    ASSERT_TRUE(aead->SealIntoInPieces(nonce, aad, msg, sealed, 65536, [&](size_t n) {
                      ready.push_back(n);
                      return absl::OkStatus();
                    }).ok());
    EXPECT_EQ(sealed, *reference);
    ASSERT_FALSE(ready.empty());
    EXPECT_TRUE(std::is_sorted(ready.begin(), ready.end()));
    EXPECT_EQ(ready.back(), sealed.size()) << "the tag was not announced last";

    Bytes opened(size, 0xAA);
    std::vector<size_t> waits;
    ASSERT_TRUE(aead->OpenIntoInPieces(nonce, aad, sealed, opened, 65536, [&](size_t n) {
                      waits.push_back(n);
                      return absl::OkStatus();
                    }).ok());
    EXPECT_EQ(opened, msg);
    EXPECT_TRUE(std::is_sorted(waits.begin(), waits.end()));
    EXPECT_EQ(waits.back(), sealed.size()) << "the tag was read before it was waited for";

    // A modified byte: refused, and the output wiped.
    Bytes tampered = sealed;
    tampered[tampered.size() / 2] ^= 1;
    Bytes out(size, 0xAA);
    EXPECT_EQ(aead->OpenIntoInPieces(nonce, aad, tampered, out, 65536,
                                     [](size_t) { return absl::OkStatus(); })
                  .code(),
              absl::StatusCode::kDataLoss);
    EXPECT_EQ(out, Bytes(size, 0));
    // A hook that fails stops the call with its error, the output wiped.
    Bytes stopped(size, 0xAA);
    EXPECT_EQ(aead->OpenIntoInPieces(nonce, aad, sealed, stopped, 65536,
                                     [](size_t) { return absl::CancelledError("sealer failed"); })
                  .code(),
              absl::StatusCode::kCancelled);
    EXPECT_EQ(stopped, Bytes(size, 0));
  }
}

TEST_P(AeadTest, APlaintextInPartsSealsAsItsConcatenation) {
  auto aead = MakeAead();
  const Bytes nonce = RandomBytes(kAeadNonceSize);
  const Bytes aad = ToBytes("header");
  // Parts of odd sizes, empty ones among them, so pieces of 65536 bytes cut across parts and a
  // part spans several pieces.
  std::vector<std::vector<size_t>> layouts = {
      {}, {0}, {0, 0, 5}, {1, 15, 16, 17}, {70000, 0, 3, 65533, 200000}, {300000}};
  // Many short parts, which are sealed together a few KiB at a time: runs longer than that, a
  // run cut by a piece boundary, and long parts between short ones.
  std::vector<size_t> short_runs;
  for (int i = 0; i < 300; ++i) short_runs.push_back(i % 7 == 3 ? 1023 + i % 3 : 333 + i % 5);
  short_runs.insert(short_runs.begin() + 150, 70000);
  layouts.push_back(short_runs);
  for (const std::vector<size_t>& sizes : layouts) {
    SCOPED_TRACE(::testing::PrintToString(sizes));
    std::vector<Bytes> parts;
    Bytes whole;
    for (size_t size : sizes) {
      parts.push_back(RandomBytes(size));
      whole.insert(whole.end(), parts.back().begin(), parts.back().end());
    }
    std::vector<ByteSpan> spans(parts.begin(), parts.end());
    absl::StatusOr<Bytes> reference = aead->Seal(nonce, aad, whole);
    ASSERT_TRUE(reference.ok());

    Bytes sealed(whole.size() + kAeadTagSize, 0xAA);
    ASSERT_TRUE(aead->SealPartsInto(nonce, aad, spans, sealed).ok());
    EXPECT_EQ(sealed, *reference);

    Bytes in_pieces(whole.size() + kAeadTagSize, 0xAA);
    std::vector<size_t> ready;
    // What is announced is final: it is already the reference's bytes.
    const Aead::PieceHook announce = [&](size_t n) {
      EXPECT_TRUE(std::equal(in_pieces.begin(), in_pieces.begin() + n, reference->begin()));
      ready.push_back(n);
      return absl::OkStatus();
    };
    ASSERT_TRUE(aead->SealPartsIntoInPieces(nonce, aad, spans, in_pieces, 65536, announce).ok());
    EXPECT_EQ(in_pieces, *reference);
    ASSERT_FALSE(ready.empty());
    EXPECT_TRUE(std::is_sorted(ready.begin(), ready.end()));
    EXPECT_EQ(ready.back(), in_pieces.size()) << "the tag was not announced last";

    // An output one byte off is refused before anything is written.
    Bytes short_out(whole.size() + kAeadTagSize - 1, 0xAA);
    EXPECT_EQ(aead->SealPartsInto(nonce, aad, spans, short_out).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(short_out, Bytes(short_out.size(), 0xAA));
  }
}

TEST_P(AeadTest, ConcurrentCallsOnOneObject) {
  auto aead = MakeAead();
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        Bytes nonce(kAeadNonceSize, 0);
        nonce[0] = static_cast<uint8_t>(t);
        nonce[1] = static_cast<uint8_t>(i);
        const Bytes msg(100 + i, static_cast<uint8_t>(t));
        absl::StatusOr<Bytes> sealed = aead->Seal(nonce, {}, msg);
        absl::StatusOr<Bytes> opened =
            sealed.ok() ? aead->Open(nonce, {}, *sealed) : sealed.status();
        if (!opened.ok() || *opened != msg) ++failures[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

INSTANTIATE_TEST_SUITE_P(AllAlgorithms, AeadTest,
                         ::testing::Values(AeadAlg::kAes128Gcm, AeadAlg::kAes256Gcm,
                                           AeadAlg::kChaCha20Poly1305),
                         [](const ::testing::TestParamInfo<AeadAlg>& info) {
                           switch (info.param) {
                             case AeadAlg::kAes128Gcm:
                               return std::string("Aes128Gcm");
                             case AeadAlg::kAes256Gcm:
                               return std::string("Aes256Gcm");
                             case AeadAlg::kChaCha20Poly1305:
                               return std::string("ChaCha20Poly1305");
                           }
                           return std::string("Unknown");
                         });

// Model-sized data in the PCIe path's 2 MiB chunks: one Aead object, many calls.
TEST(AeadTest, LargeBufferInTwoMiBChunks) {
  absl::StatusOr<std::unique_ptr<Aead>> aead = Aead::Create(AeadAlg::kAes256Gcm, RandomBytes(32));
  ASSERT_TRUE(aead.ok());
  constexpr size_t kChunk = 2 << 20;
  const Bytes model = RandomBytes(20 << 20);
  Bytes sealed(model.size() + (model.size() / kChunk) * kAeadTagSize);
  size_t out_offset = 0;
  for (size_t offset = 0, index = 0; offset < model.size(); offset += kChunk, ++index) {
    Bytes nonce(kAeadNonceSize, 0);
    nonce[11] = static_cast<uint8_t>(index);
    ASSERT_TRUE((*aead)
                    ->SealInto(nonce, {}, ByteSpan(model).subspan(offset, kChunk),
                               std::span<uint8_t>(sealed).subspan(out_offset, kChunk + 16))
                    .ok());
    out_offset += kChunk + kAeadTagSize;
  }
  Bytes opened(model.size());
  for (size_t index = 0; index < model.size() / kChunk; ++index) {
    Bytes nonce(kAeadNonceSize, 0);
    nonce[11] = static_cast<uint8_t>(index);
    ASSERT_TRUE((*aead)
                    ->OpenInto(nonce, {},
                               ByteSpan(sealed).subspan(index * (kChunk + 16), kChunk + 16),
                               std::span<uint8_t>(opened).subspan(index * kChunk, kChunk))
                    .ok());
  }
  EXPECT_EQ(opened, model);
}

}  // namespace
}  // namespace cloister::crypto
