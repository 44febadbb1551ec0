// AEADs with 96-bit nonces and 128-bit tags appended to the ciphertext (RFC 5116 layout):
// AES-128-GCM and AES-256-GCM over OpenSSL, ChaCha20-Poly1305 (IETF) over libsodium.
// Any other nonce or tag size is refused by the API before any crypto runs.
// An Aead object holds its key (wiped on destruction); Seal/Open are const and safe to call from
// several threads. The AES-GCM implementation keeps one keyed OpenSSL context per object and
// reuses it, so one owner sealing many chunks pays no allocation or key setup per call.
#pragma once

#include <functional>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"

namespace cloister::crypto {

enum class AeadAlg { kAes128Gcm, kAes256Gcm, kChaCha20Poly1305 };

inline constexpr size_t kAeadNonceSize = 12;
inline constexpr size_t kAeadTagSize = 16;
size_t AeadKeySize(AeadAlg alg);

class Aead {
 public:
  // InvalidArgument if the key size does not match the algorithm.
  static absl::StatusOr<std::unique_ptr<Aead>> Create(AeadAlg alg, ByteSpan key);
  virtual ~Aead() = default;

  // Returns ciphertext || tag.
  virtual absl::StatusOr<Bytes> Seal(ByteSpan nonce, ByteSpan aad, ByteSpan plaintext) const = 0;
  // Writes ciphertext || tag into `out`, which must be exactly plaintext.size() + 16 bytes
  // (else InvalidArgument); no allocation. `out` may start at plaintext.data() (in place) but
  // must not otherwise overlap it.
  virtual absl::Status SealInto(ByteSpan nonce, ByteSpan aad, ByteSpan plaintext,
                                std::span<uint8_t> out) const = 0;
  // Returns the plaintext. DataLoss("... authentication failed ...") when the tag does not
  // verify; InvalidArgument for a wrong nonce size or an input shorter than a tag.
  virtual absl::StatusOr<Bytes> Open(ByteSpan nonce, ByteSpan aad, ByteSpan ciphertext) const = 0;
  // Writes the plaintext into `out`, which must be exactly ciphertext.size() - 16 bytes (else
  // InvalidArgument); in place as for SealInto. On failure `out` is wiped.
  virtual absl::Status OpenInto(ByteSpan nonce, ByteSpan aad, ByteSpan ciphertext,
                                std::span<uint8_t> out) const = 0;
  virtual AeadAlg alg() const = 0;

  // SealInto over a plaintext given in parts: their concatenation, in order, is the message
  // (a batch's inputs sealed straight from where they lie, with no gather copy first). `out`
  // must be exactly the parts' total size + 16 bytes (else InvalidArgument); no part may overlap
  // it. AES-GCM takes the parts one by one; other algorithms concatenate them first.
  virtual absl::Status SealPartsInto(ByteSpan nonce, ByteSpan aad, std::span<const ByteSpan> parts,
                                     std::span<uint8_t> out) const;

  // For a pipeline in which one thread seals a large message while another opens it right
  // behind (the emulated PCIe path's single-chunk transfers): the same results and refusals
  // as SealPartsInto and OpenInto, worked in pieces of `piece` bytes of the message.
  // SealPartsIntoInPieces calls `ready(n)` each time out[0, n) is final (n = the whole output,
  // tag included, last). OpenIntoInPieces calls `wait(n)` before it reads ciphertext[0, n), and
  // the tag last, so it can follow a sealer; the tag covers exactly the bytes it read. A hook
  // returning an error stops the call with that error (OpenIntoInPieces then wipes `out`).
  // AES-GCM works incrementally; other algorithms do the whole message in one step between
  // hooks.
  using PieceHook = std::function<absl::Status(size_t bytes)>;
  virtual absl::Status SealPartsIntoInPieces(ByteSpan nonce, ByteSpan aad,
                                             std::span<const ByteSpan> parts,
                                             std::span<uint8_t> out, size_t piece,
                                             const PieceHook& ready) const;
  // SealPartsIntoInPieces with the plaintext in one part.
  absl::Status SealIntoInPieces(ByteSpan nonce, ByteSpan aad, ByteSpan plaintext,
                                std::span<uint8_t> out, size_t piece,
                                const PieceHook& ready) const {
    const ByteSpan parts[] = {plaintext};
    return SealPartsIntoInPieces(nonce, aad, parts, out, piece, ready);
  }
  virtual absl::Status OpenIntoInPieces(ByteSpan nonce, ByteSpan aad, ByteSpan ciphertext,
                                        std::span<uint8_t> out, size_t piece,
                                        const PieceHook& wait) const;
};

}  // namespace cloister::crypto
