// cloisterd as a process: started the way the end-to-end tests and operators start it, with the
// fake enclave worker from host/testing/ in place of cloister-enclave.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/bytes.h"
#include "base/file.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "crypto/hash.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

extern char** environ;

namespace cloister::host {
namespace {

namespace fs = std::filesystem;
using api::v1::Cloister;

constexpr char kHandle[] = "0123456789abcdef0123456789abcdef";
constexpr char kOtherHandle[] = "fedcba9876543210fedcba9876543210";
// Every daemon started here takes free operator and metrics ports, so that tests (and other
// daemons on the machine) never collide on the default 127.0.0.1:7701.
constexpr char kOperatorOnFreePort[] = "operator:\n  listen: 127.0.0.1:0\n";

// One cloisterd child process with its stdout on a pipe and its stderr in a file.
class Daemon {
 public:
  Daemon(std::vector<std::string> args, const fs::path& stderr_path,
         std::vector<std::string> extra_env = {}) {
    int out[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0600);
    args.insert(args.begin(), CLOISTERD_BINARY);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings = std::move(extra_env);
    for (char** e = environ; *e != nullptr; ++e) env_strings.push_back(*e);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, CLOISTERD_BINARY, &actions, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    stdout_fd_ = out[0];
  }

  ~Daemon() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
  }

  // The first stdout line, or "" if none came within `timeout` (or stdout closed).
  std::string ReadLine(absl::Duration timeout = absl::Seconds(30)) {
    std::string line;
    absl::Time give_up = absl::Now() + timeout;
    while (absl::Now() < give_up) {
      pollfd pfd = {stdout_fd_, POLLIN, 0};
      int ready = ::poll(&pfd, 1, 50);
      if (ready <= 0) continue;
      char c;
      ssize_t n = ::read(stdout_fd_, &c, 1);
      if (n <= 0) return "";
      if (c == '\n') return line;
      line.push_back(c);
    }
    return "";
  }

  // Waits for the port from "cloisterd listening on 127.0.0.1:PORT"; 0 on failure.
  int WaitListening() {
    std::string line = ReadLine();
    constexpr absl::string_view kPrefix = "cloisterd listening on 127.0.0.1:";
    int port = 0;
    if (!absl::StartsWith(line, kPrefix) ||
        !absl::SimpleAtoi(absl::string_view(line).substr(kPrefix.size()), &port) || port <= 0) {
      ADD_FAILURE() << "unexpected first line: '" << line << "'";
      return 0;
    }
    return port;
  }

  void Signal(int signal_number) { ::kill(pid_, signal_number); }

  // The exit status (as from WEXITSTATUS), -1 if it did not exit in time or was signalled.
  int WaitExit(absl::Duration timeout = absl::Seconds(20)) {
    absl::Time give_up = absl::Now() + timeout;
    while (absl::Now() < give_up) {
      int status;
      pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  bool exited_ = false;
};

class CloisterdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cloister::testing::MakeTempDir("cloisterd");
    ASSERT_FALSE(dir_.empty());
    data_dir_ = dir_ / "data";
    stderr_path_ = dir_ / "stderr.log";
  }

  // With `extra_args` that name no --config, a config file with kOperatorOnFreePort alone;
  // tests that pass their own config put kOperatorOnFreePort in it (WriteConfig).
  std::unique_ptr<Daemon> StartDaemon(std::vector<std::string> extra_args = {},
                                      std::vector<std::string> extra_env = {}) {
    std::vector<std::string> args = {"--listen",         "127.0.0.1:0",      "--data-dir",
                                     data_dir_.string(), "--enclave-binary", FAKE_ENCLAVE_WORKER};
    if (std::find(extra_args.begin(), extra_args.end(), "--config") == extra_args.end()) {
      std::string config = (dir_ / "operator.yaml").string();
      EXPECT_TRUE(WriteFileAtomic(config, kOperatorOnFreePort).ok());
      args.insert(args.end(), {"--config", config});
    }
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    return std::make_unique<Daemon>(args, stderr_path_, std::move(extra_env));
  }

