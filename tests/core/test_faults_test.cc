#include "core/common/test_faults.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

class TestFaultsTest : public ::testing::Test {
 protected:
  void TearDown() override { ASSERT_TRUE(ConfigureTestFaults("").ok()); }
};

TEST_F(TestFaultsTest, NothingFiresUnlessArmed) {
  EXPECT_TRUE(TestFault(TestFaultPoint::kForward, 7).ok());
  EXPECT_TRUE(StoreWriteFault("x").ok());
}

TEST_F(TestFaultsTest, FiresForItsPointSeedRankAndOpOnly) {
  ASSERT_TRUE(ConfigureTestFaults(
                  "forward:seed=7;store_write:op=set_status;optimizer:rank=1",
                  /*rank=*/0)
                  .ok());
  const absl::Status fired = TestFault(TestFaultPoint::kForward, 7);
  EXPECT_EQ(fired.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(fired.message(), "injected fault at forward");
  EXPECT_TRUE(TestFault(TestFaultPoint::kForward, 8).ok());
  EXPECT_TRUE(TestFault(TestFaultPoint::kForward).ok());
  EXPECT_TRUE(TestFault(TestFaultPoint::kAttach, 7).ok());
  EXPECT_EQ(StoreWriteFault("set_status").message(),
            "injected fault at store_write set_status");
  EXPECT_TRUE(StoreWriteFault("insert").ok());
  // Armed for rank 1; this process is rank 0.
  EXPECT_TRUE(TestFault(TestFaultPoint::kOptimizer, 1).ok());
  ASSERT_TRUE(ConfigureTestFaults("optimizer:rank=1", /*rank=*/1).ok());
  EXPECT_FALSE(TestFault(TestFaultPoint::kOptimizer, 1).ok());
}

TEST_F(TestFaultsTest, TimesBoundsTheFirings) {
  ASSERT_TRUE(ConfigureTestFaults("validation:times=2").ok());
  EXPECT_FALSE(TestFault(TestFaultPoint::kValidation).ok());
  EXPECT_FALSE(TestFault(TestFaultPoint::kValidation, 3).ok());
  EXPECT_TRUE(TestFault(TestFaultPoint::kValidation).ok());
}

TEST_F(TestFaultsTest, HoldMatchesItsStepAndSeedAndFailsNothing) {
  ASSERT_TRUE(ConfigureTestFaults("hold:seed=11,step=10,times=1").ok());
  EXPECT_FALSE(TestHold(11, 9));
  EXPECT_FALSE(TestHold(12, 10));
  EXPECT_TRUE(TestFault(TestFaultPoint::kForward, 11).ok());
  EXPECT_TRUE(TestHold(11, 10));
  EXPECT_FALSE(TestHold(11, 10));  // times=1: spent.
  ASSERT_TRUE(ConfigureTestFaults("hold:step=2").ok());
  EXPECT_TRUE(TestHold(1, 2));
  EXPECT_TRUE(TestHold(6, 2));
}

TEST_F(TestFaultsTest, MeetHoldsTheFirstArrivalsUntilCountHaveCome) {
  ASSERT_TRUE(ConfigureTestFaults("meet:count=2").ok());
  std::atomic<bool> first_returned{false};
  std::thread first([&] {
    TestMeet();
    first_returned = true;
  });
  // The first waits for a second (at most 30 s; this sleeps far less).
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(first_returned.load());
  TestMeet();
  first.join();
  EXPECT_TRUE(first_returned.load());
  TestMeet();  // Met: later calls pass at once.
  EXPECT_TRUE(TestFault(TestFaultPoint::kForward).ok());
}

TEST_F(TestFaultsTest, MalformedSpecsAreRefusedAndArmNothing) {
  ASSERT_TRUE(ConfigureTestFaults("forward").ok());
  for (const char* spec :
       {"explode", "forward:seed=x", "forward:colour=3",
        "store_write:op=", "forward;attach:times=-1", "hold", "hold:seed=1",
        "forward:step=3", "meet", "forward:count=2", "meet:count=x"}) {
    const absl::Status status = ConfigureTestFaults(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(status.message(), HasSubstr("--test-faults")) << spec;
  }
  // The faults armed before a refused spec stay armed.
  EXPECT_FALSE(TestFault(TestFaultPoint::kForward).ok());
}

}  // namespace
}  // namespace loraplex
