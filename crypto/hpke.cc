#include "crypto/hpke.h"

#include <initializer_list>
#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "crypto/hkdf.h"
#include "crypto/keys.h"

namespace cloister::crypto {
namespace {

constexpr uint16_t kKemX25519Sha256 = 0x0020;
constexpr uint16_t kKdfHkdfSha256 = 0x0001;
constexpr uint16_t kAeadAes128Gcm = 0x0001;
constexpr uint16_t kAeadAes256Gcm = 0x0002;
constexpr uint16_t kAeadChaCha20Poly1305 = 0x0003;
constexpr uint16_t kAeadExportOnly = 0xFFFF;

constexpr size_t kNh = 32;   // HKDF-SHA256 output, also the KEM's Nsecret
constexpr size_t kNpk = 32;  // X25519 public key = enc
constexpr size_t kNsk = 32;  // X25519 private key
constexpr size_t kNn = 12;   // AEAD nonce
constexpr size_t kMinPskSize = 32;
// Far below the RFC's limits, far above anything Cloister sends.
constexpr size_t kMaxInputSize = 64 * 1024;

constexpr std::string_view kVersionLabel = "HPKE-v1";

struct SuiteParams {
  bool export_only = false;
  AeadAlg alg = AeadAlg::kAes256Gcm;
};

absl::StatusOr<SuiteParams> CheckSuite(const HpkeSuite& suite) {
  if (suite.kem_id != kKemX25519Sha256) {
    return absl::InvalidArgumentError(absl::StrCat("HPKE KEM 0x", absl::Hex(suite.kem_id),
                                                   " is not supported (only 0x0020 X25519)"));
  }
  if (suite.kdf_id != kKdfHkdfSha256) {
    return absl::InvalidArgumentError(absl::StrCat("HPKE KDF 0x", absl::Hex(suite.kdf_id),
                                                   " is not supported (only 0x0001 HKDF-SHA256)"));
  }
  SuiteParams params;
  switch (suite.aead_id) {
    case kAeadAes128Gcm:
      params.alg = AeadAlg::kAes128Gcm;
      break;
    case kAeadAes256Gcm:
      params.alg = AeadAlg::kAes256Gcm;
      break;
    case kAeadChaCha20Poly1305:
      params.alg = AeadAlg::kChaCha20Poly1305;
      break;
    case kAeadExportOnly:
      params.export_only = true;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("HPKE AEAD 0x", absl::Hex(suite.aead_id), " is not supported"));
  }
  return params;
}

bool IsAuthMode(HpkeMode mode) { return mode == HpkeMode::kAuth || mode == HpkeMode::kAuthPsk; }
bool IsPskMode(HpkeMode mode) { return mode == HpkeMode::kPsk || mode == HpkeMode::kAuthPsk; }

absl::Status CheckMode(HpkeMode mode) {
  if (static_cast<uint8_t>(mode) > static_cast<uint8_t>(HpkeMode::kAuthPsk)) {
    return absl::InvalidArgumentError(
        absl::StrCat("HPKE mode ", static_cast<int>(mode), " does not exist"));
  }
  return absl::OkStatus();
}

// RFC 9180 VerifyPSKInputs, plus our size policy.
absl::Status CheckPskInputs(HpkeMode mode, ByteSpan psk, ByteSpan psk_id) {
  if (psk.empty() != psk_id.empty()) {
    return absl::InvalidArgumentError("HPKE psk and psk_id must be given together");
  }
  if (!psk.empty() && !IsPskMode(mode)) {
    return absl::InvalidArgumentError("HPKE psk given, but the mode does not use one");
  }
  if (psk.empty() && IsPskMode(mode)) {
    return absl::InvalidArgumentError("HPKE psk mode needs a psk and psk_id");
  }
  if (!psk.empty() && psk.size() < kMinPskSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HPKE psk of ", psk.size(), " bytes is too short (at least ", kMinPskSize, ")"));
  }
  if (psk.size() > kMaxInputSize || psk_id.size() > kMaxInputSize) {
    return absl::InvalidArgumentError("HPKE psk or psk_id is larger than 64 KiB");
  }
  return absl::OkStatus();
}

absl::Status CheckKeySize(absl::string_view what, ByteSpan key, size_t expected) {
  if (key.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("HPKE ", what, " must be ", expected, " bytes, got ", key.size()));
  }
  return absl::OkStatus();
}

SecretBytes Concat(std::initializer_list<ByteSpan> parts) {
  size_t size = 0;
  for (ByteSpan part : parts) size += part.size();
  SecretBytes out(size);
  size_t offset = 0;
  for (ByteSpan part : parts) {
    std::copy(part.begin(), part.end(), out.data() + offset);
    offset += part.size();
  }
  return out;
}

