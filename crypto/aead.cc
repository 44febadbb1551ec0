#include "crypto/aead.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <sodium.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "crypto/openssl_util.h"

namespace cloister::crypto {
namespace {

using internal::EvpCipherCtxPtr;
using internal::OpenSslError;

const char* AlgName(AeadAlg alg) {
  switch (alg) {
    case AeadAlg::kAes128Gcm:
      return "AES-128-GCM";
    case AeadAlg::kAes256Gcm:
      return "AES-256-GCM";
    case AeadAlg::kChaCha20Poly1305:
      return "ChaCha20-Poly1305";
  }
  return "unknown AEAD";
}

// The checks every AEAD call makes before any crypto runs.
absl::Status CheckNonce(AeadAlg alg, ByteSpan nonce) {
  if (nonce.size() != kAeadNonceSize) {
    return absl::InvalidArgumentError(absl::StrCat(AlgName(alg), " nonce must be ", kAeadNonceSize,
                                                   " bytes, got ", nonce.size()));
  }
  return absl::OkStatus();
}

// The message size of a plaintext given in parts.
size_t PartsSize(std::span<const ByteSpan> parts) {
  size_t size = 0;
  for (const ByteSpan part : parts) size += part.size();
  return size;
}

absl::Status CheckSealSizes(AeadAlg alg, ByteSpan nonce, std::span<const ByteSpan> parts,
                            std::span<uint8_t> out) {
  RETURN_IF_ERROR(CheckNonce(alg, nonce));
  const size_t size = PartsSize(parts);
  if (out.size() != size + kAeadTagSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(AlgName(alg), " seal output buffer must be plaintext size + ", kAeadTagSize,
                     " = ", size + kAeadTagSize, " bytes, got ", out.size()));
  }
  return absl::OkStatus();
}

absl::Status CheckSealSizes(AeadAlg alg, ByteSpan nonce, ByteSpan plaintext,
                            std::span<uint8_t> out) {
  const ByteSpan parts[] = {plaintext};
  return CheckSealSizes(alg, nonce, parts, out);
}

absl::Status CheckOpenSizes(AeadAlg alg, ByteSpan nonce, ByteSpan ciphertext,
                            std::span<uint8_t> out) {
  RETURN_IF_ERROR(CheckNonce(alg, nonce));
  if (ciphertext.size() < kAeadTagSize) {
    return absl::InvalidArgumentError(absl::StrCat(AlgName(alg), " ciphertext of ",
                                                   ciphertext.size(), " bytes is shorter than the ",
                                                   kAeadTagSize, "-byte tag"));
  }
  if (out.size() != ciphertext.size() - kAeadTagSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(AlgName(alg), " open output buffer must be ciphertext size - ", kAeadTagSize,
                     " = ", ciphertext.size() - kAeadTagSize, " bytes, got ", out.size()));
  }
  return absl::OkStatus();
}

absl::Status AuthenticationFailed(AeadAlg alg) {
  return absl::DataLossError(
      absl::StrCat(AlgName(alg),
                   " authentication failed: wrong key, nonce, associated data, "
                   "or a modified ciphertext"));
}

// The one-line Seal and Open of both implementations, on top of their *Into forms.
class AeadBase : public Aead {
 public:
  absl::StatusOr<Bytes> Seal(ByteSpan nonce, ByteSpan aad, ByteSpan plaintext) const final {
    RETURN_IF_ERROR(CheckNonce(alg(), nonce));
    Bytes out(plaintext.size() + kAeadTagSize);
    RETURN_IF_ERROR(SealInto(nonce, aad, plaintext, out));
    return out;
  }
  absl::StatusOr<Bytes> Open(ByteSpan nonce, ByteSpan aad, ByteSpan ciphertext) const final {
    RETURN_IF_ERROR(CheckNonce(alg(), nonce));
    if (ciphertext.size() < kAeadTagSize) {
      return CheckOpenSizes(alg(), nonce, ciphertext, {});
    }
    Bytes out(ciphertext.size() - kAeadTagSize);
    RETURN_IF_ERROR(OpenInto(nonce, aad, ciphertext, out));
    return out;
  }
};

