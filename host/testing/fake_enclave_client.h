// FakeEnclaveClient: an in-process EnclaveClient for host unit tests, honouring the interface's
// contract (call ids, exactly-once completion, boundary status and result kind checked as
// CheckReply does). Two modes:
// - manual (default constructor): calls wait until the test answers them with Complete() or
//   Fail(); WaitForPending() lets a test wait for the code under test to send them.
// - automatic (with a FakeEnclave): a background thread answers every call in order with the
//   FakeEnclave (FakeEnclave::Respond, streams included), like a worker process would. A stream
//   the FakeEnclave holds open ("a,hold": at least one chunk first) ends when a CancelCall
//   names it.
// The bookkeeping is InProcessCalls (host/enclave_client/function_enclave_client.h), as for
// FunctionEnclaveClient.
// Threading: thread-safe. Completions run on the thread that calls Complete()/Fail() (manual)
// or on the background thread (automatic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "host/enclave_client/enclave_client.h"
#include "host/enclave_client/function_enclave_client.h"
#include "host/testing/fake_enclave.h"

namespace cloister::host::testing {

class FakeEnclaveClient : public EnclaveClient {
 public:
  FakeEnclaveClient();
  explicit FakeEnclaveClient(std::unique_ptr<FakeEnclave> enclave);
  ~FakeEnclaveClient() override;

  void Call(boundary::v1::HostToEnclave call, Done done) override;
  uint64_t CallStream(boundary::v1::HostToEnclave call, OnFrame on_frame, Done done) override;
  void Cancel(uint64_t stream_id) override;

  // Manual mode. Waits until at least `count` calls are pending; false on timeout.
  bool WaitForPending(size_t count, absl::Duration timeout = absl::Seconds(10));
  // The pending calls, oldest first.
  std::vector<boundary::v1::HostToEnclave> Pending() const;
  // Answers a pending call (by call id) with `reply` after checking it like a real client; for
  // a streaming call `reply` is its next frame (the stream stays open until its last).
  // Returns false if there is no such pending call or open stream.
  bool Complete(uint64_t call_id, absl::StatusOr<boundary::v1::EnclaveToHost> reply);
  // Answers every pending call and open stream with `status`.
  void FailAll(const absl::Status& status);
  // Streams that have had a frame and have not ended.
  size_t open_stream_count() const;

  // Every call the worker accepted, in order (both modes); calls refused as dead are not kept.
  std::vector<boundary::v1::HostToEnclave> History() const;
  // After this, calls fail at once with UNAVAILABLE "enclave worker exited".
  void SetDead();

 private:
  // The automatic mode's handler: the FakeEnclave's reply; a crash kills the worker.
  absl::StatusOr<boundary::v1::EnclaveToHost> Handle(const boundary::v1::HostToEnclave& call);

  std::unique_ptr<FakeEnclave> enclave_;  // null in manual mode; outlives calls_' thread
  InProcessCalls calls_;
};

}  // namespace cloister::host::testing
