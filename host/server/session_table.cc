#include "host/server/session_table.h"

#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "proto/error_reason.h"

namespace cloister::host {

SessionTable::SessionTable(Clock* clock, absl::Duration ttl, int max_sessions_per_tenant)
    : clock_(clock),
      ttl_(ttl),
      max_sessions_per_tenant_(max_sessions_per_tenant),
      next_sweep_(clock->Now() + ttl) {}

void SessionTable::SweepLocked(absl::Time now) {
  if (now < next_sweep_) return;
  next_sweep_ = now + ttl_ / 4;
  RemoveExpiredLocked(now);
}

void SessionTable::RemoveExpiredLocked(absl::Time now) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second.expires_at <= now) {
      EraseExpiredLocked(it++);
    } else {
      ++it;
    }
  }
}

void SessionTable::EraseExpiredLocked(Sessions::iterator it) {
  if (on_expired_) on_expired_(it->second.tenant_id, it->second.worker);
  ReleaseTenantLocked(it->second.tenant_id);
  sessions_.erase(it);
}

void SessionTable::ReleaseTenantLocked(const std::string& tenant_id) {
  auto it = per_tenant_.find(tenant_id);
  if (it != per_tenant_.end() && --it->second == 0) per_tenant_.erase(it);
}

absl::Status SessionTable::CheckCapacity(absl::string_view tenant_id) {
  absl::MutexLock lock(&mu_);
  SweepLocked(clock_->Now());
  auto it = per_tenant_.find(tenant_id);
  if (it != per_tenant_.end() && it->second >= max_sessions_per_tenant_) {
    return proto::WithReason(
        absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant_id, " already has ",
                                                  max_sessions_per_tenant_,
                                                  " open sessions (the limit)")),
        api::v1::QUOTA_EXCEEDED);
  }
  return absl::OkStatus();
}

void SessionTable::Add(std::string session_id, std::string tenant_id, int worker) {
  absl::MutexLock lock(&mu_);
  absl::Time now = clock_->Now();
  SweepLocked(now);
  auto [it, inserted] = sessions_.try_emplace(std::move(session_id));
  if (!inserted) {
    // A reused id (the enclave derives ids from fresh HPKE contexts, so this is unexpected):
    // the newest owner wins.
    ReleaseTenantLocked(it->second.tenant_id);
  }
  ++per_tenant_[tenant_id];
  it->second = Entry{std::move(tenant_id), now + ttl_, worker};
}

absl::Status SessionTable::CheckAccess(absl::string_view session_id, absl::string_view tenant_id) {
  return WorkerFor(session_id, tenant_id).status();
}

absl::StatusOr<int> SessionTable::WorkerFor(absl::string_view session_id,
                                            absl::string_view tenant_id) {
  absl::MutexLock lock(&mu_);
  absl::Time now = clock_->Now();
  auto it = sessions_.find(session_id);
  if (it != sessions_.end() && it->second.expires_at <= now) {
    EraseExpiredLocked(it);
    it = sessions_.end();
  }
  // Another tenant's session gets the very answer an unknown one gets, so a refusal never tells
  // a tenant that some session id is live.
  if (it == sessions_.end() || it->second.tenant_id != tenant_id) {
    absl::Status unknown = absl::NotFoundError("unknown session; open a new session");
    if (it != sessions_.end()) unknown.SetPayload(kForeignSessionPayload, absl::Cord("1"));
    return unknown;
  }
  return it->second.worker;
}

std::map<std::string, int> SessionTable::CountsByTenant() {
  absl::MutexLock lock(&mu_);
  absl::Time now = clock_->Now();
  // A full sweep, not the periodic one: the counts are exact at this moment.
  RemoveExpiredLocked(now);
  return std::map<std::string, int>(per_tenant_.begin(), per_tenant_.end());
}

size_t SessionTable::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace cloister::host
