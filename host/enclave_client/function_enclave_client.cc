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
  if (IsStreamingCall(call.call_case())) {
    done(StreamingCallError());
    return;
  }
  Accept(PendingCall{std::move(call), std::move(done), nullptr});
}

uint64_t InProcessCalls::CallStream(HostToEnclave call, EnclaveClient::OnFrame on_frame,
                                    EnclaveClient::Done done) {
  return Accept(PendingCall{std::move(call), std::move(done), std::move(on_frame)});
}

uint64_t InProcessCalls::Accept(PendingCall pending) {
  uint64_t call_id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!dead_ && !stopping_) {
      call_id = next_call_id_++;
      pending.call.set_call_id(call_id);
      if (keep_history_) history_.push_back(pending.call);
      if (!runs_inline_) {
        pending_.push_back(std::move(pending));
        return call_id;
      }
    }
  }
  if (call_id == 0) {
    pending.done(WorkerExitedError());
    return 0;
  }
  Run(std::move(pending));
  return call_id;
}

void InProcessCalls::Cancel(uint64_t call_id) {
  {
    absl::MutexLock lock(&mu_);
    bool open = streams_.contains(call_id);
    for (const PendingCall& pending : pending_) {
      open = open || (pending.on_frame != nullptr && pending.call.call_id() == call_id);
    }
    if (call_id == 0 || !open) return;
  }
  Call(CancelCallFor(call_id), [](EnclaveClient::Reply) {});
}

void InProcessCalls::Run(PendingCall pending) {
  if (pending.on_frame == nullptr) {
    EnclaveClient::Reply reply = handler_(pending.call);
    Answer(std::move(pending), std::move(reply));
  } else {
    // Open before the handler runs, so that it can send more frames with Complete().
    const uint64_t call_id = pending.call.call_id();
    HostToEnclave call = pending.call;
    {
      absl::MutexLock lock(&mu_);
      OpenLocked(std::move(pending));
    }
    Deliver(call_id, handler_(call));
  }
  FailAllIfWorkerExited();
}

void InProcessCalls::Answer(PendingCall pending, EnclaveClient::Reply reply) {
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

void InProcessCalls::OpenLocked(PendingCall pending) {
  streams_.emplace(pending.call.call_id(),
                   OpenStream{pending.call.call_case(),
                              std::make_shared<EnclaveClient::OnFrame>(std::move(pending.on_frame)),
                              std::move(pending.done)});
}

bool InProcessCalls::Deliver(uint64_t call_id, EnclaveClient::Reply frame) {
  std::shared_ptr<EnclaveClient::OnFrame> on_frame;  // set while the stream stays open
  EnclaveClient::Done done;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(call_id);
    if (it == streams_.end()) return false;
    if (frame.ok()) {
      frame->set_call_id(call_id);
      absl::Status valid = CheckReply(it->second.call_case, *frame);
      if (!valid.ok()) frame = valid;
    }
    if (frame.ok() && !IsLastFrame(it->second.call_case, *frame)) {
      on_frame = it->second.on_frame;
    } else {
      done = std::move(it->second.done);
      streams_.erase(it);
      ++answered_count_;
    }
  }
  if (on_frame != nullptr) {
    (*on_frame)(*std::move(frame));
  } else {
    done(std::move(frame));
  }
  return true;
}

void InProcessCalls::FailAllIfWorkerExited() {
  bool worker_exited;
  {
    absl::MutexLock lock(&mu_);
    worker_exited = worker_exited_;
  }
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
    if (it == pending_.end()) {
      if (!streams_.contains(call_id)) return false;
    } else if (it->on_frame != nullptr) {
      OpenLocked(std::move(*it));  // its first frame
      pending_.erase(it);
    } else {
      found = std::move(*it);
      pending_.erase(it);
    }
  }
  if (found.done == nullptr) return Deliver(call_id, std::move(reply));
  Answer(std::move(found), std::move(reply));
  return true;
}

void InProcessCalls::FailAll(const absl::Status& status) {
  std::deque<PendingCall> failed;
  absl::flat_hash_map<uint64_t, OpenStream> failed_streams;
  {
    absl::MutexLock lock(&mu_);
    failed.swap(pending_);
    failed_streams.swap(streams_);
  }
  for (PendingCall& pending : failed) pending.done(status);
  for (auto& [call_id, stream] : failed_streams) stream.done(status);
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

size_t InProcessCalls::open_stream_count() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
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

uint64_t FunctionEnclaveClient::CallStream(HostToEnclave call, OnFrame on_frame, Done done) {
  return calls_.CallStream(std::move(call), std::move(on_frame), std::move(done));
}

void FunctionEnclaveClient::Cancel(uint64_t stream_id) { calls_.Cancel(stream_id); }

bool FunctionEnclaveClient::SendFrame(uint64_t stream_id, Reply frame) {
  return calls_.Complete(stream_id, std::move(frame));
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
