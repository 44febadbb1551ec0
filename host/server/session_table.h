// SessionTable: which tenant opened which enclave session, so cloisterd can refuse, before
// queueing anything, a call that names another tenant's session or one it never saw. The
// enclave checks ownership again with the session keys; this table is admission only.
// Entries expire after `ttl` (a little longer than the enclave's one-hour session lifetime).
// Threading: thread-safe (one mutex; every operation is O(1) except the periodic sweep).
#pragma once

#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"

namespace cloister::host {

inline constexpr absl::string_view kForeignSessionPayload = "cloister/foreign-session";

class SessionTable {
 public:
  SessionTable(Clock* clock, absl::Duration ttl, int max_sessions_per_tenant);

  // RESOURCE_EXHAUSTED when the tenant already holds the maximum number of live sessions.
  absl::Status CheckCapacity(absl::string_view tenant_id);
  // Records a session that enclave worker `worker` opened for `tenant_id`.
  void Add(std::string session_id, std::string tenant_id, int worker = 0);
  // OK if the session is live and belongs to `tenant_id`; otherwise (unknown, expired or
  // another tenant's: the same answer, so nothing leaks) NOT_FOUND "unknown session; open a new
  // session".
  // The NOT_FOUND for another tenant's session carries the payload kForeignSessionPayload, for
  // the host's audit log only (it never reaches the caller).
  absl::Status CheckAccess(absl::string_view session_id, absl::string_view tenant_id);
  // As CheckAccess, and on success the worker that holds the session.
  absl::StatusOr<int> WorkerFor(absl::string_view session_id, absl::string_view tenant_id);

  size_t size() const;
  // Live sessions per tenant (expired ones are swept first).
  std::map<std::string, int> CountsByTenant();

  // Called for each session that expires, with the table's lock held (it must not call the
  // table). Set before the table is shared between threads.
  void SetOnExpiredForAudit(std::function<void(const std::string& tenant_id, int worker)> hook) {
    on_expired_ = std::move(hook);
  }

 private:
  struct Entry {
    std::string tenant_id;
    absl::Time expires_at;
    int worker = 0;
  };
  using Sessions = absl::flat_hash_map<std::string, Entry>;
  // Every ttl/4 at most: RemoveExpiredLocked.
  void SweepLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every session expired at `now`.
  void RemoveExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the expired session at `it` (telling the audit hook) and its tenant's count.
  void EraseExpiredLocked(Sessions::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseTenantLocked(const std::string& tenant_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const absl::Duration ttl_;
  const int max_sessions_per_tenant_;

  mutable absl::Mutex mu_;
  Sessions sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> per_tenant_ ABSL_GUARDED_BY(mu_);
  absl::Time next_sweep_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&, int)> on_expired_;
};

}  // namespace cloister::host