  // Writes DIR/cloisterd.yaml: `text`, then kOperatorOnFreePort. Returns its path.
  std::string WriteConfig(const std::string& text) {
    std::string config = (dir_ / "cloisterd.yaml").string();
    EXPECT_TRUE(WriteFileAtomic(config, text + kOperatorOnFreePort).ok());
    return config;
  }

  void Connect(int port, const std::string& tenant, const std::string& token) {
    tenant_ = tenant;
    token_ = token;
    stub_ = Cloister::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  std::string DemoToken() { return *ReadFile((data_dir_ / "demo.token").string()); }

  void Authorize(grpc::ClientContext& context) {
    context.AddMetadata("x-cloister-tenant", tenant_);
    context.AddMetadata("authorization", "Bearer " + token_);
  }

  std::string OpenSession() {
    grpc::ClientContext context;
    Authorize(context);
    api::v1::OpenSessionRequest request;
    request.set_hpke_enc(std::string(32, 'e'));
    request.set_sealed_hello("hello:" + tenant_);
    request.set_evidence_digest(std::string(32, 'd'));
    api::v1::OpenSessionResponse response;
    grpc::Status status = stub_->OpenSession(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.session_id();
  }

  grpc::Status Upload(const std::string& session, const std::string& handle,
                      const std::string& ciphertext) {
    grpc::ClientContext context;
    Authorize(context);
    api::v1::UploadModelResponse response;
    auto writer = stub_->UploadModel(&context, &response);
    api::v1::UploadModelRequest message;
    message.mutable_start()->set_session_id(session);
    message.mutable_start()->set_model_handle(handle);
    message.mutable_start()->set_ciphertext_size(ciphertext.size());
    writer->Write(message);
    message.Clear();
    message.set_data(ciphertext);
    writer->Write(message);
    message.Clear();
    auto* finish = message.mutable_finish();
    finish->set_session_id(session);
    finish->set_request_id("upload");
    finish->set_model_handle(handle);
    finish->set_ciphertext("load:model");
    writer->Write(message);
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status Infer(const std::string& session, const std::string& request_id,
                     const std::string& input, api::v1::SealedReply& reply) {
    grpc::ClientContext context;
    Authorize(context);
    api::v1::SealedRequest call;
    call.set_session_id(session);
    call.set_request_id(request_id);
    call.set_model_handle(kHandle);
    call.set_sequence(1);
    call.set_ciphertext(input);
    return stub_->Infer(&context, call, &reply);
  }

  std::string Stderr() { return ReadFile(stderr_path_.string()).value_or(""); }

  fs::path dir_;
  fs::path data_dir_;
  fs::path stderr_path_;
  std::string tenant_;
  std::string token_;
  std::unique_ptr<Cloister::Stub> stub_;
};

TEST_F(CloisterdTest, StartsServesAndStopsOnSigterm) {
  auto daemon = StartDaemon();
  int port = daemon->WaitListening();
  ASSERT_GT(port, 0) << Stderr();

  // The development tenant's token, the data dir and the worker's files exist.
  struct stat st;
  ASSERT_EQ(::stat(data_dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700);
  ASSERT_EQ(::stat((data_dir_ / "demo.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  std::string token = DemoToken();
  EXPECT_EQ(token.size(), 64u);
  EXPECT_TRUE(fs::exists(data_dir_ / "dev-policy.yaml"));

  Connect(port, "demo", "wrong");
  {
    grpc::ClientContext context;
    Authorize(context);
    api::v1::GetEvidenceRequest request;
    request.set_nonce(std::string(32, 'n'));
    api::v1::GetEvidenceResponse response;
    EXPECT_EQ(stub_->GetEvidence(&context, request, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  Connect(port, "demo", token);
  {
    grpc::ClientContext context;
    Authorize(context);
    api::v1::GetEvidenceRequest request;
    request.set_nonce(std::string(32, 'n'));
    api::v1::GetEvidenceResponse response;
    grpc::Status status = stub_->GetEvidence(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.challenge_response(), "evidence:" + std::string(32, 'n'));
  }
  std::string session = OpenSession();
  grpc::Status status = Upload(session, kHandle, "model ciphertext");
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(fs::exists(data_dir_ / "models" / "demo" / (std::string(kHandle) + ".blob")));
  api::v1::SealedReply reply;
  status = Infer(session, "r1", "input", reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply.ciphertext(), "out:input;batch=1");

  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->WaitExit(), 0) << Stderr();
  std::string log = Stderr();
  EXPECT_EQ(log.find(token), std::string::npos) << "the token reached the log";
  EXPECT_NE(log.find("\"component\":\"cloisterd\""), std::string::npos);
  EXPECT_NE(log.find("\"event\":\"stopped\""), std::string::npos);
  // Every line on stderr is one JSON object.
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
    EXPECT_EQ(line.front(), '{') << line;
    EXPECT_EQ(line.back(), '}') << line;
  }
}

// An operator address that is already taken (here held by the test) stops start-up: exit 1,
// nothing on stdout, and one plain line at the end naming the address and what to do; gRPC's
// own complaint about the port comes out before it as one of cloisterd's JSON lines.
TEST_F(CloisterdTest, TakenOperatorPortStopsStartupWithOneLine) {
  int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(holder, 1), 0);
  socklen_t size = sizeof(address);
  ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&address), &size), 0);
  const std::string taken = absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
  std::string config = (dir_ / "cloisterd.yaml").string();
  ASSERT_TRUE(WriteFileAtomic(config, absl::StrCat("operator:\n  listen: ", taken, "\n")).ok());

  auto daemon = StartDaemon({"--config", config});
  EXPECT_EQ(daemon->WaitExit(), 1);
  EXPECT_EQ(daemon->ReadLine(absl::Seconds(1)), "");
  ::close(holder);
  const std::string log = Stderr();
  std::vector<std::string> lines = absl::StrSplit(log, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(),
            absl::StrCat("cloisterd: cannot listen on operator address ", taken,
                         " (address in use or not available?); choose free operator.listen and "
                         "operator.metrics_listen addresses in the config file (port 0 picks a "
                         "free one)"));
  EXPECT_NE(log.find("\"event\":\"grpc\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"event\":\"startup_failed\""), std::string::npos) << log;
  lines.pop_back();
  for (const std::string& line : lines) {
    EXPECT_EQ(line.front(), '{') << line;
    EXPECT_EQ(line.back(), '}') << line;
  }
}

TEST_F(CloisterdTest, RestartReusesTheTokenAndReloadsStoredModels) {
  std::string token;
  {
    auto daemon = StartDaemon();
    int port = daemon->WaitListening();
    ASSERT_GT(port, 0) << Stderr();
    token = DemoToken();
    Connect(port, "demo", token);
    std::string session = OpenSession();
    ASSERT_TRUE(Upload(session, kHandle, "model one").ok());
    ASSERT_TRUE(Upload(session, kOtherHandle, "model two").ok());
    daemon->Signal(SIGINT);
    ASSERT_EQ(daemon->WaitExit(), 0);
  }
  // Damage the second model's ciphertext (same size): it must be skipped, not fatal.
  std::string other_blob = (data_dir_ / "models" / "demo" / (std::string(kOtherHandle) + ".blob"));
  ASSERT_TRUE(WriteFileAtomic(other_blob, "model tw0").ok());

  auto daemon = StartDaemon();
  int port = daemon->WaitListening();
  ASSERT_GT(port, 0) << Stderr();
  EXPECT_EQ(DemoToken(), token);
  Connect(port, "demo", token);
  std::string session = OpenSession();
  api::v1::SealedReply reply;
  grpc::Status status = Infer(session, "r1", "again", reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply.ciphertext(), "out:again;batch=1");
  std::string log = Stderr();
  EXPECT_NE(log.find("\"event\":\"model_reloaded\""), std::string::npos);
  EXPECT_NE(log.find("\"event\":\"model_reload_failed\""), std::string::npos);
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->WaitExit(), 0);
}

TEST_F(CloisterdTest, InFlightCallsFinishOnSigterm) {
  auto daemon = StartDaemon();
  int port = daemon->WaitListening();
  ASSERT_GT(port, 0) << Stderr();
  Connect(port, "demo", DemoToken());
  std::string session = OpenSession();
  ASSERT_TRUE(Upload(session, kHandle, "model").ok());
  grpc::Status slow_status;
  api::v1::SealedReply slow_reply;
  std::thread slow([&] { slow_status = Infer(session, "slow", "sleep:700", slow_reply); });
  absl::SleepFor(absl::Milliseconds(200));
  daemon->Signal(SIGTERM);
  slow.join();
  EXPECT_TRUE(slow_status.ok()) << slow_status.error_message();
  EXPECT_EQ(slow_reply.ciphertext(), "out:sleep:700;batch=1");
  EXPECT_EQ(daemon->WaitExit(), 0);
}

TEST_F(CloisterdTest, WorkerCrashIsRestartedAndItsSessionsMustReattest) {
  auto daemon = StartDaemon();
  int port = daemon->WaitListening();
  ASSERT_GT(port, 0) << Stderr();
  Connect(port, "demo", DemoToken());
  std::string session = OpenSession();
  ASSERT_TRUE(Upload(session, kHandle, "model").ok());
  api::v1::SealedReply reply;
  grpc::Status status = Infer(session, "r1", "crash", reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(status.error_message().find("exited"), std::string::npos) << status.error_message();
  EXPECT_NE(status.error_message().find("retry"), std::string::npos) << status.error_message();
  // UNAVAILABLE while the worker restarts; then the old session is refused: its keys died.
  grpc::Status again;
  absl::Time give_up = absl::Now() + absl::Seconds(20);
  do {
    api::v1::SealedReply ignored;
    again = Infer(session, "r2", "x", ignored);
    if (again.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < give_up);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << again.error_message();
  EXPECT_NE(again.error_message().find("re-attest"), std::string::npos) << again.error_message();
  // A new session works on the restarted worker, which got the stored model back.
  std::string fresh = OpenSession();
  api::v1::SealedReply fresh_reply;
  grpc::Status fresh_status = Infer(fresh, "r3", "x", fresh_reply);
  EXPECT_TRUE(fresh_status.ok()) << fresh_status.error_message();
  EXPECT_EQ(fresh_reply.ciphertext(), "out:x;batch=1");
  EXPECT_NE(Stderr().find("enclave_worker_died"), std::string::npos);
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->WaitExit(), 0) << Stderr();
}

TEST_F(CloisterdTest, StartsWhenTheWorkerIsNotReadyAtFirst) {
  auto daemon = StartDaemon({}, {"FAKE_ENCLAVE_FIRST_EVIDENCE_ERROR=1"});
  ASSERT_GT(daemon->WaitListening(), 0) << Stderr();
  EXPECT_NE(Stderr().find("waiting_for_enclave"), std::string::npos);
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->WaitExit(), 0);
}

TEST_F(CloisterdTest, ConfiguredTenantsReplaceTheDevelopmentTenant) {
  std::string config =
      WriteConfig(absl::StrCat("batching:\n  max_batch_size: 4\n"
                               "tenants:\n  - id: acme\n    token_sha256: ",
                               HexEncode(crypto::Sha256(AsBytes("s3cret"))), "\n"));
  auto daemon = StartDaemon({"--config", config});
  int port = daemon->WaitListening();
  ASSERT_GT(port, 0) << Stderr();
  EXPECT_FALSE(fs::exists(data_dir_ / "demo.token"));
  Connect(port, "acme", "s3cret");
  EXPECT_FALSE(OpenSession().empty());
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->WaitExit(), 0);
}

TEST_F(CloisterdTest, SeveralWorkersEachGetEveryModel) {
  std::string config = WriteConfig("workers: 2\nscheduler:\n  max_batch_size: 4\n");
  auto count = [](const std::string& log, const std::string& event) {
    int found = 0;
    for (size_t at = log.find(event); at != std::string::npos; at = log.find(event, at + 1)) {
      ++found;
    }
    return found;
  };
  {
    auto daemon = StartDaemon({"--config", config});
    int port = daemon->WaitListening();
    ASSERT_GT(port, 0) << Stderr();
    Connect(port, "demo", DemoToken());
    std::string session = OpenSession();
    ASSERT_TRUE(Upload(session, kHandle, "model one").ok());
    api::v1::SealedReply reply;
    grpc::Status status = Infer(session, "r1", "hello", reply);
    ASSERT_TRUE(status.ok()) << status.error_message();
    daemon->Signal(SIGTERM);
    ASSERT_EQ(daemon->WaitExit(), 0);
  }
  std::string log = Stderr();
  EXPECT_EQ(count(log, "\"event\":\"enclave_worker_started\""), 2) << log;
  EXPECT_EQ(count(log, "\"event\":\"model_fanout_failed\""), 0) << log;
  // A restart reloads the stored model into both workers.
  auto daemon = StartDaemon({"--config", config});
  int port = daemon->WaitListening();
  ASSERT_GT(port, 0) << Stderr();
  EXPECT_EQ(count(Stderr(), "\"event\":\"model_reloaded\""), 2) << Stderr();
  Connect(port, "demo", DemoToken());
  std::string session = OpenSession();
  api::v1::SealedReply reply;
  grpc::Status status = Infer(session, "r2", "again", reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply.ciphertext(), "out:again;batch=1");
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->WaitExit(), 0);
}

TEST_F(CloisterdTest, BadUsageAndBadConfigExitTwo) {
  {
    auto daemon = StartDaemon({"--bogus"});
    EXPECT_EQ(daemon->WaitExit(), 2);
    EXPECT_EQ(daemon->ReadLine(absl::Seconds(1)), "");
  }
  std::string log = Stderr();
  EXPECT_EQ(log.rfind("cloisterd: unknown flag --bogus (usage: cloisterd", 0), 0u) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1);

  std::string config = (dir_ / "bad.yaml").string();
  ASSERT_TRUE(WriteFileAtomic(config, "listen: 127.0.0.1:0\nlisten_port: 3\n").ok());
  fs::remove(stderr_path_);
  {
    auto daemon = StartDaemon({"--config", config});
    EXPECT_EQ(daemon->WaitExit(), 2);
  }
  EXPECT_EQ(Stderr(), absl::StrCat("cloisterd: ", config, ":2: unknown field 'listen_port'\n"));
  EXPECT_FALSE(fs::exists(data_dir_));  // nothing was created
}

TEST_F(CloisterdTest, MissingEnclaveBinaryExitsOne) {
  auto daemon = std::make_unique<Daemon>(
      std::vector<std::string>{"--listen", "127.0.0.1:0", "--data-dir", data_dir_.string(),
                               "--enclave-binary", (dir_ / "nope").string()},
      stderr_path_);
  EXPECT_EQ(daemon->WaitExit(), 1);
  EXPECT_NE(Stderr().find("enclave worker binary"), std::string::npos) << Stderr();
  EXPECT_FALSE(fs::exists(data_dir_));  // nothing was created
}

}  // namespace
}  // namespace cloister::host
