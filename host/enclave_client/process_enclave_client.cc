#include "host/enclave_client/process_enclave_client.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "proto/frame.h"

namespace cloister::host {
namespace {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;


// Runs in the forked child before exec: only async-signal-safe calls from here on.
[[noreturn]] void ExecWorker(char* const* argv, int socket_fd, int devnull_fd, int error_fd,
                             pid_t parent_pid) {
  // Move the descriptors we keep above the range we are about to fill.
  int sock = ::fcntl(socket_fd, F_DUPFD, 10);  // F_DUPFD: the copy is not close-on-exec
  int err = ::fcntl(error_fd, F_DUPFD_CLOEXEC, 10);
  if (sock < 0 || err < 0) ::_exit(126);
  if (::dup2(devnull_fd, 0) < 0 || ::dup2(2, 1) < 0 || ::dup2(sock, 3) < 0 ||
      ::dup3(err, 4, O_CLOEXEC) < 0) {
    ::_exit(126);
  }
  // Close everything else (the worker must inherit only fds 0-3).
  if (::syscall(SYS_close_range, 5u, ~0u, 0u) != 0) {
    long max_fd = ::sysconf(_SC_OPEN_MAX);
    if (max_fd < 0 || max_fd > 65536) max_fd = 65536;
    for (int fd = 5; fd < max_fd; ++fd) ::close(fd);
  }
  // cloisterd blocks SIGTERM/SIGINT for sigwait and ignores SIGPIPE; the worker starts clean.
  sigset_t empty;
  ::sigemptyset(&empty);
  ::sigprocmask(SIG_SETMASK, &empty, nullptr);
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, nullptr);
  // The worker must not outlive cloisterd.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent_pid) ::_exit(1);
  ::execv(argv[0], argv);
  int exec_errno = errno;
  ssize_t unused = ::write(4, &exec_errno, sizeof(exec_errno));
  (void)unused;
  ::_exit(127);
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exit code ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return absl::StrCat("signal ", WTERMSIG(wait_status));
  return "unknown";
}

}  // namespace

std::vector<std::string> ProcessEnclaveClient::WorkerCommandLine(
    const ProcessEnclaveOptions& options) {
  std::vector<std::string> args = {options.binary_path, "--fd",  "3",        "--data-dir",
                                   options.data_dir,    "--tee", options.tee};
  if (!options.gpu.empty()) args.insert(args.end(), {"--gpu", options.gpu});
  if (options.tee == "sim") {
    args.insert(args.end(), {"--sim-dir", absl::StrCat(options.data_dir, "/sim")});
    if (options.write_dev_policy) {
      args.insert(args.end(),
                  {"--dev-policy-out", absl::StrCat(options.data_dir, "/dev-policy.yaml")});
    }
  }
  args.insert(args.end(), options.worker_arguments.begin(), options.worker_arguments.end());
  return args;
}

