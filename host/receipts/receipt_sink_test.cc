// ReceiptSink: receipts submitted from any thread are verified and written on the sink's own
// thread, in order; a forged one is refused through the callback and not written; the
// destructor writes whatever is still queued.
#include "host/receipts/receipt_sink.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "host/receipts/receipt_signer_for_test.h"
#include "tests/support/temp_dir.h"

namespace cloister::host {
namespace {

using boundary::v1::SignedUsageReceipt;
using Signer = testing::ReceiptSigner;

TEST(ReceiptSinkTest, WritesOnItsOwnThreadInOrderAndRefusesForgeries) {
  const std::string dir = cloister::testing::MakeTempDir("receipt-sink");
  ASSERT_FALSE(dir.empty());
  Signer enclave;
  auto log = ReceiptLog::Open(dir);
  ASSERT_TRUE(log.ok()) << log.status();
  std::vector<uint64_t> kept;
  std::vector<std::string> refused;
  std::atomic<std::thread::id> sink_thread;
  ReceiptSink::Callbacks callbacks;
  callbacks.on_kept = [&](const boundary::v1::UsageReceipt& receipt) {
    sink_thread = std::this_thread::get_id();
    kept.push_back(receipt.cumulative().requests());
  };
  callbacks.on_refused = [&](const std::string& worker, const absl::Status& status) {
    refused.push_back(worker + ": " + std::string(status.message()));
  };
  {
    ReceiptSink sink(log->get(), callbacks);
    for (int i = 1; i <= 3; ++i) {
      sink.Submit("worker0", enclave.public_key(), enclave.Next("alpha", i, 10 * i));
    }
    Signer stranger;  // signs with a key that is not worker1's
    sink.Submit("worker1", enclave.public_key(), stranger.Next("alpha", 1, 1));
    sink.Drain();
    ASSERT_EQ(refused.size(), 1u);
    EXPECT_EQ(refused[0].rfind("worker1: ", 0), 0u) << refused[0];
    EXPECT_NE(sink_thread.load(), std::this_thread::get_id());
    // Left in the queue at destruction: still written.
    sink.Submit("worker0", enclave.public_key(), enclave.Next("beta", 7, 70));
  }
  ASSERT_EQ(kept.size(), 4u);
  // Cumulative counters: 1, then 1+2, then 1+2+3 requests for alpha; then beta's 7.
  EXPECT_EQ(kept[0], 1u);
  EXPECT_EQ(kept[1], 3u);
  EXPECT_EQ(kept[2], 6u);
  EXPECT_EQ(kept[3], 7u);
  ASSERT_TRUE((*log)->Sync().ok());
  auto audit = AuditReceiptLog(dir + "/receipts/receipts.jsonl", {enclave.public_key()});
  ASSERT_TRUE(audit.ok()) << audit.status();
  EXPECT_EQ(audit->receipts, 4u);
}

}  // namespace
}  // namespace cloister::host