// AES-GCM over OpenSSL EVP. The object keeps one keyed EVP_CIPHER_CTX and reuses it for every
// call (only the nonce is set per call, so there is no allocation and no key expansion on the
// hot path). A call that finds the cached context busy on another thread uses a fresh one.
class AesGcmAead final : public AeadBase {
 public:
  AesGcmAead(AeadAlg alg, const EVP_CIPHER* cipher, ByteSpan key)
      : alg_(alg), cipher_(cipher), key_(key) {}

  AeadAlg alg() const override { return alg_; }

  absl::Status SealInto(ByteSpan nonce, ByteSpan aad, ByteSpan plaintext,
                        std::span<uint8_t> out) const override {
    const ByteSpan parts[] = {plaintext};
    return SealPartsInto(nonce, aad, parts, out);
  }

  absl::Status SealPartsInto(ByteSpan nonce, ByteSpan aad, std::span<const ByteSpan> parts,
                             std::span<uint8_t> out) const override {
    RETURN_IF_ERROR(CheckSealSizes(alg_, nonce, parts, out));
    return WithContext([&](EVP_CIPHER_CTX* ctx) {
      return Crypt(ctx, /*encrypt=*/true, nonce, aad, parts, out, kMaxPiece, nullptr);
    });
  }

  absl::Status SealPartsIntoInPieces(ByteSpan nonce, ByteSpan aad, std::span<const ByteSpan> parts,
                                     std::span<uint8_t> out, size_t piece,
                                     const PieceHook& ready) const override {
    RETURN_IF_ERROR(CheckSealSizes(alg_, nonce, parts, out));
    ASSIGN_OR_RETURN(EvpCipherCtxPtr ctx, NewKeyedContext());
    return Crypt(ctx.get(), /*encrypt=*/true, nonce, aad, parts, out,
                 std::clamp<size_t>(piece, 1, kMaxPiece), &ready);
  }

  absl::Status OpenIntoInPieces(ByteSpan nonce, ByteSpan aad, ByteSpan ciphertext,
                                std::span<uint8_t> out, size_t piece,
                                const PieceHook& wait) const override {
    RETURN_IF_ERROR(CheckOpenSizes(alg_, nonce, ciphertext, out));
    absl::StatusOr<EvpCipherCtxPtr> ctx = NewKeyedContext();
    const ByteSpan parts[] = {ciphertext};
    absl::Status status = ctx.ok() ? Crypt(ctx->get(), /*encrypt=*/false, nonce, aad, parts, out,
                                           std::clamp<size_t>(piece, 1, kMaxPiece), &wait)
                                   : ctx.status();
    if (!status.ok()) SecureWipe(out.data(), out.size());
    return status;
  }

  absl::Status OpenInto(ByteSpan nonce, ByteSpan aad, ByteSpan ciphertext,
                        std::span<uint8_t> out) const override {
    RETURN_IF_ERROR(CheckOpenSizes(alg_, nonce, ciphertext, out));
    const ByteSpan parts[] = {ciphertext};
    absl::Status status = WithContext([&](EVP_CIPHER_CTX* ctx) {
      return Crypt(ctx, /*encrypt=*/false, nonce, aad, parts, out, kMaxPiece, nullptr);
    });
    if (!status.ok()) SecureWipe(out.data(), out.size());
    return status;
  }

 private:
  // OpenSSL takes int lengths; larger inputs go through in pieces of this size.
  static constexpr size_t kMaxPiece = size_t{1} << 30;
  // Parts shorter than kShortStep are gathered, kGatherSize bytes at most, into one call.
  static constexpr size_t kShortStep = 1024;
  static constexpr size_t kGatherSize = 8192;