absl::StatusOr<std::unique_ptr<ProcessEnclaveClient>> ProcessEnclaveClient::Start(
    ProcessEnclaveOptions options) {
  if (::access(options.binary_path.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("enclave worker binary ", options.binary_path,
                     " is missing or not executable: ", std::strerror(errno)));
  }
  std::vector<std::string> args = WorkerCommandLine(options);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  int sockets[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0) {
    return absl::InternalError(absl::StrCat("socketpair failed: ", std::strerror(errno)));
  }
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    int err = errno;
    ::close(sockets[0]);
    ::close(sockets[1]);
    return absl::InternalError(absl::StrCat("pipe2 failed: ", std::strerror(err)));
  }
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto close_all = [&] {
    ::close(sockets[1]);
    ::close(exec_pipe[0]);
    ::close(exec_pipe[1]);
    if (devnull >= 0) ::close(devnull);
  };
  if (devnull < 0) {
    int err = errno;
    close_all();
    ::close(sockets[0]);
    return absl::InternalError(absl::StrCat("cannot open /dev/null: ", std::strerror(err)));
  }

  pid_t parent_pid = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    close_all();
    ::close(sockets[0]);
    return absl::InternalError(absl::StrCat("fork failed: ", std::strerror(err)));
  }
  if (pid == 0) ExecWorker(argv.data(), sockets[1], devnull, exec_pipe[1], parent_pid);

  ::close(sockets[1]);
  ::close(exec_pipe[1]);
  ::close(devnull);
  // The pipe closes on a successful exec; otherwise the child writes exec's errno.
  int exec_errno = 0;
  ssize_t got;
  do {
    got = ::read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (got < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  if (got != 0) {
    ::close(sockets[0]);
    int wait_status = 0;
    ::waitpid(pid, &wait_status, 0);
    std::string why =
        got == sizeof(exec_errno) ? std::strerror(exec_errno) : DescribeWaitStatus(wait_status);
    return absl::InternalError(
        absl::StrCat("cannot start enclave worker ", options.binary_path, ": ", why));
  }
  Log(LogLevel::kInfo, "enclave_worker_started",
      {{"pid", static_cast<long long>(pid)}, {"binary", options.binary_path}});
  return std::unique_ptr<ProcessEnclaveClient>(
      new ProcessEnclaveClient(std::move(options), pid, sockets[0]));
}

ProcessEnclaveClient::ProcessEnclaveClient(ProcessEnclaveOptions options, pid_t pid, int socket_fd)
    : options_(std::move(options)), pid_(pid), socket_fd_(socket_fd) {
  reader_ = std::thread([this] { ReaderLoop(); });
  writer_ = std::thread([this] { WriterLoop(); });
}

ProcessEnclaveClient::~ProcessEnclaveClient() { Stop(); }

void ProcessEnclaveClient::Call(HostToEnclave call, Done done) {
  if (IsStreamingCall(call.call_case())) {
    done(StreamingCallError());
    return;
  }
  Send(std::move(call), nullptr, std::move(done));
}

uint64_t ProcessEnclaveClient::CallStream(HostToEnclave call, OnFrame on_frame, Done done) {
  return Send(std::move(call), std::make_shared<OnFrame>(std::move(on_frame)), std::move(done));
}

void ProcessEnclaveClient::Cancel(uint64_t stream_id) {
  {
    absl::MutexLock lock(&mu_);
    if (stream_id == 0 || !pending_.contains(stream_id)) return;
  }
  Send(CancelCallFor(stream_id), nullptr, [](Reply) {});
}

uint64_t ProcessEnclaveClient::Send(HostToEnclave call, std::shared_ptr<OnFrame> on_frame,
                                    Done done) {
  HostToEnclave::CallCase call_case = call.call_case();
  if (call_case == HostToEnclave::CALL_NOT_SET) {
    done(absl::InvalidArgumentError("enclave call without a call kind"));
    return 0;
  }
  uint64_t call_id;
  {
    absl::MutexLock lock(&mu_);
    call_id = next_call_id_++;
  }
  call.set_call_id(call_id);
  if (const size_t size = call.ByteSizeLong(); size > boundary::kMaxFrameSize) {
    done(absl::InvalidArgumentError(absl::StrCat("enclave call of ", size,
                                                 " bytes exceeds the boundary frame limit of ",
                                                 boundary::kMaxFrameSize)));
    return 0;
  }
  {
    absl::MutexLock lock(&mu_);
    if (connected_) {
      pending_.emplace(call_id, PendingCall{call_case, std::move(done), std::move(on_frame)});
      outgoing_.push_back(std::move(call));
      return call_id;
    }
  }
  done(WorkerExitedError());
  return 0;
}

void ProcessEnclaveClient::WriterLoop() {
  while (true) {
    HostToEnclave call;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !outgoing_.empty() || !connected_;
      };
      mu_.Await(absl::Condition(&ready));
      if (!connected_) return;
      call = std::move(outgoing_.front());
      outgoing_.pop_front();
    }
    // Large fields (sealed requests, models) go to the socket from the call's own storage.
    absl::Status status = boundary::WriteMessageFrame(socket_fd_, call);
    if (!status.ok()) {
      // The reader sees the shutdown and fails every outstanding call, this one included.
      Log(LogLevel::kError, "enclave_write_failed", {{"error", status.ToString()}});
      ::shutdown(socket_fd_, SHUT_RDWR);
      return;
    }
  }
}

