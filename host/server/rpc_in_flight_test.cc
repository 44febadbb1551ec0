#include "host/server/rpc_in_flight.h"

#include <memory>
#include <thread>
#include <utility>

#include "gtest/gtest.h"

namespace cloister::host {
namespace {

TEST(RpcInFlightTest, CountsWhileItLivesAndMovesItsCount) {
  InFlightRpcs rpcs;
  EXPECT_EQ(rpcs.count(), 0);
  {
    RpcInFlight first(&rpcs);
    EXPECT_EQ(rpcs.count(), 1);
    RpcInFlight moved(std::move(first));  // still one RPC
    EXPECT_EQ(rpcs.count(), 1);
    RpcInFlight second(&rpcs);
    EXPECT_EQ(rpcs.count(), 2);
    second = std::move(moved);  // second's own RPC ends; it takes over the first one's
    EXPECT_EQ(rpcs.count(), 1);
  }
  EXPECT_EQ(rpcs.count(), 0);
}

TEST(RpcInFlightTest, DrainRefusesNewRpcsAndWaitsForTheCountedOnes) {
  InFlightRpcs rpcs;
  EXPECT_TRUE(rpcs.CheckAccepting().ok());
  auto running = std::make_unique<RpcInFlight>(&rpcs);
  rpcs.BeginDrain();
  absl::Status refused = rpcs.CheckAccepting();
  EXPECT_TRUE(absl::IsUnavailable(refused));
  EXPECT_EQ(refused.message(), "cloisterd is shutting down");
  EXPECT_FALSE(rpcs.WaitUntilIdle(absl::Milliseconds(10)));
  std::thread finishing([&running] {
    absl::SleepFor(absl::Milliseconds(20));
    running.reset();
  });
  EXPECT_TRUE(rpcs.WaitUntilIdle(absl::Seconds(10)));
  finishing.join();
  EXPECT_EQ(rpcs.count(), 0);
}

}  // namespace
}  // namespace cloister::host
