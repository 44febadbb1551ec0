// CostModel: the learned execution time per request of each model, which the Scheduler charges
// at dispatch (deficit round robin) and uses to size best-effort batches. Before its first
// batch a model costs `initial_item_cost`; the first measurement replaces that guess and later
// ones are smoothed in (an exponentially weighted moving average).
//
// A plain value with no clock and no lock: the caller passes the measured times and guards the
// model (the Scheduler's mutex). Options are as CheckSchedulerOptions allows.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace cloister::host {

class CostModel {
 public:
  // The least a request costs, so that a batch always costs something.
  static constexpr absl::Duration kMinItemCost = absl::Microseconds(1);

  // smoothing: the weight of the newest measurement, in (0, 1].
  CostModel(absl::Duration initial_item_cost, double smoothing);

  // The current per-request estimate of `model_handle`.
  absl::Duration ItemCost(absl::string_view model_handle) const;

  // Learns from a finished batch of `count` (>= 1) requests of `model_handle` that ran for
  // `measured`. Returns the time to charge for it: `measured`, but at least kMinItemCost per
  // request.
  absl::Duration Learn(absl::string_view model_handle, int count, absl::Duration measured);

 private:
  const int64_t initial_item_cost_ns_;
  const double smoothing_;
  absl::flat_hash_map<std::string, int64_t> item_cost_ns_;
};

}  // namespace cloister::host