void ProcessEnclaveClient::ReaderLoop() {
  absl::Status reason;
  std::string buffer;  // reused from frame to frame
  while (true) {
    absl::StatusOr<absl::string_view> frame = boundary::ReadFrameInto(socket_fd_, buffer);
    if (!frame.ok()) {
      reason = frame.status();
      break;
    }
    EnclaveToHost reply;
    if (!reply.ParseFromArray(frame->data(), static_cast<int>(frame->size()))) {
      reason = absl::DataLossError("enclave worker sent a frame that is not an EnclaveToHost");
      break;
    }
    Dispatch(std::move(reply));
  }
  ::shutdown(socket_fd_, SHUT_RDWR);
  bool unexpected;
  {
    absl::MutexLock lock(&mu_);
    unexpected = !stop_requested_;
  }
  FailAll();
  if (unexpected) {
    Log(LogLevel::kError, "enclave_worker_disconnected",
        {{"pid", static_cast<long long>(pid_)}, {"reason", reason.ToString()}});
    if (options_.on_exit) options_.on_exit(reason);
  }
}

void ProcessEnclaveClient::Dispatch(EnclaveToHost reply) {
  PendingCall pending;
  std::shared_ptr<OnFrame> on_frame;  // set for a frame of a stream that stays open
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(reply.call_id());
    if (it == pending_.end()) {
      Log(LogLevel::kWarning, "enclave_reply_for_unknown_call",
          {{"call_id", static_cast<unsigned long>(reply.call_id())}});
      return;
    }
    status = CheckReply(it->second.call_case, reply);
    if (status.ok() && !IsLastFrame(it->second.call_case, reply)) {
      on_frame = it->second.on_frame;  // the call stays outstanding until its last frame
    } else {
      pending = std::move(it->second);
      pending_.erase(it);
    }
  }
  if (on_frame != nullptr) {
    (*on_frame)(std::move(reply));
  } else if (status.ok()) {
    pending.done(std::move(reply));
  } else {
    pending.done(std::move(status));
  }
}

void ProcessEnclaveClient::FailAll() {
  absl::flat_hash_map<uint64_t, PendingCall> failed;
  {
    absl::MutexLock lock(&mu_);
    connected_ = false;
    failed.swap(pending_);
    outgoing_.clear();
  }
  for (auto& [call_id, pending] : failed) pending.done(WorkerExitedError());
}

bool ProcessEnclaveClient::connected() const {
  absl::MutexLock lock(&mu_);
  return connected_;
}

void ProcessEnclaveClient::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock lock(&mu_);
    stop_requested_ = true;
  }
  ::shutdown(socket_fd_, SHUT_RDWR);
  ::kill(pid_, SIGTERM);
  int wait_status = 0;
  bool reaped = false;
  absl::Time give_up = absl::Now() + options_.stop_grace;
  while (true) {
    pid_t done = ::waitpid(pid_, &wait_status, WNOHANG);
    if (done == pid_ || (done < 0 && errno != EINTR)) {
      reaped = done == pid_;
      break;
    }
    if (absl::Now() >= give_up) {
      Log(LogLevel::kWarning, "enclave_worker_kill",
          {{"pid", static_cast<long long>(pid_)},
           {"reason", "did not exit after SIGTERM within the grace period"}});
      ::kill(pid_, SIGKILL);
      while (true) {
        done = ::waitpid(pid_, &wait_status, 0);
        if (done == pid_ || (done < 0 && errno != EINTR)) break;
      }
      reaped = done == pid_;
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  reader_.join();
  writer_.join();
  ::close(socket_fd_);
  Log(LogLevel::kInfo, "enclave_worker_stopped",
      {{"pid", static_cast<long long>(pid_)},
       {"status", reaped ? DescribeWaitStatus(wait_status) : std::string("not reaped")}});
}

absl::StatusOr<std::string> DefaultEnclaveBinaryPath() {
  char path[PATH_MAX];
  ssize_t size = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (size <= 0) {
    return absl::InternalError(absl::StrCat("cannot read /proc/self/exe: ", std::strerror(errno)));
  }
  std::string self(path, size);
  size_t slash = self.rfind('/');
  std::string folder = slash == std::string::npos ? "." : self.substr(0, slash);
  return absl::StrCat(folder, "/cloister-enclave");
}

}  // namespace cloister::host
