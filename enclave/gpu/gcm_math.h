// AES-256-GCM over the chunked transfer format of enclave/pcie/chunk_cipher.h, written once for
// both the device kernels (cuda_gcm_kernels.cu) and a host rendering of the same kernels that
// tests compare with OpenSSL on machines without a GPU.
//
// The parallel form: GHASH over X_1..X_n (3 blocks of associated data, m ciphertext blocks, one
// length block) is the sum of X_k * H^(n-k+1) in GF(2^128), so each ciphertext block's term is
// computed on its own (data block j, 0-based, is weighted by H^(m+1-j)), terms are XORed
// together in any order, and FinishChunk adds the associated data, the length block and
// E_K(J0). H^k comes from H^(2^b) by square-and-multiply (PowerOfH), so no thread waits for
// another. AES is the T-table form: one 256-word table (the others are its rotations) and the
// S-box, both computed here rather than written out, so a build can check them against FIPS 197.
//
// Blocks are held as two big-endian 64-bit halves (`hi` holds bytes 0..7), which is GCM's bit
// order: bit 0 of a block is the most significant bit of `hi`.
//
// Threading: pure functions over caller-owned memory. Plain C++ with CUDA qualifiers; no absl.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define CLOISTER_GCM_FN __host__ __device__ __forceinline__
#else
#define CLOISTER_GCM_FN inline
#endif

