#include "server/results/result_hub.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace loraplex {
namespace {

using Hub = ResultHub<std::string>;
using std::chrono::milliseconds;

// What one Wait answered, once it has.
struct Caught {
  absl::Notification done;
  Hub::Answer answer = std::optional<std::string>();
  Hub::Waiter Catch() {
    return [this](Hub::Answer a) {
      answer = std::move(a);
      done.Notify();
    };
  }
  // Waits for the answer (tests fail by their own timeout if it never
  // comes).
  const Hub::Answer& Get() {
    done.WaitForNotification();
    return answer;
  }
};

TEST(ResultHubTest, AWaiterGetsTheResultWhenItIsPut) {
  Hub hub(ResultHubOptions{});
  hub.Expect({"s", 1});
  Caught polled, caller;
  hub.Wait({"s", 1}, milliseconds(60000), polled.Catch());
  hub.Wait({"s", 1}, std::nullopt, caller.Catch());
  EXPECT_FALSE(polled.done.HasBeenNotified());
  EXPECT_EQ(hub.Find({"s", 1}), Hub::State::kPending);
  hub.Put({"s", 1}, "loss 1.5");
  ASSERT_TRUE(polled.Get().ok());
  EXPECT_EQ(polled.Get()->value_or(""), "loss 1.5");
  EXPECT_EQ(caller.Get()->value_or(""), "loss 1.5");
  // Kept: a later wait (a repeat) is answered at once; a second Put of the
  // same key changes nothing.
  hub.Put({"s", 1}, "other");
  Caught repeat;
  hub.Wait({"s", 1}, milliseconds(0), repeat.Catch());
  EXPECT_EQ(repeat.Get()->value_or(""), "loss 1.5");
  std::string value;
  EXPECT_EQ(hub.Find({"s", 1}, &value), Hub::State::kFinished);
  EXPECT_EQ(value, "loss 1.5");
}

TEST(ResultHubTest, ALongPollEndsEmptyAtItsDeadline) {
  Hub hub(ResultHubOptions{});
  hub.Expect({"s", 2});
  Caught polled;
  hub.Wait({"s", 2}, milliseconds(20), polled.Catch());
  ASSERT_TRUE(polled.Get().ok());
  EXPECT_FALSE(polled.Get()->has_value());
  // The result is still expected: the next poll gets it.
  hub.Put({"s", 2}, "done");
  Caught again;
  hub.Wait({"s", 2}, milliseconds(20), again.Catch());
  EXPECT_EQ(again.Get()->value_or(""), "done");
}

TEST(ResultHubTest, UnknownKeysAndOtherOwnersAreNotFound) {
  Hub hub(ResultHubOptions{});
  hub.Put({"tenant-a", 7}, "a's");
  Caught other_owner, unknown;
  hub.Wait({"tenant-b", 7}, milliseconds(1000), other_owner.Catch());
  hub.Wait({"tenant-a", 8}, std::nullopt, unknown.Catch());
  EXPECT_TRUE(absl::IsNotFound(other_owner.Get().status()));
  EXPECT_TRUE(absl::IsNotFound(unknown.Get().status()));
  EXPECT_EQ(hub.Find({"tenant-b", 7}), Hub::State::kUnknown);
}

TEST(ResultHubTest, KeepsTheNewestResultsOfEachOwner) {
  ResultHubOptions options;
  options.max_kept_per_owner = 2;
  Hub hub(options);
  hub.Expect({"a", 4});  // Pending results are never dropped.
  for (int64_t seq = 1; seq <= 3; ++seq) {
    hub.Put({"a", seq}, "a");
    hub.Put({"b", seq}, "b");
  }
  EXPECT_EQ(hub.Find({"a", 1}), Hub::State::kUnknown);
  EXPECT_EQ(hub.Find({"a", 2}), Hub::State::kFinished);
  EXPECT_EQ(hub.Find({"a", 3}), Hub::State::kFinished);
  EXPECT_EQ(hub.Find({"a", 4}), Hub::State::kPending);
  EXPECT_EQ(hub.Find({"b", 1}), Hub::State::kUnknown);
  EXPECT_EQ(hub.Find({"b", 3}), Hub::State::kFinished);
}

TEST(ResultHubTest, ResultsExpireAfterTheirTimeAndSoonerOnceDelivered) {
  ResultHubOptions options;
  options.kept_for = milliseconds(60000);
  options.kept_after_delivery = milliseconds(1);
  Hub hub(options);
  hub.Put({"t", 1}, "polled");
  hub.Put({"t", 2}, "not polled");
  Caught polled;
  hub.Wait({"t", 1}, milliseconds(1000), polled.Catch());
  EXPECT_EQ(polled.Get()->value_or(""), "polled");
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(hub.Find({"t", 1}), Hub::State::kUnknown);
  EXPECT_EQ(hub.Find({"t", 2}), Hub::State::kFinished);

  options.kept_for = milliseconds(1);
  Hub short_lived(options);
  short_lived.Put({"t", 1}, "gone soon");
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(short_lived.Find({"t", 1}), Hub::State::kUnknown);
}

TEST(ResultHubTest, StopAnswersLongPollsButNotTheOperationsCallers) {
  Hub hub(ResultHubOptions{});
  hub.Expect({"s", 1});
  Caught polled, caller;
  hub.Wait({"s", 1}, milliseconds(60000), polled.Catch());
  hub.Wait({"s", 1}, std::nullopt, caller.Catch());
  hub.Stop();
  EXPECT_TRUE(absl::IsUnavailable(polled.Get().status()));
  EXPECT_FALSE(caller.done.HasBeenNotified());
  Caught late;
  hub.Wait({"s", 1}, milliseconds(60000), late.Catch());
  EXPECT_TRUE(absl::IsUnavailable(late.Get().status()));
  // The operation still ends, and its caller hears of it.
  hub.Put({"s", 1}, "finished anyway");
  EXPECT_EQ(caller.Get()->value_or(""), "finished anyway");
}

TEST(ResultHubTest, ManyWaitersOnManyThreads) {
  Hub hub(ResultHubOptions{});
  constexpr int kKeys = 32;
  for (int k = 0; k < kKeys; ++k) hub.Expect({"s", k});
  std::vector<Caught> caught(kKeys * 2);
  std::vector<std::thread> threads;
  for (int k = 0; k < kKeys; ++k) {
    threads.emplace_back([&, k] {
      hub.Wait({"s", k}, milliseconds(60000), caught[2 * k].Catch());
      hub.Wait({"s", k}, std::nullopt, caught[2 * k + 1].Catch());
    });
  }
  for (int k = 0; k < kKeys; ++k) {
    threads.emplace_back([&, k] { hub.Put({"s", k}, std::to_string(k)); });
  }
  for (std::thread& t : threads) t.join();
  for (int k = 0; k < 2 * kKeys; ++k) {
    EXPECT_EQ(caught[k].Get()->value_or(""), std::to_string(k / 2));
  }
}

TEST(ResultHubTest, ForgettingAnOwnerAnswersItsWaiters) {
  Hub hub(ResultHubOptions{});
  hub.Expect({"gone", 1});
  hub.Put({"kept", 1}, "x");
  Caught caller;
  hub.Wait({"gone", 1}, std::nullopt, caller.Catch());
  hub.ForgetOwner("gone");
  EXPECT_TRUE(absl::IsUnavailable(caller.Get().status()));
  EXPECT_EQ(hub.Find({"gone", 1}), Hub::State::kUnknown);
  EXPECT_EQ(hub.Find({"kept", 1}), Hub::State::kFinished);
}

}  // namespace
}  // namespace loraplex
