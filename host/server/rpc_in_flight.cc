#include "host/server/rpc_in_flight.h"

#include <utility>

namespace cloister::host {

absl::Status InFlightRpcs::CheckAccepting() const {
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("cloisterd is shutting down");
  return absl::OkStatus();
}

void InFlightRpcs::BeginDrain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool InFlightRpcs::WaitUntilIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

int InFlightRpcs::count() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

void InFlightRpcs::Add(int delta) {
  absl::MutexLock lock(&mu_);
  count_ += delta;
}

RpcInFlight::RpcInFlight(InFlightRpcs* rpcs) : rpcs_(rpcs) { rpcs_->Add(1); }

RpcInFlight::RpcInFlight(RpcInFlight&& other) noexcept
    : rpcs_(std::exchange(other.rpcs_, nullptr)) {}

RpcInFlight& RpcInFlight::operator=(RpcInFlight&& other) noexcept {
  if (this != &other) {
    if (rpcs_ != nullptr) rpcs_->Add(-1);
    rpcs_ = std::exchange(other.rpcs_, nullptr);
  }
  return *this;
}

RpcInFlight::~RpcInFlight() {
  if (rpcs_ != nullptr) rpcs_->Add(-1);
}

}  // namespace cloister::host
