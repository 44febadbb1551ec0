// TaskPool: every task runs once, slots name stable threads, errors come back after the other
// tasks ran, and jobs from several callers overlap. Also built with ThreadSanitizer
// (scripts/tsan-scheduler.sh).
#include "base/task_pool.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace cloister {
namespace {

TEST(TaskPoolTest, RunsEveryTaskOnceAcrossTheCallerAndThePool) {
  TaskPool pool(3);
  EXPECT_EQ(pool.size(), 3);
  std::vector<std::atomic<int>> runs(200);
  absl::Mutex mu;
  std::set<std::pair<int, std::thread::id>> slots;  // each slot is always one thread
  ASSERT_TRUE(pool.Run(runs.size(),
                       [&](size_t task, int slot) {
                         runs[task].fetch_add(1);
                         EXPECT_GE(slot, 0);
                         EXPECT_LT(slot, 3);
                         absl::MutexLock lock(&mu);
                         slots.insert({slot, std::this_thread::get_id()});
                         return absl::OkStatus();
                       })
                  .ok());
  for (const auto& count : runs) EXPECT_EQ(count.load(), 1);
  std::set<int> seen;
  for (const auto& [slot, thread] : slots) {
    EXPECT_TRUE(seen.insert(slot).second) << "slot " << slot << " ran on two threads";
    if (slot == 0) {
      EXPECT_EQ(thread, std::this_thread::get_id());
    }
  }
}

TEST(TaskPoolTest, TheIntraOpOptionsKeepThePoolOffOneCpuAndRunEveryTask) {
  TaskPool pool(2, TaskPool::ForIntraOp());
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  std::atomic<int> pool_tasks{0}, wrong_affinity{0};
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> runs(8);
    absl::Status status = pool.Run(runs.size(), [&](size_t task, int slot) {
      runs[task].fetch_add(1);
      if (slot != 0) {
        pool_tasks.fetch_add(1);
        // A pool thread's affinity is the process's CPUs less one (the caller's, which may
        // have moved since; with one CPU, all of them).
        cpu_set_t mine;
        CPU_ZERO(&mine);
        const int expected = std::max(1, CPU_COUNT(&allowed) - 1);
        if (sched_getaffinity(0, sizeof(mine), &mine) != 0 || CPU_COUNT(&mine) != expected) {
          wrong_affinity.fetch_add(1);
        }
      }
      absl::SleepFor(absl::Microseconds(task % 3 == 0 ? 50 : 5));
      return task == 5 ? absl::InternalError("task 5") : absl::OkStatus();
    });
    EXPECT_EQ(status, absl::InternalError("task 5"));
    for (const auto& count : runs) EXPECT_EQ(count.load(), 1);
  }
  EXPECT_GT(pool_tasks.load(), 0) << "the pool thread ran no task in 50 jobs";
  EXPECT_EQ(wrong_affinity.load(), 0);
}

// The CPU time a thread has used, by its clock id.
absl::Duration CpuTimeOf(clockid_t clock) {
  timespec now{};
  clock_gettime(clock, &now);
  return absl::DurationFromTimespec(now);
}

// While a Hold lives, a pool thread that ran a job polls for the next (it uses CPU without a
// job); once the Hold is gone it sleeps, and without a Hold it never lingers: no thread is left
// spinning after a model run.
TEST(TaskPoolTest, APoolThreadLingersOnlyWhileTheHoldLives) {
  TaskPool::Options options;
  options.linger = absl::Seconds(5);
  TaskPool pool(2, options);
  // The pool thread's CPU clock, taken from inside one of its tasks.
  std::atomic<bool> have_clock{false};
  clockid_t clock{};
  auto find_clock = [&] {
    while (!have_clock.load()) {
      ASSERT_TRUE(pool.Run(2,
                           [&](size_t, int slot) {
                             if (slot != 0 && !have_clock.load()) {
                               pthread_getcpuclockid(pthread_self(), &clock);
                               have_clock.store(true);
                             }
                             absl::SleepFor(absl::Milliseconds(1));
                             return absl::OkStatus();
                           })
                      .ok());
    }
  };
  // No Hold: after its job the thread sleeps at once.
  find_clock();
  absl::SleepFor(absl::Milliseconds(20));
  absl::Duration before = CpuTimeOf(clock);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_LT(CpuTimeOf(clock) - before, absl::Milliseconds(20)) << "it lingered without a Hold";

  {
    TaskPool::Hold hold(&pool);
    have_clock.store(false);
    find_clock();
    // It polls now: its CPU time grows with no job to run (up to 2 s for a loaded machine).
    before = CpuTimeOf(clock);
    const absl::Time give_up = absl::Now() + absl::Seconds(2);
    while (CpuTimeOf(clock) - before < absl::Milliseconds(20) && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_GE(CpuTimeOf(clock) - before, absl::Milliseconds(20)) << "it did not linger";
    // A job posted while it lingers runs, on both threads or the caller alone.
    std::atomic<int> ran{0};
    ASSERT_TRUE(pool.Run(16,
                         [&](size_t, int) {
                           ran.fetch_add(1);
                           return absl::OkStatus();
                         })
                    .ok());
    EXPECT_EQ(ran.load(), 16);
  }
  // The Hold is gone: the thread stops polling within its next few polls and sleeps.
  absl::SleepFor(absl::Milliseconds(50));
  before = CpuTimeOf(clock);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_LT(CpuTimeOf(clock) - before, absl::Milliseconds(20)) << "it went on after the Hold";
}

TEST(TaskPoolTest, ReturnsTheFirstErrorAfterRunningTheOtherTasks) {
  TaskPool pool(2);
  std::atomic<int> ran{0};
  absl::Status status = pool.Run(10, [&](size_t task, int) {
    ran.fetch_add(1);
    return task == 3 ? absl::InternalError("task 3 failed") : absl::OkStatus();
  });
  EXPECT_EQ(status, absl::InternalError("task 3 failed"));
  EXPECT_EQ(ran.load(), 10);
}

TEST(TaskPoolTest, APoolOfOneRunsOnTheCallerAndJobsMayOverlap) {
  TaskPool single(1);
  EXPECT_EQ(single.size(), 1);
  ASSERT_TRUE(single
                  .Run(5,
                       [](size_t, int slot) {
                         EXPECT_EQ(slot, 0);
                         return absl::OkStatus();
                       })
                  .ok());
  TaskPool shared(2);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int job = 0; job < 50; ++job) {
        EXPECT_TRUE(shared
                        .Run(7,
                             [&](size_t, int) {
                               total.fetch_add(1);
                               return absl::OkStatus();
                             })
                        .ok());
      }
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(total.load(), 4 * 50 * 7);
}

}  // namespace
}  // namespace cloister
