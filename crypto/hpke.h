// HPKE (RFC 9180) with KEM DHKEM(X25519, HKDF-SHA256), KDF HKDF-SHA256 and the AEADs
// AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305 or export-only; all four modes.
// Cloister's sessions use base mode with AES-256-GCM (kSessionSuite). Spec: shared/specs/hpke.md.
// A Context is not thread-safe (it carries a sequence number); one owner at a time.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "base/secret_bytes.h"
#include "crypto/aead.h"

namespace cloister::crypto {

enum class HpkeMode : uint8_t { kBase = 0, kPsk = 1, kAuth = 2, kAuthPsk = 3 };

struct HpkeSuite {
  uint16_t kem_id = 0x0020;   // DHKEM(X25519, HKDF-SHA256); the only KEM supported
  uint16_t kdf_id = 0x0001;   // HKDF-SHA256; the only KDF supported
  uint16_t aead_id = 0x0002;  // 0x0001 AES-128-GCM, 0x0002 AES-256-GCM, 0x0003 ChaCha20, 0xFFFF export-only
};
inline constexpr HpkeSuite kSessionSuite{0x0020, 0x0001, 0x0002};

class HpkeContext {
 public:
  ~HpkeContext();
  // Seal/Open use and then advance the sequence number. FailedPrecondition for an
  // export-only suite; Open fails with "authentication failed" and does not advance.
  absl::StatusOr<Bytes> Seal(ByteSpan aad, ByteSpan plaintext);
  absl::StatusOr<Bytes> Open(ByteSpan aad, ByteSpan ciphertext);
  absl::StatusOr<SecretBytes> Export(ByteSpan exporter_context, size_t length) const;

  // For the known-answer tests.
  ByteSpan KeyForTest() const { return key_.span(); }
  ByteSpan BaseNonceForTest() const { return base_nonce_.span(); }
  ByteSpan ExporterSecretForTest() const { return exporter_secret_.span(); }
  void SetSequenceForTest(uint64_t seq) { seq_ = seq; }

 private:
  friend class HpkeInternal;
  HpkeContext() = default;
  SecretBytes key_, base_nonce_, exporter_secret_;
  std::unique_ptr<Aead> aead_;
  uint64_t seq_ = 0;
};

struct HpkeSenderSetup {
  Bytes enc;  // the encapsulated key to send to the receiver
  std::unique_ptr<HpkeContext> context;
};

struct HpkeOptions {
  HpkeMode mode = HpkeMode::kBase;
  ByteSpan psk;         // psk modes
  ByteSpan psk_id;      // psk modes
  ByteSpan sender_private_key;  // auth modes (skS)
  ByteSpan sender_public_key;   // auth modes, receiver side (pkS)
  ByteSpan ephemeral_ikm;       // tests: derive skE deterministically from this IKM
};

// Sender: encapsulates to `recipient_public_key`. InvalidArgument for unsupported suites,
// bad key sizes, missing or inconsistent psk/auth inputs, or a low-order recipient key.
absl::StatusOr<HpkeSenderSetup> HpkeSetupSender(const HpkeSuite& suite, ByteSpan recipient_public_key,
                                                ByteSpan info, const HpkeOptions& options = {});
// Receiver: decapsulates `enc` with `recipient_private_key`.
absl::StatusOr<std::unique_ptr<HpkeContext>> HpkeSetupReceiver(const HpkeSuite& suite, ByteSpan enc,
                                                               ByteSpan recipient_private_key,
                                                               ByteSpan info,
                                                               const HpkeOptions& options = {});
// DeriveKeyPair(ikm) of RFC 9180 section 7.1.3 for X25519 (private key unclamped as derived).
absl::StatusOr<std::pair<SecretBytes, Bytes>> HpkeDeriveKeyPair(ByteSpan ikm);

}  // namespace cloister::crypto
