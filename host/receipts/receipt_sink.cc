#include "host/receipts/receipt_sink.h"

#include <utility>

namespace cloister::host {

ReceiptSink::ReceiptSink(ReceiptLog* log, Callbacks callbacks)
    : log_(log), callbacks_(std::move(callbacks)), thread_([this] { Loop(); }) {}

ReceiptSink::~ReceiptSink() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void ReceiptSink::Submit(std::string worker, Bytes enclave_signing_public_key,
                         boundary::v1::SignedUsageReceipt signed_receipt) {
  absl::MutexLock lock(&mu_);
  queue_.push_back({std::move(worker), std::move(enclave_signing_public_key),
                    std::move(signed_receipt)});
  ++submitted_;
}

void ReceiptSink::Drain() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = submitted_;
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return handled_ >= target; };
  mu_.Await(absl::Condition(&done));
}

void ReceiptSink::Loop() {
  while (true) {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and everything submitted is handled
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::StatusOr<boundary::v1::UsageReceipt> kept =
        log_->Append(item.worker, item.key, item.receipt);
    if (kept.ok()) {
      if (callbacks_.on_kept) callbacks_.on_kept(*kept);
    } else if (callbacks_.on_refused) {
      callbacks_.on_refused(item.worker, kept.status());
    }
    absl::MutexLock lock(&mu_);
    ++handled_;
  }
}

}  // namespace cloister::host
