// The device-side AES-256-GCM arithmetic (gcm_math.h), run on the host exactly as the kernels run
// it block by block, against FIPS 197 and against OpenSSL through pcie::ChunkCipher: the same key,
// counter and direction must give the same sealed bytes, and each side must open the other's.
#include "enclave/gpu/gcm_math.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "enclave/pcie/chunk_cipher.h"

namespace cloister::gpu::gcm {
namespace {

namespace pcie = enclave::pcie;

std::vector<uint8_t> FromHex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

struct HostGcm {
  explicit HostGcm(const std::vector<uint8_t>& key, size_t chunk_size) {
    BuildTables(&tables);
    ExpandKey(key.data(), tables, &material);
    powers.resize(PowerTableSize(chunk_size));
    BuildPowerTable(material, powers.size(), powers.data());
  }
  Transfer Describe(uint8_t direction, uint64_t counter, size_t size, size_t chunk_size) const {
    Transfer t;
    t.size = size;
    t.chunk_size = chunk_size;
    t.chunks = static_cast<uint32_t>(pcie::ChunkCount(size, chunk_size));
    const auto nonce = pcie::ChunkNonce(direction, counter, 0);
    std::copy(nonce.begin(), nonce.begin() + 8, t.nonce_prefix);
    const auto aad = pcie::TransferAad(size, t.chunks);
    std::copy(aad.begin(), aad.end(), t.aad);
    return t;
  }
  Tables tables;
  KeyMaterial material;
  std::vector<U128> powers;
};

TEST(GcmMathTest, SboxAndBlockMatchFips197) {
  Tables tables;
  BuildTables(&tables);
  EXPECT_EQ(tables.sbox[0x00], 0x63);
  EXPECT_EQ(tables.sbox[0x53], 0xed);
  EXPECT_EQ(tables.sbox[0xff], 0x16);
  // FIPS 197 appendix C.3 (AES-256).
  const auto key = FromHex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");
  KeyMaterial material;
  ExpandKey(key.data(), tables, &material);
  const auto plain = FromHex("00112233445566778899aabbccddeeff");
  const uint32_t in[4] = {LoadWord(&plain[0]), LoadWord(&plain[4]), LoadWord(&plain[8]),
                          LoadWord(&plain[12])};
  uint32_t out[4];
  EncryptBlock(material.round_keys, tables.te0, tables.sbox, in, out);
  EXPECT_EQ(out[0], 0x8ea2b7cau);
  EXPECT_EQ(out[1], 0x516745bfu);
  EXPECT_EQ(out[2], 0xeafc4990u);
  EXPECT_EQ(out[3], 0x4b496089u);
}

TEST(GcmMathTest, PowersBySquaringMatchTheTable) {
  const HostGcm gcm(std::vector<uint8_t>(32, 7), 4096);
  for (uint64_t k : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{17}, uint64_t{255},
                     uint64_t{gcm.powers.size() - 1}}) {
    const U128 squared = PowerOfH(gcm.material, k);
    EXPECT_EQ(squared.hi, gcm.powers[k].hi) << k;
    EXPECT_EQ(squared.lo, gcm.powers[k].lo) << k;
  }
  // x * 1 = x in GCM's bit order.
  const U128 one{0x8000000000000000ull, 0};
  const U128 x{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(Multiply(x, one).hi, x.hi);
  EXPECT_EQ(Multiply(one, x).lo, x.lo);
}

class GcmAgainstOpenSsl : public ::testing::TestWithParam<size_t> {};

// Same key, counter and direction: the host rendering of the kernels and OpenSSL produce the
// same sealed bytes, and each opens what the other sealed.
TEST_P(GcmAgainstOpenSsl, SealsTheSameBytesAndOpensEachOther) {
  const size_t chunk_size = 4096;
  const size_t size = GetParam();
  std::mt19937 random(static_cast<unsigned>(size) + 1);
  std::vector<uint8_t> key(32), plain(size);
  for (auto& b : key) b = static_cast<uint8_t>(random());
  for (auto& b : plain) b = static_cast<uint8_t>(random());
  auto cipher = pcie::ChunkCipher::Create(key, chunk_size, 2);
  ASSERT_TRUE(cipher.ok()) << cipher.status();
  const HostGcm gcm(key, chunk_size);
  const uint64_t counter = 0x00abcdef123456;
  const uint8_t direction = 1;

  std::vector<uint8_t> expected(pcie::SealedSize(size, chunk_size));
  ASSERT_TRUE((*cipher)->Seal(direction, counter, plain, expected).ok());

  std::vector<uint8_t> sealed(expected.size(), 0xa5);
  Transfer seal = gcm.Describe(direction, counter, size, chunk_size);
  seal.in = plain.data();
  seal.out = sealed.data();
  seal.seal = true;
  EXPECT_TRUE(ProcessOnHost(seal, gcm.material, gcm.powers.data(), gcm.tables));
  EXPECT_EQ(sealed, expected);

  std::vector<uint8_t> opened(size, 0x5a);
  Transfer open = gcm.Describe(direction, counter, size, chunk_size);
  open.in = expected.data();
  open.out = opened.data();
  EXPECT_TRUE(ProcessOnHost(open, gcm.material, gcm.powers.data(), gcm.tables));
  EXPECT_EQ(opened, plain);

  std::vector<uint8_t> back(size);
  EXPECT_TRUE((*cipher)->Open(direction, counter, sealed, back, "to the host").ok());
  EXPECT_EQ(back, plain);
}

INSTANTIATE_TEST_SUITE_P(Sizes, GcmAgainstOpenSsl,
                         ::testing::Values(0, 1, 15, 16, 17, 100, 4095, 4096, 4097, 3 * 4096 + 5));

// Any flipped byte (ciphertext or tag), another counter or another direction fails the host
// rendering's tag check, as it fails OpenSSL's.
TEST(GcmMathTest, TamperingFailsTheTag) {
  const size_t chunk_size = 4096;
  const size_t size = 2 * 4096 + 33;
  std::vector<uint8_t> key(32, 3), plain(size, 9);
  auto cipher = pcie::ChunkCipher::Create(key, chunk_size, 1);
  ASSERT_TRUE(cipher.ok());
  const HostGcm gcm(key, chunk_size);
  std::vector<uint8_t> sealed(pcie::SealedSize(size, chunk_size));
  ASSERT_TRUE((*cipher)->Seal(1, 5, plain, sealed).ok());
  std::vector<uint8_t> out(size);
  auto opens = [&](const std::vector<uint8_t>& bytes, uint8_t direction, uint64_t counter) {
    Transfer t = gcm.Describe(direction, counter, size, chunk_size);
    t.in = bytes.data();
    t.out = out.data();
    return ProcessOnHost(t, gcm.material, gcm.powers.data(), gcm.tables);
  };
  EXPECT_TRUE(opens(sealed, 1, 5));
  EXPECT_FALSE(opens(sealed, 1, 6));
  EXPECT_FALSE(opens(sealed, 2, 5));
  for (size_t at :
       {size_t{0}, size_t{4095}, size_t{4096}, size_t{4111}, size_t{4112}, sealed.size() - 1}) {
    std::vector<uint8_t> bad = sealed;
    bad[at] ^= 0x01;
    EXPECT_FALSE(opens(bad, 1, 5)) << "byte " << at;
  }
}

}  // namespace
}  // namespace cloister::gpu::gcm
