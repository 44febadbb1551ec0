// Per-tenant usage accounting inside the enclave (DESIGN.md section 7): requests, bytes and
// executor time per (tenant, model handle), turned into one receipt per batch that carries the
// batch's own counters and the cumulative ones, under a sequence number that counts every
// receipt this enclave issued (docs/PROTOCOL.md section 7). The enclave signs the receipts; the
// ledger only counts.
//
// Threading: thread-safe. Receipts are numbered in the order Record() is called, and each one's
// cumulative counters are the previous receipt's (same tenant and model) plus its batch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/bytes.h"
#include "base/clock.h"
#include "cloister/boundary/v1/boundary.pb.h"

namespace cloister::enclave {

class UsageLedger {
 public:
  // `signing_public_key` and `pcie_mode` are copied into every receipt.
  UsageLedger(Bytes signing_public_key, std::string pcie_mode, Clock* clock);

  // Adds one batch's counters to (tenant, model) and returns its receipt, unsigned.
  boundary::v1::UsageReceipt Record(const std::string& tenant_id, const std::string& model_handle,
                                    const boundary::v1::UsageCounters& batch);

  // The cumulative counters of (tenant, model); all zero when nothing was recorded.
  boundary::v1::UsageCounters Totals(const std::string& tenant_id,
                                     const std::string& model_handle) const;

 private:
  const Bytes signing_public_key_;
  const std::string pcie_mode_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  uint64_t last_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::pair<std::string, std::string>, boundary::v1::UsageCounters> totals_
      ABSL_GUARDED_BY(mu_);
};

// a += b, field by field.
void AddUsage(boundary::v1::UsageCounters& a, const boundary::v1::UsageCounters& b);

}  // namespace cloister::enclave
