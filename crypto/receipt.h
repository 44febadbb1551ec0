// Signatures over usage receipts (docs/PROTOCOL.md section 7): the enclave signs each serialized
// UsageReceipt with its Ed25519 signing key (the one in its evidence bundle), and the host, the
// tenant or an auditor checks it with the public key. The domain label keeps a receipt
// signature from ever verifying as any other signature the enclave makes.
// Thread-safe: pure functions.
#pragma once

#include "absl/status/statusor.h"
#include "base/bytes.h"

namespace cloister::crypto {

inline constexpr std::string_view kUsageReceiptLabel = "cloister/v1 usage receipt";

// "cloister/v1 usage receipt" || receipt.
Bytes UsageReceiptMessage(ByteSpan receipt);
// Ed25519 over UsageReceiptMessage(receipt) with the 32-byte seed.
absl::StatusOr<Bytes> SignUsageReceipt(ByteSpan signing_seed, ByteSpan receipt);
// OK, or PermissionDenied("usage receipt signature does not verify ...") / InvalidArgument for
// a key or signature of the wrong size.
absl::Status VerifyUsageReceipt(ByteSpan signing_public_key, ByteSpan receipt, ByteSpan signature);

// Audit checkpoints (host/audit/): the enclave signs a serialized boundary.v1.AuditCheckpoint
// (the head of the host's hash-chained audit log) under its own domain label.
inline constexpr std::string_view kAuditCheckpointLabel = "cloister/v1 audit checkpoint";

// Ed25519 over "cloister/v1 audit checkpoint" || checkpoint with the 32-byte seed.
absl::StatusOr<Bytes> SignAuditCheckpoint(ByteSpan signing_seed, ByteSpan checkpoint);
// OK, or PermissionDenied("audit checkpoint signature does not verify ...") / InvalidArgument
// for a key or signature of the wrong size.
absl::Status VerifyAuditCheckpoint(ByteSpan signing_public_key, ByteSpan checkpoint,
                                   ByteSpan signature);

}  // namespace cloister::crypto
