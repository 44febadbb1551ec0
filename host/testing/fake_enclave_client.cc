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

absl::StatusOr<EnclaveToHost> FakeEnclaveClient::Handle(const HostToEnclave& call) {
  std::optional<EnclaveToHost> reply = enclave_->Handle(call);
  if (!reply.has_value()) return calls_.WorkerExited();
  return *std::move(reply);
}

bool FakeEnclaveClient::WaitForPending(size_t count, absl::Duration timeout) {
  return calls_.WaitForPending(count, timeout);
}

std::vector<HostToEnclave> FakeEnclaveClient::Pending() const { return calls_.Pending(); }

bool FakeEnclaveClient::Complete(uint64_t call_id, absl::StatusOr<EnclaveToHost> reply) {
  return calls_.Complete(call_id, std::move(reply));
}

void FakeEnclaveClient::FailAll(const absl::Status& status) { calls_.FailAll(status); }

std::vector<HostToEnclave> FakeEnclaveClient::History() const { return calls_.History(); }

void FakeEnclaveClient::SetDead() { calls_.SetDead(); }

}  // namespace cloister::host::testing