  absl::StatusOr<EvpCipherCtxPtr> NewKeyedContext() const {
    EvpCipherCtxPtr ctx(EVP_CIPHER_CTX_new());
    if (ctx == nullptr) return OpenSslError(absl::StatusCode::kInternal, "EVP_CIPHER_CTX_new");
    if (EVP_CipherInit_ex2(ctx.get(), cipher_, key_.data(), nullptr, 1, nullptr) != 1) {
      return OpenSslError(absl::StatusCode::kInternal,
                          absl::StrCat("EVP_CipherInit_ex2(", AlgName(alg_), ", key)"));
    }
    return ctx;
  }

  template <typename F>
  absl::Status WithContext(F&& use) const {
    if (mu_.TryLock()) {
      absl::Status status;
      if (cached_ == nullptr) {
        absl::StatusOr<EvpCipherCtxPtr> ctx = NewKeyedContext();
        if (ctx.ok())
          cached_ = std::move(*ctx);
        else
          status = ctx.status();
      }
      if (status.ok()) {
        status = use(cached_.get());
        // After an error from OpenSSL itself (not a failed tag check), start afresh.
        if (!status.ok() && status.code() != absl::StatusCode::kDataLoss) cached_.reset();
      }
      mu_.Unlock();
      return status;
    }
    ASSIGN_OR_RETURN(EvpCipherCtxPtr ctx, NewKeyedContext());
    return use(ctx.get());
  }

