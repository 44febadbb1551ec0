// TaskPool: a fixed set of threads that work, together with the calling thread, through the
// tasks of a job. Run(count, fn) calls fn(task, slot) once for every task in [0, count) and
// returns when all have finished. `slot` names the thread running the task (0: the caller,
// 1 .. size()-1: the pool's own threads, each always the same one), so callers can keep state
// per thread, such as a keyed cipher context. Used by the PCIe path's chunk ciphers and by the
// enclave's batch runner, both of which handle tenants' plaintext: a pool thread therefore
// scrubs its vector registers and the stack its tasks used before it waits for the next job.
//
// Threading: Run may be called from many threads at once; pool threads take the oldest job
// with tasks left. The caller always works on its own job, so a job never waits for a pool
// thread to be free, and a pool of size 1 (no threads) runs every task on the caller.
// Ownership: `fn` is borrowed for the call. Destroying the pool while Run is in progress is a
// bug.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace cloister {

class TaskPool {
 public:
  using TaskFn = std::function<absl::Status(size_t task, int slot)>;

  // `threads` counts the calling thread: a pool of N starts N-1 threads. At least 1.
  explicit TaskPool(int threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // The calling thread plus the pool's threads.
  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // Runs every task; returns the first error a task returned (the other tasks still run).
  absl::Status Run(size_t count, const TaskFn& fn);

 private:
  struct Job;

  void Work(Job& job, int slot);
  void Loop(int slot);

  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace cloister
