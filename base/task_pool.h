// TaskPool: a fixed set of threads that work, together with the calling thread, through the
// tasks of a job. Run(count, fn) calls fn(task, slot) once for every task in [0, count) and
// returns when all have finished. `slot` names the thread running the task (0: the caller,
// 1 .. size()-1: the pool's own threads, each always the same one), so callers can keep state
// per thread, such as a keyed cipher context. Used by the PCIe path's chunk ciphers and by the
// enclave's batch runner, both of which handle tenants' plaintext: a pool thread therefore
// scrubs its vector registers and the stack its tasks used before it sleeps.
//
// Threading: Run may be called from many threads at once; pool threads take the oldest job
// with tasks left. The caller always works on its own job, so a job never waits for a pool
// thread to be free, and a pool of size 1 (no threads) runs every task on the caller.
// Ownership: `fn` is borrowed for the call. Destroying the pool while Run is in progress is a
// bug.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace cloister {

class TaskPool {
 public:
  using TaskFn = std::function<absl::Status(size_t task, int slot)>;

  struct Options {
    // A pool thread taking a job keeps off the CPU its caller posted it from (its CPU
    // affinity: the process's CPUs less that one, set again only when the caller's CPU
    // changes; best effort). No effect where the process has one CPU.
    bool off_callers_cpu = false;
    // How long a caller that finished its own tasks polls for the pool's last ones before it
    // sleeps on the pool's lock (zero: it sleeps at once).
    absl::Duration caller_poll = absl::ZeroDuration();
    // While a Hold is held on the pool: how long a pool thread that finished a job polls for
    // the next one before it scrubs and sleeps (zero, or no Hold: it scrubs and sleeps at
    // once). A thread that finds a job in that time takes it without being woken, and scrubs
    // only when it does go to sleep.
    absl::Duration linger = absl::ZeroDuration();
  };
  // For a model run's intra-op threads, whose jobs (one per operator) are tens to hundreds of
  // microseconds: Linux woke each of the two threads onto the CPU of the one that woke it, so
  // a caller and its pool thread took turns on one vCPU with the other idle, and the pool
  // thread missed half the jobs; keeping it off the caller's CPU, and the caller awake for
  // the last tasks (so that the pool thread's wake does not pull it over), ended that
  // (bench/results/2026-12-04-gathered-transfer.md).
  // And a pool thread lingers between one run's operators (Model holds the pool for each
  // run): the sleep and wake it paid per operator cost bert_mini about 5 % at 2 threads
  // (bench/results/2026-12-06-aliased-rows-and-lingering.md).
  static Options ForIntraOp() { return {true, absl::Microseconds(30), absl::Microseconds(500)}; }

  // `threads` counts the calling thread: a pool of N starts N-1 threads. At least 1.
  explicit TaskPool(int threads) : TaskPool(threads, Options{}) {}
  TaskPool(int threads, Options options);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Says that jobs will follow each other closely while it lives (one model run's operators):
  // the pool's threads linger between them (Options::linger), and stop lingering, scrub and
  // sleep once no Hold is left. Null: no pool, nothing held. Holds may overlap.
  class Hold {
   public:
    explicit Hold(TaskPool* pool) : pool_(pool) {
      if (pool_ != nullptr) pool_->holds_.fetch_add(1, std::memory_order_relaxed);
    }
    ~Hold() {
      if (pool_ != nullptr) pool_->holds_.fetch_sub(1, std::memory_order_relaxed);
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    TaskPool* const pool_;
  };

  // The calling thread plus the pool's threads.
  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // Runs every task; returns the first error a task returned (the other tasks still run).
  absl::Status Run(size_t count, const TaskFn& fn);

 private:
  struct Job;

  void Work(Job& job, int slot);
  void Loop(int slot);
  // Polls for a posted job while a Hold is held, for options_.linger at most; whether one was
  // seen.
  bool Linger();

  // Keeps the calling pool thread off `cpu` (the process's CPUs less that one); `excluded` is
  // the CPU it keeps off now (-1: none).
  void KeepOff(int cpu, int& excluded) const;

  const Options options_;
  std::vector<int> cpus_;  // the CPUs the process may run on, with off_callers_cpu
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<size_t> queued_{0};  // queue_.size(), read without the lock by lingering threads
  std::atomic<int> holds_{0};      // Holds alive
};

}  // namespace cloister
