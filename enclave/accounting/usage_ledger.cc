#include "enclave/accounting/usage_ledger.h"

#include "absl/time/time.h"

namespace cloister::enclave {

void AddUsage(boundary::v1::UsageCounters& a, const boundary::v1::UsageCounters& b) {
  a.set_batches(a.batches() + b.batches());
  a.set_requests(a.requests() + b.requests());
  a.set_failed_requests(a.failed_requests() + b.failed_requests());
  a.set_input_size(a.input_size() + b.input_size());
  a.set_output_size(a.output_size() + b.output_size());
  a.set_execution_ns(a.execution_ns() + b.execution_ns());
  a.set_transfer_ns(a.transfer_ns() + b.transfer_ns());
  a.set_sequences(a.sequences() + b.sequences());
  a.set_prompt_tokens(a.prompt_tokens() + b.prompt_tokens());
  a.set_cached_tokens(a.cached_tokens() + b.cached_tokens());
  a.set_completion_tokens(a.completion_tokens() + b.completion_tokens());
  a.set_kv_block_ms(a.kv_block_ms() + b.kv_block_ms());
}

UsageLedger::UsageLedger(Bytes signing_public_key, std::string pcie_mode, Clock* clock)
    : signing_public_key_(std::move(signing_public_key)),
      pcie_mode_(std::move(pcie_mode)),
      clock_(clock) {}

boundary::v1::UsageReceipt UsageLedger::Record(const std::string& tenant_id,
                                               const std::string& model_handle,
                                               const boundary::v1::UsageCounters& batch) {
  boundary::v1::UsageReceipt receipt;
  receipt.set_enclave_signing_public_key(ToString(signing_public_key_));
  receipt.set_issued_at_unix_ns(absl::ToUnixNanos(clock_->Now()));
  receipt.set_tenant_id(tenant_id);
  receipt.set_model_handle(model_handle);
  receipt.set_pcie_mode(pcie_mode_);
  *receipt.mutable_batch() = batch;
  absl::MutexLock lock(&mu_);
  receipt.set_sequence(++last_sequence_);
  boundary::v1::UsageCounters& total = totals_[{tenant_id, model_handle}];
  AddUsage(total, batch);
  *receipt.mutable_cumulative() = total;
  return receipt;
}

boundary::v1::UsageCounters UsageLedger::Totals(const std::string& tenant_id,
                                                const std::string& model_handle) const {
  absl::MutexLock lock(&mu_);
  auto it = totals_.find({tenant_id, model_handle});
  return it == totals_.end() ? boundary::v1::UsageCounters() : it->second;
}

}  // namespace cloister::enclave