namespace cloister::gpu::gcm {

struct U128 {
  uint64_t hi = 0;
  uint64_t lo = 0;
};

inline constexpr int kAesRounds = 14;
inline constexpr int kRoundKeyWords = 4 * (kAesRounds + 1);
inline constexpr int kPowerBits = 40;     // H^k for k < 2^40
inline constexpr int kAadBlocks = 3;      // the 37-byte transfer AAD, padded
inline constexpr uint64_t kAadSize = 37;  // pcie::kTransferAadSize
inline constexpr int kTagSize = 16;

struct Tables {
  uint32_t te0[256];  // MixColumns(SubBytes(x)) as a big-endian column: {2s, s, s, 3s}
  uint8_t sbox[256];
};

struct KeyMaterial {
  uint32_t round_keys[kRoundKeyWords];
  U128 h_pow2[kPowerBits];  // H^(2^b)
};

// One transfer's parameters for the kernels. `in` and `out` are device (or, for the host
// rendering, host) pointers: seal reads plaintext `in` and writes the sealed layout to `out`;
// open reads the sealed layout from `in` and writes plaintext to `out`.
struct Transfer {
  const uint8_t* in = nullptr;
  uint8_t* out = nullptr;
  uint64_t size = 0;        // plaintext bytes
  uint64_t chunk_size = 0;  // a multiple of 16
  uint32_t chunks = 0;
  uint8_t nonce_prefix[8] = {};  // direction || 56-bit counter
  uint8_t aad[48] = {};          // kAadSize bytes, zero padded to 3 blocks
  bool seal = false;
};

CLOISTER_GCM_FN U128 Xor(U128 a, U128 b) { return {a.hi ^ b.hi, a.lo ^ b.lo}; }

// X * Y in GCM's field (NIST SP 800-38D, algorithm 1).
CLOISTER_GCM_FN U128 Multiply(U128 x, U128 y) {
  U128 z;
  U128 v = y;
  for (int i = 0; i < 128; ++i) {
    const uint64_t bit = i < 64 ? (x.hi >> (63 - i)) & 1 : (x.lo >> (127 - i)) & 1;
    const uint64_t take = 0 - bit;
    z.hi ^= v.hi & take;
    z.lo ^= v.lo & take;
    const uint64_t carry = 0 - (v.lo & 1);
    v.lo = (v.lo >> 1) | (v.hi << 63);
    v.hi = (v.hi >> 1) ^ (0xE100000000000000ull & carry);
  }
  return z;
}

// H^k for 1 <= k < 2^kPowerBits. The kernels read H^k from a table built with this once per
// key (PowerTableSize entries, index k; entry 0 unused).
CLOISTER_GCM_FN U128 PowerOfH(const KeyMaterial& key, uint64_t k) {
  U128 result{0x8000000000000000ull, 0};  // the field's 1
  for (int b = 0; b < kPowerBits && k != 0; ++b, k >>= 1) {
    if (k & 1) result = Multiply(result, key.h_pow2[b]);
  }
  return result;
}

// Entries of the power table for chunks of up to `chunk_size` bytes: H^1 .. H^n with
// n = 3 + chunk_size / 16 + 1 (rounded up), plus the unused entry 0.
CLOISTER_GCM_FN uint64_t PowerTableSize(uint64_t chunk_size) {
  return kAadBlocks + (chunk_size + 15) / 16 + 2;
}

CLOISTER_GCM_FN uint32_t RotateRight(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

CLOISTER_GCM_FN uint32_t LoadWord(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// AES-256 encryption of one block given as four big-endian words.
CLOISTER_GCM_FN void EncryptBlock(const uint32_t* round_keys, const uint32_t* te0,
                                  const uint8_t* sbox, const uint32_t in[4], uint32_t out[4]) {
  uint32_t s0 = in[0] ^ round_keys[0], s1 = in[1] ^ round_keys[1];
  uint32_t s2 = in[2] ^ round_keys[2], s3 = in[3] ^ round_keys[3];
  for (int round = 1; round < kAesRounds; ++round) {
    const uint32_t* rk = round_keys + 4 * round;
    const uint32_t t0 = te0[s0 >> 24] ^ RotateRight(te0[(s1 >> 16) & 0xff], 8) ^
                        RotateRight(te0[(s2 >> 8) & 0xff], 16) ^ RotateRight(te0[s3 & 0xff], 24) ^
                        rk[0];
    const uint32_t t1 = te0[s1 >> 24] ^ RotateRight(te0[(s2 >> 16) & 0xff], 8) ^
                        RotateRight(te0[(s3 >> 8) & 0xff], 16) ^ RotateRight(te0[s0 & 0xff], 24) ^
                        rk[1];
    const uint32_t t2 = te0[s2 >> 24] ^ RotateRight(te0[(s3 >> 16) & 0xff], 8) ^
                        RotateRight(te0[(s0 >> 8) & 0xff], 16) ^ RotateRight(te0[s1 & 0xff], 24) ^
                        rk[2];
    const uint32_t t3 = te0[s3 >> 24] ^ RotateRight(te0[(s0 >> 16) & 0xff], 8) ^
                        RotateRight(te0[(s1 >> 8) & 0xff], 16) ^ RotateRight(te0[s2 & 0xff], 24) ^
                        rk[3];
    s0 = t0;
    s1 = t1;
    s2 = t2;
    s3 = t3;
  }
  const uint32_t* rk = round_keys + 4 * kAesRounds;
  auto last = [&](uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    return (uint32_t{sbox[a >> 24]} << 24) | (uint32_t{sbox[(b >> 16) & 0xff]} << 16) |
           (uint32_t{sbox[(c >> 8) & 0xff]} << 8) | uint32_t{sbox[d & 0xff]};
  };
  out[0] = last(s0, s1, s2, s3) ^ rk[0];
  out[1] = last(s1, s2, s3, s0) ^ rk[1];
  out[2] = last(s2, s3, s0, s1) ^ rk[2];
  out[3] = last(s3, s0, s1, s2) ^ rk[3];
}

// The counter block nonce || be32(counter) of chunk `chunk`, encrypted.
CLOISTER_GCM_FN void Keystream(const KeyMaterial& key, const uint32_t* te0, const uint8_t* sbox,
                               const Transfer& t, uint32_t chunk, uint32_t counter,
                               uint32_t out[4]) {
  const uint32_t in[4] = {LoadWord(t.nonce_prefix), LoadWord(t.nonce_prefix + 4), chunk, counter};
  EncryptBlock(key.round_keys, te0, sbox, in, out);
}

CLOISTER_GCM_FN U128 BlockFromWords(const uint32_t w[4]) {
  return {(uint64_t{w[0]} << 32) | w[1], (uint64_t{w[2]} << 32) | w[3]};
}

CLOISTER_GCM_FN uint8_t ByteOf(const uint32_t w[4], int i) {
  return static_cast<uint8_t>(w[i >> 2] >> (24 - 8 * (i & 3)));
}

// Where chunk c's bytes are: plaintext at c * chunk_size, sealed at c * (chunk_size + 16).
CLOISTER_GCM_FN uint64_t ChunkLength(const Transfer& t, uint32_t chunk) {
  const uint64_t begin = uint64_t{chunk} * t.chunk_size;
  const uint64_t rest = t.size - begin;
  return rest < t.chunk_size ? rest : t.chunk_size;
}

// Data block `block` of chunk `chunk`: encrypts or decrypts its (up to 16) bytes into t.out and
// returns its GHASH term, C_j * H^(m+1-j).
CLOISTER_GCM_FN U128 ProcessBlock(const Transfer& t, const KeyMaterial& key, const U128* powers,
                                  const uint32_t* te0, const uint8_t* sbox, uint32_t chunk,
                                  uint64_t block) {
  const uint64_t length = ChunkLength(t, chunk);
  const uint64_t blocks = (length + 15) / 16;
  const uint64_t offset = block * 16;
  const int bytes = static_cast<int>(length - offset < 16 ? length - offset : 16);
  const uint64_t plain_at = uint64_t{chunk} * t.chunk_size + offset;
  const uint64_t sealed_at = uint64_t{chunk} * (t.chunk_size + kTagSize) + offset;
  const uint8_t* in = t.in + (t.seal ? plain_at : sealed_at);
  uint8_t* out = t.out + (t.seal ? sealed_at : plain_at);

  uint32_t stream[4];
  Keystream(key, te0, sbox, t, chunk, static_cast<uint32_t>(block + 2), stream);
  uint8_t cipher[16] = {};
  for (int i = 0; i < bytes; ++i) {
    const uint8_t x = in[i];
    const uint8_t y = x ^ ByteOf(stream, i);
    out[i] = y;
    cipher[i] = t.seal ? y : x;
  }
  const uint32_t words[4] = {LoadWord(cipher), LoadWord(cipher + 4), LoadWord(cipher + 8),
                             LoadWord(cipher + 12)};
  return Multiply(BlockFromWords(words), powers[blocks + 1 - block]);
}

// Completes chunk `chunk` given the XOR of all its ProcessBlock terms: seal writes the tag after
// the chunk's ciphertext and returns true; open returns whether the stored tag matches.
CLOISTER_GCM_FN bool FinishChunk(const Transfer& t, const KeyMaterial& key, const U128* powers,
                                 const uint32_t* te0, const uint8_t* sbox, uint32_t chunk,
                                 U128 sum) {
  const uint64_t length = ChunkLength(t, chunk);
  const uint64_t blocks = (length + 15) / 16;
  const uint64_t n = kAadBlocks + blocks + 1;
  for (int i = 0; i < kAadBlocks; ++i) {
    const uint8_t* a = t.aad + 16 * i;
    const uint32_t words[4] = {LoadWord(a), LoadWord(a + 4), LoadWord(a + 8), LoadWord(a + 12)};
    sum = Xor(sum, Multiply(BlockFromWords(words), powers[n - i]));
  }
  const U128 lengths{kAadSize * 8, length * 8};
  sum = Xor(sum, Multiply(lengths, powers[1]));
  uint32_t mask[4];
  Keystream(key, te0, sbox, t, chunk, 1, mask);
  const U128 tag = Xor(sum, BlockFromWords(mask));
  uint8_t* stored = (t.seal ? t.out : const_cast<uint8_t*>(t.in)) +
                    uint64_t{chunk} * (t.chunk_size + kTagSize) + length;
  uint8_t differ = 0;
  for (int i = 0; i < 16; ++i) {
    const uint8_t byte =
        static_cast<uint8_t>((i < 8 ? tag.hi >> (56 - 8 * i) : tag.lo >> (120 - 8 * i)) & 0xff);
    if (t.seal) {
      stored[i] = byte;
    } else {
      differ |= static_cast<uint8_t>(stored[i] ^ byte);
    }
  }
  return differ == 0;
}

// --- Host-only set-up --------------------------------------------------------------------------

inline uint8_t GfMul8(uint8_t a, uint8_t b) {
  uint8_t product = 0;
  for (int i = 0; i < 8; ++i) {
    if (b & 1) product ^= a;
    const bool high = a & 0x80;
    a = static_cast<uint8_t>(a << 1);
    if (high) a ^= 0x1b;
    b >>= 1;
  }
  return product;
}

// The S-box (multiplicative inverse in GF(2^8), then the affine map) and the round table.
inline void BuildTables(Tables* tables) {
  for (int x = 0; x < 256; ++x) {
    uint8_t inverse = 0;
    for (int y = 1; y < 256 && x != 0; ++y) {
      if (GfMul8(static_cast<uint8_t>(x), static_cast<uint8_t>(y)) == 1) {
        inverse = static_cast<uint8_t>(y);
        break;
      }
    }
    uint8_t s = inverse;
    for (int shift = 1; shift <= 4; ++shift) {
      s ^= static_cast<uint8_t>((inverse << shift) | (inverse >> (8 - shift)));
    }
    s ^= 0x63;
    tables->sbox[x] = s;
    tables->te0[x] =
        (uint32_t{GfMul8(s, 2)} << 24) | (uint32_t{s} << 16) | (uint32_t{s} << 8) | GfMul8(s, 3);
  }
}

// The AES-256 key schedule and H = E_K(0) with its powers H^(2^b).
inline void ExpandKey(const uint8_t key[32], const Tables& tables, KeyMaterial* material) {
  uint32_t* w = material->round_keys;
  for (int i = 0; i < 8; ++i) w[i] = LoadWord(key + 4 * i);
  uint8_t rcon = 1;
  auto sub_word = [&](uint32_t x) {
    return (uint32_t{tables.sbox[x >> 24]} << 24) |
           (uint32_t{tables.sbox[(x >> 16) & 0xff]} << 16) |
           (uint32_t{tables.sbox[(x >> 8) & 0xff]} << 8) | tables.sbox[x & 0xff];
  };
  for (int i = 8; i < kRoundKeyWords; ++i) {
    uint32_t temp = w[i - 1];
    if (i % 8 == 0) {
      temp = sub_word((temp << 8) | (temp >> 24)) ^ (uint32_t{rcon} << 24);
      rcon = GfMul8(rcon, 2);
    } else if (i % 8 == 4) {
      temp = sub_word(temp);
    }
    w[i] = w[i - 8] ^ temp;
  }
  const uint32_t zero[4] = {0, 0, 0, 0};
  uint32_t h[4];
  EncryptBlock(material->round_keys, tables.te0, tables.sbox, zero, h);
  material->h_pow2[0] = BlockFromWords(h);
  for (int b = 1; b < kPowerBits; ++b) {
    material->h_pow2[b] = Multiply(material->h_pow2[b - 1], material->h_pow2[b - 1]);
  }
}

inline void BuildPowerTable(const KeyMaterial& key, uint64_t entries, U128* powers) {
  powers[0] = U128{};
  if (entries > 1) powers[1] = key.h_pow2[0];
  for (uint64_t k = 2; k < entries; ++k) powers[k] = Multiply(powers[k - 1], key.h_pow2[0]);
}

// The whole transfer on the host, block by block, exactly as the kernels do it. Seal returns
// true; open returns whether every chunk authenticated (the failing chunks' plaintext is left in
// t.out, as on the device, for the caller to discard).
// `powers` holds PowerTableSize(t.chunk_size) entries (BuildPowerTable).
inline bool ProcessOnHost(const Transfer& t, const KeyMaterial& key, const U128* powers,
                          const Tables& tables) {
  bool ok = true;
  for (uint32_t chunk = 0; chunk < t.chunks; ++chunk) {
    const uint64_t blocks = (ChunkLength(t, chunk) + 15) / 16;
    U128 sum;
    for (uint64_t block = 0; block < blocks; ++block) {
      sum = Xor(sum, ProcessBlock(t, key, powers, tables.te0, tables.sbox, chunk, block));
    }
    ok = FinishChunk(t, key, powers, tables.te0, tables.sbox, chunk, sum) && ok;
  }
  return ok;
}

}  // namespace cloister::gpu::gcm
