#include "host/testing/fake_enclave_client.h"

#include <optional>
#include <utility>

namespace cloister::host::testing {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

FakeEnclaveClient::FakeEnclaveClient()
    : calls_(/*handler=*/nullptr, /*threads=*/0, /*keep_history=*/true) {}

FakeEnclaveClient::FakeEnclaveClient(std::unique_ptr<FakeEnclave> enclave)
    : enclave_(std::move(enclave)),
      calls_([this](const HostToEnclave& call) { return Handle(call); }, /*threads=*/1,
             /*keep_history=*/true) {}

FakeEnclaveClient::~FakeEnclaveClient() = default;

void FakeEnclaveClient::Call(HostToEnclave call, Done done) {
  calls_.Call(std::move(call), std::move(done));
}

uint64_t FakeEnclaveClient::CallStream(HostToEnclave call, OnFrame on_frame, Done done) {
  return calls_.CallStream(std::move(call), std::move(on_frame), std::move(done));
}

void FakeEnclaveClient::Cancel(uint64_t stream_id) { calls_.Cancel(stream_id); }

absl::StatusOr<EnclaveToHost> FakeEnclaveClient::Handle(const HostToEnclave& call) {
  FakeEnclave::Response response = enclave_->Respond(call);
  // The frames for other calls (a cancelled stream's last one) and this call's frames before
  // its last go out now; the last of this call's is the handler's answer.
  std::optional<EnclaveToHost> last;
  for (EnclaveToHost& frame : response.frames) {
    if (const uint64_t target = frame.call_id(); target != call.call_id()) {
      calls_.Complete(target, std::move(frame));
      continue;
    }
    if (last.has_value()) calls_.Complete(call.call_id(), *std::move(last));
    last = std::move(frame);
  }
  if (response.crash) {
    if (last.has_value()) calls_.Complete(call.call_id(), *std::move(last));
    return calls_.WorkerExited();
  }
  if (!last.has_value()) return absl::InternalError("the fake enclave sent no frame for the call");
  return *std::move(last);
}

bool FakeEnclaveClient::WaitForPending(size_t count, absl::Duration timeout) {
  return calls_.WaitForPending(count, timeout);
}

std::vector<HostToEnclave> FakeEnclaveClient::Pending() const { return calls_.Pending(); }

bool FakeEnclaveClient::Complete(uint64_t call_id, absl::StatusOr<EnclaveToHost> reply) {
  return calls_.Complete(call_id, std::move(reply));
}

void FakeEnclaveClient::FailAll(const absl::Status& status) { calls_.FailAll(status); }

size_t FakeEnclaveClient::open_stream_count() const { return calls_.open_stream_count(); }

std::vector<HostToEnclave> FakeEnclaveClient::History() const { return calls_.History(); }

void FakeEnclaveClient::SetDead() { calls_.SetDead(); }

}  // namespace cloister::host::testing
