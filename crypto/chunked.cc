#include "crypto/chunked.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <array>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "crypto/aead.h"
#include "crypto/hkdf.h"
#include "crypto/random.h"

namespace cloister::crypto {
namespace {

constexpr std::string_view kInfoPrefix = "c2sp.org/chunked-encryption@v1+";
constexpr std::string_view kAeadName = "AEAD_AES_256_GCM";
constexpr size_t kNonceSize = 12;
constexpr size_t kCommitmentSize = 32;
constexpr size_t kTagSize = kChunkedCipherChunkSize - kChunkedPlainChunkSize;
constexpr uint64_t kMaxChunkCount = uint64_t{1} << 38;

static_assert(kChunkedHeaderSize == kChunkedSaltSize + kCommitmentSize);
static_assert(kTagSize == kAeadTagSize);

struct Derived {
  SecretBytes aead_key;
  Bytes base_nonce;
  Bytes commitment;
};

absl::Status CheckInputKey(ByteSpan key) {
  if (key.size() != kChunkedKeySize) {
    return absl::InvalidArgumentError(absl::StrCat("chunked encryption key must be ",
                                                   kChunkedKeySize, " bytes, got ", key.size()));
  }
  return absl::OkStatus();
}

// Spec section 3: HKDF-Expand-SHA-512(key, prefix || aead name || 0x00 || salt || context, 76),
// split into aead key (32), base nonce (12) and commitment (32).
absl::StatusOr<Derived> Derive(ByteSpan key, ByteSpan salt, ByteSpan context) {
  RETURN_IF_ERROR(CheckInputKey(key));
  if (salt.size() != kChunkedSaltSize) {
    return absl::InvalidArgumentError(absl::StrCat("chunked encryption salt must be ",
                                                   kChunkedSaltSize, " bytes, got ", salt.size()));
  }
  Bytes info;
  info.reserve(kInfoPrefix.size() + kAeadName.size() + 1 + salt.size() + context.size());
  Append(info, AsBytes(kInfoPrefix));
  Append(info, AsBytes(kAeadName));
  info.push_back(0x00);
  Append(info, salt);
  Append(info, context);
  ASSIGN_OR_RETURN(SecretBytes okm,
                   HkdfExpandWithKey(HashAlg::kSha512, key, info,
                                     kChunkedKeySize + kNonceSize + kCommitmentSize));
  ByteSpan all = okm.span();
  Derived out;
  out.aead_key = SecretBytes(all.first(kChunkedKeySize));
  ByteSpan nonce = all.subspan(kChunkedKeySize, kNonceSize);
  out.base_nonce.assign(nonce.begin(), nonce.end());
  ByteSpan commitment = all.subspan(kChunkedKeySize + kNonceSize, kCommitmentSize);
  out.commitment.assign(commitment.begin(), commitment.end());
  return out;
}

// nonce_k = base nonce XOR I2OSP(k, 12).
std::array<uint8_t, kNonceSize> ChunkNonce(ByteSpan base_nonce, uint64_t index) {
  std::array<uint8_t, kNonceSize> nonce;
  std::copy(base_nonce.begin(), base_nonce.end(), nonce.begin());
  for (size_t i = 0; i < 8; ++i)
    nonce[kNonceSize - 1 - i] ^= static_cast<uint8_t>(index >> (8 * i));
  return nonce;
}

absl::Status ChunkLimitReached() {
  return absl::OutOfRangeError(
      absl::StrCat("chunked message is longer than the limit of 2^38 chunks of ",
                   kChunkedPlainChunkSize, " bytes"));
}

}  // namespace

uint64_t ChunkedCiphertextSize(uint64_t plaintext_size) {
  return kChunkedHeaderSize + plaintext_size +
         kTagSize * (plaintext_size / kChunkedPlainChunkSize + 1);
}

// ---------------------------------------------------------------------------------------------
// Encryption.

struct ChunkedEncryptor::State {
  std::unique_ptr<Aead> aead;
  Bytes base_nonce;
  Bytes header;  // salt || commitment, written before the first chunk
  bool header_written = false;
  SecretBytes buffer{kChunkedPlainChunkSize};  // plaintext of the chunk being filled
  size_t buffered_size = 0;
  uint64_t chunk_index = 0;
  bool finished = false;

