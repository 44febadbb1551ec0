#include "host/scheduler/arrival_predictor.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace cloister::host {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

absl::Time At(absl::Duration since_start) { return kStart + since_start; }

// Arrivals every `period` from `first` on, `count` of them.
void ArriveEvery(ArrivalPredictor& predictor, absl::Duration first, absl::Duration period,
                 int count) {
  for (int i = 0; i < count; ++i) predictor.Arrived(At(first + i * period));
}

TEST(ArrivalPredictorTest, FiveEvenArrivalsMakeATrustedPeriod) {
  ArrivalPredictor predictor;
  EXPECT_EQ(predictor.arrival_count(), 0);
  EXPECT_EQ(predictor.last_arrival(), absl::InfinitePast());
  EXPECT_FALSE(predictor.PeriodTrusted());
  ArriveEvery(predictor, absl::ZeroDuration(), absl::Milliseconds(20), 4);
  // The jitter starts at half a gap and shrinks by a quarter per agreeing gap: 10, 7.5, 5.625 ms.
  EXPECT_EQ(predictor.jitter(), absl::Microseconds(5625));
  EXPECT_FALSE(predictor.PeriodTrusted()) << "three gaps are not enough";
  predictor.Arrived(At(absl::Milliseconds(80)));
  EXPECT_TRUE(predictor.PeriodTrusted());
  EXPECT_EQ(predictor.arrival_count(), 5);
  EXPECT_EQ(predictor.period(), absl::Milliseconds(20));
  EXPECT_EQ(predictor.jitter(), absl::Nanoseconds(4'218'750));
  EXPECT_EQ(predictor.last_arrival(), At(absl::Milliseconds(80)));
  EXPECT_EQ(predictor.next_due(), At(absl::Milliseconds(100)));
}

TEST(ArrivalPredictorTest, PeriodsOverASecondAreNeverTrusted) {
  ArrivalPredictor predictor;
  ArriveEvery(predictor, absl::ZeroDuration(), absl::Seconds(2), 20);
  EXPECT_EQ(predictor.period(), absl::Seconds(2));
  EXPECT_FALSE(predictor.PeriodTrusted());
  EXPECT_EQ(predictor.HoldBackUntil(At(absl::Seconds(39)), absl::Seconds(1), absl::Seconds(1)),
            absl::InfinitePast());
}

TEST(ArrivalPredictorTest, RoomIsTheTimeToTheNextArrivalLessGuardAndJitter) {
  ArrivalPredictor predictor;
  ArriveEvery(predictor, absl::ZeroDuration(), absl::Milliseconds(20), 4);
  EXPECT_EQ(predictor.RoomBefore(At(absl::Milliseconds(60)), absl::Milliseconds(1)),
            absl::ZeroDuration())
      << "no room without a trusted period";
  predictor.Arrived(At(absl::Milliseconds(80)));
  // Due at 100 ms: 20 ms less the 1 ms guard and the 4.21875 ms jitter.
  EXPECT_EQ(predictor.RoomBefore(At(absl::Milliseconds(80)), absl::Milliseconds(1)),
            absl::Nanoseconds(14'781'250));
  EXPECT_EQ(predictor.RoomBefore(At(absl::Milliseconds(90)), absl::Milliseconds(1)),
            absl::Nanoseconds(4'781'250));
  EXPECT_EQ(predictor.RoomBefore(At(absl::Milliseconds(99)), absl::Milliseconds(1)),
            absl::ZeroDuration());
  EXPECT_EQ(predictor.RoomBefore(At(absl::Milliseconds(130)), absl::Milliseconds(1)),
            absl::ZeroDuration())
      << "overdue";
}

