// FakeEnclaveClient keeps the EnclaveClient contract in both modes: call ids, exactly one
// answer per call, replies checked like a real client's, and a crashed or dead worker's calls
// answered UNAVAILABLE with reason WORKER_EXITED.
#include "host/testing/fake_enclave_client.h"

#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "proto/error_reason.h"

namespace cloister::host::testing {
namespace {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

HostToEnclave EvidenceCall() {
  HostToEnclave call;
  call.mutable_get_evidence()->set_nonce("n");
  return call;
}

HostToEnclave InferCall(const std::string& ciphertext) {
  HostToEnclave call;
  call.mutable_infer_batch()->set_tenant_id("acme");
  call.mutable_infer_batch()->add_items()->set_ciphertext(ciphertext);
  return call;
}

// Calls `client` and waits for its answer.
EnclaveClient::Reply CallAndWait(EnclaveClient& client, HostToEnclave call) {
  EnclaveClient::Reply reply = absl::UnknownError("not answered");
  absl::Notification answered;
  client.Call(std::move(call), [&](EnclaveClient::Reply r) {
    reply = std::move(r);
    answered.Notify();
  });
  answered.WaitForNotification();
  return reply;
}

void ExpectWorkerExited(const EnclaveClient::Reply& reply) {
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reply.status().message(), "enclave worker exited");
  EXPECT_EQ(proto::ReasonOf(reply.status()), api::v1::WORKER_EXITED);
}

TEST(FakeEnclaveClientTest, AutomaticModeAnswersInOrderAndDiesWithACrash) {
  FakeEnclaveClient client(std::make_unique<FakeEnclave>());
  EnclaveClient::Reply first = CallAndWait(client, EvidenceCall());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->call_id(), 1u);
  EXPECT_EQ(first->get_evidence().challenge_response(), "evidence:n");

  ExpectWorkerExited(CallAndWait(client, InferCall("crash")));
  // The worker is gone: every later call fails at once, without reaching it.
  ExpectWorkerExited(CallAndWait(client, EvidenceCall()));
  std::vector<HostToEnclave> history = client.History();
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].call_id(), 1u);
  EXPECT_EQ(history[1].call_id(), 2u);
  EXPECT_TRUE(history[1].has_infer_batch());
}

TEST(FakeEnclaveClientTest, ManualModeChecksRepliesAndAnswersOnce) {
  auto client = std::make_unique<FakeEnclaveClient>();
  std::vector<EnclaveClient::Reply> replies;
  auto keep = [&replies](EnclaveClient::Reply reply) { replies.push_back(std::move(reply)); };
  client->Call(EvidenceCall(), keep);
  client->Call(EvidenceCall(), keep);
  ASSERT_TRUE(client->WaitForPending(2));
  std::vector<HostToEnclave> pending = client->Pending();
  ASSERT_EQ(pending.size(), 2u);

  // A reply of the wrong kind reaches the caller as an error, as from a real worker.
  EnclaveToHost wrong;
  wrong.mutable_open_session()->set_session_id("s");
  EXPECT_TRUE(client->Complete(pending[0].call_id(), wrong));
  EXPECT_FALSE(client->Complete(pending[0].call_id(), wrong));  // answered already
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].status().code(), absl::StatusCode::kInternal) << replies[0].status();

  // A dead worker keeps what it holds and refuses what comes; the rest is answered when the
  // client goes away.
  client->SetDead();
  client->Call(EvidenceCall(), keep);
  ASSERT_EQ(replies.size(), 2u);
  ExpectWorkerExited(replies[1]);
  EXPECT_EQ(client->Pending().size(), 1u);
  client.reset();
  ASSERT_EQ(replies.size(), 3u);
  ExpectWorkerExited(replies[2]);
}

}  // namespace
}  // namespace cloister::host::testing
