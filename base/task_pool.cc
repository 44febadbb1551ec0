#include "base/task_pool.h"

#include <algorithm>
#include <atomic>

#include "base/secret_bytes.h"

namespace cloister {

// One call to Run. `next` hands out task indices; the rest is guarded by the pool's mutex.
struct TaskPool::Job {
  const TaskFn* fn;
  size_t count;
  std::atomic<size_t> next{0};
  size_t done = 0;
  int active = 0;  // pool threads inside Work() on this job
  absl::Status error;
};

TaskPool::TaskPool(int threads) {
  for (int slot = 1; slot < threads; ++slot) {
    threads_.emplace_back([this, slot] { Loop(slot); });
  }
}

TaskPool::~TaskPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& thread : threads_) thread.join();
}

absl::Status TaskPool::Run(size_t count, const TaskFn& fn) {
  if (count <= 1 || threads_.empty()) {
    // Nothing to share: the caller runs the tasks without the pool's lock. Releasing that lock
    // wakes a waiting pool thread (a futex wake, seen in profiles as the caller's kernel time),
    // which the PCIe path paid on every small transfer: in a profile of the tiny LLM's emulated
    // steps, 5.8 % of the stepping thread's samples against 2.4 % on the plaintext path
    // (bench/results/2026-12-03-llm-cc-tax-wakeups.md).
    absl::Status first;
    for (size_t task = 0; task < count; ++task) {
      absl::Status status = fn(task, 0);
      if (!status.ok() && first.ok()) first = std::move(status);
    }
    return first;
  }
  Job job{&fn, count};
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(&job);
  }
  Work(job, 0);
  absl::MutexLock lock(&mu_);
  // The job lives on this stack: wait until no thread can touch it any more.
  mu_.Await(absl::Condition(
      +[](Job* j) { return j->done == j->count && j->active == 0; }, &job));
  auto it = std::find(queue_.begin(), queue_.end(), &job);
  if (it != queue_.end()) queue_.erase(it);
  return job.error;
}

void TaskPool::Work(Job& job, int slot) {
  for (;;) {
    const size_t task = job.next.fetch_add(1);
    if (task >= job.count) return;
    absl::Status status = (*job.fn)(task, slot);
    absl::MutexLock lock(&mu_);
    if (!status.ok() && job.error.ok()) job.error = std::move(status);
    ++job.done;
  }
}

void TaskPool::Loop(int slot) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(
        +[](TaskPool* pool) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // Await holds mu_
          return pool->stopping_ || !pool->queue_.empty();
        },
        this));
    if (stopping_) return;
    Job* job = queue_.front();
    if (job->next.load() >= job->count) {
      queue_.pop_front();  // every task is handed out; its owner waits for the last ones
      continue;
    }
    ++job->active;
    mu_.Unlock();
    Work(*job, slot);
    mu_.Lock();
    --job->active;
    // (`job` may be gone once the lock is released: its caller returns when it is done.)
    mu_.Unlock();
    // The tasks' plaintext passed through this thread's registers and stack (ciphers and
    // copies work in the vector registers): leave none of it behind while the thread waits.
    // After the job is released, so that its caller does not wait for the scrub as well (64 KiB
    // of stack, a few microseconds, on every operator of a model run split over the threads).
    ScrubStack(kStackScrubSize);
    ScrubVectorRegisters();
    mu_.Lock();
  }
}

}  // namespace cloister
