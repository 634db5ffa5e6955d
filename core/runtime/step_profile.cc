#include "core/runtime/step_profile.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>
#include <utility>

namespace loraplex {
namespace {

std::vector<ProfileEntry> Largest(std::map<std::string, ProfileEntry> byname) {
  std::vector<ProfileEntry> out;
  for (auto& [name, entry] : byname) out.push_back(std::move(entry));
  std::stable_sort(out.begin(), out.end(),
                   [](const ProfileEntry& a, const ProfileEntry& b) {
                     return a.total_ns > b.total_ns;
                   });
  return out;
}

void AddTo(std::map<std::string, ProfileEntry>& byname, const std::string& name,
           int64_t ns) {
  ProfileEntry& entry = byname[name];
  entry.name = name;
  ++entry.count;
  entry.total_ns += ns;
}

}  // namespace

ProfileSummary SummarizeProfile(const std::vector<ProfiledEvent>& events) {
  ProfileSummary summary;
  if (events.empty()) return summary;
  std::vector<const ProfiledEvent*> order;
  int64_t first = events.front().start_ns;
  int64_t last = events.front().end_ns;
  for (const ProfiledEvent& e : events) {
    order.push_back(&e);
    first = std::min(first, e.start_ns);
    last = std::max(last, e.end_ns);
  }
  summary.span_ns = last - first;
  // Outer events first where two start together.
  std::stable_sort(order.begin(), order.end(),
                   [](const ProfiledEvent* a, const ProfiledEvent* b) {
                     if (a->start_ns != b->start_ns) {
                       return a->start_ns < b->start_ns;
                     }
                     return a->end_ns > b->end_ns;
                   });

  // CPU: self time = own time less the time of the operators directly
  // inside, found with one stack of open operators per lane.
  std::map<uint64_t, std::vector<size_t>> open;  // Indices into `self`.
  std::vector<int64_t> self;
  std::vector<const ProfiledEvent*> cpu;
  // Device: the union of the intervals, taken in start order.
  int64_t busy_until = first;
  std::map<std::string, ProfileEntry> device;
  for (const ProfiledEvent* e : order) {
    const int64_t duration = e->end_ns - e->start_ns;
    if (e->on_device) {
      ++summary.device_events;
      AddTo(device, e->name, duration);
      const int64_t from = std::max(busy_until, e->start_ns);
      if (e->end_ns > from) {
        summary.device_busy_ns += e->end_ns - from;
        busy_until = e->end_ns;
      }
      continue;
    }
    ++summary.cpu_ops;
    std::vector<size_t>& stack = open[e->lane];
    while (!stack.empty() && cpu[stack.back()]->end_ns < e->end_ns) {
      stack.pop_back();  // Ended before this one ends: not its parent.
    }
    if (stack.empty()) {
      ++summary.top_level_ops;
    } else {
      self[stack.back()] -= duration;
    }
    cpu.push_back(e);
    self.push_back(duration);
    stack.push_back(cpu.size() - 1);
  }
  std::map<std::string, ProfileEntry> by_self;
  for (size_t i = 0; i < cpu.size(); ++i) AddTo(by_self, cpu[i]->name, self[i]);
  summary.cpu_by_self_time = Largest(std::move(by_self));
  summary.device_by_time = Largest(std::move(device));
  return summary;
}

double DeviceBusyPercent(const ProfileSummary& summary) {
  return 100.0 * static_cast<double>(summary.device_busy_ns) /
         static_cast<double>(std::max<int64_t>(1, summary.span_ns));
}

std::string FormatProfile(const ProfileSummary& summary, int top) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2);
  const double span =
      static_cast<double>(std::max<int64_t>(1, summary.span_ns));
  out << "span " << summary.span_ns / 1e6 << " ms; " << summary.top_level_ops
      << " operators called, " << summary.cpu_ops << " in all";
  if (summary.device_events > 0) {
    out << "; " << summary.device_events
        << " device kernels/copies, device busy "
        << summary.device_busy_ns / 1e6 << " ms (" << DeviceBusyPercent(summary)
        << "% of the span)";
  }
  out << "\n";
  auto list = [&](const char* title, const std::vector<ProfileEntry>& entries) {
    if (entries.empty()) return;
    out << "  " << title << ":\n";
    for (size_t i = 0; i < entries.size() && static_cast<int>(i) < top; ++i) {
      const ProfileEntry& e = entries[i];
      out << "    " << std::setw(6)
          << 100.0 * static_cast<double>(e.total_ns) / span << "%  "
          << std::setw(9) << e.total_ns / 1e6 << " ms  " << std::setw(6)
          << e.count << "x  " << e.name.substr(0, 100) << "\n";
    }
  };
  list("CPU operators by self time", summary.cpu_by_self_time);
  list("device kernels and copies by time", summary.device_by_time);
  return out.str();
}

}  // namespace loraplex
