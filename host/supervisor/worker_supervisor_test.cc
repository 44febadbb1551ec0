// WorkerSupervisor with real worker processes (fake_enclave_worker, which speaks the boundary
// framing with FakeEnclave's plain-text "sealing"), killed with SIGKILL as a crash would.
#include "host/supervisor/worker_supervisor.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "gtest/gtest.h"
#include "host/storage/file_blob_store.h"
#include "proto/error_reason.h"
#include "tests/support/temp_dir.h"

namespace cloister::host {
namespace {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

constexpr char kTenant[] = "acme";
constexpr char kHandle[] = "0123456789abcdef0123456789abcdef";
constexpr absl::Duration kWait = absl::Seconds(20);

// What FakeEnclave accepts as the wrapped key of a model.
std::string WrappedKeyFor(const std::string& handle, const std::string& ciphertext) {
  return absl::StrCat("wrapped:", handle, ":", HexEncode(crypto::Sha256(AsBytes(ciphertext))));
}

class WorkerSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cloister::testing::MakeTempDir("supervisor-test");
    ASSERT_FALSE(dir_.empty());
    auto blobs = FileBlobStore::Open(dir_ + "/models");
    ASSERT_TRUE(blobs.ok()) << blobs.status();
    blobs_ = *std::move(blobs);
  }
  void TearDown() override {
    supervisor_.reset();
  }

  // Default options: `workers` fake workers, quick backoff, evidence recorded.
  WorkerSupervisorOptions Options(int workers) {
    WorkerSupervisorOptions options;
    options.worker_count = workers;
    options.blobs = blobs_.get();
    options.initial_backoff = absl::Milliseconds(10);
    options.max_backoff = absl::Milliseconds(50);
    options.ready_timeout = absl::Seconds(10);
    options.start_worker = [this](int index, std::function<void(const absl::Status&)> on_exit) {
      ++starts_;
      if (fail_starts_.load()) {
        return absl::StatusOr<std::unique_ptr<ProcessEnclaveClient>>(
            absl::InternalError("worker binary broken (test)"));
      }
      ProcessEnclaveOptions process;
      process.binary_path = FAKE_ENCLAVE_WORKER;
      process.data_dir = dir_;
      process.write_dev_policy = index == 0;
      process.stop_grace = absl::Seconds(2);
      process.on_exit = std::move(on_exit);
      return ProcessEnclaveClient::Start(std::move(process));
    };
    options.on_ready = [this](int worker, int generation,
                              const boundary::v1::GetEvidenceResult& evidence) {
      absl::MutexLock lock(&mu_);
      ready_events_.push_back({worker, generation, evidence.challenge_response()});
    };
    return options;
  }

  void StartSupervisor(WorkerSupervisorOptions options) {
    auto supervisor = WorkerSupervisor::Start(std::move(options));
    ASSERT_TRUE(supervisor.ok()) << supervisor.status();
    supervisor_ = *std::move(supervisor);
  }

  void StoreModel(const std::string& ciphertext) {
    auto upload = blobs_->BeginUpload(kTenant, kHandle);
    ASSERT_TRUE(upload.ok()) << upload.status();
    ASSERT_TRUE((*upload)->Append(ciphertext).ok());
    ASSERT_TRUE((*upload)->Commit(WrappedKeyFor(kHandle, ciphertext)).ok());
  }

  absl::StatusOr<EnclaveToHost> Send(int worker, HostToEnclave call) {
    return CallAndWait(*supervisor_->client(worker), std::move(call), kWait);
  }

  absl::StatusOr<std::string> OpenSession(int worker) {
    HostToEnclave call;
    call.mutable_open_session()->set_tenant_id(kTenant);
    call.mutable_open_session()->set_sealed_hello(absl::StrCat("hello:", kTenant));
    ASSIGN_OR_RETURN(EnclaveToHost reply, Send(worker, std::move(call)));
    return reply.open_session().session_id();
  }

