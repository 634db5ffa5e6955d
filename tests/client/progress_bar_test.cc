#include "client/progress_bar.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace loraplex {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

ProgressSnapshot RunningSnapshot() {
  ProgressSnapshot snapshot;
  snapshot.label = "abc";
  snapshot.status = "RUNNING";
  snapshot.step = 30;
  snapshot.total_steps = 60;
  snapshot.loss = 2.34512;
  snapshot.lr = 2e-3;
  snapshot.tokens_per_second = 1234;
  snapshot.eta_seconds = 75;
  return snapshot;
}

TEST(FormatBarTest, FillsInProportion) {
  EXPECT_EQ(FormatBar(0.0, 12), "[..........]");
  EXPECT_EQ(FormatBar(0.5, 12), "[#####.....]");
  EXPECT_EQ(FormatBar(1.0, 12), "[##########]");
}

TEST(FormatBarTest, ClampsOutOfRangeFractions) {
  EXPECT_EQ(FormatBar(-1.0, 7), "[.....]");
  EXPECT_EQ(FormatBar(3.0, 7), "[#####]");
  EXPECT_EQ(FormatBar(std::nan(""), 7), "[.....]");
  EXPECT_EQ(FormatBar(0.5, 1), "[.]");  // Never narrower than 3.
}

TEST(FormatProgressLineTest, WideLineHasEveryField) {
  const std::string line = FormatProgressLine(RunningSnapshot(), 120);
  EXPECT_EQ(line,
            "abc  RUNNING [###############...............] 30/60 50%  "
            "loss 2.3451  lr 2.00e-03  1.23k tok/s  ETA 1m15s");
  EXPECT_THAT(line, StartsWith("abc  RUNNING ["));
  EXPECT_THAT(line, HasSubstr("] 30/60 50%"));
  EXPECT_THAT(line, HasSubstr("loss 2.3451"));
  EXPECT_THAT(line, HasSubstr("lr 2.00e-03"));
  EXPECT_THAT(line, HasSubstr("1.23k tok/s"));
  EXPECT_THAT(line, HasSubstr("ETA 1m15s"));
  EXPECT_LE(static_cast<int>(line.size()), 120);
  // Half of a full-width bar is filled.
  EXPECT_THAT(line, HasSubstr("[###############..............."));
}

TEST(FormatProgressLineTest, NeverExceedsWidth) {
  for (int width = 1; width <= 140; ++width) {
    const std::string line = FormatProgressLine(RunningSnapshot(), width);
    EXPECT_LE(static_cast<int>(line.size()), width) << line;
    EXPECT_EQ(line.find('\n'), std::string::npos);
  }
}

TEST(FormatProgressLineTest, DropsLessImportantFieldsBeforeTheBar) {
  // 100 columns: everything fits.
  const std::string at100 = FormatProgressLine(RunningSnapshot(), 100);
  EXPECT_THAT(at100, HasSubstr("lr "));
  EXPECT_THAT(at100, HasSubstr("tok/s"));

  // 80 columns: lr goes so that a bar still fits.
  const std::string at80 = FormatProgressLine(RunningSnapshot(), 80);
  EXPECT_EQ(at80,
            "abc  RUNNING [########.........] 30/60 50%  loss 2.3451  "
            "1.23k tok/s  ETA 1m15s");

  // 60 columns: throughput goes too.
  const std::string at60 = FormatProgressLine(RunningSnapshot(), 60);
  EXPECT_THAT(at60, Not(HasSubstr("lr ")));
  EXPECT_THAT(at60, HasSubstr("loss 2.3451"));
  EXPECT_THAT(at60, HasSubstr("30/60 50%"));
  EXPECT_THAT(at60, HasSubstr("["));
  EXPECT_THAT(at60, Not(HasSubstr("tok/s")));

  // 30 columns: the label, a bar and the step count.
  EXPECT_EQ(FormatProgressLine(RunningSnapshot(), 30),
            "abc [######.......] 30/60 50%");

  // 20 columns: no room for a bar.
  EXPECT_EQ(FormatProgressLine(RunningSnapshot(), 20), "abc  30/60 50%");
}

