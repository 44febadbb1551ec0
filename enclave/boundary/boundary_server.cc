#include "enclave/boundary/boundary_server.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/secret_bytes.h"
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

absl::Status ServeBoundary(int fd, const CallHandler& handler, int threads) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<HostToEnclave> queue;
  bool closing = false;
  std::mutex write_mu;
  absl::Status write_status;

  auto reply = [&](const EnclaveToHost& message) {
    std::lock_guard<std::mutex> lock(write_mu);
    absl::Status st = boundary::WriteMessageFrame(fd, message);
    if (!st.ok() && write_status.ok()) write_status = st;
  };

  std::vector<std::thread> workers;
  for (int i = 0; i < std::max(1, threads); ++i) {
    workers.emplace_back([&] {
      while (true) {
        HostToEnclave call;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return closing || !queue.empty(); });
          if (queue.empty()) return;
          call = std::move(queue.front());
          queue.pop_front();
        }
        reply(handler(std::move(call)));
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
      error.mutable_status()->set_code(static_cast<int>(call.status().code()));
      error.mutable_status()->set_message(std::string(call.status().message()));
      reply(error);
      continue;
    }
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(std::move(*call));
    cv.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    closing = true;
  }
  cv.notify_all();
  for (auto& t : workers) t.join();
  return status;
}

}  // namespace cloister::enclave
