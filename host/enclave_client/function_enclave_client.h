// FunctionEnclaveClient: an EnclaveClient whose "enclave" is a function run in process. It lets
// a benchmark or a test drive the Scheduler (or anything else that speaks EnclaveClient) with an
// executor of its choosing, for example one that does nothing, so that the host's own overhead
// can be measured without a worker process or any cryptography.
//
// It honours the EnclaveClient contract: call ids are assigned here, every call is answered
// exactly once, and replies are checked with CheckReply (a reply with a non-OK boundary status
// or of the wrong kind arrives as an error).
//
// Threading: Call() is thread-safe. With `threads` == 0 the handler runs inside Call() on the
// caller's thread (and `done` with it); otherwise `threads` threads take calls in FIFO order.
// The handler must be thread-safe when threads > 1.
// Ownership: owns its threads; the destructor answers calls not yet run with UNAVAILABLE
// "enclave worker exited".
//
// InProcessCalls, below it, is the call bookkeeping this client shares with
// testing::FakeEnclaveClient.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "host/enclave_client/enclave_client.h"

namespace cloister::host {

// The calls of an enclave run in process: it assigns call ids, keeps a FIFO of calls not yet
// answered, answers each exactly once (checking replies with CheckReply), and answers calls
// made after SetDead(), or left over at destruction, with UNAVAILABLE "enclave worker exited".
// Three modes, fixed at construction:
// - a handler and `threads` > 0: that many worker threads run calls in FIFO order; the
//   destructor lets them run every call already queued;
// - a handler and `threads` == 0: the handler runs inside Call() on the caller's thread;
// - no handler: calls wait until Complete() or FailAll() answers them.
// Threading: thread-safe; `done` runs on the thread that answers (a worker, the caller of
// Call(), Complete() or FailAll()). The handler must be thread-safe when threads > 1.
class InProcessCalls {
 public:
  using Handler = std::function<absl::StatusOr<boundary::v1::EnclaveToHost>(
      const boundary::v1::HostToEnclave& call)>;

  // `keep_history`: remember every accepted call for History().
  InProcessCalls(Handler handler, int threads, bool keep_history);
  ~InProcessCalls();
  InProcessCalls(const InProcessCalls&) = delete;
  InProcessCalls& operator=(const InProcessCalls&) = delete;

  // Assigns the call id and queues the call (or runs it, in the inline mode).
  void Call(boundary::v1::HostToEnclave call, EnclaveClient::Done done);

  // Answers a pending call (by call id) with `reply`, checked like a handler's reply. Returns
  // false if there is no such pending call.
  bool Complete(uint64_t call_id, EnclaveClient::Reply reply);
  // Answers every pending call with `status`.
  void FailAll(const absl::Status& status);
  // Waits until at least `count` calls are pending; false on timeout.
  bool WaitForPending(size_t count, absl::Duration timeout);
  // The pending calls, oldest first.
  std::vector<boundary::v1::HostToEnclave> Pending() const;
  // Every accepted call, in call id order (empty without `keep_history`).
  std::vector<boundary::v1::HostToEnclave> History() const;
  // After this, calls fail at once with UNAVAILABLE "enclave worker exited"; pending ones stay.
  void SetDead();
  // For a handler whose worker has just gone: SetDead(), and once the call being handled is
  // answered, every pending call fails too. Returns UNAVAILABLE "enclave worker exited" for the
  // handler to answer that call with.
  absl::Status WorkerExited();

  // Calls answered with a reply or a handler's error so far.
  uint64_t answered_count() const;

 private:
  struct PendingCall {
    boundary::v1::HostToEnclave call;
    EnclaveClient::Done done;
  };
  void Run(PendingCall pending) ABSL_LOCKS_EXCLUDED(mu_);
  // Stamps the call id on an OK reply, checks it and passes it to `done`.
  void Answer(PendingCall pending, EnclaveClient::Reply reply) ABSL_LOCKS_EXCLUDED(mu_);
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const Handler handler_;
  const bool runs_inline_;
  const bool keep_history_;
  mutable absl::Mutex mu_;
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t answered_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<PendingCall> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<boundary::v1::HostToEnclave> history_ ABSL_GUARDED_BY(mu_);
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  bool worker_exited_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

class FunctionEnclaveClient : public EnclaveClient {
 public:
  using Handler = InProcessCalls::Handler;

  explicit FunctionEnclaveClient(Handler handler, int threads = 0);
  ~FunctionEnclaveClient() override;
  FunctionEnclaveClient(const FunctionEnclaveClient&) = delete;
  FunctionEnclaveClient& operator=(const FunctionEnclaveClient&) = delete;

  void Call(boundary::v1::HostToEnclave call, Done done) override;

  // Calls answered so far.
  uint64_t answered_count() const;

 private:
  InProcessCalls calls_;
};

// A handler that answers each InferBatchCall with one empty OK reply item per request (same
// request ids and sequence numbers, same order) and `execution` as the batch's execution time,
// after spending no time at all; every other call gets UNIMPLEMENTED. For measuring the host.
FunctionEnclaveClient::Handler NoOpInferHandler(absl::Duration execution = absl::ZeroDuration());

}  // namespace cloister::host