  // Encrypts the message `in` (the concatenation of its parts) into out[0, size) and writes the
  // tag after it, or decrypts `in` (one part: ciphertext || tag) into `out` and checks the tag.
  // `out` may be the one part itself. Works in pieces of `piece_size` bytes of the message (a
  // piece may span parts); with a hook, calls it after each piece is written (encrypting) or
  // before each piece and the tag are read (decrypting), as
  // Aead::SealPartsIntoInPieces/OpenIntoInPieces.
  absl::Status Crypt(EVP_CIPHER_CTX* ctx, bool encrypt, ByteSpan nonce, ByteSpan aad,
                     std::span<const ByteSpan> in, std::span<uint8_t> out, size_t piece_size,
                     const PieceHook* hook) const {
    // No ClearOpenSslErrors here: this is the hot path, and every failure below drains the
    // queue (OpenSslError) or clears it (a failed tag check).
    const size_t body_size = encrypt ? out.size() - kAeadTagSize : out.size();
    if (EVP_CipherInit_ex2(ctx, nullptr, nullptr, nonce.data(), encrypt ? 1 : 0, nullptr) != 1) {
      return OpenSslError(absl::StatusCode::kInternal,
                          absl::StrCat("EVP_CipherInit_ex2(", AlgName(alg_), ", nonce)"));
    }
    int written = 0;
    for (size_t offset = 0; offset < aad.size(); offset += kMaxPiece) {
      const size_t piece = std::min(kMaxPiece, aad.size() - offset);
      if (EVP_CipherUpdate(ctx, nullptr, &written, aad.data() + offset, static_cast<int>(piece)) !=
          1) {
        return OpenSslError(absl::StatusCode::kInternal, "EVP_CipherUpdate(associated data)");
      }
    }
    // Runs of short parts (a batch of small requests) are copied together and sent in one
    // call: a call costs more than copying a few hundred bytes. The copy is wiped at the end.
    struct Gathered {
      uint8_t bytes[kGatherSize];
      size_t size = 0;  // bytes held
      size_t at = 0;    // where they go in `out`
      size_t used = 0;  // the most bytes ever held
      ~Gathered() {
        if (used > 0) SecureWipe(bytes, used);
      }
    } gathered;
    auto update = [&](uint8_t* to, const uint8_t* from, size_t size) -> absl::Status {
      if (EVP_CipherUpdate(ctx, to, &written, from, static_cast<int>(size)) != 1 ||
          static_cast<size_t>(written) != size) {
        return OpenSslError(absl::StatusCode::kInternal, "EVP_CipherUpdate(data)");
      }
      return absl::OkStatus();
    };
    auto flush = [&]() -> absl::Status {
      if (gathered.size == 0) return absl::OkStatus();
      RETURN_IF_ERROR(update(out.data() + gathered.at, gathered.bytes, gathered.size));
      gathered.size = 0;
      return absl::OkStatus();
    };
    size_t part = 0, in_part = 0;  // where the next byte of the message is read
    for (size_t offset = 0; offset < body_size;) {
      const size_t piece_end = std::min(offset + piece_size, body_size);
      if (hook != nullptr && !encrypt) RETURN_IF_ERROR((*hook)(piece_end));
      while (offset < piece_end) {
        while (in_part == in[part].size()) {
          ++part;
          in_part = 0;
        }
        const size_t step = std::min(piece_end - offset, in[part].size() - in_part);
        const uint8_t* from = in[part].data() + in_part;
        if (step < kShortStep) {
          if (gathered.size + step > sizeof(gathered.bytes)) RETURN_IF_ERROR(flush());
          if (gathered.size == 0) gathered.at = offset;
          std::memcpy(gathered.bytes + gathered.size, from, step);
          gathered.size += step;
          gathered.used = std::max(gathered.used, gathered.size);
        } else {
          RETURN_IF_ERROR(flush());
          RETURN_IF_ERROR(update(out.data() + offset, from, step));
        }
        offset += step;
        in_part += step;
      }
      RETURN_IF_ERROR(flush());
      // (The last piece is announced with the tag.)
      if (hook != nullptr && encrypt && offset < body_size) RETURN_IF_ERROR((*hook)(offset));
    }
    uint8_t tag[kAeadTagSize];
    if (hook != nullptr && !encrypt) RETURN_IF_ERROR((*hook)(body_size + kAeadTagSize));
    if (!encrypt) {
      std::memcpy(tag, in[0].data() + body_size, kAeadTagSize);
      OSSL_PARAM params[] = {
          OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, tag, kAeadTagSize),
          OSSL_PARAM_construct_end()};
      if (EVP_CIPHER_CTX_set_params(ctx, params) != 1) {
        return OpenSslError(absl::StatusCode::kInternal, "EVP_CIPHER_CTX_set_params(tag)");
      }
    }
    uint8_t final_block[16];
    if (EVP_CipherFinal_ex(ctx, final_block, &written) != 1) {
      if (!encrypt) {
        internal::ClearOpenSslErrors();
        return AuthenticationFailed(alg_);
      }
      return OpenSslError(absl::StatusCode::kInternal, "EVP_CipherFinal_ex");
    }
    if (encrypt) {
      OSSL_PARAM params[] = {
          OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, tag, kAeadTagSize),
          OSSL_PARAM_construct_end()};
      if (EVP_CIPHER_CTX_get_params(ctx, params) != 1) {
        return OpenSslError(absl::StatusCode::kInternal, "EVP_CIPHER_CTX_get_params(tag)");
      }
      std::memcpy(out.data() + body_size, tag, kAeadTagSize);
      if (hook != nullptr) RETURN_IF_ERROR((*hook)(out.size()));
    }
    return absl::OkStatus();
  }

  const AeadAlg alg_;
  const EVP_CIPHER* const cipher_;
  const SecretBytes key_;
  mutable absl::Mutex mu_;
  mutable EvpCipherCtxPtr cached_ ABSL_GUARDED_BY(mu_);
};

// ChaCha20-Poly1305 (RFC 8439, 96-bit nonce) over libsodium, which is stateless per call.
class ChaChaPolyAead final : public AeadBase {
 public:
  explicit ChaChaPolyAead(ByteSpan key) : key_(key) {}

  AeadAlg alg() const override { return AeadAlg::kChaCha20Poly1305; }

  absl::Status SealInto(ByteSpan nonce, ByteSpan aad, ByteSpan plaintext,
                        std::span<uint8_t> out) const override {
    RETURN_IF_ERROR(CheckSealSizes(alg(), nonce, plaintext, out));
    unsigned long long tag_size = 0;
    if (crypto_aead_chacha20poly1305_ietf_encrypt_detached(
            out.data(), out.data() + plaintext.size(), &tag_size, plaintext.data(),
            plaintext.size(), aad.data(), aad.size(), nullptr, nonce.data(), key_.data()) != 0 ||
        tag_size != kAeadTagSize) {
      return absl::InternalError("libsodium ChaCha20-Poly1305 encryption failed");
    }
    return absl::OkStatus();
  }