  static HostToEnclave InferCall(const std::vector<std::string>& sessions,
                                 const std::string& ciphertext,
                                 const std::string& handle = kHandle) {
    HostToEnclave call;
    auto* batch = call.mutable_infer_batch();
    batch->set_tenant_id(kTenant);
    batch->set_model_handle(handle);
    int n = 0;
    for (const std::string& session : sessions) {
      auto* item = batch->add_items();
      item->set_session_id(session);
      item->set_request_id(absl::StrCat("r", n++));
      item->set_model_handle(handle);
      item->set_sequence(1);
      item->set_ciphertext(ciphertext);
    }
    return call;
  }

  static HostToEnclave ListCall(const std::string& session) {
    HostToEnclave call;
    call.mutable_list_models()->set_tenant_id(kTenant);
    call.mutable_list_models()->mutable_request()->set_session_id(session);
    call.mutable_list_models()->mutable_request()->set_request_id("list");
    return call;
  }

  // Kills worker `index`'s process and waits for restart number `restarts`.
  void KillAndWait(int index, int restarts) {
    pid_t pid = supervisor_->pid(index);
    ASSERT_GT(pid, 0);
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    ASSERT_TRUE(supervisor_->WaitForRestarts(index, restarts, kWait));
    EXPECT_NE(supervisor_->pid(index), pid);
  }

  struct ReadyEvent {
    int worker;
    int generation;
    std::string evidence;
  };
  std::vector<ReadyEvent> ReadyEvents() {
    absl::MutexLock lock(&mu_);
    return ready_events_;
  }

  std::string dir_;
  std::unique_ptr<FileBlobStore> blobs_;
  std::unique_ptr<WorkerSupervisor> supervisor_;
  std::atomic<int> starts_{0};
  std::atomic<bool> fail_starts_{false};
  absl::Mutex mu_;
  std::vector<ReadyEvent> ready_events_ ABSL_GUARDED_BY(mu_);
};

TEST_F(WorkerSupervisorTest, RestartsAKilledWorkerAndRefreshesItsEvidence) {
  StartSupervisor(Options(2));
  EXPECT_EQ(ReadyEvents().size(), 2u);
  KillAndWait(1, 1);
  EXPECT_EQ(supervisor_->restarts(0), 0);
  EXPECT_EQ(supervisor_->restarts(1), 1);
  std::vector<ReadyEvent> events = ReadyEvents();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[2].worker, 1);
  EXPECT_EQ(events[2].generation, 1);
  // Evidence over a fresh nonce, not the first incarnation's.
  EXPECT_TRUE(absl::StartsWith(events[2].evidence, "evidence:"));
  EXPECT_NE(events[2].evidence, events[1].evidence);
  // The same stable client now reaches the new process.
  HostToEnclave call;
  call.mutable_get_evidence()->set_nonce("n");
  auto reply = Send(1, std::move(call));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->get_evidence().challenge_response(), "evidence:n");
  // Several deaths in a row are each restarted.
  KillAndWait(1, 2);
  KillAndWait(0, 1);
  EXPECT_FALSE(supervisor_->gave_up());
}

TEST_F(WorkerSupervisorTest, CallsHeldByAKilledWorkerGetExactlyOneUnavailable) {
  StoreModel("model-bytes");
  StartSupervisor(Options(1));
  auto session = OpenSession(0);
  ASSERT_TRUE(session.ok()) << session.status();
  constexpr int kCalls = 6;
  std::atomic<int> answers{0};
  std::atomic<int> unavailable{0};
  std::vector<std::atomic<int>> per_call(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    // The fake worker answers calls in order; the first one sleeps, so all are held.
    supervisor_->client(0)->Call(InferCall({*session}, "sleep:10000"),
                                 [&, i](EnclaveClient::Reply reply) {
                                   ++per_call[i];
                                   if (absl::IsUnavailable(reply.status()) &&
                                       absl::StrContains(reply.status().message(), "retry")) {
                                     ++unavailable;
                                   }
                                   ++answers;
                                 });
  }
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(answers.load(), 0);
  KillAndWait(0, 1);
  // A late duplicate would show up here.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(answers.load(), kCalls);
  EXPECT_EQ(unavailable.load(), kCalls);
  for (int i = 0; i < kCalls; ++i) EXPECT_EQ(per_call[i].load(), 1) << "call " << i;
}