Bytes KemSuiteId() { return {'K', 'E', 'M', kKemX25519Sha256 >> 8, kKemX25519Sha256 & 0xff}; }

Bytes HpkeSuiteId(const HpkeSuite& suite) {
  Bytes id = ToBytes("HPKE");
  AppendBigEndian(id, suite.kem_id, 2);
  AppendBigEndian(id, suite.kdf_id, 2);
  AppendBigEndian(id, suite.aead_id, 2);
  return id;
}

SecretBytes LabeledExtract(ByteSpan suite_id, ByteSpan salt, std::string_view label, ByteSpan ikm) {
  SecretBytes labeled_ikm = Concat({AsBytes(kVersionLabel), suite_id, AsBytes(label), ikm});
  return HkdfExtract(HashAlg::kSha256, salt, labeled_ikm.span());
}

absl::StatusOr<SecretBytes> LabeledExpand(ByteSpan suite_id, ByteSpan prk, std::string_view label,
                                          ByteSpan info, size_t length) {
  if (length > 0xffff) return absl::InvalidArgumentError("HPKE expand length over 65535");
  Bytes labeled_info;
  AppendBigEndian(labeled_info, length, 2);
  Append(labeled_info, AsBytes(kVersionLabel));
  Append(labeled_info, suite_id);
  Append(labeled_info, AsBytes(label));
  Append(labeled_info, info);
  return HkdfExpand(HashAlg::kSha256, prk, labeled_info, length);
}

absl::StatusOr<SecretBytes> ExtractAndExpand(ByteSpan dh, ByteSpan kem_context) {
  const Bytes kem_id = KemSuiteId();
  SecretBytes eae_prk = LabeledExtract(kem_id, {}, "eae_prk", dh);
  return LabeledExpand(kem_id, eae_prk.span(), "shared_secret", kem_context, kNh);
}

struct Encapsulation {
  SecretBytes shared_secret;
  Bytes enc;
};

// Encap / AuthEncap (RFC 9180 4.1) for the sender, with a fresh ephemeral key unless the
// options carry a test IKM.
absl::StatusOr<Encapsulation> Encap(HpkeMode mode, ByteSpan recipient_public_key,
                                    const HpkeOptions& options) {
  RETURN_IF_ERROR(CheckKeySize("recipient public key", recipient_public_key, kNpk));
  X25519KeyPair ephemeral;
  if (!options.ephemeral_ikm.empty()) {
    ASSIGN_OR_RETURN(auto derived, HpkeDeriveKeyPair(options.ephemeral_ikm));
    ephemeral.private_key = std::move(derived.first);
    ephemeral.public_key = std::move(derived.second);
  } else {
    ephemeral = GenerateX25519();
  }
  ASSIGN_OR_RETURN(SecretBytes dh, X25519(ephemeral.private_key.span(), recipient_public_key));
  Bytes kem_context = ephemeral.public_key;
  Append(kem_context, recipient_public_key);
  if (IsAuthMode(mode)) {
    RETURN_IF_ERROR(CheckKeySize("sender private key", options.sender_private_key, kNsk));
    ASSIGN_OR_RETURN(X25519KeyPair sender, X25519FromPrivate(options.sender_private_key));
    ASSIGN_OR_RETURN(SecretBytes static_dh,
                     X25519(sender.private_key.span(), recipient_public_key));
    dh = Concat({dh.span(), static_dh.span()});
    Append(kem_context, sender.public_key);
  } else if (!options.sender_private_key.empty()) {
    return absl::InvalidArgumentError("HPKE sender private key given, but the mode is not auth");
  }
  Encapsulation out;
  ASSIGN_OR_RETURN(out.shared_secret, ExtractAndExpand(dh.span(), kem_context));
  out.enc = std::move(ephemeral.public_key);
  return out;
}

// Decap / AuthDecap (RFC 9180 4.1) for the recipient.
absl::StatusOr<SecretBytes> Decap(HpkeMode mode, ByteSpan enc, ByteSpan recipient_private_key,
                                  const HpkeOptions& options) {
  RETURN_IF_ERROR(CheckKeySize("enc", enc, kNpk));
  RETURN_IF_ERROR(CheckKeySize("recipient private key", recipient_private_key, kNsk));
  ASSIGN_OR_RETURN(X25519KeyPair recipient, X25519FromPrivate(recipient_private_key));
  ASSIGN_OR_RETURN(SecretBytes dh, X25519(recipient_private_key, enc));
  Bytes kem_context(enc.begin(), enc.end());
  Append(kem_context, recipient.public_key);
  if (IsAuthMode(mode)) {
    RETURN_IF_ERROR(CheckKeySize("sender public key", options.sender_public_key, kNpk));
    ASSIGN_OR_RETURN(SecretBytes static_dh,
                     X25519(recipient_private_key, options.sender_public_key));
    dh = Concat({dh.span(), static_dh.span()});
    Append(kem_context, options.sender_public_key);
  } else if (!options.sender_public_key.empty()) {
    return absl::InvalidArgumentError("HPKE sender public key given, but the mode is not auth");
  }
  return ExtractAndExpand(dh.span(), kem_context);
}