TEST(FormatProgressLineTest, BarWidthFollowsTerminalWidth) {
  const std::string wide = FormatProgressLine(RunningSnapshot(), 200);
  const std::string narrower = FormatProgressLine(RunningSnapshot(), 90);
  auto bar_width = [](const std::string& line) {
    const size_t open = line.find('[');
    const size_t close = line.find(']');
    if (open == std::string::npos || close == std::string::npos) return 0;
    return static_cast<int>(close - open + 1);
  };
  EXPECT_EQ(bar_width(wide), kMaxBarWidth);
  EXPECT_LT(bar_width(narrower), kMaxBarWidth);
  EXPECT_GE(bar_width(narrower), kMinBarWidth);
}

TEST(FormatProgressLineTest, UnknownTotalHasNoBarPercentOrEta) {
  ProgressSnapshot snapshot = RunningSnapshot();
  snapshot.total_steps = 0;
  const std::string line = FormatProgressLine(snapshot, 120);
  EXPECT_THAT(line, HasSubstr("step 30"));
  EXPECT_THAT(line, Not(HasSubstr("[")));
  EXPECT_THAT(line, Not(HasSubstr("%")));
  EXPECT_THAT(line, Not(HasSubstr("ETA")));
  EXPECT_THAT(line, HasSubstr("loss 2.3451"));
}

TEST(FormatProgressLineTest, LeavesOutUnsetFields) {
  ProgressSnapshot snapshot;
  snapshot.label = "abc";
  snapshot.status = "QUEUED";
  snapshot.total_steps = 60;
  const std::string line = FormatProgressLine(snapshot, 100);
  EXPECT_THAT(line, HasSubstr("0/60 0%"));
  EXPECT_THAT(line, Not(HasSubstr("loss")));
  EXPECT_THAT(line, Not(HasSubstr("lr")));
  EXPECT_THAT(line, Not(HasSubstr("ETA")));
}

TEST(FormatProgressLineTest, NoWidthLimitWhenWidthIsZero) {
  const std::string line = FormatProgressLine(RunningSnapshot(), 0);
  EXPECT_THAT(line, HasSubstr("lr 2.00e-03"));
  EXPECT_THAT(line, HasSubstr("ETA 1m15s"));
}

TEST(FormatProgressLineTest, StepBeyondTotalShowsFullBar) {
  ProgressSnapshot snapshot = RunningSnapshot();
  snapshot.step = 70;
  const std::string line = FormatProgressLine(snapshot, 100);
  EXPECT_THAT(line, HasSubstr("70/60 100%"));
  EXPECT_THAT(line, Not(HasSubstr(".]")));
}

TEST(FormatProgressTextTest, PlainLine) {
  ProgressSnapshot snapshot = RunningSnapshot();
  snapshot.status.clear();
  EXPECT_EQ(FormatProgressText(snapshot),
            "abc  step 30/60 (50%)  loss 2.3451  lr 2.00e-03  1.23k tok/s  "
            "ETA 1m15s");
}

TEST(FormatProgressTextTest, NonFiniteLoss) {
  ProgressSnapshot snapshot;
  snapshot.label = "x";
  snapshot.step = 3;
  snapshot.loss = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(FormatProgressText(snapshot), "x  step 3  loss nan");
}

TEST(FormatProgressTextTest, ValidationLossAfterLoss) {
  ProgressSnapshot snapshot;
  snapshot.label = "x";
  snapshot.step = 0;
  snapshot.validation_loss = 0.23312;
  EXPECT_EQ(FormatProgressText(snapshot), "x  step 0  val 0.2331");
  snapshot.step = 4;
  snapshot.loss = 1.5;
  EXPECT_EQ(FormatProgressText(snapshot), "x  step 4  loss 1.5000  val 0.2331");
}

TEST(FormatDurationTest, PicksTwoUnits) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(0.2), "1s");
  EXPECT_EQ(FormatDuration(45), "45s");
  EXPECT_EQ(FormatDuration(60), "1m00s");
  EXPECT_EQ(FormatDuration(185), "3m05s");
  EXPECT_EQ(FormatDuration(2 * 3600 + 7 * 60 + 5), "2h07m");
  EXPECT_EQ(FormatDuration(3 * 86400 + 4 * 3600), "3d04h");
  EXPECT_EQ(FormatDuration(-1), "?");
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::infinity()), "?");
}

