// FakeEnclaveClient keeps the EnclaveClient contract in both modes: call ids, exactly one
// answer per call, replies checked like a real client's, and a crashed or dead worker's calls
// answered UNAVAILABLE with reason WORKER_EXITED; streams too (frames in order, one `done`,
// cancellation). The bookkeeping is InProcessCalls, so this covers FunctionEnclaveClient's.
#include "host/testing/fake_enclave_client.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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

// What a stream delivered: its frames' chunk texts and its one end.
struct StreamLog {
  absl::Mutex mu;
  std::vector<std::string> frames ABSL_GUARDED_BY(mu);
  std::vector<EnclaveClient::Reply> ends ABSL_GUARDED_BY(mu);

  EnclaveClient::OnFrame OnFrame() {
    return [this](EnclaveToHost frame) {
      absl::MutexLock lock(&mu);
      EXPECT_TRUE(ends.empty()) << "a frame after done";
      frames.push_back(frame.generate().ciphertext());
    };
  }
  EnclaveClient::Done Done() {
    return [this](EnclaveClient::Reply reply) {
      absl::MutexLock lock(&mu);
      ends.push_back(std::move(reply));
    };
  }
  bool WaitForEnd(absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !ends.empty(); };
    return mu.AwaitWithTimeout(absl::Condition(&ended), timeout);
  }
  bool WaitForFrames(size_t count, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu);
    auto arrived = [this, count]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return frames.size() >= count; };
    return mu.AwaitWithTimeout(absl::Condition(&arrived), timeout);
  }
};

HostToEnclave GenerateCall(const std::string& session, const std::string& ciphertext) {
  HostToEnclave call;
  call.mutable_generate()->set_tenant_id("acme");
  call.mutable_generate()->mutable_request()->set_session_id(session);
  call.mutable_generate()->mutable_request()->set_request_id("r1");
  call.mutable_generate()->mutable_request()->set_ciphertext(ciphertext);
  return call;
}

EnclaveToHost Chunk(uint64_t chunk, bool final) {
  EnclaveToHost frame;
  frame.mutable_generate()->set_chunk(chunk);
  frame.mutable_generate()->set_final(final);
  frame.mutable_generate()->set_ciphertext(absl::StrCat("c", chunk));
  return frame;
}

// A session of acme on the automatic client.
std::string OpenAcmeSession(EnclaveClient& client) {
  HostToEnclave open;
  open.mutable_open_session()->set_tenant_id("acme");
  open.mutable_open_session()->set_sealed_hello("hello:acme");
  EnclaveClient::Reply reply = CallAndWait(client, open);
  EXPECT_TRUE(reply.ok()) << reply.status();
  return reply.ok() ? reply->open_session().session_id() : "";
}

