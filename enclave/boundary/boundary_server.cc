#include "enclave/boundary/boundary_server.h"

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"
#include "base/secret_bytes.h"
#include "proto/error_reason.h"
#include "proto/frame.h"

namespace cloister::enclave {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

absl::StatusOr<HostToEnclave> ParseHostFrame(absl::string_view frame) {
  HostToEnclave call;
  if (frame.size() > static_cast<size_t>(INT32_MAX) ||
      !call.ParseFromArray(frame.data(), static_cast<int>(frame.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("boundary frame of ", frame.size(), " bytes is not a HostToEnclave message"));
  }
  return call;
}

namespace {

// The calls read from the host and not yet taken by a worker.
class CallQueue {
 public:
  void Push(HostToEnclave call) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    calls_.push_back(std::move(call));
  }
  // After Close, Pop hands out the calls still queued, then returns false.
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  // Waits for a call; false once the queue is closed and empty.
  bool Pop(HostToEnclave& call) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &CallQueue::ReadyLocked));
    if (calls_.empty()) return false;
    call = std::move(calls_.front());
    calls_.pop_front();
    return true;
  }

 private:
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closing_ || !calls_.empty();
  }

  absl::Mutex mu_;
  std::deque<HostToEnclave> calls_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

// Frames to the host's socket, one at a time, until Close().
class SocketSink : public FrameSink {
 public:
  explicit SocketSink(int fd) : fd_(fd) {}
  void Write(const EnclaveToHost& frame) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    // A failed write shows on the read side too, which ends ServeBoundary's loop.
    (void)boundary::WriteMessageFrame(fd_, frame);
  }
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

 private:
  const int fd_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::Status ServeBoundary(int fd, const CallHandler& handler, int threads) {
  CallQueue queue;
  auto sink = std::make_shared<SocketSink>(fd);
  auto reply = [&](const EnclaveToHost& message) { sink->Write(message); };
  // Streams still running when the host goes away must not write to a socket this function
  // no longer owns.
  struct CloseOnReturn {
    SocketSink* sink;
    ~CloseOnReturn() { sink->Close(); }
  } close_on_return{sink.get()};
  const std::shared_ptr<FrameSink> shared_sink = sink;

  std::vector<std::thread> workers;
  for (int i = 0; i < std::max(1, threads); ++i) {
    workers.emplace_back([&] {
      while (true) {
        HostToEnclave call;
        if (!queue.Pop(call)) return;
        std::optional<EnclaveToHost> answer = handler(std::move(call), shared_sink);
        if (answer) reply(*answer);
        // The handler opened sealed requests and models on this thread's stack, and its
        // copies left their last bytes in the vector registers.
        ScrubStack(kStackScrubSize);
        ScrubVectorRegisters();
      }
    });
  }

  absl::Status status;
  std::string buffer;  // reused from frame to frame
  while (true) {
    auto frame = boundary::ReadFrameInto(fd, buffer);
    if (!frame.ok()) {
      if (!absl::IsOutOfRange(frame.status())) status = frame.status();
      break;
    }
    auto call = ParseHostFrame(*frame);
    if (!call.ok()) {
      // Without a parsed call id there is no one to answer: report and go on.
      Log(LogLevel::kWarning, "boundary_frame_refused", {{"reason", std::string(call.status().message())}});
      EnclaveToHost error;
      proto::SetBoundaryStatus(call.status(), *error.mutable_status());
      reply(error);
      continue;
    }
    queue.Push(std::move(*call));
  }
  queue.Close();
  for (auto& t : workers) t.join();
  return status;
}

}  // namespace cloister::enclave
