// SerialWorker: one background thread that runs posted tasks in order. cloisterd uses it for the
// blocking file work of model uploads and deletes (reading a staged model back, fsync and rename
// on commit), so neither gRPC threads nor the enclave client's completion thread wait on disk.
// Threading: Post() is thread-safe. Ownership: owns its thread; the destructor runs every task
// already posted, then joins.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace cloister::host {

class SerialWorker {
 public:
  SerialWorker();
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `task`. After the destructor has started, tasks still run (on the caller's thread),
  // so no posted work is ever dropped.
  void Post(std::function<void()> task);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace cloister::host
