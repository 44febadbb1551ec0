// ProcessEnclaveClient against a real child process: the fake worker in host/testing/, which
// speaks the boundary framing like cloister-enclave.
#include "host/enclave_client/process_enclave_client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/file.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace cloister::host {
namespace {

namespace fs = std::filesystem;
using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

HostToEnclave EvidenceCall(const std::string& nonce) {
  HostToEnclave call;
  call.mutable_get_evidence()->set_nonce(nonce);
  return call;
}

class ProcessEnclaveClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_dir_ = cloister::testing::MakeTempDir("enclave-client");
    ASSERT_FALSE(data_dir_.empty());
  }
  void TearDown() override {
    ::unsetenv("FAKE_ENCLAVE_EXIT_AT_START");
    ::unsetenv("FAKE_ENCLAVE_IGNORE_SIGTERM");
    fs::remove_all(data_dir_);
  }

  ProcessEnclaveOptions Options() {
    ProcessEnclaveOptions options;
    options.binary_path = FAKE_ENCLAVE_WORKER;
    options.data_dir = data_dir_.string();
    return options;
  }

  fs::path data_dir_;
};

TEST_F(ProcessEnclaveClientTest, WorkerCommandLine) {
  ProcessEnclaveOptions options;
  options.binary_path = "/bin/cloister-enclave";
  options.data_dir = "/data";
  EXPECT_EQ(ProcessEnclaveClient::WorkerCommandLine(options),
            (std::vector<std::string>{"/bin/cloister-enclave", "--fd", "3", "--data-dir", "/data",
                                      "--tee", "sim", "--sim-dir", "/data/sim",
                                      "--dev-policy-out", "/data/dev-policy.yaml"}));
  // A second worker on the same data dir shares the roots but leaves the policy to the first.
  options.write_dev_policy = false;
  EXPECT_EQ(ProcessEnclaveClient::WorkerCommandLine(options),
            (std::vector<std::string>{"/bin/cloister-enclave", "--fd", "3", "--data-dir", "/data",
                                      "--tee", "sim", "--sim-dir", "/data/sim"}));
  // Real hardware: no simulated roots and no development policy.
  options.tee = "sev-snp";
  options.gpu = "nvidia-cc";
  EXPECT_EQ(ProcessEnclaveClient::WorkerCommandLine(options),
            (std::vector<std::string>{"/bin/cloister-enclave", "--fd", "3", "--data-dir", "/data",
                                      "--tee", "sev-snp", "--gpu", "nvidia-cc"}));
}

TEST_F(ProcessEnclaveClientTest, CallsReachTheWorkerAndComeBack) {
  // A descriptor without close-on-exec must still not reach the worker (it checks).
  int leaky = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(leaky, 0);
  auto client = ProcessEnclaveClient::Start(Options());
  ::close(leaky);
  ASSERT_TRUE(client.ok()) << client.status();
  auto reply = CallAndWait(**client, EvidenceCall("nonce-1"), absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->get_evidence().challenge_response(), "evidence:nonce-1");
  EXPECT_NE(reply->call_id(), 0u);
  // The worker got the data dir layout on its command line.
  EXPECT_TRUE(fs::exists(data_dir_ / "sim" / "ready"));
  EXPECT_TRUE(fs::exists(data_dir_ / "dev-policy.yaml"));
  EXPECT_TRUE((*client)->connected());
  (*client)->Stop();
  EXPECT_FALSE((*client)->connected());
  auto after = CallAndWait(**client, EvidenceCall("late"), absl::Seconds(1));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(after.status().message(), "enclave worker exited");
  EXPECT_EQ(proto::ReasonOf(after.status()), api::v1::WORKER_EXITED);
}

