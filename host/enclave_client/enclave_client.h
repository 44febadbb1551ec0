// EnclaveClient: how cloisterd talks to one enclave worker. The whole host-side view of the
// trusted/untrusted boundary is this one asynchronous call: a HostToEnclave message goes out, an
// EnclaveToHost message (or an error) comes back; a GenerateCall is answered by a stream of them
// (CallStream). Implementations: ProcessEnclaveClient (a `cloister-enclave` child over a
// socketpair) and the fakes in host/testing/ for tests.
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
// - A GenerateCall goes through CallStream(), never Call() (INVALID_ARGUMENT): its frames go
//   to `on_frame` one at a time, in the order the enclave sent them, each checked like a reply
//   (OK status, a GenerateResult); `done` runs once after the last of them with the final frame
//   (GenerateResult.final), or with the error that ended the stream (a frame with a non-OK
//   boundary status, a frame of the wrong kind, the worker's death). `on_frame` never runs
//   after `done`, and the two never run at the same time.
// Thread-safe: Call(), CallStream() and Cancel() may be used from any number of threads.
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
  using OnFrame = std::function<void(boundary::v1::EnclaveToHost)>;

  virtual ~EnclaveClient() = default;

  // Sends one call to the enclave; `done` receives its answer exactly once (see above).
  virtual void Call(boundary::v1::HostToEnclave call, Done done) = 0;

  // Sends a call answered by a stream of frames (a GenerateCall; a call of another kind is
  // answered by `done` alone, as by Call()). `on_frame` receives every frame but the last and
  // `done` the last one or the stream's error, exactly once (see above). Returns the id that
  // names the stream for Cancel(), or 0 when the call was refused at once (`done` has then run
  // on the caller's thread).
  virtual uint64_t CallStream(boundary::v1::HostToEnclave call, OnFrame on_frame, Done done) = 0;

  // Asks the enclave to stop the stream `stream_id` (CallStream's id) with a CancelCall; its
  // CancelResult is consumed here. The stream still ends through its `done`: with a final
  // frame (finish_reason "cancelled" under the seal) or with an error. Does nothing for a
  // stream that has already ended, or for 0. Never blocks on the enclave.
  virtual void Cancel(uint64_t stream_id) = 0;
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
// For a GenerateCall it checks each frame of the stream.
absl::Status CheckReply(boundary::v1::HostToEnclave::CallCase call_case,
                        const boundary::v1::EnclaveToHost& reply);

// Whether calls of this kind are answered by a stream of frames (GenerateCall).
bool IsStreamingCall(boundary::v1::HostToEnclave::CallCase call_case);

// Whether `frame`, which passed CheckReply for a call of kind `call_case`, is the last one the
// call gets: always for a call that is not streaming, the final GenerateResult for one that is.
bool IsLastFrame(boundary::v1::HostToEnclave::CallCase call_case,
                 const boundary::v1::EnclaveToHost& frame);

// The refusal of a streaming call sent with Call(): INVALID_ARGUMENT.
absl::Status StreamingCallError();

// The CancelCall that stops the call `target_call_id`.
boundary::v1::HostToEnclave CancelCallFor(uint64_t target_call_id);

// Sends `call` and blocks until the answer arrives or `timeout` passes (DEADLINE_EXCEEDED).
// For start-up code only; never call it on a gRPC or enclave-reader thread.
absl::StatusOr<boundary::v1::EnclaveToHost> CallAndWait(EnclaveClient& client,
                                                        boundary::v1::HostToEnclave call,
                                                        absl::Duration timeout);

}  // namespace cloister::host
