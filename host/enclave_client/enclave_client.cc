#include "host/enclave_client/enclave_client.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace cloister::host {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

absl::Status WorkerExitedError() {
  return proto::WithReason(absl::UnavailableError("enclave worker exited"), api::v1::WORKER_EXITED);
}

EnclaveToHost::ResultCase ExpectedResultCase(HostToEnclave::CallCase call_case) {
  switch (call_case) {
    case HostToEnclave::kGetEvidence:
      return EnclaveToHost::kGetEvidence;
    case HostToEnclave::kOpenSession:
      return EnclaveToHost::kOpenSession;
    case HostToEnclave::kLoadModel:
      return EnclaveToHost::kLoadModel;
    case HostToEnclave::kReloadModel:
      return EnclaveToHost::kReloadModel;
    case HostToEnclave::kListModels:
      return EnclaveToHost::kListModels;
    case HostToEnclave::kDeleteModel:
      return EnclaveToHost::kDeleteModel;
    case HostToEnclave::kInferBatch:
      return EnclaveToHost::kInferBatch;
    case HostToEnclave::kSignAuditCheckpoint:
      return EnclaveToHost::kSignAuditCheckpoint;
    case HostToEnclave::kGetStats:
      return EnclaveToHost::kGetStats;
    case HostToEnclave::kGenerate:
      return EnclaveToHost::kGenerate;
    case HostToEnclave::kCancel:
      return EnclaveToHost::kCancel;
    case HostToEnclave::kPublishModel:
      return EnclaveToHost::kPublishModel;
    case HostToEnclave::CALL_NOT_SET:
      return EnclaveToHost::RESULT_NOT_SET;
  }
  return EnclaveToHost::RESULT_NOT_SET;
}

absl::Status CheckReply(HostToEnclave::CallCase call_case, const EnclaveToHost& reply) {
  if (reply.has_status()) {
    absl::Status status = FromBoundaryStatus(reply.status());
    if (!status.ok()) return status;
  }
  EnclaveToHost::ResultCase expected = ExpectedResultCase(call_case);
  if (reply.result_case() != expected) {
    return absl::InternalError(absl::StrCat("enclave answered call kind ",
                                            static_cast<int>(call_case), " with result kind ",
                                            static_cast<int>(reply.result_case())));
  }
  return absl::OkStatus();
}

bool IsStreamingCall(HostToEnclave::CallCase call_case) {
  return call_case == HostToEnclave::kGenerate;
}

bool IsLastFrame(HostToEnclave::CallCase call_case, const EnclaveToHost& frame) {
  return !IsStreamingCall(call_case) || !frame.has_generate() || frame.generate().final();
}

absl::Status StreamingCallError() {
  return absl::InvalidArgumentError(
      "a GenerateCall is answered by a stream of frames: send it with CallStream");
}

HostToEnclave CancelCallFor(uint64_t target_call_id) {
  HostToEnclave call;
  call.mutable_cancel()->set_target_call_id(target_call_id);
  return call;
}

absl::StatusOr<EnclaveToHost> CallAndWait(EnclaveClient& client, HostToEnclave call,
                                          absl::Duration timeout) {
  // Shared with the callback, which may outlive this frame when the wait times out.
  struct State {
    absl::Mutex mu;
    std::optional<EnclaveClient::Reply> reply ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  client.Call(std::move(call), [state](EnclaveClient::Reply reply) {
    absl::MutexLock lock(&state->mu);
    state->reply = std::move(reply);
  });
  absl::MutexLock lock(&state->mu);
  auto arrived = [&state]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) { return state->reply.has_value(); };
  if (!state->mu.AwaitWithTimeout(absl::Condition(&arrived), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("enclave worker did not answer within ", absl::FormatDuration(timeout)));
  }
  return std::move(*state->reply);
}

}  // namespace cloister::host
