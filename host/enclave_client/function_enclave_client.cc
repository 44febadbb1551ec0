#include "host/enclave_client/function_enclave_client.h"

#include <utility>

namespace cloister::host {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

InProcessCalls::InProcessCalls(Handler handler, int threads, bool keep_history)
    : handler_(std::move(handler)),
      runs_inline_(handler_ != nullptr && threads == 0),
      keep_history_(keep_history) {
  if (handler_ == nullptr) return;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

InProcessCalls::~InProcessCalls() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
  FailAll(WorkerExitedError());
}

void InProcessCalls::Call(HostToEnclave call, EnclaveClient::Done done) {
  bool accepted;
  {
    absl::MutexLock lock(&mu_);
    accepted = !dead_ && !stopping_;
    if (accepted) {
      call.set_call_id(next_call_id_++);
      if (keep_history_) history_.push_back(call);
      if (!runs_inline_) {
        pending_.push_back(PendingCall{std::move(call), std::move(done)});
        return;
      }
    }
  }
  if (accepted) {
    Run(PendingCall{std::move(call), std::move(done)});
  } else {
    done(WorkerExitedError());
  }
}

void InProcessCalls::Run(PendingCall pending) {
  EnclaveClient::Reply reply = handler_(pending.call);
  Answer(std::move(pending), std::move(reply));
}

void InProcessCalls::Answer(PendingCall pending, EnclaveClient::Reply reply) {
  if (reply.ok()) {
    reply->set_call_id(pending.call.call_id());
    absl::Status valid = CheckReply(pending.call.call_case(), *reply);
    if (!valid.ok()) reply = valid;
  }
  bool worker_exited;
  {
    absl::MutexLock lock(&mu_);
    ++answered_count_;
    worker_exited = worker_exited_;
  }
  pending.done(std::move(reply));
  if (worker_exited) FailAll(WorkerExitedError());
}

void InProcessCalls::WorkerLoop() {
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
    Run(std::move(next));
  }
}

bool InProcessCalls::Complete(uint64_t call_id, EnclaveClient::Reply reply) {
  PendingCall found;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.begin();
    while (it != pending_.end() && it->call.call_id() != call_id) ++it;
    if (it == pending_.end()) return false;
    found = std::move(*it);
    pending_.erase(it);
  }
  Answer(std::move(found), std::move(reply));
  return true;
}

void InProcessCalls::FailAll(const absl::Status& status) {
  std::deque<PendingCall> failed;
  {
    absl::MutexLock lock(&mu_);
    failed.swap(pending_);
  }
  for (PendingCall& pending : failed) pending.done(status);
}

bool InProcessCalls::WaitForPending(size_t count, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, count]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_.size() >= count; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

std::vector<HostToEnclave> InProcessCalls::Pending() const {
  absl::MutexLock lock(&mu_);
  std::vector<HostToEnclave> calls;
  for (const PendingCall& pending : pending_) calls.push_back(pending.call);
  return calls;
}

std::vector<HostToEnclave> InProcessCalls::History() const {
  absl::MutexLock lock(&mu_);
  return history_;
}

void InProcessCalls::SetDead() {
  absl::MutexLock lock(&mu_);
  dead_ = true;
}

absl::Status InProcessCalls::WorkerExited() {
  absl::MutexLock lock(&mu_);
  dead_ = true;
  worker_exited_ = true;
  return WorkerExitedError();
}

uint64_t InProcessCalls::answered_count() const {
  absl::MutexLock lock(&mu_);
  return answered_count_;
}

FunctionEnclaveClient::FunctionEnclaveClient(Handler handler, int threads)
    : calls_(std::move(handler), threads, /*keep_history=*/false) {}

FunctionEnclaveClient::~FunctionEnclaveClient() = default;

void FunctionEnclaveClient::Call(HostToEnclave call, Done done) {
  calls_.Call(std::move(call), std::move(done));
}

uint64_t FunctionEnclaveClient::answered_count() const { return calls_.answered_count(); }

FunctionEnclaveClient::Handler NoOpInferHandler(absl::Duration execution) {
  int64_t execution_ns = absl::ToInt64Nanoseconds(execution);
  return [execution_ns](const HostToEnclave& call) -> absl::StatusOr<EnclaveToHost> {
    if (call.call_case() != HostToEnclave::kInferBatch) {
      return absl::UnimplementedError("the no-op executor only answers inference batches");
    }
    EnclaveToHost reply;
    boundary::v1::InferBatchResult* result = reply.mutable_infer_batch();
    result->mutable_replies()->Reserve(call.infer_batch().items_size());
    for (const boundary::v1::ForwardedRequest& item : call.infer_batch().items()) {
      boundary::v1::EnclaveReply* out = result->add_replies();
      out->set_request_id(item.request_id());
      out->set_sequence(item.sequence());
    }
    result->set_execution_ns(execution_ns);
    return reply;
  };
}

}  // namespace cloister::host
