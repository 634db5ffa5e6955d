// What a profiled call spent its time on: the CPU operators by self time
// (their time less that of the operators they called), the device's
// kernels and copies by time, and how busy the device was. Built from
// ProfileCall's events.
#ifndef LORAPLEX_CORE_RUNTIME_STEP_PROFILE_H_
#define LORAPLEX_CORE_RUNTIME_STEP_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/runtime/torch_compat.h"

namespace loraplex {

// The events of one name.
struct ProfileEntry {
  std::string name;
  int64_t count = 0;
  // Self time for CPU operators; the whole duration for device events.
  int64_t total_ns = 0;
};

struct ProfileSummary {
  // From the first event's start to the last one's end.
  int64_t span_ns = 0;
  // CPU operators called from outside any other operator (what the caller
  // dispatched), and all CPU operators.
  int64_t top_level_ops = 0;
  int64_t cpu_ops = 0;
  // Device events (kernels, copies, memsets) and the time at least one of
  // them ran: busy / span is the device's utilisation.
  int64_t device_events = 0;
  int64_t device_busy_ns = 0;
  // Largest first.
  std::vector<ProfileEntry> cpu_by_self_time;
  std::vector<ProfileEntry> device_by_time;
};

// The share of the span in which the device was busy, in percent (0 when
// nothing ran there).
double DeviceBusyPercent(const ProfileSummary& summary);

// Events may come in any order. An operator is nested in another of the
// same lane that starts no later and ends no earlier.
ProfileSummary SummarizeProfile(const std::vector<ProfiledEvent>& events);

// A few lines: the totals, then the `top` largest entries of each list
// with their share of the span.
std::string FormatProfile(const ProfileSummary& summary, int top);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_RUNTIME_STEP_PROFILE_H_
