#include "host/server/generate_reactor.h"

#include <utility>

#include "host/server/cloister_service.h"

namespace cloister::host {

using api::v1::SealedChunk;
using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

GenerateReactor::GenerateReactor(RpcInFlight in_flight) : in_flight_(std::move(in_flight)) {}

void GenerateReactor::Start(EnclaveClient* worker, HostToEnclave call, std::string request_id,
                            OnStreamEnd on_stream_end) {
  worker_ = worker;
  request_id_ = std::move(request_id);
  on_stream_end_ = std::move(on_stream_end);
  references_.fetch_add(1);  // the stream's, until its `done`
  {
    absl::MutexLock lock(&mu_);
    timing_.started = absl::Now();
  }
  const uint64_t stream_id = worker_->CallStream(
      std::move(call), [this](EnclaveToHost frame) { OnFrame(std::move(frame)); },
      [this](EnclaveClient::Reply last) { OnStreamDone(std::move(last)); });
  {
    absl::MutexLock lock(&mu_);
    stream_id_ = stream_id;
  }
  // A cancellation that came before the id was known is sent now.
  CancelStream();
  Unref();
}

void GenerateReactor::Refuse(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    stream_ended_ = true;
    end_ = status;
  }
  Next();
  Unref();
}

void GenerateReactor::OnFrame(EnclaveToHost frame) {
  absl::StatusOr<SealedChunk> chunk = ToChunk(frame);
  {
    absl::MutexLock lock(&mu_);
    timing_.chunk_times.push_back(absl::Now());
    if (end_.has_value()) return;  // ending already: the chunk would not be written
    if (chunk.ok()) {
      queue_.push_back(*std::move(chunk));
    } else {
      EndEarlyLocked(chunk.status());
    }
  }
  CancelStream();
  Next();
}

void GenerateReactor::OnStreamDone(EnclaveClient::Reply last) {
  Timing timing;
  {
    absl::MutexLock lock(&mu_);
    stream_ended_ = true;
    if (last.ok()) timing_.chunk_times.push_back(absl::Now());
    timing = timing_;
    if (!end_.has_value()) {
      absl::StatusOr<SealedChunk> chunk =
          last.ok() ? ToChunk(*last) : absl::StatusOr<SealedChunk>(last.status());
      if (chunk.ok()) {
        queue_.push_back(*std::move(chunk));
        end_ = absl::OkStatus();
      } else {
        EndEarlyLocked(chunk.status());
      }
    }
  }
  // Before the final chunk can reach the client: a client that starts its next generation as
  // soon as this one has ended must find the admission slot free again.
  if (on_stream_end_) on_stream_end_(last, timing);
  Next();
  Unref();
}

absl::StatusOr<SealedChunk> GenerateReactor::ToChunk(EnclaveToHost& frame) const {
  boundary::v1::GenerateResult& result = *frame.mutable_generate();
  if (result.request_id() != request_id_) {
    return absl::InternalError("enclave streamed a chunk of a different request id");
  }
  SealedChunk chunk;
  chunk.set_sequence(result.sequence());
  chunk.set_chunk(result.chunk());
  chunk.set_final(result.final());
  chunk.set_ciphertext(std::move(*result.mutable_ciphertext()));
  return chunk;
}

void GenerateReactor::EndEarlyLocked(const absl::Status& status) {
  queue_.clear();
  if (!end_.has_value() || end_->ok()) end_ = status;
  if (!stream_ended_) cancel_wanted_ = true;
}

void GenerateReactor::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    // The client is gone (or the RPC was cancelled): nothing more can be written.
    if (!ok) EndEarlyLocked(absl::CancelledError("the client went away"));
  }
  CancelStream();
  Next();
}

void GenerateReactor::OnCancel() {
  {
    absl::MutexLock lock(&mu_);
    EndEarlyLocked(absl::CancelledError("the client cancelled the generation"));
  }
  CancelStream();
  Next();
}

void GenerateReactor::OnDone() { Unref(); }

void GenerateReactor::Next() {
  enum class Action { kNone, kWrite, kFinish } action = Action::kNone;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (writing_ || finished_) return;
    if (!queue_.empty()) {
      writing_chunk_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      action = Action::kWrite;
    } else if (end_.has_value()) {
      finished_ = true;
      status = *end_;
      action = Action::kFinish;
    }
  }
  // gRPC runs OnWriteDone on its own threads, never inside StartWrite, and `writing_` keeps
  // every other thread away from `writing_chunk_` until then.
  if (action == Action::kWrite) StartWrite(&writing_chunk_);
  if (action == Action::kFinish) Finish(ToGrpcStatus(status));
}

void GenerateReactor::CancelStream() {
  uint64_t stream_id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!cancel_wanted_ || cancel_sent_ || stream_ended_ || stream_id_ == 0) return;
    cancel_sent_ = true;
    stream_id = stream_id_;
  }
  worker_->Cancel(stream_id);
}

void GenerateReactor::Unref() {
  if (references_.fetch_sub(1) == 1) delete this;
}

}  // namespace cloister::host