  void WriteHeader(Bytes& out) {
    if (header_written) return;
    Append(out, header);
    header_written = true;
  }

  absl::Status SealChunk(ByteSpan plaintext, Bytes& out) {
    if (chunk_index >= kMaxChunkCount) return ChunkLimitReached();
    const auto nonce = ChunkNonce(base_nonce, chunk_index);
    const size_t offset = out.size();
    out.resize(offset + plaintext.size() + kTagSize);
    absl::Status status =
        aead->SealInto(nonce, {}, plaintext, std::span<uint8_t>(out).subspan(offset));
    if (!status.ok()) {
      out.resize(offset);
      return status;
    }
    ++chunk_index;
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<ChunkedEncryptor>> ChunkedEncryptor::Create(ByteSpan key,
                                                                           ByteSpan context,
                                                                           ByteSpan salt_for_test) {
  RETURN_IF_ERROR(CheckInputKey(key));
  Bytes salt;
  if (salt_for_test.empty()) {
    salt = RandomBytes(kChunkedSaltSize);
  } else {
    salt.assign(salt_for_test.begin(), salt_for_test.end());
  }
  ASSIGN_OR_RETURN(Derived derived, Derive(key, salt, context));
  auto state = std::make_unique<State>();
  ASSIGN_OR_RETURN(state->aead, Aead::Create(AeadAlg::kAes256Gcm, derived.aead_key.span()));
  state->base_nonce = std::move(derived.base_nonce);
  state->header = std::move(salt);
  Append(state->header, derived.commitment);
  std::unique_ptr<ChunkedEncryptor> encryptor(new ChunkedEncryptor());
  encryptor->state_ = std::move(state);
  return encryptor;
}

ChunkedEncryptor::~ChunkedEncryptor() = default;

absl::Status ChunkedEncryptor::Update(ByteSpan plaintext, Bytes& out) {
  State& s = *state_;
  if (s.finished) return absl::FailedPreconditionError("chunked encryptor already finished");
  s.WriteHeader(out);
  // Top up a partly filled chunk first; a full chunk is sealed at once (it is never final).
  if (s.buffered_size > 0) {
    const size_t take = std::min(plaintext.size(), kChunkedPlainChunkSize - s.buffered_size);
    std::copy_n(plaintext.begin(), take, s.buffer.data() + s.buffered_size);
    s.buffered_size += take;
    plaintext = plaintext.subspan(take);
    if (s.buffered_size < kChunkedPlainChunkSize) return absl::OkStatus();
    RETURN_IF_ERROR(s.SealChunk(s.buffer.span(), out));
    s.buffered_size = 0;
  }
  // Whole chunks straight from the caller's buffer, without copying.
  while (plaintext.size() >= kChunkedPlainChunkSize) {
    RETURN_IF_ERROR(s.SealChunk(plaintext.first(kChunkedPlainChunkSize), out));
    plaintext = plaintext.subspan(kChunkedPlainChunkSize);
  }
  std::copy(plaintext.begin(), plaintext.end(), s.buffer.data());
  s.buffered_size = plaintext.size();
  return absl::OkStatus();
}

absl::Status ChunkedEncryptor::Finish(Bytes& out) {
  State& s = *state_;
  if (s.finished) return absl::FailedPreconditionError("chunked encryptor already finished");
  s.WriteHeader(out);
  RETURN_IF_ERROR(s.SealChunk(s.buffer.span().first(s.buffered_size), out));
  SecureWipe(s.buffer.data(), s.buffered_size);
  s.buffered_size = 0;
  s.finished = true;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Decryption.

struct ChunkedDecryptor::State {
  SecretBytes input_key;  // until the header has been checked
  Bytes context;
  Bytes header;  // bytes of the header received so far
  bool header_checked = false;
  std::unique_ptr<Aead> aead;
  Bytes base_nonce;
  Bytes pending;  // ciphertext of the current chunk, always < 16400 bytes between calls
  uint64_t chunk_index = 0;
  bool finished = false;
  absl::Status error;  // sticky: once set, every call returns it

  absl::Status Fail(absl::Status status) {
    error = std::move(status);
    return error;
  }

  absl::Status CheckHeader() {
    const ByteSpan salt = ByteSpan(header).first(kChunkedSaltSize);
    const ByteSpan stored_commitment = ByteSpan(header).subspan(kChunkedSaltSize);
    ASSIGN_OR_RETURN(Derived derived, Derive(input_key.span(), salt, context));
    if (CRYPTO_memcmp(derived.commitment.data(), stored_commitment.data(), kCommitmentSize) != 0) {
      return absl::DataLossError(
          "chunked ciphertext header does not match: wrong key, wrong context, or a modified "
          "salt or commitment");
    }
    ASSIGN_OR_RETURN(aead, Aead::Create(AeadAlg::kAes256Gcm, derived.aead_key.span()));
    base_nonce = std::move(derived.base_nonce);
    input_key = SecretBytes();  // wiped: no longer needed
    header_checked = true;
    return absl::OkStatus();
  }

  // Opens one chunk (full or final) and appends its plaintext; on failure appends nothing.
  absl::Status OpenChunk(ByteSpan chunk, Bytes& out) {
    if (chunk_index >= kMaxChunkCount) return ChunkLimitReached();
    const auto nonce = ChunkNonce(base_nonce, chunk_index);
    const size_t offset = out.size();
    out.resize(offset + chunk.size() - kTagSize);
    absl::Status status = aead->OpenInto(nonce, {}, chunk, std::span<uint8_t>(out).subspan(offset));
    if (!status.ok()) {
      out.resize(offset);
      return absl::DataLossError(absl::StrCat("chunk ", chunk_index,
                                              " of the chunked ciphertext does not authenticate "
                                              "(modified, reordered, or truncated)"));
    }
    ++chunk_index;
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<ChunkedDecryptor>> ChunkedDecryptor::Create(ByteSpan key,
                                                                           ByteSpan context) {
  RETURN_IF_ERROR(CheckInputKey(key));
  auto state = std::make_unique<State>();
  state->input_key = SecretBytes(key);
  state->context.assign(context.begin(), context.end());
  state->header.reserve(kChunkedHeaderSize);
  state->pending.reserve(kChunkedCipherChunkSize);
  std::unique_ptr<ChunkedDecryptor> decryptor(new ChunkedDecryptor());
  decryptor->state_ = std::move(state);
  return decryptor;
}

absl::StatusOr<std::unique_ptr<ChunkedDecryptor>> ChunkedDecryptor::CreateRaw(ByteSpan aead_key,
                                                                              ByteSpan base_nonce) {
  if (base_nonce.size() != kNonceSize) {
    return absl::InvalidArgumentError(absl::StrCat("chunked raw-mode base nonce must be ",
                                                   kNonceSize, " bytes, got ", base_nonce.size()));
  }
  if (aead_key.size() != kChunkedKeySize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunked raw-mode AEAD key must be ", kChunkedKeySize, " bytes, got ", aead_key.size()));
  }
  auto state = std::make_unique<State>();
  ASSIGN_OR_RETURN(state->aead, Aead::Create(AeadAlg::kAes256Gcm, aead_key));
  state->base_nonce.assign(base_nonce.begin(), base_nonce.end());
  state->header_checked = true;
  state->pending.reserve(kChunkedCipherChunkSize);
  std::unique_ptr<ChunkedDecryptor> decryptor(new ChunkedDecryptor());
  decryptor->state_ = std::move(state);
  return decryptor;
}

ChunkedDecryptor::~ChunkedDecryptor() = default;

absl::Status ChunkedDecryptor::Update(ByteSpan ciphertext, std::vector<uint8_t>& out) {
  State& s = *state_;
  if (!s.error.ok()) return s.error;
  if (s.finished) return absl::FailedPreconditionError("chunked decryptor already finished");
  if (!s.header_checked) {
    const size_t take = std::min(ciphertext.size(), kChunkedHeaderSize - s.header.size());
    s.header.insert(s.header.end(), ciphertext.begin(), ciphertext.begin() + take);
    ciphertext = ciphertext.subspan(take);
    if (s.header.size() < kChunkedHeaderSize) return absl::OkStatus();
    absl::Status header_status = s.CheckHeader();
    if (!header_status.ok()) return s.Fail(std::move(header_status));
  }
  // A chunk of exactly 16400 bytes is always a full chunk, so it is opened as soon as it is
  // complete; anything shorter waits, because only the end of input tells that it is final.
  if (!s.pending.empty()) {
    const size_t take = std::min(ciphertext.size(), kChunkedCipherChunkSize - s.pending.size());
    s.pending.insert(s.pending.end(), ciphertext.begin(), ciphertext.begin() + take);
    ciphertext = ciphertext.subspan(take);
    if (s.pending.size() < kChunkedCipherChunkSize) return absl::OkStatus();
    absl::Status status = s.OpenChunk(s.pending, out);
    s.pending.clear();
    if (!status.ok()) return s.Fail(std::move(status));
  }
  while (ciphertext.size() >= kChunkedCipherChunkSize) {
    absl::Status status = s.OpenChunk(ciphertext.first(kChunkedCipherChunkSize), out);
    if (!status.ok()) return s.Fail(std::move(status));
    ciphertext = ciphertext.subspan(kChunkedCipherChunkSize);
  }
  s.pending.assign(ciphertext.begin(), ciphertext.end());
  return absl::OkStatus();
}

absl::Status ChunkedDecryptor::Finish(std::vector<uint8_t>& out) {
  State& s = *state_;
  if (!s.error.ok()) return s.error;
  if (s.finished) return absl::FailedPreconditionError("chunked decryptor already finished");
  if (!s.header_checked) {
    return s.Fail(absl::DataLossError(
        absl::StrCat("chunked ciphertext is truncated: ", s.header.size(),
                     " bytes, shorter than the ", kChunkedHeaderSize, "-byte header")));
  }
  if (s.pending.empty()) {
    return s.Fail(absl::DataLossError(
        "chunked ciphertext is truncated: it ends without its short final chunk"));
  }
  if (s.pending.size() < kTagSize) {
    return s.Fail(absl::DataLossError(
        absl::StrCat("chunked ciphertext is truncated: the final chunk of ", s.pending.size(),
                     " bytes is shorter than a ", kTagSize, "-byte tag")));
  }
  absl::Status status = s.OpenChunk(s.pending, out);
  s.pending.clear();
  if (!status.ok()) return s.Fail(std::move(status));
  s.finished = true;
  return absl::OkStatus();
}

absl::StatusOr<Bytes> ChunkedEncrypt(ByteSpan key, ByteSpan context, ByteSpan plaintext) {
  ASSIGN_OR_RETURN(auto encryptor, ChunkedEncryptor::Create(key, context));
  Bytes out;
  out.reserve(ChunkedCiphertextSize(plaintext.size()));
  RETURN_IF_ERROR(encryptor->Update(plaintext, out));
  RETURN_IF_ERROR(encryptor->Finish(out));
  return out;
}

absl::StatusOr<Bytes> ChunkedDecrypt(ByteSpan key, ByteSpan context, ByteSpan ciphertext) {
  ASSIGN_OR_RETURN(auto decryptor, ChunkedDecryptor::Create(key, context));
  Bytes out;
  out.reserve(ciphertext.size());
  absl::Status status = decryptor->Update(ciphertext, out);
  if (status.ok()) status = decryptor->Finish(out);
  if (!status.ok()) {
    SecureWipe(out.data(), out.size());  // all or nothing for the one-shot form
    return status;
  }
  return out;
}

absl::StatusOr<std::pair<SecretBytes, Bytes>> ChunkedDeriveForTest(ByteSpan key, ByteSpan salt,
                                                                   ByteSpan context) {
  ASSIGN_OR_RETURN(Derived derived, Derive(key, salt, context));
  return std::make_pair(std::move(derived.aead_key), std::move(derived.base_nonce));
}

}  // namespace cloister::crypto
