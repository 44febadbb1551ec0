// ReceiptSink: takes the usage receipts off the thread that reads a worker's replies. Submit
// copies a signed receipt into a queue and returns at once, so the scheduler answers the batch's
// callers without waiting for a signature check or a write; the sink's own thread verifies each
// receipt against its worker's key and appends it to the ReceiptLog, in submission order, then
// hands the verified receipt to `on_kept` (or the refusal to `on_refused`).
//
// Threading: Submit and Drain are thread-safe; the callbacks run on the sink's thread.
// Ownership: the sink borrows the log, which must outlive it; the destructor drains the queue
// (every submitted receipt is checked and written) and joins the thread.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/bytes.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "host/receipts/receipt_log.h"

namespace cloister::host {

class ReceiptSink {
 public:
  struct Callbacks {
    std::function<void(const boundary::v1::UsageReceipt&)> on_kept;
    // The worker's name and why its receipt was not written.
    std::function<void(const std::string&, const absl::Status&)> on_refused;
  };
  ReceiptSink(ReceiptLog* log, Callbacks callbacks);
  ~ReceiptSink();
  ReceiptSink(const ReceiptSink&) = delete;
  ReceiptSink& operator=(const ReceiptSink&) = delete;

  void Submit(std::string worker, Bytes enclave_signing_public_key,
              boundary::v1::SignedUsageReceipt signed_receipt) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every receipt submitted before the call has been handled.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Item {
    std::string worker;
    Bytes key;
    boundary::v1::SignedUsageReceipt receipt;
  };
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  ReceiptLog* const log_;
  const Callbacks callbacks_;
  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t handled_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace cloister::host
