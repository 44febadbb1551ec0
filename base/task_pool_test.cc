// TaskPool: every task runs once, slots name stable threads, errors come back after the other
// tasks ran, and jobs from several callers overlap. Also built with ThreadSanitizer
// (scripts/tsan-scheduler.sh).
#include "base/task_pool.h"

#include <sched.h>

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