struct Schedule {
  Bytes key_schedule_context;
  SecretBytes secret;
  SecretBytes key, base_nonce, exporter_secret;
};

// KeySchedule (RFC 9180 5.1).
absl::StatusOr<Schedule> KeySchedule(const HpkeSuite& suite, HpkeMode mode, ByteSpan shared_secret,
                                     ByteSpan info, ByteSpan psk, ByteSpan psk_id) {
  ASSIGN_OR_RETURN(SuiteParams params, CheckSuite(suite));
  RETURN_IF_ERROR(CheckMode(mode));
  RETURN_IF_ERROR(CheckPskInputs(mode, psk, psk_id));
  if (info.size() > kMaxInputSize) {
    return absl::InvalidArgumentError("HPKE info is larger than 64 KiB");
  }
  const Bytes suite_id = HpkeSuiteId(suite);
  Schedule out;
  SecretBytes psk_id_hash = LabeledExtract(suite_id, {}, "psk_id_hash", psk_id);
  SecretBytes info_hash = LabeledExtract(suite_id, {}, "info_hash", info);
  out.key_schedule_context.push_back(static_cast<uint8_t>(mode));
  Append(out.key_schedule_context, psk_id_hash.span());
  Append(out.key_schedule_context, info_hash.span());
  out.secret = LabeledExtract(suite_id, shared_secret, "secret", psk);
  if (!params.export_only) {
    ASSIGN_OR_RETURN(out.key, LabeledExpand(suite_id, out.secret.span(), "key",
                                            out.key_schedule_context, AeadKeySize(params.alg)));
    ASSIGN_OR_RETURN(out.base_nonce, LabeledExpand(suite_id, out.secret.span(), "base_nonce",
                                                   out.key_schedule_context, kNn));
  }
  ASSIGN_OR_RETURN(out.exporter_secret, LabeledExpand(suite_id, out.secret.span(), "exp",
                                                      out.key_schedule_context, kNh));
  return out;
}

}  // namespace

// Builds contexts; the friend of HpkeContext.
class HpkeInternal {
 public:
  static absl::StatusOr<std::unique_ptr<HpkeContext>> NewContext(const HpkeSuite& suite,
                                                                 HpkeMode mode,
                                                                 ByteSpan shared_secret,
                                                                 ByteSpan info,
                                                                 const HpkeOptions& options) {
    ASSIGN_OR_RETURN(SuiteParams params, CheckSuite(suite));
    ASSIGN_OR_RETURN(Schedule schedule,
                     KeySchedule(suite, mode, shared_secret, info, options.psk, options.psk_id));
    std::unique_ptr<HpkeContext> context(new HpkeContext());
    context->suite_id_ = HpkeSuiteId(suite);
    if (!params.export_only) {
      ASSIGN_OR_RETURN(context->aead_, Aead::Create(params.alg, schedule.key.span()));
    }
    context->key_ = std::move(schedule.key);
    context->base_nonce_ = std::move(schedule.base_nonce);
    context->exporter_secret_ = std::move(schedule.exporter_secret);
    return context;
  }
};

HpkeContext::~HpkeContext() = default;

Bytes HpkeContext::ComputeNonce(uint64_t seq) const {
  Bytes nonce(base_nonce_.span().begin(), base_nonce_.span().end());
  for (size_t i = 0; i < 8; ++i)
    nonce[nonce.size() - 1 - i] ^= static_cast<uint8_t>(seq >> (8 * i));
  return nonce;
}

absl::StatusOr<Bytes> HpkeContext::Seal(ByteSpan aad, ByteSpan plaintext) {
  if (aead_ == nullptr) {
    return absl::FailedPreconditionError("HPKE context is export-only: it cannot seal");
  }
  if (seq_ == std::numeric_limits<uint64_t>::max()) {
    return absl::ResourceExhaustedError("HPKE message limit reached: the context must be replaced");
  }
  ASSIGN_OR_RETURN(Bytes ciphertext, aead_->Seal(ComputeNonce(seq_), aad, plaintext));
  ++seq_;
  return ciphertext;
}

