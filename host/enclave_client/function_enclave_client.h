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
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "host/enclave_client/enclave_client.h"

namespace cloister::host {

class FunctionEnclaveClient : public EnclaveClient {
 public:
  using Handler = std::function<absl::StatusOr<boundary::v1::EnclaveToHost>(
      const boundary::v1::HostToEnclave& call)>;

  explicit FunctionEnclaveClient(Handler handler, int threads = 0);
  ~FunctionEnclaveClient() override;
  FunctionEnclaveClient(const FunctionEnclaveClient&) = delete;
  FunctionEnclaveClient& operator=(const FunctionEnclaveClient&) = delete;

  void Call(boundary::v1::HostToEnclave call, Done done) override;

  // Calls answered so far.
  uint64_t answered_count() const;

 private:
  struct PendingCall {
    boundary::v1::HostToEnclave call;
    Done done;
  };
  void Run(PendingCall pending);
  void WorkerLoop();

  const Handler handler_;
  mutable absl::Mutex mu_;
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t answered_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<PendingCall> pending_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// A handler that answers each InferBatchCall with one empty OK reply item per request (same
// request ids and sequence numbers, same order) and `execution` as the batch's execution time,
// after spending no time at all; every other call gets UNIMPLEMENTED. For measuring the host.
FunctionEnclaveClient::Handler NoOpInferHandler(absl::Duration execution = absl::ZeroDuration());

}  // namespace cloister::host
