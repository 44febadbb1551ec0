#include "crypto/receipt.h"

#include "absl/strings/str_cat.h"
#include "crypto/keys.h"

namespace cloister::crypto {

Bytes UsageReceiptMessage(ByteSpan receipt) {
  Bytes message = ToBytes(kUsageReceiptLabel);
  Append(message, receipt);
  return message;
}

absl::StatusOr<Bytes> SignUsageReceipt(ByteSpan signing_seed, ByteSpan receipt) {
  return Ed25519Sign(signing_seed, UsageReceiptMessage(receipt));
}

absl::Status VerifyUsageReceipt(ByteSpan signing_public_key, ByteSpan receipt, ByteSpan signature) {
  if (signing_public_key.size() != kEd25519PublicKeySize) {
    return absl::InvalidArgumentError(
        absl::StrCat("usage receipt key is ", signing_public_key.size(), " bytes, not 32"));
  }
  if (signature.size() != kEd25519SignatureSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("usage receipt signature is ", signature.size(), " bytes, not 64"));
  }
  absl::Status status = Ed25519Verify(signing_public_key, UsageReceiptMessage(receipt), signature);
  if (status.code() == absl::StatusCode::kPermissionDenied) {
    return absl::PermissionDeniedError(
        "usage receipt signature does not verify under the enclave's signing key");
  }
  return status;
}

absl::StatusOr<Bytes> SignAuditCheckpoint(ByteSpan signing_seed, ByteSpan checkpoint) {
  Bytes message = ToBytes(kAuditCheckpointLabel);
  Append(message, checkpoint);
  return Ed25519Sign(signing_seed, message);
}

absl::Status VerifyAuditCheckpoint(ByteSpan signing_public_key, ByteSpan checkpoint,
                                   ByteSpan signature) {
  if (signing_public_key.size() != kEd25519PublicKeySize) {
    return absl::InvalidArgumentError(
        absl::StrCat("audit checkpoint key is ", signing_public_key.size(), " bytes, not 32"));
  }
  if (signature.size() != kEd25519SignatureSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("audit checkpoint signature is ", signature.size(), " bytes, not 64"));
  }
  Bytes message = ToBytes(kAuditCheckpointLabel);
  Append(message, checkpoint);
  absl::Status status = Ed25519Verify(signing_public_key, message, signature);
  if (status.code() == absl::StatusCode::kPermissionDenied) {
    return absl::PermissionDeniedError(
        "audit checkpoint signature does not verify under the enclave's signing key");
  }
  return status;
}

}  // namespace cloister::crypto