TEST(FakeEnclaveClientTest, AutomaticModeStreamsChunksInOrder) {
  FakeEnclaveClient client(std::make_unique<FakeEnclave>());
  const std::string session = OpenAcmeSession(client);
  StreamLog log;
  EXPECT_NE(client.CallStream(GenerateCall(session, "a,b,c"), log.OnFrame(), log.Done()), 0u);
  ASSERT_TRUE(log.WaitForEnd());
  absl::MutexLock lock(&log.mu);
  EXPECT_EQ(log.frames, (std::vector<std::string>{"chunk:a", "chunk:b"}));
  ASSERT_EQ(log.ends.size(), 1u);
  ASSERT_TRUE(log.ends[0].ok()) << log.ends[0].status();
  EXPECT_TRUE(log.ends[0]->generate().final());
  EXPECT_EQ(log.ends[0]->generate().chunk(), 2u);
  EXPECT_EQ(log.ends[0]->generate().ciphertext(), "chunk:c");
  EXPECT_TRUE(log.ends[0]->generate().has_receipt());
  EXPECT_EQ(client.open_stream_count(), 0u);

  // A streaming call sent as a plain call is refused, without reaching the worker.
  EnclaveClient::Reply refused = CallAndWait(client, GenerateCall(session, "x"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FakeEnclaveClientTest, AutomaticModeCancelEndsAHeldStream) {
  FakeEnclaveClient client(std::make_unique<FakeEnclave>());
  const std::string session = OpenAcmeSession(client);
  StreamLog log;
  const uint64_t id = client.CallStream(GenerateCall(session, "a,hold"), log.OnFrame(), log.Done());
  ASSERT_TRUE(log.WaitForFrames(1));
  EXPECT_FALSE(log.WaitForEnd(absl::Milliseconds(50)));
  client.Cancel(id);
  ASSERT_TRUE(log.WaitForEnd());
  {
    absl::MutexLock lock(&log.mu);
    ASSERT_TRUE(log.ends[0].ok()) << log.ends[0].status();
    EXPECT_EQ(log.ends[0]->generate().ciphertext(), "chunk:cancelled");
    EXPECT_EQ(log.ends[0]->generate().chunk(), 1u);
  }
  std::vector<HostToEnclave> history = client.History();
  ASSERT_TRUE(history.back().has_cancel());
  EXPECT_EQ(history.back().cancel().target_call_id(), id);
  // A stream that has ended is not cancelled again.
  client.Cancel(id);
  EXPECT_EQ(client.History().size(), history.size());
}

TEST(FakeEnclaveClientTest, AutomaticModeCrashMidStreamEndsEveryStreamOnce) {
  FakeEnclaveClient client(std::make_unique<FakeEnclave>());
  const std::string session = OpenAcmeSession(client);
  StreamLog held, crashing;
  client.CallStream(GenerateCall(session, "x,hold"), held.OnFrame(), held.Done());
  client.CallStream(GenerateCall(session, "a,b,crash"), crashing.OnFrame(), crashing.Done());
  ASSERT_TRUE(crashing.WaitForEnd());
  ASSERT_TRUE(held.WaitForEnd());
  for (StreamLog* log : {&held, &crashing}) {
    absl::MutexLock lock(&log->mu);
    ASSERT_EQ(log->ends.size(), 1u);
    ExpectWorkerExited(log->ends[0]);
  }
  absl::MutexLock lock(&crashing.mu);
  EXPECT_EQ(crashing.frames, (std::vector<std::string>{"chunk:a", "chunk:b"}));
}

TEST(FakeEnclaveClientTest, ManualModeStreamFramesAndCancel) {
  auto client = std::make_unique<FakeEnclaveClient>();
  StreamLog log;
  const uint64_t id = client->CallStream(GenerateCall("s", "p"), log.OnFrame(), log.Done());
  ASSERT_TRUE(client->WaitForPending(1));
  EXPECT_TRUE(client->Complete(id, Chunk(0, false)));
  EXPECT_TRUE(client->Complete(id, Chunk(1, false)));
  EXPECT_EQ(client->open_stream_count(), 1u);
  EXPECT_TRUE(client->Pending().empty());  // open, no longer pending
  client->Cancel(id);
  std::vector<HostToEnclave> pending = client->Pending();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].cancel().target_call_id(), id);
  EnclaveToHost found;
  found.mutable_cancel()->set_found(true);
  EXPECT_TRUE(client->Complete(pending[0].call_id(), found));
  // A frame with an error status ends the stream with that error.
  EnclaveToHost refused;
  refused.mutable_status()->set_code(static_cast<int>(absl::StatusCode::kNotFound));
  refused.mutable_status()->set_message("unknown session");
  EXPECT_TRUE(client->Complete(id, refused));
  EXPECT_FALSE(client->Complete(id, Chunk(2, true)));  // ended already
  absl::MutexLock lock(&log.mu);
  EXPECT_EQ(log.frames, (std::vector<std::string>{"c0", "c1"}));
  ASSERT_EQ(log.ends.size(), 1u);
  EXPECT_EQ(log.ends[0].status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->open_stream_count(), 0u);
}

TEST(FakeEnclaveClientTest, ManualModeStreamEndsWithTheWorker) {
  auto client = std::make_unique<FakeEnclaveClient>();
  StreamLog log;
  const uint64_t id = client->CallStream(GenerateCall("s", "p"), log.OnFrame(), log.Done());
  ASSERT_TRUE(client->WaitForPending(1));
  EXPECT_TRUE(client->Complete(id, Chunk(0, false)));
  client.reset();  // the worker goes away mid-stream
  absl::MutexLock lock(&log.mu);
  EXPECT_EQ(log.frames.size(), 1u);
  ASSERT_EQ(log.ends.size(), 1u);
  ExpectWorkerExited(log.ends[0]);
}

}  // namespace
}  // namespace cloister::host::testing
