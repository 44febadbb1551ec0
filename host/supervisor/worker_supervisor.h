// WorkerSupervisor: keeps cloisterd's enclave workers running. It starts each worker process,
// waits until it answers a GetEvidenceCall, hands it every stored model (the sealed blobs and
// wrapped keys in the BlobStore), and from then on restarts it whenever it dies (killed, crashed,
// GPU error), with exponential backoff, doing the same three steps again.
//
// The rest of cloisterd (scheduler, service, operator plane) sees one stable EnclaveClient per
// worker index, `client(index)`; behind it the process is swapped on each restart:
// - A call held by a worker that dies completes exactly once with UNAVAILABLE "enclave worker N
//   exited ...; retry" (ProcessEnclaveClient already answers each call once; this keeps that),
//   an open stream (CallStream) too. Stream ids are the supervisor's, so a Cancel() for a
//   stream of a dead incarnation never reaches its successor.
// - While a worker restarts (until its models are reloaded) every call is answered at once with
//   UNAVAILABLE "enclave worker N is restarting; retry", except two kinds that are held:
//   ReloadModel (a model uploaded meanwhile through another worker) is handed to the new
//   incarnation before it serves, so it never misses a model committed during its restart;
//   GetEvidence (a client attesting again) is answered by the new incarnation once it serves,
//   since that is the evidence the client's next session needs. Both are answered UNAVAILABLE
//   if the supervisor gives up or stops.
// - Sessions live in the enclave's memory, so a restart ends them. The supervisor remembers the
//   session ids each incarnation opened; a sealed call that names a session of an earlier
//   incarnation is refused with FAILED_PRECONDITION carrying kReattestMessage (Infer items get it
//   as their item status), which tells the client to attest again and open a new session.
// - After each (re)start `on_ready` receives the worker's fresh evidence (its signing key
//   changes with every incarnation, e.g. for checking usage receipts).
// - After `max_consecutive_failures` failed starts in a row the supervisor gives up on that
//   worker (`on_gave_up`); it keeps answering UNAVAILABLE.
//
// Threading: Start() and Stop() from one owning thread; client(i)->Call() from any thread, with
// the EnclaveClient contract. Restarts run on the supervisor's own thread; `on_ready` and
// `on_gave_up` run there (and on the Start() caller's thread for the first start).
// Ownership: owns the worker processes (ProcessEnclaveClient) and its thread; the BlobStore is
// borrowed and must outlive the supervisor. Dead incarnations are kept (stopped: no process,
// thread or descriptor, a few hundred bytes each) until the supervisor is destroyed, so a call
// racing with a restart never touches freed memory.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "host/enclave_client/enclave_client.h"
#include "host/enclave_client/process_enclave_client.h"
#include "host/storage/blob_store.h"
#include "proto/error_reason.h"

