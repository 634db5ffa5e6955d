#include "core/common/test_faults.h"

#include <atomic>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace loraplex {
namespace {

struct PointName {
  TestFaultPoint point;
  absl::string_view name;
};

constexpr PointName kPoints[] = {
    {TestFaultPoint::kAttach, "attach"},
    {TestFaultPoint::kForward, "forward"},
    {TestFaultPoint::kOptimizer, "optimizer"},
    {TestFaultPoint::kPauseCheckpoint, "pause_checkpoint"},
    {TestFaultPoint::kValidation, "validation"},
    {TestFaultPoint::kStoreWrite, "store_write"},
    {TestFaultPoint::kHold, "hold"},
    {TestFaultPoint::kMeet, "meet"},
    {TestFaultPoint::kSlowCheckpoint, "slow_checkpoint"},
};

absl::string_view NameOf(TestFaultPoint point) {
  for (const PointName& entry : kPoints) {
    if (entry.point == point) return entry.name;
  }
  return "unknown";
}

struct Fault {
  TestFaultPoint point = TestFaultPoint::kForward;
  std::optional<uint64_t> seed;
  std::optional<int> rank;
  std::string op;
  std::optional<int64_t> step;   // hold only.
  std::optional<int64_t> count;  // meet only.
  std::optional<int64_t> ms;     // slow_checkpoint only.
  int64_t arrived = 0;           // meet only.
  int64_t times_left = -1;       // -1: unlimited.
};

struct Armed {
  absl::Mutex mu;
  std::vector<Fault> faults ABSL_GUARDED_BY(mu);
  int rank ABSL_GUARDED_BY(mu) = 0;
};

std::atomic<bool> g_armed{false};

Armed& State() {
  static Armed* state = new Armed;
  return *state;
}

absl::Status BadSpec(absl::string_view part, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--test-faults: \"", part, "\": ", why));
}

absl::Status ParseFault(absl::string_view text, Fault& fault) {
  std::pair<absl::string_view, absl::string_view> head =
      absl::StrSplit(text, absl::MaxSplits(':', 1));
  bool known = false;
  for (const PointName& entry : kPoints) {
    if (entry.name == head.first) {
      fault.point = entry.point;
      known = true;
    }
  }
  if (!known) {
    return BadSpec(text,
                   "unknown point (attach, forward, optimizer, "
                   "pause_checkpoint, validation, store_write, hold, meet, "
                   "slow_checkpoint)");
  }
  for (absl::string_view pair :
       absl::StrSplit(head.second, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(pair, absl::MaxSplits('=', 1));
    uint64_t number = 0;
    const bool numeric = absl::SimpleAtoi(kv.second, &number);
    if (kv.first == "op") {
      if (kv.second.empty()) return BadSpec(text, "op needs a name");
      fault.op = std::string(kv.second);
    } else if (!numeric) {
      return BadSpec(text, absl::StrCat(kv.first, " needs a number"));
    } else if (kv.first == "seed") {
      fault.seed = number;
    } else if (kv.first == "rank") {
      fault.rank = static_cast<int>(number);
    } else if (kv.first == "times") {
      fault.times_left = static_cast<int64_t>(number);
    } else if (kv.first == "step") {
      fault.step = static_cast<int64_t>(number);
    } else if (kv.first == "count") {
      fault.count = static_cast<int64_t>(number);
    } else if (kv.first == "ms") {
      fault.ms = static_cast<int64_t>(number);
    } else {
      return BadSpec(text, absl::StrCat("unknown key \"", kv.first,
                                        "\" (seed, rank, op, times, step, "
                                        "count, ms)"));
    }
  }
  if ((fault.point == TestFaultPoint::kHold) != fault.step.has_value()) {
    return BadSpec(text, "step is for hold, and hold needs one");
  }
  if ((fault.point == TestFaultPoint::kMeet) != fault.count.has_value()) {
    return BadSpec(text, "count is for meet, and meet needs one");
  }
  if ((fault.point == TestFaultPoint::kSlowCheckpoint) !=
      fault.ms.has_value()) {
    return BadSpec(text,
                   "ms is for slow_checkpoint, and slow_checkpoint needs one");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ConfigureTestFaults(absl::string_view spec, int rank) {
  std::vector<Fault> faults;
  for (absl::string_view text : absl::StrSplit(spec, ';', absl::SkipEmpty())) {
    Fault fault;
    if (absl::Status status = ParseFault(text, fault); !status.ok()) {
      return status;
    }
    faults.push_back(std::move(fault));
  }
  Armed& state = State();
  absl::MutexLock lock(&state.mu);
  state.rank = rank;
  g_armed.store(!faults.empty(), std::memory_order_relaxed);
  state.faults = std::move(faults);
  return absl::OkStatus();
}

absl::Status TestFault(TestFaultPoint point, std::optional<uint64_t> seed,
                       absl::string_view op) {
  if (!g_armed.load(std::memory_order_relaxed)) return absl::OkStatus();
  Armed& state = State();
  absl::MutexLock lock(&state.mu);
  for (Fault& fault : state.faults) {
    if (fault.point != point || fault.times_left == 0) continue;
    if (fault.rank && *fault.rank != state.rank) continue;
    if (fault.seed && fault.seed != seed) continue;
    if (!fault.op.empty() && fault.op != op) continue;
    if (fault.times_left > 0) --fault.times_left;
    return absl::InternalError(absl::StrCat("injected fault at ", NameOf(point),
                                            op.empty() ? "" : " ", op));
  }
  return absl::OkStatus();
}

bool TestHold(uint64_t seed, int64_t step) {
  if (!g_armed.load(std::memory_order_relaxed)) return false;
  Armed& state = State();
  absl::MutexLock lock(&state.mu);
  for (Fault& fault : state.faults) {
    if (fault.point != TestFaultPoint::kHold || fault.times_left == 0) continue;
    if (fault.rank && *fault.rank != state.rank) continue;
    if (fault.seed && fault.seed != seed) continue;
    if (fault.step != step) continue;
    if (fault.times_left > 0) --fault.times_left;
    return true;
  }
  return false;
}

void TestMeet() {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  Armed& state = State();
  absl::MutexLock lock(&state.mu);
  for (Fault& fault : state.faults) {
    if (fault.point != TestFaultPoint::kMeet) continue;
    if (fault.arrived >= *fault.count) continue;
    ++fault.arrived;
    // `faults` is replaced only by ConfigureTestFaults, which tests call
    // before the server runs; the fault stays put while this waits.
    const Fault* met = &fault;
    state.mu.AwaitWithTimeout(
        absl::Condition(
            +[](const Fault* f) { return f->arrived >= *f->count; }, met),
        absl::Seconds(30));
    return;
  }
}

void TestSlowCheckpoint(std::optional<uint64_t> seed) {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  int64_t ms = 0;
  {
    Armed& state = State();
    absl::MutexLock lock(&state.mu);
    for (Fault& fault : state.faults) {
      if (fault.point != TestFaultPoint::kSlowCheckpoint ||
          fault.times_left == 0) {
        continue;
      }
      if (fault.rank && *fault.rank != state.rank) continue;
      if (fault.seed && fault.seed != seed) continue;
      if (fault.times_left > 0) --fault.times_left;
      ms = *fault.ms;
      break;
    }
  }
  if (ms <= 0) return;
  std::cerr << "test fault slow_checkpoint: holding a checkpoint write for "
            << ms << " ms" << std::endl;
  absl::SleepFor(absl::Milliseconds(ms));
}

}  // namespace loraplex
