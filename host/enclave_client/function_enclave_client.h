// FunctionEnclaveClient: an EnclaveClient whose "enclave" is a function run in process. It lets
// a benchmark or a test drive the Scheduler (or anything else that speaks EnclaveClient) with an
// executor of its choosing, for example one that does nothing, so that the host's own overhead
// can be measured without a worker process or any cryptography.
//
// It honours the EnclaveClient contract: call ids are assigned here, every call is answered
// exactly once, and replies are checked with CheckReply (a reply with a non-OK boundary status
// or of the wrong kind arrives as an error). A streaming call's handler reply is its first
// frame; when that is not the last, the stream stays open for SendFrame().
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
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "host/enclave_client/enclave_client.h"

namespace cloister::host {

// The calls of an enclave run in process: it assigns call ids, keeps a FIFO of calls not yet
// answered, answers each exactly once (checking replies with CheckReply), and answers calls
// made after SetDead(), or left over at destruction, with UNAVAILABLE "enclave worker exited".
// A streaming call (CallStream) is open from the moment it runs (or, without a handler, from
// its first Complete()) until its last frame: the handler's reply and each Complete() for it
// is one frame, checked and passed to `on_frame`, or to `done` when it is the last.
// Three modes, fixed at construction:
// - a handler and `threads` > 0: that many worker threads run calls in FIFO order; the
//   destructor lets them run every call already queued;
// - a handler and `threads` == 0: the handler runs inside Call() on the caller's thread;
// - no handler: calls wait until Complete() or FailAll() answers them.
// Threading: thread-safe; `done` and `on_frame` run on the thread that answers (a worker, the
// caller of Call(), Complete() or FailAll()). The handler must be thread-safe when threads > 1.
// The frames of one stream must come from one thread at a time (so that they stay in order).
class InProcessCalls {
 public:
  using Handler = std::function<absl::StatusOr<boundary::v1::EnclaveToHost>(
      const boundary::v1::HostToEnclave& call)>;

  // `keep_history`: remember every accepted call for History().
  InProcessCalls(Handler handler, int threads, bool keep_history);
  ~InProcessCalls();
  InProcessCalls(const InProcessCalls&) = delete;
  InProcessCalls& operator=(const InProcessCalls&) = delete;

  // Assigns the call id and queues the call (or runs it, in the inline mode). A streaming call
  // is refused (EnclaveClient's contract).
  void Call(boundary::v1::HostToEnclave call, EnclaveClient::Done done);
  // The same for a streaming call; returns its call id, 0 when refused at once.
  uint64_t CallStream(boundary::v1::HostToEnclave call, EnclaveClient::OnFrame on_frame,
                      EnclaveClient::Done done);
  // Sends a CancelCall for `call_id` (answered by the handler, or pending without one) if it
  // names a streaming call not yet ended; its answer is dropped.
  void Cancel(uint64_t call_id);

  // Answers a pending call (by call id) with `reply`, checked like a handler's reply; for a
  // streaming call, pending or open, `reply` is its next frame. Returns false if there is no
  // such pending call or open stream.
  bool Complete(uint64_t call_id, EnclaveClient::Reply reply);
  // Answers every pending call and open stream with `status`.
  void FailAll(const absl::Status& status);
  // Waits until at least `count` calls are pending; false on timeout.
  bool WaitForPending(size_t count, absl::Duration timeout);
  // The pending calls (not yet run or answered; a stream is pending until its first frame),
  // oldest first.
  std::vector<boundary::v1::HostToEnclave> Pending() const;
  // Streams that have had a frame and are not yet ended.
  size_t open_stream_count() const;
  // Every accepted call, in call id order (empty without `keep_history`).
  std::vector<boundary::v1::HostToEnclave> History() const;
  // After this, calls fail at once with UNAVAILABLE "enclave worker exited"; pending ones stay.
  void SetDead();
  // For a handler whose worker has just gone: SetDead(), and once the call being handled is
  // answered, every pending call fails too. Returns UNAVAILABLE "enclave worker exited" for the
  // handler to answer that call with.
  absl::Status WorkerExited();

  // Calls answered with a reply or a handler's error so far (a stream counts when it ends).
  uint64_t answered_count() const;

 private:
  struct PendingCall {
    boundary::v1::HostToEnclave call;
    EnclaveClient::Done done;
    EnclaveClient::OnFrame on_frame;  // set for a streaming call
  };
  struct OpenStream {
    boundary::v1::HostToEnclave::CallCase call_case;
    std::shared_ptr<EnclaveClient::OnFrame> on_frame;  // run without the lock
    EnclaveClient::Done done;
  };
  // Call() and CallStream(): the call id, 0 when refused (`done` has run).
  uint64_t Accept(PendingCall pending) ABSL_LOCKS_EXCLUDED(mu_);
  void Run(PendingCall pending) ABSL_LOCKS_EXCLUDED(mu_);
  // Stamps the call id on an OK reply, checks it and passes it to `done`.
  void Answer(PendingCall pending, EnclaveClient::Reply reply) ABSL_LOCKS_EXCLUDED(mu_);
  // Makes a pending streaming call an open stream.
  void OpenLocked(PendingCall pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Passes one frame to the open stream `call_id`, as Answer does for a call; false when no
  // such stream is open.
  bool Deliver(uint64_t call_id, EnclaveClient::Reply frame) ABSL_LOCKS_EXCLUDED(mu_);
  // After a handler's reply: once the worker has exited, every pending call fails too.
  void FailAllIfWorkerExited() ABSL_LOCKS_EXCLUDED(mu_);
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const Handler handler_;
  const bool runs_inline_;
  const bool keep_history_;
  mutable absl::Mutex mu_;
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t answered_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<PendingCall> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, OpenStream> streams_ ABSL_GUARDED_BY(mu_);
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
  uint64_t CallStream(boundary::v1::HostToEnclave call, OnFrame on_frame, Done done) override;
  void Cancel(uint64_t stream_id) override;

  // The next frame of the open stream `stream_id` (for a handler that answers a streaming call
  // with more than one frame); false when no such stream is open.
  bool SendFrame(uint64_t stream_id, Reply frame);

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