namespace cloister::host {

// The refusal of a session whose worker restarted (FAILED_PRECONDITION, reason SESSION_LOST).
inline constexpr char kReattestMessage[] =
    "the enclave worker holding this session restarted and the session's keys are gone; "
    "re-attest and open a new session";
// That refusal as a status: FAILED_PRECONDITION kReattestMessage, reason SESSION_LOST.
inline absl::Status SessionLostError() {
  return proto::WithReason(absl::FailedPreconditionError(kReattestMessage), api::v1::SESSION_LOST);
}

// An operator-published model (config `published_models`), published into every (re)started
// worker after its stored models are reloaded.
struct PublishedModelSource {
  std::string name;
  std::string file;    // an ONNX file, a model package, or a checkpoint folder (packed)
  std::string digest;  // expected SHA-256, 64 lowercase hex digits
};

// The bytes of a published model: the file, or the package of a checkpoint folder, of at most
// `max_size` bytes, whose SHA-256 must be `model.digest`. InvalidArgument naming the model and
// what is wrong (unreadable, too large, a folder that does not pack, another digest).
absl::StatusOr<std::string> ReadPublishedModel(const PublishedModelSource& model,
                                               uint64_t max_size);

// The SHA-256 (hex) of what ReadPublishedModel would publish from `path` (cloisterd
// --model-digest): the file's, or the package's of a checkpoint folder.
absl::StatusOr<std::string> PublishedModelDigest(const std::string& path);

// Publishes each model into `enclave` (PublishModelCall), reading its file again each time so
// a worker restarted later checks what is on disk then. Stops at the first failure and returns
// it, naming the model: a published model the enclave refuses is a configuration error.
absl::Status PublishModels(const std::vector<PublishedModelSource>& models,
                           EnclaveClient& enclave, absl::Duration timeout, int* published_out);

// Hands every model stored in `blobs` to `enclave` (ReloadModelCall). A model whose blob cannot
// be read, does not match its recorded SHA-256 or is refused by the enclave is logged and
// skipped; UNAVAILABLE (the worker died) stops the reload and is returned. OK otherwise, with
// the number reloaded in `reloaded` when given.
absl::Status ReloadStoredModels(BlobStore& blobs, EnclaveClient& enclave, absl::Duration timeout,
                                int* reloaded = nullptr);

struct WorkerSupervisorOptions {
  int worker_count = 1;
  // Starts one incarnation of worker `index`; `on_exit` must be passed on as
  // ProcessEnclaveOptions::on_exit. The first call for index 0 happens before any other worker
  // starts (it may create state the others share).
  std::function<absl::StatusOr<std::unique_ptr<ProcessEnclaveClient>>(
      int index, std::function<void(const absl::Status&)> on_exit)>
      start_worker;
  BlobStore* blobs = nullptr;  // models to load into every (re)started worker; nullptr: none
  std::vector<PublishedModelSource> published;  // then published into every (re)started worker
  absl::Duration ready_timeout = absl::Seconds(120);         // first GetEvidenceCall answered
  absl::Duration reload_timeout = absl::Seconds(300);        // per model
  absl::Duration initial_backoff = absl::Milliseconds(100);  // before the first restart
  absl::Duration max_backoff = absl::Seconds(5);
  // A worker that stays up this long resets its backoff to initial_backoff.
  absl::Duration stable_after = absl::Seconds(30);
  int max_consecutive_failures = 10;
  // Session ids remembered per worker, of the live incarnation and of dead ones (each list
  // forgets its oldest first).
  int max_stale_sessions = 1 << 20;
  // Each worker's evidence after each (re)start; generation 0 is the first start.
  std::function<void(int worker, int generation, const boundary::v1::GetEvidenceResult& evidence)>
      on_ready;
  std::function<void(int worker, const absl::Status& why)> on_gave_up;
};

class WorkerSupervisor {
 public:
  // Starts the workers one after the other (each ready and loaded before the next), then the
  // restart thread. Fails (stopping what it started) if a worker does not come up: the first
  // start is not retried, so that a broken binary or config stops cloisterd at once.
  static absl::StatusOr<std::unique_ptr<WorkerSupervisor>> Start(WorkerSupervisorOptions options);
  ~WorkerSupervisor();  // Stop()
  WorkerSupervisor(const WorkerSupervisor&) = delete;
  WorkerSupervisor& operator=(const WorkerSupervisor&) = delete;

  // The stable client of worker `index` (0 <= index < worker_count), valid until destruction.
  EnclaveClient* client(int index) const;
  std::vector<EnclaveClient*> clients() const;
  int worker_count() const { return static_cast<int>(workers_.size()); }

  // Completed restarts of worker `index` (0 before its first death).
  int restarts(int index) const;
  // Whether worker `index` is up and loaded (false while it restarts or after giving up).
  bool ready(int index) const;
  // Whether some worker was given up on.
  bool gave_up() const;
  // The pid of worker `index`'s current process (-1 while it restarts).
  pid_t pid(int index) const;
  // Blocks until worker `index` has completed `restarts` restarts and is ready (true) or
  // `timeout` passes (false). For tests and tools.
  bool WaitForRestarts(int index, int restarts, absl::Duration timeout) const;

  // Shutdown, step 1: workers that die from now on are not restarted (at shutdown a service
  // manager may signal the workers along with cloisterd). Thread-safe; idempotent.
  void StopRestarting();
  // Stops the restart thread and every worker; outstanding calls complete with UNAVAILABLE.
  // Idempotent.
  void Stop();

 private:
  class Worker;

  explicit WorkerSupervisor(WorkerSupervisorOptions options);
  // Starts worker `index`'s next incarnation and makes it ready; the error if any step fails.
  absl::Status StartIncarnation(int index);
  void SuperviseLoop();
  // From a dying incarnation's reader thread.
  void OnWorkerExit(int index, uint64_t generation, const absl::Status& why);
  // Stops every incarnation's process (idempotent per process).
  void StopAllIncarnations();
  // Answers the calls held for `worker` (ReloadModel, GetEvidence) with `why`; with `give_up`,
  // later ones are refused at once instead of held.
  void FailHeldReloads(Worker& worker, const absl::Status& why, bool give_up);

  const WorkerSupervisorOptions options_;
  std::vector<std::unique_ptr<Worker>> workers_;

  mutable absl::Mutex mu_;
  std::deque<int> dead_ ABSL_GUARDED_BY(mu_);  // worker indexes waiting for a restart
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool gave_up_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread thread_;
};

}  // namespace cloister::host
