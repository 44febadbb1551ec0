// Splitting a kernel's loop over the run's intra-op workers (BufferPool::workers(), set when a
// model is loaded with LoadOptions::threads above 1). Threading: `fn` runs on several threads
// at once, each on its own range; it must not write what another range reads.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "base/task_pool.h"
#include "enclave/runtime/kernel.h"
#include "enclave/runtime/plan.h"

namespace cloister::runtime {

// Elements a part must touch before a loop is worth splitting: handing a part to another thread
// and waking it costs a few microseconds, about what 2^15 simple element steps take.
inline constexpr int64_t kMinPartElements = int64_t{1} << 15;

// Calls fn(begin, end) on contiguous ranges that together cover [0, count): one range per
// worker, each of at least kMinPartElements elements of work (`item_cost` per item), or the
// whole range on this thread when there are no workers or too little work.
template <typename Fn>
void ForRanges(KernelContext& context, int64_t count, int64_t item_cost, Fn&& fn) {
  if (count <= 0) return;
  TaskPool* workers = context.pool().workers();
  int64_t parts = workers != nullptr ? std::min<int64_t>(workers->size(), count) : 1;
  parts = std::min(parts, std::max<int64_t>(1, count * std::max<int64_t>(item_cost, 1) /
                                                   kMinPartElements));
  if (parts <= 1) {
    fn(int64_t{0}, count);
    return;
  }
  workers
      ->Run(static_cast<size_t>(parts),
            [&](size_t task, int) {
              const int64_t p = static_cast<int64_t>(task);
              fn(count * p / parts, count * (p + 1) / parts);
              return absl::OkStatus();
            })
      .IgnoreError();  // the tasks return no error
}

}  // namespace cloister::runtime
