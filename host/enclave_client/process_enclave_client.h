// ProcessEnclaveClient: the development and single-host EnclaveClient. It spawns one
// `cloister-enclave` worker as a child process connected by a unix socketpair:
//
//   BINARY --fd 3 --data-dir DATA_DIR --sim-dir DATA_DIR/sim --dev-policy-out
//   DATA_DIR/dev-policy.yaml
//
// The child gets its end of the socket as fd 3, /dev/null as stdin and cloisterd's stderr as both
// stdout and stderr (so its JSON logs land beside ours and cloisterd's stdout stays clean for the
// "listening" line); every other descriptor is closed before exec, and the child dies with
// cloisterd (PR_SET_PDEATHSIG). That signal comes when the *thread* that called Start() ends,
// not only the process: call Start() from a thread that lives as long as the worker should
// (WorkerSupervisor restarts workers from its own thread and stops them before it ends).
//
// Frames (proto/frame.h) go out through a writer thread fed by a queue, so Call() never blocks
// on the socket, and replies come back on a reader thread that completes calls by call id (in
// any order). A streaming call (CallStream) stays outstanding until its last frame. When the
// connection ends for any reason, every outstanding call, open streams included, completes with
// UNAVAILABLE "enclave worker exited" and so does every later call.
//
// Threading: Call(), CallStream() and Cancel() are thread-safe. Completion and frame callbacks
// and `on_exit` run on the reader thread (or, for a call refused at once, on the caller's);
// they must not block for long and must not call Stop(). Stop() (also run by the
// destructor) must be called from a thread that is not the reader thread.
// Ownership: the object owns the child process, the socket and both threads.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "host/enclave_client/enclave_client.h"

namespace cloister::host {

struct ProcessEnclaveOptions {
  std::string binary_path;  // the cloister-enclave executable
  std::string data_dir;     // cloisterd's data dir; the worker keeps its state below it
  // Where evidence comes from (cloister-enclave --tee and --gpu): tee "sim", "sev-snp" or
  // "tdx"; gpu "sim", "nvidia-cc", "none" or "" for the worker's default (sim with tee sim).
  std::string tee = "sim";
  std::string gpu;
  // With the simulated TEE: whether this worker writes DATA_DIR/dev-policy.yaml. With several
  // workers sharing a data dir only the first one does.
  bool write_dev_policy = true;
  // Appended to the worker's command line (e.g. --executor cuda --pcie-mode driver for the
  // device this worker owns).
  std::vector<std::string> worker_arguments;
  // How long Stop() waits after SIGTERM before SIGKILL.
  absl::Duration stop_grace = absl::Seconds(5);
  // Runs once, on the reader thread, if the connection ends without Stop() having been called
  // (the worker crashed or closed its socket). The status says why.
  std::function<void(const absl::Status&)> on_exit;
};

class ProcessEnclaveClient : public EnclaveClient {
 public:
  // Spawns the worker. NotFound if the binary is missing or not executable, Internal if the
  // process cannot be created or exec fails. Returns once the child has exec'd; whether the
  // worker is ready is for the caller to find out (e.g. with a GetEvidenceCall).
  static absl::StatusOr<std::unique_ptr<ProcessEnclaveClient>> Start(ProcessEnclaveOptions options);

  // The worker's command line for `options` (argv[0] is the binary). A simulated TEE keeps
  // its roots in DATA_DIR/sim and writes the development policy to DATA_DIR/dev-policy.yaml.
  static std::vector<std::string> WorkerCommandLine(const ProcessEnclaveOptions& options);

  ~ProcessEnclaveClient() override;
  ProcessEnclaveClient(const ProcessEnclaveClient&) = delete;
  ProcessEnclaveClient& operator=(const ProcessEnclaveClient&) = delete;

  void Call(boundary::v1::HostToEnclave call, Done done) override;
  // The stream id is the call id.
  uint64_t CallStream(boundary::v1::HostToEnclave call, OnFrame on_frame, Done done) override;
  // Sends the CancelCall only while the stream is still outstanding.
  void Cancel(uint64_t stream_id) override;

  // Closes the socket, sends SIGTERM, waits up to stop_grace, then SIGKILL; joins the threads.
  // Outstanding calls complete with UNAVAILABLE. Idempotent.
  void Stop();

  // False once the connection to the worker has ended (crash, exit or Stop()).
  bool connected() const;
  pid_t pid() const { return pid_; }

 private:
  struct PendingCall {
    boundary::v1::HostToEnclave::CallCase call_case;
    Done done;
    // A streaming call's frames before the last; shared so that the reader thread can run it
    // without the lock while the call stays in `pending_`.
    std::shared_ptr<OnFrame> on_frame;
  };

  ProcessEnclaveClient(ProcessEnclaveOptions options, pid_t pid, int socket_fd);

  // Call() and CallStream(): assigns the id and queues the call; 0 if refused (done has run).
  uint64_t Send(boundary::v1::HostToEnclave call, std::shared_ptr<OnFrame> on_frame, Done done);

  void ReaderLoop();
  void WriterLoop();
  // Hands one frame read from the worker to its call: to `on_frame` for a frame of a stream
  // before its last, else to `done` (the call is no longer outstanding). On the reader thread.
  void Dispatch(boundary::v1::EnclaveToHost reply);
  // Marks the connection closed and fails every outstanding call.
  void FailAll();

  const ProcessEnclaveOptions options_;
  const pid_t pid_;
  const int socket_fd_;

  mutable absl::Mutex mu_;
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, PendingCall> pending_ ABSL_GUARDED_BY(mu_);
  // Calls to write, in order; serialized as they are written (boundary::WriteMessageFrame).
  std::deque<boundary::v1::HostToEnclave> outgoing_ ABSL_GUARDED_BY(mu_);
  bool connected_ ABSL_GUARDED_BY(mu_) = true;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex stop_mu_;  // serializes Stop()
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;

  std::thread reader_;
  std::thread writer_;
};

// `cloister-enclave` in the folder of the running executable (/proc/self/exe).
absl::StatusOr<std::string> DefaultEnclaveBinaryPath();

}  // namespace cloister::host
