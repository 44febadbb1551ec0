// EnclaveClient: how cloisterd talks to one enclave worker. The whole host-side view of the
// trusted/untrusted boundary is this one asynchronous call: a HostToEnclave message goes out, an
// EnclaveToHost message (or an error) comes back. Implementations: ProcessEnclaveClient (a
// `cloister-enclave` child over a socketpair) and the fakes in host/testing/ for tests.
//
// Contract for every implementation:
// - Call() never blocks on the enclave; it assigns the call id itself (any call_id in `call` is
//   overwritten).
// - `done` runs exactly once per Call(), with the reply or an error. A reply whose
//   `status.code` is not OK arrives as that error (FromBoundaryStatus), and a reply whose result
//   does not match the call's kind arrives as INTERNAL; so an OK reply always holds the result
//   that answers the call. If the worker dies, every outstanding and later call completes with
//   UNAVAILABLE "enclave worker exited".
// - `done` may run on an internal thread or, when the call fails at once, on the caller's
//   thread; callers must not hold a lock that `done` takes while calling Call().
// Thread-safe: Call() may be used from any number of threads.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "proto/error_reason.h"

namespace cloister::host {

class EnclaveClient {
 public:
  using Reply = absl::StatusOr<boundary::v1::EnclaveToHost>;
  using Done = std::function<void(Reply)>;

  virtual ~EnclaveClient() = default;

  // Sends one call to the enclave; `done` receives its answer exactly once (see above).
  virtual void Call(boundary::v1::HostToEnclave call, Done done) = 0;
};

// The status an enclave reported at the boundary as an absl::Status with its reason (code 0:
// OK). Codes outside absl's range become UNKNOWN.
using proto::FromBoundaryStatus;

// How every client answers a call its worker will never answer: UNAVAILABLE "enclave worker
// exited", reason WORKER_EXITED.
absl::Status WorkerExitedError();

// The result kind that answers a call kind, RESULT_NOT_SET for CALL_NOT_SET.
boundary::v1::EnclaveToHost::ResultCase ExpectedResultCase(
    boundary::v1::HostToEnclave::CallCase call_case);

// Checks a raw reply for a call of kind `call_case`: its boundary status must be OK and its
// result must be of the expected kind. Used by implementations to honour the contract above.
absl::Status CheckReply(boundary::v1::HostToEnclave::CallCase call_case,
                        const boundary::v1::EnclaveToHost& reply);

// Sends `call` and blocks until the answer arrives or `timeout` passes (DEADLINE_EXCEEDED).
// For start-up code only; never call it on a gRPC or enclave-reader thread.
absl::StatusOr<boundary::v1::EnclaveToHost> CallAndWait(EnclaveClient& client,
                                                        boundary::v1::HostToEnclave call,
                                                        absl::Duration timeout);

}  // namespace cloister::host