TEST(ArrivalPredictorTest, HoldsBackABatchThatWouldRunWhenTheNextArrivalIsDue) {
  ArrivalPredictor predictor;
  ArriveEvery(predictor, absl::ZeroDuration(), absl::Milliseconds(20), 5);
  const absl::Duration guard = absl::Milliseconds(1);
  const absl::Duration cost = absl::Milliseconds(1);
  // Due at 100 ms; waited for until the guard and the jitter (4.21875 ms) have passed too.
  const absl::Time latest = At(absl::Milliseconds(100) + guard + absl::Nanoseconds(4'218'750));
  EXPECT_EQ(predictor.HoldBackUntil(At(absl::Microseconds(98500)), cost, guard), latest);
  EXPECT_EQ(predictor.HoldBackUntil(At(absl::Milliseconds(98)), cost, guard), latest)
      << "ends just at the due time, give or take the guard";
  EXPECT_EQ(predictor.HoldBackUntil(At(absl::Microseconds(97900)), cost, guard),
            absl::InfinitePast())
      << "ends before the guard";
  EXPECT_EQ(predictor.HoldBackUntil(At(absl::Milliseconds(90)), absl::Milliseconds(9), guard),
            latest)
      << "a longer batch from earlier on";
  EXPECT_EQ(predictor.HoldBackUntil(latest - absl::Nanoseconds(1), cost, guard), latest);
  EXPECT_EQ(predictor.HoldBackUntil(latest, cost, guard), absl::InfinitePast())
      << "overdue beyond the allowance: not coming on schedule";
}

// A clock-driven sender whose request came 3 ms late keeps its schedule, and is waited for
// that much longer past its due time from then on.
TEST(ArrivalPredictorTest, ALateArrivalKeepsTheScheduleAndLengthensTheHoldBack) {
  ArrivalPredictor predictor;
  ArriveEvery(predictor, absl::ZeroDuration(), absl::Milliseconds(20), 12);  // 0 to 220 ms
  predictor.Arrived(At(absl::Milliseconds(243)));                            // due at 240
  EXPECT_EQ(predictor.lateness(), absl::Milliseconds(3));
  // The smoothed gap takes in a quarter of the 3 ms; the schedule runs on from 240 ms, not 243.
  EXPECT_EQ(predictor.period(), absl::Microseconds(20750));
  EXPECT_EQ(predictor.next_due(), At(absl::Microseconds(260750)));
  ASSERT_TRUE(predictor.PeriodTrusted());
  EXPECT_LT(predictor.jitter(), absl::Milliseconds(3));
  // Held until 3 ms (the lateness, which exceeds the jitter) past the guard after 260.75 ms.
  EXPECT_EQ(predictor.HoldBackUntil(At(absl::Milliseconds(259)), absl::Milliseconds(1),
                                    absl::Milliseconds(1)),
            At(absl::Microseconds(264750)));
  // The lateness fades by 1/256 per arrival.
  predictor.Arrived(At(absl::Microseconds(260750)));
  EXPECT_EQ(predictor.lateness(), absl::Nanoseconds(3'000'000 - 3'000'000 / 256));
}

TEST(ArrivalPredictorTest, APauseIsABreakAndThreeLongGapsAreANewPace) {
  ArrivalPredictor predictor;
  ArriveEvery(predictor, absl::ZeroDuration(), absl::Milliseconds(20), 12);  // 0 to 220 ms
  predictor.Arrived(At(absl::Milliseconds(2220)));                           // after a pause
  EXPECT_EQ(predictor.period(), absl::Milliseconds(20)) << "the pause is not learnt";
  EXPECT_TRUE(predictor.PeriodTrusted());
  EXPECT_EQ(predictor.next_due(), At(absl::Milliseconds(2240)));
  predictor.Arrived(At(absl::Milliseconds(2240)));
  // The sender slows to one request every 60 ms: two such gaps are breaks, the third a new pace.
  predictor.Arrived(At(absl::Milliseconds(2300)));
  predictor.Arrived(At(absl::Milliseconds(2360)));
  EXPECT_EQ(predictor.period(), absl::Milliseconds(20));
  EXPECT_TRUE(predictor.PeriodTrusted());
  predictor.Arrived(At(absl::Milliseconds(2420)));
  EXPECT_EQ(predictor.period(), absl::Milliseconds(60));
  EXPECT_EQ(predictor.jitter(), absl::Milliseconds(30));
  EXPECT_EQ(predictor.arrival_count(), 2);
  EXPECT_FALSE(predictor.PeriodTrusted()) << "a new pace is learnt afresh";
  EXPECT_EQ(predictor.next_due(), At(absl::Milliseconds(2480)));
  ArriveEvery(predictor, absl::Milliseconds(2480), absl::Milliseconds(60), 3);  // to 2600 ms
  EXPECT_TRUE(predictor.PeriodTrusted());
  EXPECT_EQ(predictor.next_due(), At(absl::Milliseconds(2660)));
}

}  // namespace
}  // namespace cloister::host