// A stream through the supervisor: its frames, its one UNAVAILABLE when the worker dies, and a
// Cancel() for it that never reaches the next incarnation (whose call ids start again).
TEST_F(WorkerSupervisorTest, StreamsEndWithTheirWorkerAndCancelStaysWithTheirIncarnation) {
  StartSupervisor(Options(1));
  struct Stream {
    absl::Mutex mu;
    std::vector<std::string> frames ABSL_GUARDED_BY(mu);
    std::vector<EnclaveClient::Reply> ends ABSL_GUARDED_BY(mu);
    bool WaitFor(size_t frame_count, size_t end_count, absl::Duration timeout = kWait) {
      absl::MutexLock lock(&mu);
      auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return frames.size() >= frame_count && ends.size() >= end_count;
      };
      return mu.AwaitWithTimeout(absl::Condition(&arrived), timeout);
    }
  };
  auto generate = [this](const std::string& session, const std::string& parts, Stream& stream) {
    HostToEnclave call;
    call.mutable_generate()->set_tenant_id(kTenant);
    call.mutable_generate()->mutable_request()->set_session_id(session);
    call.mutable_generate()->mutable_request()->set_request_id("g");
    call.mutable_generate()->mutable_request()->set_ciphertext(parts);
    return supervisor_->client(0)->CallStream(
        std::move(call),
        [&stream](EnclaveToHost frame) {
          absl::MutexLock lock(&stream.mu);
          stream.frames.push_back(frame.generate().ciphertext());
        },
        [&stream](EnclaveClient::Reply reply) {
          absl::MutexLock lock(&stream.mu);
          stream.ends.push_back(std::move(reply));
        });
  };
  auto old_session = OpenSession(0);
  ASSERT_TRUE(old_session.ok()) << old_session.status();
  Stream first;
  const uint64_t first_id = generate(*old_session, "a,hold", first);
  EXPECT_NE(first_id, 0u);
  ASSERT_TRUE(first.WaitFor(1, 0));
  KillAndWait(0, 1);
  ASSERT_TRUE(first.WaitFor(1, 1));
  {
    absl::MutexLock lock(&first.mu);
    ASSERT_EQ(first.ends.size(), 1u);
    EXPECT_TRUE(absl::IsUnavailable(first.ends[0].status())) << first.ends[0].status();
    EXPECT_TRUE(absl::StrContains(first.ends[0].status().message(), "restarting, retry"));
    EXPECT_EQ(proto::ReasonOf(first.ends[0].status()), api::v1::WORKER_EXITED);
  }
  // The dead incarnation's session is refused at once.
  Stream stale;
  EXPECT_EQ(generate(*old_session, "x", stale), 0u);
  ASSERT_TRUE(stale.WaitFor(0, 1, absl::Seconds(1)));
  {
    absl::MutexLock lock(&stale.mu);
    EXPECT_EQ(proto::ReasonOf(stale.ends[0].status()), api::v1::SESSION_LOST);
  }

  auto new_session = OpenSession(0);
  ASSERT_TRUE(new_session.ok()) << new_session.status();
  Stream second;
  const uint64_t second_id = generate(*new_session, "b,hold", second);
  ASSERT_TRUE(second.WaitFor(1, 0));
  EXPECT_NE(second_id, first_id);
  supervisor_->client(0)->Cancel(first_id);  // ended: nothing is sent
  EXPECT_FALSE(second.WaitFor(1, 1, absl::Milliseconds(200)));
  supervisor_->client(0)->Cancel(second_id);
  ASSERT_TRUE(second.WaitFor(1, 1));
  absl::MutexLock lock(&second.mu);
  ASSERT_TRUE(second.ends[0].ok()) << second.ends[0].status();
  EXPECT_EQ(second.ends[0]->generate().ciphertext(), "chunk:cancelled");
}