  absl::Status OpenInto(ByteSpan nonce, ByteSpan aad, ByteSpan ciphertext,
                        std::span<uint8_t> out) const override {
    RETURN_IF_ERROR(CheckOpenSizes(alg(), nonce, ciphertext, out));
    const size_t body_size = ciphertext.size() - kAeadTagSize;
    if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(
            out.data(), nullptr, ciphertext.data(), body_size, ciphertext.data() + body_size,
            aad.data(), aad.size(), nonce.data(), key_.data()) != 0) {
      SecureWipe(out.data(), out.size());
      return AuthenticationFailed(alg());
    }
    return absl::OkStatus();
  }

 private:
  const SecretBytes key_;
};

const EVP_CIPHER* FetchCipher(AeadAlg alg) {
  static const EVP_CIPHER* const aes128 = EVP_CIPHER_fetch(nullptr, "AES-128-GCM", nullptr);
  static const EVP_CIPHER* const aes256 = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
  return alg == AeadAlg::kAes128Gcm ? aes128 : aes256;
}

}  // namespace

absl::Status Aead::SealPartsInto(ByteSpan nonce, ByteSpan aad, std::span<const ByteSpan> parts,
                                 std::span<uint8_t> out) const {
  if (parts.size() == 1) return SealInto(nonce, aad, parts[0], out);
  SecretBytes message(PartsSize(parts));
  size_t offset = 0;
  for (const ByteSpan part : parts) {
    if (!part.empty()) std::memcpy(message.data() + offset, part.data(), part.size());
    offset += part.size();
  }
  return SealInto(nonce, aad, message.span(), out);
}

absl::Status Aead::SealPartsIntoInPieces(ByteSpan nonce, ByteSpan aad,
                                         std::span<const ByteSpan> parts, std::span<uint8_t> out,
                                         size_t /*piece*/, const PieceHook& ready) const {
  RETURN_IF_ERROR(SealPartsInto(nonce, aad, parts, out));
  return ready(out.size());
}

absl::Status Aead::OpenIntoInPieces(ByteSpan nonce, ByteSpan aad, ByteSpan ciphertext,
                                    std::span<uint8_t> out, size_t /*piece*/,
                                    const PieceHook& wait) const {
  absl::Status waited = wait(ciphertext.size());
  if (!waited.ok()) {
    SecureWipe(out.data(), out.size());
    return waited;
  }
  return OpenInto(nonce, aad, ciphertext, out);
}

size_t AeadKeySize(AeadAlg alg) {
  switch (alg) {
    case AeadAlg::kAes128Gcm:
      return 16;
    case AeadAlg::kAes256Gcm:
    case AeadAlg::kChaCha20Poly1305:
      return 32;
  }
  return 32;
}

absl::StatusOr<std::unique_ptr<Aead>> Aead::Create(AeadAlg alg, ByteSpan key) {
  if (key.size() != AeadKeySize(alg)) {
    return absl::InvalidArgumentError(
        absl::StrCat(AlgName(alg), " key must be ", AeadKeySize(alg), " bytes, got ", key.size()));
  }
  if (alg == AeadAlg::kChaCha20Poly1305) {
    static const bool sodium_ready = sodium_init() >= 0;
    if (!sodium_ready) return absl::InternalError("libsodium failed to initialize");
    return std::unique_ptr<Aead>(new ChaChaPolyAead(key));
  }
  const EVP_CIPHER* cipher = FetchCipher(alg);
  if (cipher == nullptr) {
    return OpenSslError(absl::StatusCode::kInternal,
                        absl::StrCat("EVP_CIPHER_fetch(", AlgName(alg), ")"));
  }
  return std::unique_ptr<Aead>(new AesGcmAead(alg, cipher, key));
}

}  // namespace cloister::crypto
