// ProcessEnclaveClient against a real child process: the fake worker in host/testing/, which
// speaks the boundary framing like cloister-enclave.
#include "host/enclave_client/process_enclave_client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
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

TEST(DefaultEnclaveBinaryPathTest, IsBesideTheRunningExecutable) {
  auto path = DefaultEnclaveBinaryPath();
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(fs::path(*path).filename(), "cloister-enclave");
  EXPECT_EQ(fs::path(*path).parent_path(), fs::read_symlink("/proc/self/exe").parent_path());
}

}  // namespace
}  // namespace cloister::host
