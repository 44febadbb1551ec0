// The host's copy of the enclave's usage receipts (docs/PROTOCOL.md section 7): a verifier for
// one signed receipt, an append-only log of them as JSON lines in DATA_DIR/receipts/, and an
// audit that re-reads a log and re-checks every signature and every cumulative chain. The host
// is untrusted, so the receipts (not this log) are the evidence: anyone holding the enclave's
// attested signing key can re-check the log the same way, and a line the host altered fails.
//
// Threading: ReceiptLog is thread-safe (appends are serialized); the free functions are pure.
// Ownership: ReceiptLog owns its file descriptor.
#pragma once

#include <istream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/bytes.h"
#include "base/clock.h"
#include "cloister/boundary/v1/boundary.pb.h"

namespace cloister::host {

// The enclave's Ed25519 signing key as its evidence names it (the bundle inside the
// ChallengeResponse of a GetEvidence result). The host learns the key this way; whether that
// evidence is genuine is for a verifier with a policy to decide (cloister-verify).
// InvalidArgument when the result does not parse or carries no 32-byte key.
absl::StatusOr<Bytes> EnclaveSigningKeyFromEvidence(const boundary::v1::GetEvidenceResult& result);

// Checks `signed_receipt` against `enclave_signing_public_key` and returns the parsed receipt.
// PermissionDenied when the signature does not verify or the receipt names another key;
// InvalidArgument when the signed bytes are not a UsageReceipt.
absl::StatusOr<boundary::v1::UsageReceipt> VerifyUsageReceipt(
    ByteSpan enclave_signing_public_key, const boundary::v1::SignedUsageReceipt& signed_receipt);

class ReceiptLog {
 public:
  // Opens DATA_DIR/receipts/receipts.jsonl for appending, creating the folder (0700) and the
  // file (0600) when missing. Internal when they cannot be created.
  static absl::StatusOr<std::unique_ptr<ReceiptLog>> Open(const std::string& data_dir,
                                                          Clock* clock = Clock::Real());
  ~ReceiptLog();
  ReceiptLog(const ReceiptLog&) = delete;
  ReceiptLog& operator=(const ReceiptLog&) = delete;

  // Verifies the receipt against the enclave key of `worker` and appends one ReceiptLogLine.
  // A receipt that does not verify is refused (VerifyUsageReceipt's errors) and nothing is
  // written; Internal when the write fails. Lines are written whole, with one write(2) each.
  absl::StatusOr<boundary::v1::UsageReceipt> Append(
      const std::string& worker, ByteSpan enclave_signing_public_key,
      const boundary::v1::SignedUsageReceipt& signed_receipt) ABSL_LOCKS_EXCLUDED(mu_);

  // Flushes the file to stable storage (fdatasync).
  absl::Status Sync() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& path() const { return path_; }

 private:
  ReceiptLog(std::string path, int fd, Clock* clock)
      : path_(std::move(path)), fd_(fd), clock_(clock) {}

  const std::string path_;
  absl::Mutex mu_;
  const int fd_ ABSL_GUARDED_BY(mu_);
  Clock* const clock_;
};

struct ReceiptAudit {
  size_t receipts = 0;
  // The enclave keys that signed them, in the order they first appear in the log.
  std::vector<Bytes> keys;
  // The latest cumulative counters of each (tenant, model), summed over enclave keys.
  std::map<std::pair<std::string, std::string>, boundary::v1::UsageCounters> totals;
};

// Re-reads a receipt log and checks every line: it parses, its signature verifies under the key
// its receipt names, that key is one of `trusted_keys` (attested enclave keys; empty: any key),
// each key's sequence numbers run 1, 2, 3... with none repeated or missing, and for each (key,
// tenant, model), in sequence order, every cumulative count is the previous one plus the batch.
// DataLoss naming the line for the first failure; NotFound when the file cannot be read. What
// no check can see is receipts cut off after each key's last one.
absl::StatusOr<ReceiptAudit> AuditReceiptLog(const std::string& path,
                                             const std::vector<Bytes>& trusted_keys = {});

// The same checks over the lines of `in`; errors name `name` (the file) and the line.
absl::StatusOr<ReceiptAudit> AuditReceiptLines(std::istream& in, const std::string& name,
                                               const std::vector<Bytes>& trusted_keys = {});

}  // namespace cloister::host
