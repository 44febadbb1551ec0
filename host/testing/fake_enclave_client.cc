#include "host/testing/fake_enclave_client.h"

#include <utility>

namespace cloister::host::testing {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

namespace {

EnclaveClient::Reply Checked(HostToEnclave::CallCase call_case, EnclaveClient::Reply reply) {
  if (!reply.ok()) return reply;
  absl::Status status = CheckReply(call_case, *reply);
  if (!status.ok()) return status;
  return reply;
}

}  // namespace

FakeEnclaveClient::FakeEnclaveClient() = default;

FakeEnclaveClient::FakeEnclaveClient(std::unique_ptr<FakeEnclave> enclave)
    : enclave_(std::move(enclave)) {
  auto_thread_ = std::thread([this] { AutoLoop(); });
}

FakeEnclaveClient::~FakeEnclaveClient() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (auto_thread_.joinable()) auto_thread_.join();
  FailAll(absl::UnavailableError("enclave worker exited"));
}

void FakeEnclaveClient::Call(HostToEnclave call, Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!dead_) {
      call.set_call_id(next_call_id_++);
      history_.push_back(call);
      pending_.push_back(PendingCall{std::move(call), std::move(done)});
      return;
    }
  }
  done(absl::UnavailableError("enclave worker exited"));
}

void FakeEnclaveClient::AutoLoop() {
  while (true) {
    PendingCall next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !pending_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (pending_.empty()) return;
      next = std::move(pending_.front());
      pending_.pop_front();
    }
    std::optional<EnclaveToHost> reply = enclave_->Handle(next.call);
    if (!reply.has_value()) {
      SetDead();
      next.done(absl::UnavailableError("enclave worker exited"));
      FailAll(absl::UnavailableError("enclave worker exited"));
      continue;
    }
    next.done(Checked(next.call.call_case(), *std::move(reply)));
  }
}

bool FakeEnclaveClient::WaitForPending(size_t count, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, count]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_.size() >= count; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

std::vector<HostToEnclave> FakeEnclaveClient::Pending() const {
  absl::MutexLock lock(&mu_);
  std::vector<HostToEnclave> calls;
  for (const PendingCall& pending : pending_) calls.push_back(pending.call);
  return calls;
}

bool FakeEnclaveClient::Complete(uint64_t call_id, absl::StatusOr<EnclaveToHost> reply) {
  PendingCall found;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.begin();
    while (it != pending_.end() && it->call.call_id() != call_id) ++it;
    if (it == pending_.end()) return false;
    found = std::move(*it);
    pending_.erase(it);
  }
  if (reply.ok()) reply->set_call_id(call_id);
  found.done(Checked(found.call.call_case(), std::move(reply)));
  return true;
}

void FakeEnclaveClient::FailAll(const absl::Status& status) {
  std::deque<PendingCall> failed;
  {
    absl::MutexLock lock(&mu_);
    failed.swap(pending_);
  }
  for (PendingCall& pending : failed) pending.done(status);
}

std::vector<HostToEnclave> FakeEnclaveClient::History() const {
  absl::MutexLock lock(&mu_);
  return history_;
}

void FakeEnclaveClient::SetDead() {
  absl::MutexLock lock(&mu_);
  dead_ = true;
}

}  // namespace cloister::host::testing