TEST(FormatCountTest, SuffixesWithThreeSignificantDigits) {
  EXPECT_EQ(FormatCount(0), "0");
  EXPECT_EQ(FormatCount(950), "950");
  EXPECT_EQ(FormatCount(1234), "1.23k");
  EXPECT_EQ(FormatCount(12345), "12.3k");
  EXPECT_EQ(FormatCount(123456), "123k");
  EXPECT_EQ(FormatCount(45.6e6), "45.6M");
  EXPECT_EQ(FormatCount(2e9), "2.00G");
}

TEST(StepRateEstimatorTest, UnknownUntilTwoSamplesSpanTimeAndSteps) {
  StepRateEstimator rate;
  EXPECT_FALSE(rate.StepsPerSecond().has_value());
  rate.Add(1, 100.0);
  EXPECT_FALSE(rate.StepsPerSecond().has_value());
  EXPECT_FALSE(rate.EtaSeconds(1, 10).has_value());
  rate.Add(1, 101.0);  // Time but no steps.
  EXPECT_FALSE(rate.StepsPerSecond().has_value());
  rate.Add(3, 102.0);
  ASSERT_TRUE(rate.StepsPerSecond().has_value());
  EXPECT_DOUBLE_EQ(*rate.StepsPerSecond(), 1.0);
}

TEST(StepRateEstimatorTest, EtaFromRecentRate) {
  StepRateEstimator rate(/*window=*/4);
  // Slow start (1 step / s), then fast (4 steps / s).
  for (int i = 0; i <= 10; ++i) rate.Add(i, i);
  for (int i = 1; i <= 4; ++i) rate.Add(10 + 4 * i, 10 + i);
  ASSERT_TRUE(rate.StepsPerSecond().has_value());
  EXPECT_DOUBLE_EQ(*rate.StepsPerSecond(), 4.0);
  ASSERT_TRUE(rate.EtaSeconds(26, 66).has_value());
  EXPECT_DOUBLE_EQ(*rate.EtaSeconds(26, 66), 10.0);
  EXPECT_EQ(rate.EtaSeconds(66, 66), 0.0);
  EXPECT_EQ(rate.EtaSeconds(70, 66), 0.0);
  EXPECT_FALSE(rate.EtaSeconds(26, 0).has_value());
}

TEST(StepRateEstimatorTest, RestartsWhenStepsGoBack) {
  StepRateEstimator rate;
  rate.Add(10, 0);
  rate.Add(20, 1);
  rate.Add(1, 2);  // A new run.
  EXPECT_FALSE(rate.StepsPerSecond().has_value());
  rate.Add(3, 3);
  EXPECT_DOUBLE_EQ(*rate.StepsPerSecond(), 2.0);
}

TEST(PlainProgressThrottleTest, PrintsFirstEveryTenthAndLast) {
  PlainProgressThrottle throttle(/*min_interval_seconds=*/1000,
                                 /*progress_fraction=*/0.1);
  std::vector<int64_t> printed;
  for (int64_t step = 1; step <= 100; ++step) {
    if (throttle.ShouldPrint(step, 100, /*now_seconds=*/0)) {
      printed.push_back(step);
    }
  }
  EXPECT_EQ(printed,
            (std::vector<int64_t>{1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100}));
}

TEST(PlainProgressThrottleTest, PrintsAfterIntervalWhenProgressIsSlow) {
  PlainProgressThrottle throttle(/*min_interval_seconds=*/5,
                                 /*progress_fraction=*/0.1);
  EXPECT_TRUE(throttle.ShouldPrint(1, 1000, 0));
  EXPECT_FALSE(throttle.ShouldPrint(2, 1000, 1));
  EXPECT_FALSE(throttle.ShouldPrint(3, 1000, 4.9));
  EXPECT_TRUE(throttle.ShouldPrint(4, 1000, 5.0));
  EXPECT_FALSE(throttle.ShouldPrint(5, 1000, 6));
  EXPECT_FALSE(throttle.ShouldPrint(4, 1000, 60));  // The printed step again.
}

TEST(PlainProgressThrottleTest, UnknownTotalUsesTimeOnly) {
  PlainProgressThrottle throttle(/*min_interval_seconds=*/5);
  EXPECT_TRUE(throttle.ShouldPrint(1, 0, 0));
  EXPECT_FALSE(throttle.ShouldPrint(500, 0, 1));
  EXPECT_TRUE(throttle.ShouldPrint(501, 0, 6));
}

}  // namespace
}  // namespace loraplex
