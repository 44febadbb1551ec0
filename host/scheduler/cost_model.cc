#include "host/scheduler/cost_model.h"

#include <algorithm>

#include "base/status.h"

namespace cloister::host {

CostModel::CostModel(absl::Duration initial_item_cost, double smoothing)
    : initial_item_cost_ns_(absl::ToInt64Nanoseconds(initial_item_cost)), smoothing_(smoothing) {}

absl::Duration CostModel::ItemCost(absl::string_view model_handle) const {
  auto it = item_cost_ns_.find(model_handle);
  return absl::Nanoseconds(it != item_cost_ns_.end() ? it->second : initial_item_cost_ns_);
}

absl::Duration CostModel::Learn(absl::string_view model_handle, int count,
                                absl::Duration measured) {
  CLOISTER_CHECK(count >= 1);
  const int64_t min_item_ns = absl::ToInt64Nanoseconds(kMinItemCost);
  const int64_t measured_ns = std::max(absl::ToInt64Nanoseconds(measured), min_item_ns * count);
  const int64_t per_item = measured_ns / count;
  auto [it, inserted] = item_cost_ns_.try_emplace(model_handle, per_item);
  if (!inserted) {
    it->second += static_cast<int64_t>(smoothing_ * static_cast<double>(per_item - it->second));
    it->second = std::max(it->second, min_item_ns);
  }
  return absl::Nanoseconds(measured_ns);
}

}  // namespace cloister::host
