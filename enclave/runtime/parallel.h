// Splitting a kernel's loop over the run's intra-op workers (BufferPool::workers(), set when a
// model is loaded with LoadOptions::threads above 1). Threading: a part runs on several threads
// at once, each on its own range; it must not write what another range reads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "base/task_pool.h"
#include "enclave/runtime/kernel.h"
#include "enclave/runtime/plan.h"

namespace cloister::runtime {

// Elements a part must touch before a loop is worth splitting: handing a part to another thread
// and waking it costs a few microseconds, about what 2^15 simple element steps take.
inline constexpr int64_t kMinPartElements = int64_t{1} << 15;

// The parts `count` items of `work` in all split into over `workers`: at most one per worker
// and per item, each of at least `min_work`; 1 without workers.
inline int64_t PartsFor(const TaskPool* workers, int64_t count, int64_t work, int64_t min_work) {
  const int64_t parts = workers != nullptr ? std::min<int64_t>(workers->size(), count) : 1;
  return std::max<int64_t>(1, std::min(parts, work / min_work));
}

// Calls part(first, last) (returning absl::Status) on `parts` contiguous ranges of [0, count):
// on this thread when there is one part, else side by side on `workers`. Returns the first
// error.
template <typename Part>
absl::Status RunInParts(TaskPool* workers, int64_t count, int64_t parts, Part&& part) {
  if (parts <= 1 || workers == nullptr) return part(int64_t{0}, count);
  return workers->Run(static_cast<size_t>(parts), [&](size_t task, int) {
    const int64_t p = static_cast<int64_t>(task);
    return part(count * p / parts, count * (p + 1) / parts);
  });
}

// Calls fn(begin, end) on contiguous ranges that together cover [0, count): one range per
// worker, each of at least kMinPartElements elements of work (`item_cost` per item), or the
// whole range on this thread when there are no workers (null) or too little work.
template <typename Fn>
void ForRanges(TaskPool* workers, int64_t count, int64_t item_cost, Fn&& fn) {
  if (count <= 0) return;
  const int64_t parts =
      PartsFor(workers, count, count * std::max<int64_t>(item_cost, 1), kMinPartElements);
  RunInParts(workers, count, parts,
             [&](int64_t first, int64_t last) {
               fn(first, last);
               return absl::OkStatus();
             })
      .IgnoreError();  // the parts return no error
}

// ForRanges over the workers of the run `context` belongs to.
template <typename Fn>
void ForRanges(KernelContext& context, int64_t count, int64_t item_cost, Fn&& fn) {
  ForRanges(context.pool().workers(), count, item_cost, std::forward<Fn>(fn));
}

}  // namespace cloister::runtime
