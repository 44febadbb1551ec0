#include "host/enclave_client/function_enclave_client.h"

#include <utility>

namespace cloister::host {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

FunctionEnclaveClient::FunctionEnclaveClient(Handler handler, int threads)
    : handler_(std::move(handler)) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

FunctionEnclaveClient::~FunctionEnclaveClient() {
  std::deque<PendingCall> left;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
  {
    absl::MutexLock lock(&mu_);
    left.swap(pending_);
  }
  for (PendingCall& pending : left) pending.done(absl::UnavailableError("enclave worker exited"));
}

void FunctionEnclaveClient::Call(HostToEnclave call, Done done) {
  {
    absl::MutexLock lock(&mu_);
    call.set_call_id(next_call_id_++);
    if (!threads_.empty()) {
      if (!stopping_) {
        pending_.push_back(PendingCall{std::move(call), std::move(done)});
        return;
      }
    }
  }
  if (threads_.empty()) {
    Run(PendingCall{std::move(call), std::move(done)});
  } else {
    done(absl::UnavailableError("enclave worker exited"));
  }
}

void FunctionEnclaveClient::Run(PendingCall pending) {
  absl::StatusOr<EnclaveToHost> reply = handler_(pending.call);
  if (reply.ok()) {
    reply->set_call_id(pending.call.call_id());
    absl::Status valid = CheckReply(pending.call.call_case(), *reply);
    if (!valid.ok()) reply = valid;
  }
  {
    absl::MutexLock lock(&mu_);
    ++answered_count_;
  }
  pending.done(std::move(reply));
}

void FunctionEnclaveClient::WorkerLoop() {
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

uint64_t FunctionEnclaveClient::answered_count() const {
  absl::MutexLock lock(&mu_);
  return answered_count_;
}

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