TEST_F(WorkerSupervisorTest, ReloadsStoredModelsIntoTheNewWorker) {
  StoreModel("model-bytes");
  StartSupervisor(Options(1));
  KillAndWait(0, 1);
  // The new process learned the model only from the blob store.
  auto session = OpenSession(0);
  ASSERT_TRUE(session.ok()) << session.status();
  auto reply = Send(0, InferCall({*session}, "x"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->infer_batch().replies_size(), 1);
  EXPECT_EQ(reply->infer_batch().replies(0).status().code(), 0)
      << reply->infer_batch().replies(0).status().message();
  EXPECT_EQ(reply->infer_batch().replies(0).ciphertext(), "out:x;batch=1");
}

TEST_F(WorkerSupervisorTest, RefusesSessionsOfTheDeadWorkerAskingToReattest) {
  StoreModel("model-bytes");
  StartSupervisor(Options(1));
  auto old_session = OpenSession(0);
  ASSERT_TRUE(old_session.ok()) << old_session.status();
  ASSERT_TRUE(Send(0, ListCall(*old_session)).ok());
  KillAndWait(0, 1);

  auto listed = Send(0, ListCall(*old_session));
  EXPECT_TRUE(absl::IsFailedPrecondition(listed.status())) << listed.status();
  EXPECT_TRUE(absl::StrContains(listed.status().message(), "re-attest")) << listed.status();
  EXPECT_EQ(proto::ReasonOf(listed.status()), api::v1::SESSION_LOST);

  // A new session works, and in a batch mixing both only the old one's item is refused. (The
  // fake numbers sessions from 1 again: the reused id counts as new once opened.)
  auto new_session = OpenSession(0);
  ASSERT_TRUE(new_session.ok()) << new_session.status();
  auto fresh = Send(0, ListCall(*new_session));
  EXPECT_TRUE(fresh.ok()) << fresh.status();
  auto third = OpenSession(0);  // not reused: "session-00000002" was never stale
  ASSERT_TRUE(third.ok());
  KillAndWait(0, 2);
  auto newest = OpenSession(0);
  ASSERT_TRUE(newest.ok());
  // Now *third (opened by incarnation 1) is stale and *newest (incarnation 2) is live.
  auto reply = Send(0, InferCall({*third, *newest}, "y"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->infer_batch().replies_size(), 2);
  EXPECT_EQ(reply->infer_batch().replies(0).status().code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(absl::StrContains(reply->infer_batch().replies(0).status().message(), "re-attest"));
  EXPECT_EQ(reply->infer_batch().replies(0).status().reason(), api::v1::SESSION_LOST);
  EXPECT_EQ(reply->infer_batch().replies(1).status().code(), 0);
}

TEST_F(WorkerSupervisorTest, AnswersUnavailableWhileRestarting) {
  auto options = Options(1);
  absl::Notification release;
  std::atomic<bool> hold{false};
  auto start = options.start_worker;
  options.start_worker = [&, start](int index, std::function<void(const absl::Status&)> on_exit) {
    if (hold.load()) release.WaitForNotification();
    return start(index, std::move(on_exit));
  };
  StartSupervisor(std::move(options));
  hold = true;
  pid_t pid = supervisor_->pid(0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  // Until the restart is let through, calls are refused at once, each exactly once.
  absl::Time give_up = absl::Now() + kWait;
  while (supervisor_->ready(0) && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_FALSE(supervisor_->ready(0));
  auto refused = Send(0, ListCall("session-00000009"));
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "restarting")) << refused.status();
  // GetEvidence waits for the new incarnation instead (a client attesting again needs its
  // evidence), and is answered exactly once.
  HostToEnclave call;
  call.mutable_get_evidence()->set_nonce("n");
  std::atomic<int> evidence_answers{0};
  absl::Notification evidence_answered;
  absl::StatusOr<EnclaveToHost> evidence = absl::UnknownError("not answered");
  supervisor_->client(0)->Call(call, [&](EnclaveClient::Reply reply) {
    evidence = std::move(reply);
    ++evidence_answers;
    evidence_answered.Notify();
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(evidence_answered.HasBeenNotified());
  release.Notify();
  ASSERT_TRUE(evidence_answered.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(evidence.ok()) << evidence.status();
  EXPECT_EQ(evidence->get_evidence().challenge_response(), "evidence:n");
  ASSERT_TRUE(supervisor_->WaitForRestarts(0, 1, kWait));
  EXPECT_TRUE(Send(0, call).ok());
  EXPECT_EQ(evidence_answers.load(), 1);
}

TEST_F(WorkerSupervisorTest, HoldsAModelUploadedDuringARestartForTheNewWorker) {
  auto options = Options(1);
  absl::Notification release;
  std::atomic<bool> hold{false};
  auto start = options.start_worker;
  options.start_worker = [&, start](int index, std::function<void(const absl::Status&)> on_exit) {
    if (hold.load()) release.WaitForNotification();
    return start(index, std::move(on_exit));
  };
  StartSupervisor(std::move(options));
  hold = true;
  ASSERT_EQ(::kill(supervisor_->pid(0), SIGKILL), 0);
  absl::Time give_up = absl::Now() + kWait;
  while (supervisor_->ready(0) && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_FALSE(supervisor_->ready(0));
  // Another worker loaded a model meanwhile and fans it out to this one (as an upload does).
  const std::string handle = "fedcba9876543210fedcba9876543210";
  HostToEnclave reload;
  reload.mutable_reload_model()->set_model_handle(handle);
  reload.mutable_reload_model()->set_model_ciphertext("late-model");
  reload.mutable_reload_model()->set_wrapped_model_key(WrappedKeyFor(handle, "late-model"));
  absl::Notification answered;
  absl::Status reload_status = absl::UnknownError("not answered");
  std::atomic<int> answers{0};
  supervisor_->client(0)->Call(std::move(reload), [&](EnclaveClient::Reply reply) {
    reload_status = reply.status();
    ++answers;
    answered.Notify();
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(answered.HasBeenNotified()) << reload_status;  // held, not refused
  release.Notify();
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(reload_status.ok()) << reload_status;
  ASSERT_TRUE(supervisor_->WaitForRestarts(0, 1, kWait));
  auto session = OpenSession(0);
  ASSERT_TRUE(session.ok()) << session.status();
  auto reply = Send(0, InferCall({*session}, "z", handle));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->infer_batch().replies(0).ciphertext(), "out:z;batch=1");
  EXPECT_EQ(answers.load(), 1);
}

TEST_F(WorkerSupervisorTest, GivesUpAfterRepeatedFailedRestarts) {
  auto options = Options(1);
  options.max_consecutive_failures = 3;
  absl::Notification gave_up;
  options.on_gave_up = [&](int worker, const absl::Status& why) {
    EXPECT_EQ(worker, 0);
    EXPECT_TRUE(absl::StrContains(why.message(), "3 times")) << why;
    gave_up.Notify();
  };
  StartSupervisor(std::move(options));
  fail_starts_ = true;
  ASSERT_EQ(::kill(supervisor_->pid(0), SIGKILL), 0);
  ASSERT_TRUE(gave_up.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(supervisor_->gave_up());
  EXPECT_EQ(starts_.load(), 1 + 3);
  HostToEnclave call;
  call.mutable_get_evidence()->set_nonce("n");
  EXPECT_TRUE(absl::IsUnavailable(Send(0, std::move(call)).status()));
}

TEST_F(WorkerSupervisorTest, NoRestartOnceShuttingDown) {
  StartSupervisor(Options(1));
  supervisor_->StopRestarting();
  ASSERT_EQ(::kill(supervisor_->pid(0), SIGKILL), 0);
  absl::Time give_up = absl::Now() + kWait;
  while (supervisor_->ready(0) && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_FALSE(supervisor_->WaitForRestarts(0, 1, absl::Milliseconds(500)));
  EXPECT_EQ(starts_.load(), 1);
  EXPECT_TRUE(absl::IsUnavailable(Send(0, ListCall("session-00000001")).status()));
}

TEST_F(WorkerSupervisorTest, FirstStartFailureIsReturned) {
  fail_starts_ = true;
  auto supervisor = WorkerSupervisor::Start(Options(2));
  EXPECT_TRUE(absl::IsInternal(supervisor.status())) << supervisor.status();
  EXPECT_EQ(starts_.load(), 1);
  WorkerSupervisorOptions no_workers = Options(1);
  no_workers.worker_count = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(WorkerSupervisor::Start(std::move(no_workers)).status()));
}

}  // namespace
}  // namespace cloister::host

namespace cloister::host {
namespace {

TEST(PublishedModelTest, ReadsAFileOrPacksAFolderAndChecksTheDigest) {
  const std::string dir = cloister::testing::MakeTempDir("published-model-test");
  ASSERT_FALSE(dir.empty());
  const std::string file = dir + "/model.onnx";
  ASSERT_TRUE(WriteFileAtomic(file, "model bytes", 0600).ok());
  const std::string digest = HexEncode(crypto::Sha256(AsBytes(std::string("model bytes"))));
  auto digest_of = PublishedModelDigest(file);
  ASSERT_TRUE(digest_of.ok()) << digest_of.status();
  EXPECT_EQ(*digest_of, digest);
  auto bytes = ReadPublishedModel({"m", file, digest}, 1 << 20);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, "model bytes");

  auto wrong = ReadPublishedModel({"m", file, std::string(64, '0')}, 1 << 20);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong.status().message(),
            absl::StrCat("published model m (", file, ") has digest ", digest,
                         " but the config expects ", std::string(64, '0')));
  auto too_large = ReadPublishedModel({"m", file, digest}, 4);
  EXPECT_FALSE(too_large.ok());
  EXPECT_TRUE(absl::StrContains(too_large.status().message(), "published model m ("))
      << too_large.status();

  // A folder is packed as a checkpoint: one without config.json is refused, naming it.
  std::filesystem::create_directories(dir + "/folder");
  auto not_checkpoint = ReadPublishedModel({"f", dir + "/folder", digest}, 1 << 20);
  EXPECT_EQ(not_checkpoint.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(not_checkpoint.status().message(), "published model f ("))
      << not_checkpoint.status();
  EXPECT_FALSE(PublishedModelDigest(dir + "/missing").ok());
}

TEST_F(WorkerSupervisorTest, AWrongPublishedDigestStopsTheFirstStart) {
  const std::string file = dir_ + "/published.onnx";
  ASSERT_TRUE(WriteFileAtomic(file, "published bytes", 0600).ok());
  WorkerSupervisorOptions options = Options(1);
  options.published.push_back({"pub", file, std::string(64, 'e')});
  auto supervisor = WorkerSupervisor::Start(std::move(options));
  ASSERT_FALSE(supervisor.ok());
  EXPECT_TRUE(absl::StrContains(supervisor.status().message(),
                                "but the config expects " + std::string(64, 'e')))
      << supervisor.status();
  // With the right digest it starts (the fake worker accepts the model).
  WorkerSupervisorOptions good = Options(1);
  good.published.push_back(
      {"pub", file, HexEncode(crypto::Sha256(AsBytes(std::string("published bytes"))))});
  StartSupervisor(std::move(good));
}

}  // namespace
}  // namespace cloister::host