TEST_F(ProcessEnclaveClientTest, ConcurrentCallsAreMatchedById) {
  auto client = ProcessEnclaveClient::Start(Options());
  ASSERT_TRUE(client.ok()) << client.status();
  const int kThreads = 4;
  const int kCallsPerThread = 50;
  std::atomic<int> mismatches{0};
  std::atomic<int> completed{0};
  absl::Notification all_done;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kCallsPerThread; ++i) {
      std::string nonce = absl::StrCat("t", t, "-", i);
      (*client)->Call(EvidenceCall(nonce), [&, nonce](EnclaveClient::Reply reply) {
        if (!reply.ok() || reply->get_evidence().challenge_response() != "evidence:" + nonce) {
          ++mismatches;
        }
        if (++completed == kThreads * kCallsPerThread) all_done.Notify();
      });
    }
  }
  ASSERT_TRUE(all_done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_F(ProcessEnclaveClientTest, WorkerErrorStatusBecomesTheCallsError) {
  auto client = ProcessEnclaveClient::Start(Options());
  ASSERT_TRUE(client.ok());
  HostToEnclave reload;
  reload.mutable_reload_model()->set_model_handle("0123456789abcdef0123456789abcdef");
  reload.mutable_reload_model()->set_wrapped_model_key("not the key");
  reload.mutable_reload_model()->set_model_ciphertext("ciphertext");
  auto reply = CallAndWait(**client, reload, absl::Seconds(10));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(reply.status().message(), "wrapped model key does not open");
  HostToEnclave empty;
  EXPECT_EQ(CallAndWait(**client, empty, absl::Seconds(10)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ProcessEnclaveClientTest, WorkerCrashFailsOutstandingAndLaterCalls) {
  std::atomic<bool> exited{false};
  ProcessEnclaveOptions options = Options();
  options.on_exit = [&exited](const absl::Status&) { exited = true; };
  auto client = ProcessEnclaveClient::Start(std::move(options));
  ASSERT_TRUE(client.ok());
  HostToEnclave crash;
  auto* batch = crash.mutable_infer_batch();
  batch->set_tenant_id("acme");
  batch->add_items()->set_ciphertext("crash");
  auto reply = CallAndWait(**client, crash, absl::Seconds(10));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reply.status().message(), "enclave worker exited");
  for (int i = 0; i < 100 && !exited.load(); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(exited.load());
  EXPECT_FALSE((*client)->connected());
  auto later = CallAndWait(**client, EvidenceCall("n"), absl::Seconds(1));
  EXPECT_EQ(later.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ProcessEnclaveClientTest, WorkerThatExitsAtStart) {
  ::setenv("FAKE_ENCLAVE_EXIT_AT_START", "7", 1);
  auto client = ProcessEnclaveClient::Start(Options());
  ASSERT_TRUE(client.ok());
  auto reply = CallAndWait(**client, EvidenceCall("n"), absl::Seconds(10));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ProcessEnclaveClientTest, StopKillsAWorkerThatIgnoresSigterm) {
  ::setenv("FAKE_ENCLAVE_IGNORE_SIGTERM", "1", 1);
  ProcessEnclaveOptions options = Options();
  options.stop_grace = absl::Milliseconds(300);
  auto client = ProcessEnclaveClient::Start(std::move(options));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(CallAndWait(**client, EvidenceCall("n"), absl::Seconds(10)).ok());
  // A call the worker is still busy with when Stop() comes.
  HostToEnclave slow;
  auto* batch = slow.mutable_infer_batch();
  batch->set_tenant_id("acme");
  batch->add_items()->set_ciphertext("sleep:3000");
  absl::Notification answered;
  absl::Status slow_status;
  (*client)->Call(slow, [&](EnclaveClient::Reply reply) {
    slow_status = reply.status();
    answered.Notify();
  });
  absl::SleepFor(absl::Milliseconds(50));
  absl::Time start = absl::Now();
  (*client)->Stop();
  absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(answered.HasBeenNotified());
  EXPECT_EQ(slow_status.code(), absl::StatusCode::kUnavailable);
  // The worker kept sleeping (SIGTERM ignored) until SIGKILL after the grace period.
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_NE(::kill((*client)->pid(), 0), 0);  // reaped: no such process
}

TEST_F(ProcessEnclaveClientTest, MissingOrBrokenBinary) {
  ProcessEnclaveOptions options = Options();
  options.binary_path = (data_dir_ / "does-not-exist").string();
  EXPECT_EQ(ProcessEnclaveClient::Start(options).status().code(), absl::StatusCode::kNotFound);

  std::string not_executable = (data_dir_ / "plain-file").string();
  ASSERT_TRUE(WriteFileAtomic(not_executable, "data", 0600).ok());
  options.binary_path = not_executable;
  EXPECT_EQ(ProcessEnclaveClient::Start(options).status().code(), absl::StatusCode::kNotFound);

  std::string garbage = (data_dir_ / "garbage-binary").string();
  ASSERT_TRUE(WriteFileAtomic(garbage,
                              "\x7f"
                              "ELF garbage",
                              0700)
                  .ok());
  options.binary_path = garbage;
  auto started = ProcessEnclaveClient::Start(options);
  EXPECT_EQ(started.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(started.status().message().find("cannot start enclave worker"), std::string::npos);
}

// What a stream delivered: its frames and its one end, in the order the reader thread saw them.
struct StreamLog {
  absl::Mutex mu;
  std::vector<EnclaveToHost> frames ABSL_GUARDED_BY(mu);
  std::vector<EnclaveClient::Reply> ends ABSL_GUARDED_BY(mu);
  int frames_after_end ABSL_GUARDED_BY(mu) = 0;

  EnclaveClient::OnFrame OnFrame() {
    return [this](EnclaveToHost frame) {
      absl::MutexLock lock(&mu);
      if (!ends.empty()) ++frames_after_end;
      frames.push_back(std::move(frame));
    };
  }
  EnclaveClient::Done Done() {
    return [this](EnclaveClient::Reply reply) {
      absl::MutexLock lock(&mu);
      ends.push_back(std::move(reply));
    };
  }
  bool WaitFor(size_t frame_count, size_t end_count, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu);
    auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return frames.size() >= frame_count && ends.size() >= end_count;
    };
    return mu.AwaitWithTimeout(absl::Condition(&arrived), timeout);
  }
};

class ProcessEnclaveStreamTest : public ProcessEnclaveClientTest {
 protected:
  void SetUp() override {
    ProcessEnclaveClientTest::SetUp();
    ProcessEnclaveOptions options = Options();
    options.on_exit = [this](const absl::Status&) { exits_.fetch_add(1); };
    auto client = ProcessEnclaveClient::Start(std::move(options));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    HostToEnclave open;
    open.mutable_open_session()->set_tenant_id("acme");
    open.mutable_open_session()->set_sealed_hello("hello:acme");
    auto opened = CallAndWait(*client_, open, absl::Seconds(10));
    ASSERT_TRUE(opened.ok()) << opened.status();
    session_ = opened->open_session().session_id();
  }
  void TearDown() override {
    client_.reset();
    ProcessEnclaveClientTest::TearDown();
  }

  HostToEnclave Generate(const std::string& parts, const std::string& request_id = "r1") {
    HostToEnclave call;
    call.mutable_generate()->set_tenant_id("acme");
    boundary::v1::ForwardedRequest* request = call.mutable_generate()->mutable_request();
    request->set_session_id(session_);
    request->set_request_id(request_id);
    request->set_model_handle("0123456789abcdef0123456789abcdef");
    request->set_ciphertext(parts);
    return call;
  }

  std::atomic<int> exits_{0};
  std::unique_ptr<ProcessEnclaveClient> client_;
  std::string session_;
};

TEST_F(ProcessEnclaveStreamTest, FramesArriveInOrderAndDoneRunsOnceWithTheFinalFrame) {
  StreamLog log;
  const uint64_t id = client_->CallStream(Generate("a,b,c"), log.OnFrame(), log.Done());
  EXPECT_NE(id, 0u);
  ASSERT_TRUE(log.WaitFor(2, 1));
  // Another call on the same connection still works after the stream (the reader kept going).
  ASSERT_TRUE(CallAndWait(*client_, EvidenceCall("after"), absl::Seconds(10)).ok());
  absl::MutexLock lock(&log.mu);
  ASSERT_EQ(log.frames.size(), 2u);
  for (uint64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(log.frames[i].call_id(), id);
    EXPECT_EQ(log.frames[i].generate().chunk(), i);
    EXPECT_FALSE(log.frames[i].generate().final());
    EXPECT_EQ(log.frames[i].generate().request_id(), "r1");
  }
  EXPECT_EQ(log.frames[0].generate().ciphertext(), "chunk:a");
  EXPECT_EQ(log.frames[1].generate().ciphertext(), "chunk:b");
  // Sequence numbers are the session's: they rise.
  EXPECT_LT(log.frames[0].generate().sequence(), log.frames[1].generate().sequence());
  ASSERT_EQ(log.ends.size(), 1u);
  ASSERT_TRUE(log.ends[0].ok()) << log.ends[0].status();
  EXPECT_EQ(log.ends[0]->call_id(), id);
  EXPECT_TRUE(log.ends[0]->generate().final());
  EXPECT_EQ(log.ends[0]->generate().chunk(), 2u);
  EXPECT_EQ(log.ends[0]->generate().ciphertext(), "chunk:c");
  EXPECT_TRUE(log.ends[0]->generate().has_receipt());
  EXPECT_EQ(log.frames_after_end, 0);
}

TEST_F(ProcessEnclaveStreamTest, StreamsInterleaveAndAreMatchedById) {
  StreamLog held, quick;
  const uint64_t held_id =
      client_->CallStream(Generate("x,hold", "r-held"), held.OnFrame(), held.Done());
  client_->CallStream(Generate("a,b", "r-quick"), quick.OnFrame(), quick.Done());
  ASSERT_TRUE(quick.WaitFor(1, 1));
  ASSERT_TRUE(held.WaitFor(1, 0));
  client_->Cancel(held_id);
  ASSERT_TRUE(held.WaitFor(1, 1));
  absl::MutexLock held_lock(&held.mu);
  absl::MutexLock quick_lock(&quick.mu);
  ASSERT_TRUE(quick.ends[0].ok()) << quick.ends[0].status();
  EXPECT_EQ(quick.ends[0]->generate().request_id(), "r-quick");
  ASSERT_EQ(held.frames.size(), 1u);
  EXPECT_EQ(held.frames[0].generate().request_id(), "r-held");
  ASSERT_EQ(held.ends.size(), 1u);
  ASSERT_TRUE(held.ends[0].ok()) << held.ends[0].status();
  EXPECT_EQ(held.ends[0]->generate().ciphertext(), "chunk:cancelled");
  EXPECT_EQ(held.ends[0]->generate().chunk(), 1u);
}

// The fake worker keeps a "hold" stream open until a CancelCall names it: the stream ending is
// the proof that Cancel() sent one with the stream's call id.
TEST_F(ProcessEnclaveStreamTest, CancelSendsACancelCallForTheStream) {
  StreamLog log;
  const uint64_t id = client_->CallStream(Generate("a,hold"), log.OnFrame(), log.Done());
  ASSERT_TRUE(log.WaitFor(1, 0));
  EXPECT_FALSE(log.WaitFor(1, 1, absl::Milliseconds(100)));  // still open
  client_->Cancel(id);
  ASSERT_TRUE(log.WaitFor(1, 1));
  {
    absl::MutexLock lock(&log.mu);
    ASSERT_TRUE(log.ends[0].ok()) << log.ends[0].status();
    EXPECT_EQ(log.ends[0]->generate().ciphertext(), "chunk:cancelled");
  }
  // Cancelling an ended stream, or nothing, does nothing; the connection is still good.
  client_->Cancel(id);
  client_->Cancel(0);
  ASSERT_TRUE(CallAndWait(*client_, EvidenceCall("n"), absl::Seconds(10)).ok());
  absl::MutexLock lock(&log.mu);
  EXPECT_EQ(log.ends.size(), 1u);
}

TEST_F(ProcessEnclaveStreamTest, WorkerDeathMidStreamEndsEveryOpenStreamOnceUnavailable) {
  StreamLog held, crashing;
  client_->CallStream(Generate("x,hold", "r-held"), held.OnFrame(), held.Done());
  ASSERT_TRUE(held.WaitFor(1, 0));
  client_->CallStream(Generate("a,b,crash", "r-crash"), crashing.OnFrame(), crashing.Done());
  ASSERT_TRUE(crashing.WaitFor(2, 1));
  ASSERT_TRUE(held.WaitFor(1, 1));
  for (int i = 0; i < 100 && exits_.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(exits_.load(), 1);
  for (StreamLog* log : {&held, &crashing}) {
    absl::MutexLock lock(&log->mu);
    ASSERT_EQ(log->ends.size(), 1u);
    EXPECT_EQ(log->ends[0].status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(log->ends[0].status().message(), "enclave worker exited");
    EXPECT_EQ(proto::ReasonOf(log->ends[0].status()), api::v1::WORKER_EXITED);
    EXPECT_EQ(log->frames_after_end, 0);
  }
  absl::MutexLock lock(&crashing.mu);
  EXPECT_EQ(crashing.frames.size(), 2u);
  // A stream sent to the dead worker is refused at once.
  StreamLog late;
  EXPECT_EQ(client_->CallStream(Generate("a"), late.OnFrame(), late.Done()), 0u);
  ASSERT_TRUE(late.WaitFor(0, 1, absl::Seconds(1)));
}

TEST_F(ProcessEnclaveStreamTest, RefusedRequestAndMisuse) {
  // A request that does not open (unknown session) ends with the frame's boundary status.
  StreamLog log;
  HostToEnclave unknown = Generate("a");
  unknown.mutable_generate()->mutable_request()->set_session_id("no-such-session");
  client_->CallStream(std::move(unknown), log.OnFrame(), log.Done());
  ASSERT_TRUE(log.WaitFor(0, 1));
  {
    absl::MutexLock lock(&log.mu);
    EXPECT_TRUE(log.frames.empty());
    EXPECT_EQ(log.ends[0].status().code(), absl::StatusCode::kNotFound);
  }
  // A GenerateCall is answered by a stream: Call() refuses it without sending it.
  auto reply = CallAndWait(*client_, Generate("a"), absl::Seconds(10));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
  // A call of another kind through CallStream: one answer, no frames.
  StreamLog unary;
  client_->CallStream(EvidenceCall("u"), unary.OnFrame(), unary.Done());
  ASSERT_TRUE(unary.WaitFor(0, 1));
  absl::MutexLock lock(&unary.mu);
  EXPECT_TRUE(unary.frames.empty());
  ASSERT_TRUE(unary.ends[0].ok());
  EXPECT_EQ(unary.ends[0]->get_evidence().challenge_response(), "evidence:u");
}

TEST(DefaultEnclaveBinaryPathTest, IsBesideTheRunningExecutable) {
  auto path = DefaultEnclaveBinaryPath();
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(fs::path(*path).filename(), "cloister-enclave");
  EXPECT_EQ(fs::path(*path).parent_path(), fs::read_symlink("/proc/self/exe").parent_path());
}

}  // namespace
}  // namespace cloister::host
