#include "host/scheduler/cost_model.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace cloister::host {
namespace {

constexpr char kModelA[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
constexpr char kModelB[] = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

TEST(CostModelTest, AModelCostsTheInitialGuessUntilItsFirstBatch) {
  CostModel model(absl::Milliseconds(1), /*smoothing=*/0.25);
  EXPECT_EQ(model.ItemCost(kModelA), absl::Milliseconds(1));
  model.Learn(kModelA, /*count=*/2, absl::Milliseconds(10));
  EXPECT_EQ(model.ItemCost(kModelA), absl::Milliseconds(5));
  EXPECT_EQ(model.ItemCost(kModelB), absl::Milliseconds(1)) << "each model learns on its own";
}

TEST(CostModelTest, LaterMeasurementsAreSmoothedIn) {
  CostModel model(absl::Milliseconds(1), /*smoothing=*/0.5);
  model.Learn(kModelA, /*count=*/2, absl::Milliseconds(8));  // 4 ms each replaces the guess
  model.Learn(kModelA, /*count=*/2, absl::Milliseconds(4));  // 2 ms each: half-way
  EXPECT_EQ(model.ItemCost(kModelA), absl::Milliseconds(3));
  model.Learn(kModelA, /*count=*/1, absl::Milliseconds(7));
  EXPECT_EQ(model.ItemCost(kModelA), absl::Milliseconds(5));
}

TEST(CostModelTest, FullSmoothingTakesTheNewestMeasurement) {
  CostModel model(absl::Milliseconds(1), /*smoothing=*/1);
  model.Learn(kModelA, /*count=*/1, absl::Milliseconds(9));
  model.Learn(kModelA, /*count=*/4, absl::Milliseconds(8));
  EXPECT_EQ(model.ItemCost(kModelA), absl::Milliseconds(2));
}

TEST(CostModelTest, ABatchAlwaysCostsSomething) {
  CostModel model(absl::Milliseconds(1), /*smoothing=*/1);
  // A batch measured at nothing (or less) is charged the floor per request, and learnt as it.
  EXPECT_EQ(model.Learn(kModelA, /*count=*/4, absl::ZeroDuration()), 4 * CostModel::kMinItemCost);
  EXPECT_EQ(model.ItemCost(kModelA), CostModel::kMinItemCost);
  EXPECT_EQ(model.Learn(kModelA, /*count=*/2, absl::Nanoseconds(-5)), 2 * CostModel::kMinItemCost);
  // Above the floor the charge is the measurement.
  EXPECT_EQ(model.Learn(kModelB, /*count=*/3, absl::Microseconds(7)), absl::Microseconds(7));
}

}  // namespace
}  // namespace cloister::host
