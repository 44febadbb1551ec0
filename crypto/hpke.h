// HPKE (RFC 9180) with KEM DHKEM(X25519, HKDF-SHA256), KDF HKDF-SHA256 and the AEADs
// AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305 or export-only; all four modes.
// Cloister's sessions use base mode with AES-256-GCM (kSessionSuite). Spec: shared/specs/hpke.md.
// A Context is not thread-safe (it carries a sequence number); one owner at a time.
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"
#include "crypto/aead.h"

namespace cloister::crypto {

enum class HpkeMode : uint8_t { kBase = 0, kPsk = 1, kAuth = 2, kAuthPsk = 3 };

struct HpkeSuite {
  uint16_t kem_id = 0x0020;  // DHKEM(X25519, HKDF-SHA256); the only KEM supported
  uint16_t kdf_id = 0x0001;  // HKDF-SHA256; the only KDF supported
  // 0x0001 AES-128-GCM, 0x0002 AES-256-GCM, 0x0003 ChaCha20-Poly1305, 0xFFFF export-only.
  uint16_t aead_id = 0x0002;
};
inline constexpr HpkeSuite kSessionSuite{0x0020, 0x0001, 0x0002};

class HpkeContext {
 public:
  ~HpkeContext();
  // Seal/Open use and then advance the sequence number. FailedPrecondition for an
  // export-only suite; Open fails with DataLoss("... authentication failed ...") and does not
  // advance; ResourceExhausted once the 64-bit sequence number is used up.
  // A sender context only seals and a receiver context only opens (RFC 9180 section 5.2).
  absl::StatusOr<Bytes> Seal(ByteSpan aad, ByteSpan plaintext);
  absl::StatusOr<Bytes> Open(ByteSpan aad, ByteSpan ciphertext);
  // RFC 9180 Export: InvalidArgument for length > 255 * 32 or a context over 64 KiB.
  absl::StatusOr<SecretBytes> Export(ByteSpan exporter_context, size_t length) const;

  // For the known-answer tests.
  ByteSpan KeyForTest() const { return key_.span(); }
  ByteSpan BaseNonceForTest() const { return base_nonce_.span(); }
  ByteSpan ExporterSecretForTest() const { return exporter_secret_.span(); }
  void SetSequenceForTest(uint64_t seq) { seq_ = seq; }

 private:
  friend class HpkeInternal;
  HpkeContext() = default;
  Bytes ComputeNonce(uint64_t seq) const;  // base_nonce XOR I2OSP(seq, 12)
  Bytes suite_id_;                         // "HPKE" || kem_id || kdf_id || aead_id
  SecretBytes key_, base_nonce_, exporter_secret_;
  std::unique_ptr<Aead> aead_;
  uint64_t seq_ = 0;
};

struct HpkeSenderSetup {
  Bytes enc;  // the encapsulated key to send to the receiver
  std::unique_ptr<HpkeContext> context;
};

// Inputs beside the suite and keys. Each side reads only its own fields: the sender ignores
// sender_public_key, the receiver ignores sender_private_key and ephemeral_ikm.
struct HpkeOptions {
  HpkeMode mode = HpkeMode::kBase;
  ByteSpan psk;                 // psk modes: at least 32 bytes (RFC 9180 section 9.5), with psk_id
  ByteSpan psk_id;              // psk modes
  ByteSpan sender_private_key;  // auth modes (skS)
  ByteSpan sender_public_key;   // auth modes, receiver side (pkS)
  ByteSpan ephemeral_ikm;       // tests: derive skE deterministically from this IKM
};

// Sender: encapsulates to `recipient_public_key`. InvalidArgument for unsupported suites,
// bad key sizes, missing or inconsistent psk/auth inputs, or a low-order recipient key.
absl::StatusOr<HpkeSenderSetup> HpkeSetupSender(const HpkeSuite& suite,
                                                ByteSpan recipient_public_key, ByteSpan info,
                                                const HpkeOptions& options = {});
// Receiver: decapsulates `enc` with `recipient_private_key`.
absl::StatusOr<std::unique_ptr<HpkeContext>> HpkeSetupReceiver(const HpkeSuite& suite, ByteSpan enc,
                                                               ByteSpan recipient_private_key,
                                                               ByteSpan info,
                                                               const HpkeOptions& options = {});
// DeriveKeyPair(ikm) of RFC 9180 section 7.1.3 for X25519 (private key unclamped as derived).
// Returns (private key, public key); InvalidArgument for an IKM shorter than 32 bytes.
absl::StatusOr<std::pair<SecretBytes, Bytes>> HpkeDeriveKeyPair(ByteSpan ikm);

// Known-answer test hooks for the intermediate values of RFC 9180 Appendix A; they run the
// same code as the setup functions. Not for production use.
// Encap/AuthEncap (by options.mode): returns (shared_secret, enc).
absl::StatusOr<std::pair<SecretBytes, Bytes>> HpkeEncapForTest(ByteSpan recipient_public_key,
                                                               const HpkeOptions& options);
// Decap/AuthDecap (by options.mode): returns shared_secret.
absl::StatusOr<SecretBytes> HpkeDecapForTest(ByteSpan enc, ByteSpan recipient_private_key,
                                             const HpkeOptions& options);
// KeySchedule: returns (key_schedule_context, secret).
absl::StatusOr<std::pair<Bytes, SecretBytes>> HpkeKeyScheduleForTest(const HpkeSuite& suite,
                                                                     ByteSpan shared_secret,
                                                                     ByteSpan info,
                                                                     const HpkeOptions& options);

}  // namespace cloister::crypto
