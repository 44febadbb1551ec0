#include "base/task_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>

#include "absl/time/clock.h"
#include "base/secret_bytes.h"

namespace cloister {

// One call to Run. `next` hands out task indices; the rest is guarded by the pool's mutex.
struct TaskPool::Job {
  const TaskFn* fn;
  size_t count;
  int caller_cpu = -1;  // where the caller posted it from (off_callers_cpu only)
  // Every task done and no pool thread on it: the caller may return (set by MarkProgress, under the
  // lock).
  std::atomic<bool> finished{false};
  std::atomic<size_t> next{0};
  size_t done = 0;
  int active = 0;  // pool threads inside Work() on this job
  absl::Status error;

  // After `done` or `active` changed, under the pool's lock.
  void MarkProgress() {
    if (done == count && active == 0) finished.store(true, std::memory_order_release);
  }
};

TaskPool::TaskPool(int threads, Options options) : options_(options) {
  if (options_.off_callers_cpu && threads > 1) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) cpus_.push_back(cpu);
      }
    }
  }
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
  if (cpus_.size() > 1) job.caller_cpu = sched_getcpu();
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(&job);
    queued_.store(queue_.size(), std::memory_order_release);
  }
  Work(job, 0);
  if (options_.caller_poll > absl::ZeroDuration()) {
    const absl::Time until = absl::Now() + options_.caller_poll;
    // The clock only every 64 polls: reading it costs more than a poll.
    for (int polls = 0; !job.finished.load(std::memory_order_acquire); ++polls) {
      if (polls % 64 == 63 && absl::Now() >= until) break;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
  absl::MutexLock lock(&mu_);
  // The job lives on this stack: wait until no thread can touch it any more.
  mu_.Await(absl::Condition(
      +[](Job* j) { return j->finished.load(std::memory_order_relaxed); }, &job));
  auto it = std::find(queue_.begin(), queue_.end(), &job);
  if (it != queue_.end()) queue_.erase(it);
  queued_.store(queue_.size(), std::memory_order_release);
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
    job.MarkProgress();
  }
}

void TaskPool::KeepOff(int cpu, int& excluded) const {
  if (cpu < 0 || cpu == excluded) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int allowed : cpus_) {
    if (allowed != cpu) CPU_SET(allowed, &set);
  }
  // Best effort: when it fails (the operator narrowed the process's CPUs since), the thread
  // runs where the scheduler puts it, as without the option.
  if (CPU_COUNT(&set) > 0 && sched_setaffinity(0, sizeof(set), &set) == 0) excluded = cpu;
}

bool TaskPool::Linger() {
  if (options_.linger <= absl::ZeroDuration()) return false;
  const absl::Time until = absl::Now() + options_.linger;
  // The clock only every 64 polls, as the caller's poll in Run.
  for (int polls = 0;; ++polls) {
    if (queued_.load(std::memory_order_acquire) > 0) return true;
    if (holds_.load(std::memory_order_relaxed) == 0) return false;
    if (polls % 64 == 63) {
      if (absl::Now() >= until) return false;
      // Give the CPU to a thread that waits for it here (the caller, moved onto this CPU).
      sched_yield();
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

void TaskPool::Loop(int slot) {
  int excluded = -1;   // the CPU this thread keeps off now
  bool dirty = false;  // it ran tasks since it last scrubbed
  mu_.Lock();
  for (;;) {
    if (queue_.empty() && !stopping_) {
      mu_.Unlock();
      // Nothing to take: poll a while for the next job (an operator's job follows the last
      // one within microseconds in a model run), else scrub and sleep. The tasks' plaintext
      // passed through this thread's registers and stack (ciphers and copies work in the
      // vector registers): none of it is left behind while the thread sleeps. (64 KiB of
      // stack a scrub, a few microseconds and the core's L1: not paid between two jobs.)
      const bool job_posted = dirty && Linger();
      if (!job_posted && dirty) {
        ScrubStack(kStackScrubSize);
        ScrubVectorRegisters();
        dirty = false;
      }
      mu_.Lock();
      if (!job_posted) {
        mu_.Await(absl::Condition(
            +[](TaskPool* pool) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // Await holds mu_
              return pool->stopping_ || !pool->queue_.empty();
            },
            this));
      }
      continue;
    }
    if (stopping_) break;
    Job* job = queue_.front();
    if (job->next.load() >= job->count) {
      queue_.pop_front();  // every task is handed out; its owner waits for the last ones
      queued_.store(queue_.size(), std::memory_order_release);
      continue;
    }
    ++job->active;
    const int caller_cpu = job->caller_cpu;
    mu_.Unlock();
    KeepOff(caller_cpu, excluded);
    Work(*job, slot);
    dirty = true;
    mu_.Lock();
    --job->active;
    // Once the lock is released, `job` may be gone: its caller returns when it is done.
    job->MarkProgress();
  }
  mu_.Unlock();
  if (dirty) {
    ScrubStack(kStackScrubSize);
    ScrubVectorRegisters();
  }
}

}  // namespace cloister
