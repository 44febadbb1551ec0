// The appliance's audit log (docs/OPERATIONS.md, "Audit log"): an append-only file of
// security-relevant events (tenant config changes, sessions opened and closed, models uploaded
// and deleted, evidence refreshed, policy reloads, refusals), one JSON object per line with a
// fixed key set (proto/cloister/ops/v1/ops.proto describes it). Each line carries the
// SHA-256 of the line before it, so an edited, inserted or removed line breaks the chain at
// that point; from time to time the host asks an enclave worker to sign the chain's head
// (boundary SignAuditCheckpointCall) and appends the signed checkpoint as an entry of its own,
// so that the host, which is untrusted, cannot rewrite the signed part later either.
// VerifyAuditLog re-reads a file and checks all of it (`cloister-audit verify`).
//
// What goes in: event names and detail keys are words chosen by the host code, and values are
// ids, status codes and counts the host already holds. The host never holds plaintext, and
// callers pass no payloads, model names or secrets; values are also limited in size.
//
// Threading: AuditLog is thread-safe (entries are appended whole, in order, under a mutex;
// Checkpoint() calls the signer without the mutex held). VerifyAuditLog is a pure function.
// Ownership: AuditLog owns its file descriptor.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/bytes.h"
#include "base/clock.h"
#include "cloister/boundary/v1/boundary.pb.h"

namespace cloister::host {

// Event names the appliance writes.
namespace audit_event {
inline constexpr char kDaemonStarted[] = "daemon_started";
inline constexpr char kDaemonStopped[] = "daemon_stopped";
inline constexpr char kTenantConfigChanged[] = "tenant_config_changed";
inline constexpr char kPolicyReloaded[] = "policy_reloaded";
inline constexpr char kReloadRefused[] = "reload_refused";
inline constexpr char kSessionOpened[] = "session_opened";
inline constexpr char kSessionClosed[] = "session_closed";
inline constexpr char kModelUploaded[] = "model_uploaded";
inline constexpr char kModelDeleted[] = "model_deleted";
inline constexpr char kEvidenceRefreshed[] = "evidence_refreshed";
inline constexpr char kRefused[] = "refused";
inline constexpr char kCheckpoint[] = "checkpoint";
}  // namespace audit_event

// A detail value longer than this is cut (with "...") so no caller can pour bulk data in.
inline constexpr size_t kMaxAuditValueSize = 256;

using AuditDetails = std::vector<std::pair<std::string, std::string>>;

class AuditLog {
 public:
  // Signs a checkpoint over `chain_digest` (SHA-256 of line `sequence`); in cloisterd it is a
  // SignAuditCheckpointCall to an enclave worker.
  using Signer = std::function<absl::StatusOr<boundary::v1::SignedAuditCheckpoint>(
      ByteSpan chain_digest, uint64_t sequence)>;

  // Opens `path` for appending (the folder is created 0700, the file 0600) and continues the
  // chain from its last line. DataLoss when the existing file does not end with a whole,
  // parseable entry (a torn write: `cloister-audit verify` says where); Internal when the file
  // cannot be created or read.
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(const std::string& path,
                                                        Clock* clock = Clock::Real());
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Appends one entry. Internal when the write fails (the chain head does not move then).
  // `event` and the detail keys must be lowercase words with '_' (checked: a broken caller).
  absl::Status Record(absl::string_view event, absl::string_view tenant_id,
                      const AuditDetails& details = {});

  // When entries were added since the last checkpoint, has `signer` sign the current head and
  // appends a "checkpoint" entry with the signature. Returns the signer's error (nothing is
  // written then) or the write's; OK and no entry when nothing is new.
  absl::Status Checkpoint(const Signer& signer);

  absl::Status Sync();  // fdatasync

  uint64_t entry_count() const;
  // The sequence number the latest checkpoint covers (0: none yet).
  uint64_t signed_count() const;
  const std::string& path() const { return path_; }

 private:
  AuditLog(std::string path, int fd, Clock* clock, uint64_t last_sequence, Bytes last_digest,
           uint64_t signed_sequence, bool head_is_checkpoint);
  absl::Status AppendLocked(absl::string_view event, absl::string_view tenant_id,
                            const AuditDetails& details) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  const int fd_;
  uint64_t last_sequence_ ABSL_GUARDED_BY(mu_);
  Bytes last_digest_ ABSL_GUARDED_BY(mu_);  // SHA-256 of the last line; 32 zeros before any
  uint64_t signed_sequence_ ABSL_GUARDED_BY(mu_);
  bool head_is_checkpoint_ ABSL_GUARDED_BY(mu_);  // the last line is a checkpoint entry
  absl::Mutex checkpoint_mu_;                     // one checkpoint at a time
};

struct AuditCheckpointInfo {
  uint64_t entry = 0;   // the checkpoint's own line
  uint64_t covers = 0;  // the line whose hash it signs
  Bytes signing_public_key;
  absl::Time signed_at;
};

struct AuditReport {
  uint64_t entries = 0;
  std::vector<AuditCheckpointInfo> checkpoints;
  uint64_t signed_entries = 0;  // entries covered by the last valid checkpoint
  // Keys that signed checkpoints (each once).
  std::vector<Bytes> signing_keys;
};

// Checks a whole audit log: every line is a JSON entry with exactly the fixed keys, sequence
// numbers run 1, 2, 3..., each `prev` is the SHA-256 of the line before, and every checkpoint's
// signature verifies, names the hash of the line it covers, and is made with one of
// `trusted_keys` (the enclave keys of attested evidence; empty: any key, and the caller must
// say the keys were not pinned). DataLoss naming the first bad entry ("entry 7: ..."); NotFound
// when the file cannot be read. Entries after the last checkpoint are chained but unsigned:
// AuditReport says how many are signed.
absl::StatusOr<AuditReport> VerifyAuditLog(const std::string& path,
                                           const std::vector<Bytes>& trusted_keys = {});
// The same over the file's contents.
absl::StatusOr<AuditReport> VerifyAuditText(absl::string_view text,
                                            const std::vector<Bytes>& trusted_keys = {});

// The enclave signing key named in an evidence file: a serialized attest.v1.EvidenceBundle or
// ChallengeResponse (the forms cloister-verify reads).
// InvalidArgument when it is neither or carries no 32-byte key.
absl::StatusOr<Bytes> SigningKeyFromEvidenceBytes(absl::string_view evidence);

}  // namespace cloister::host