absl::StatusOr<Bytes> HpkeContext::Open(ByteSpan aad, ByteSpan ciphertext) {
  if (aead_ == nullptr) {
    return absl::FailedPreconditionError("HPKE context is export-only: it cannot open");
  }
  if (seq_ == std::numeric_limits<uint64_t>::max()) {
    return absl::ResourceExhaustedError("HPKE message limit reached: the context must be replaced");
  }
  absl::StatusOr<Bytes> plaintext = aead_->Open(ComputeNonce(seq_), aad, ciphertext);
  if (!plaintext.ok()) {
    return absl::Status(plaintext.status().code(),
                        absl::StrCat("HPKE open: ", plaintext.status().message()));
  }
  ++seq_;
  return plaintext;
}

absl::StatusOr<SecretBytes> HpkeContext::Export(ByteSpan exporter_context, size_t length) const {
  if (length > 255 * kNh) {
    return absl::InvalidArgumentError(
        absl::StrCat("HPKE export length ", length, " exceeds the limit of ", 255 * kNh));
  }
  if (exporter_context.size() > kMaxInputSize) {
    return absl::InvalidArgumentError("HPKE exporter context is larger than 64 KiB");
  }
  return LabeledExpand(suite_id_, exporter_secret_.span(), "sec", exporter_context, length);
}

absl::StatusOr<HpkeSenderSetup> HpkeSetupSender(const HpkeSuite& suite,
                                                ByteSpan recipient_public_key, ByteSpan info,
                                                const HpkeOptions& options) {
  RETURN_IF_ERROR(CheckSuite(suite).status());
  RETURN_IF_ERROR(CheckMode(options.mode));
  RETURN_IF_ERROR(CheckPskInputs(options.mode, options.psk, options.psk_id));
  ASSIGN_OR_RETURN(Encapsulation encapsulation, Encap(options.mode, recipient_public_key, options));
  HpkeSenderSetup setup;
  ASSIGN_OR_RETURN(setup.context,
                   HpkeInternal::NewContext(suite, options.mode, encapsulation.shared_secret.span(),
                                            info, options));
  setup.enc = std::move(encapsulation.enc);
  return setup;
}

absl::StatusOr<std::unique_ptr<HpkeContext>> HpkeSetupReceiver(const HpkeSuite& suite, ByteSpan enc,
                                                               ByteSpan recipient_private_key,
                                                               ByteSpan info,
                                                               const HpkeOptions& options) {
  RETURN_IF_ERROR(CheckSuite(suite).status());
  RETURN_IF_ERROR(CheckMode(options.mode));
  RETURN_IF_ERROR(CheckPskInputs(options.mode, options.psk, options.psk_id));
  ASSIGN_OR_RETURN(SecretBytes shared_secret,
                   Decap(options.mode, enc, recipient_private_key, options));
  return HpkeInternal::NewContext(suite, options.mode, shared_secret.span(), info, options);
}

absl::StatusOr<std::pair<SecretBytes, Bytes>> HpkeDeriveKeyPair(ByteSpan ikm) {
  if (ikm.size() < kNsk) {
    return absl::InvalidArgumentError(absl::StrCat("HPKE DeriveKeyPair IKM of ", ikm.size(),
                                                   " bytes is too short (at least ", kNsk, ")"));
  }
  const Bytes kem_id = KemSuiteId();
  SecretBytes dkp_prk = LabeledExtract(kem_id, {}, "dkp_prk", ikm);
  ASSIGN_OR_RETURN(SecretBytes private_key, LabeledExpand(kem_id, dkp_prk.span(), "sk", {}, kNsk));
  ASSIGN_OR_RETURN(X25519KeyPair pair, X25519FromPrivate(private_key.span()));
  return std::make_pair(std::move(private_key), std::move(pair.public_key));
}

absl::StatusOr<std::pair<SecretBytes, Bytes>> HpkeEncapForTest(ByteSpan recipient_public_key,
                                                               const HpkeOptions& options) {
  RETURN_IF_ERROR(CheckMode(options.mode));
  ASSIGN_OR_RETURN(Encapsulation encapsulation, Encap(options.mode, recipient_public_key, options));
  return std::make_pair(std::move(encapsulation.shared_secret), std::move(encapsulation.enc));
}

absl::StatusOr<SecretBytes> HpkeDecapForTest(ByteSpan enc, ByteSpan recipient_private_key,
                                             const HpkeOptions& options) {
  RETURN_IF_ERROR(CheckMode(options.mode));
  return Decap(options.mode, enc, recipient_private_key, options);
}

absl::StatusOr<std::pair<Bytes, SecretBytes>> HpkeKeyScheduleForTest(const HpkeSuite& suite,
                                                                     ByteSpan shared_secret,
                                                                     ByteSpan info,
                                                                     const HpkeOptions& options) {
  ASSIGN_OR_RETURN(Schedule schedule, KeySchedule(suite, options.mode, shared_secret, info,
                                                  options.psk, options.psk_id));
  return std::make_pair(std::move(schedule.key_schedule_context), std::move(schedule.secret));
}

}  // namespace cloister::crypto
