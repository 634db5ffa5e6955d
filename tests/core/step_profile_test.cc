#include "core/runtime/step_profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/runtime/torch_compat.h"

namespace loraplex {
namespace {

ProfiledEvent Cpu(const std::string& name, uint64_t lane, int64_t start,
                  int64_t end) {
  return ProfiledEvent{name, false, lane, start, end};
}

ProfiledEvent Device(const std::string& name, int64_t start, int64_t end) {
  return ProfiledEvent{name, true, 7, start, end};
}

const ProfileEntry* Find(const std::vector<ProfileEntry>& entries,
                         const std::string& name) {
  for (const ProfileEntry& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

// Two threads' operators nested three deep and overlapping device work,
// given out of order: self times, counts and the device's busy time by
// hand.
TEST(StepProfileTest, SelfTimesAndDeviceBusyTimeByHand) {
  const std::vector<ProfiledEvent> events = {
      Cpu("add", 1, 50, 60),   Device("k2", 20, 50),
      Cpu("outer", 1, 0, 100), Cpu("mm", 1, 10, 40),
      Cpu("fill", 1, 52, 55),  Cpu("outer", 2, 20, 70),
      Device("k1", 0, 25),     Device("k3", 80, 90),
      Cpu("mm", 2, 20, 30),  // Starts with its parent on lane 2.
  };
  const ProfileSummary s = SummarizeProfile(events);
  EXPECT_EQ(s.span_ns, 100);
  EXPECT_EQ(s.cpu_ops, 6);
  EXPECT_EQ(s.top_level_ops, 2);
  EXPECT_EQ(s.device_events, 3);
  // [0, 50] and [80, 90].
  EXPECT_EQ(s.device_busy_ns, 60);
  EXPECT_DOUBLE_EQ(DeviceBusyPercent(s), 60.0);

  const ProfileEntry* outer = Find(s.cpu_by_self_time, "outer");
  ASSERT_NE(outer, nullptr);
  EXPECT_EQ(outer->count, 2);
  // Lane 1: 100 - 30 (mm) - 10 (add); lane 2: 50 - 10 (mm).
  EXPECT_EQ(outer->total_ns, 60 + 40);
  const ProfileEntry* add = Find(s.cpu_by_self_time, "add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->total_ns, 10 - 3);
  const ProfileEntry* mm = Find(s.cpu_by_self_time, "mm");
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(mm->count, 2);
  EXPECT_EQ(mm->total_ns, 30 + 10);
  // Largest first.
  EXPECT_EQ(s.cpu_by_self_time.front().name, "outer");
  ASSERT_EQ(s.device_by_time.size(), 3u);
  EXPECT_EQ(s.device_by_time[0].name, "k2");
  EXPECT_EQ(s.device_by_time[0].total_ns, 30);
  EXPECT_EQ(s.device_by_time[2].name, "k3");

  const std::string text = FormatProfile(s, 2);
  EXPECT_THAT(text, ::testing::HasSubstr("2 operators called, 6 in all"));
  EXPECT_THAT(text, ::testing::HasSubstr("device busy 0.00 ms (60.00%"));
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("fill")));
}

TEST(StepProfileTest, NoEventsGiveAnEmptySummary) {
  const ProfileSummary s = SummarizeProfile({});
  EXPECT_EQ(s.span_ns, 0);
  EXPECT_EQ(s.cpu_ops, 0);
  EXPECT_TRUE(s.cpu_by_self_time.empty());
}

// LibTorch's own profiler, really run: the operators a matmul and an add
// dispatch, and a Chrome trace that parses.
TEST(StepProfileTest, ProfilesLibTorchOperatorsAndWritesATrace) {
  const torch::Tensor a = torch::randn({64, 64});
  const torch::Tensor b = torch::randn({64, 64});
  const std::string trace =
      (std::filesystem::path(::testing::TempDir()) / "step_profile_trace.json")
          .string();
  std::filesystem::remove(trace);
  torch::Tensor c;
  const absl::StatusOr<std::vector<ProfiledEvent>> events =
      ProfileCall([&] { c = torch::mm(a, b).add(1.0); }, /*cuda=*/false, trace);
  if (!kTorchIs2OrNewer) {
    EXPECT_EQ(events.status().code(), absl::StatusCode::kFailedPrecondition);
    return;
  }
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_TRUE(c.defined());
  auto named = [&](const std::string& name) {
    return std::any_of(events->begin(), events->end(),
                       [&](const ProfiledEvent& e) { return e.name == name; });
  };
  EXPECT_TRUE(named("aten::mm"));
  EXPECT_TRUE(named("aten::add"));
  const ProfileSummary s = SummarizeProfile(*events);
  EXPECT_EQ(s.top_level_ops, 2);
  EXPECT_EQ(s.device_events, 0);
  ASSERT_TRUE(std::filesystem::exists(trace));
  std::ifstream in(trace);
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(json.is_discarded());
  EXPECT_TRUE(json.contains("traceEvents"));
}

TEST(StepProfileTest, ATraceThatCannotBeWrittenIsAnError) {
  if (!kTorchIs2OrNewer) GTEST_SKIP() << "profiling needs LibTorch 2.x";
  const std::string trace =
      (std::filesystem::path(::testing::TempDir()) / "no-such-dir" / "t.json")
          .string();
  const absl::StatusOr<std::vector<ProfiledEvent>> events =
      ProfileCall([] { torch::ones({2}).sum(); }, false, trace);
  EXPECT_EQ(events.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(events.status().message(), ::testing::HasSubstr(trace));
}

TEST(StepProfileTest, ProfilesCudaKernelsOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Tensor a = torch::randn({256, 256}, torch::kCUDA);
  torch::Tensor c;
  const absl::StatusOr<std::vector<ProfiledEvent>> events = ProfileCall(
      [&] {
        c = torch::mm(a, a);
        torch::cuda::synchronize();
      },
      /*cuda=*/true, "");
  ASSERT_TRUE(events.ok()) << events.status();
  const ProfileSummary s = SummarizeProfile(*events);
  EXPECT_GE(s.device_events, 1);
  EXPECT_GT(s.device_busy_ns, 0);
}

// An exception of the profiled call passes through and leaves the profiler
// off, so the next call can start it again.
TEST(StepProfileTest, AThrowingCallStopsTheProfiler) {
  if (!kTorchIs2OrNewer) GTEST_SKIP() << "profiling needs LibTorch 2.x";
  EXPECT_THROW(ProfileCall([] { throw std::runtime_error("boom"); }, false, "")
                   .IgnoreError(),
               std::runtime_error);
  const absl::StatusOr<std::vector<ProfiledEvent>> again =
      ProfileCall([] { torch::ones({2}).sum(); }, false, "");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->empty());
}

}  // namespace
}  // namespace loraplex
