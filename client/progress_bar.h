// Text of training-progress displays: one line per job with a bar, the
// step count, loss, learning rate, throughput and ETA, fitted to a
// terminal width. Pure functions and small state machines with no I/O, so
// the CLI's live display (client/job_progress.h) and tests share them.
//
//   StepRateEstimator rate;
//   rate.Add(step, event_time_seconds);
//   ProgressSnapshot snapshot;
//   snapshot.label = "abc";
//   snapshot.step = step;
//   snapshot.total_steps = 60;
//   snapshot.eta_seconds = rate.EtaSeconds(step, 60);
//   std::cout << "\r" << FormatProgressLine(snapshot, /*width=*/80);
#ifndef LORAPLEX_CLIENT_PROGRESS_BAR_H_
#define LORAPLEX_CLIENT_PROGRESS_BAR_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>

namespace loraplex {

// What one progress line shows; unset fields are left out.
struct ProgressSnapshot {
  std::string label;   // Shown first, e.g. the job ID.
  std::string status;  // e.g. "RUNNING"; empty: not shown.
  int64_t step = 0;
  int64_t total_steps = 0;  // 0 (or less): unknown, so no bar and no ETA.
  std::optional<double> loss;
  std::optional<double> validation_loss;
  std::optional<double> lr;
  std::optional<double> tokens_per_second;
  std::optional<double> eta_seconds;
};

// Widest and narrowest bar FormatProgressLine draws ("[###.....]" counts
// the brackets).
inline constexpr int kMaxBarWidth = 32;
inline constexpr int kMinBarWidth = 12;

// One line of at most `width` columns (no limit when width <= 0), e.g.
//   "abc  RUNNING [#####.....] 30/60 50%  loss 2.3451  val 2.5012
//    lr 2.00e-03  1.23k tok/s  ETA 12s"
// When it does not fit, lr goes first, then throughput, ETA, validation
// loss, loss and status, keeping room for a bar of at least kMinBarWidth; the
// bar goes only when the label and step count alone leave no room for it, and
// the rest is cut at `width`. Never ends with a newline.
std::string FormatProgressLine(const ProgressSnapshot& snapshot, int width);

// The same fields without a bar or width limit, for log-style output:
//   "abc  RUNNING  step 30/60 (50%)  loss 2.3451  lr 2.00e-03  ..."
std::string FormatProgressText(const ProgressSnapshot& snapshot);

// "[####....]" of `width` columns in all, brackets included (>= 3).
std::string FormatBar(double fraction, int width);

// A duration for people: "45s", "3m05s", "2h07m", "3d04h"; "?" when
// negative or not finite.
std::string FormatDuration(double seconds);

// A count with a k/M/G suffix: "950", "1.23k", "45.6M".
std::string FormatCount(double value);

// Estimates the step rate from (step, time) samples over a sliding window,
// so the ETA follows recent speed rather than the whole run's average.
class StepRateEstimator {
 public:
  // Samples kept; the rate spans the oldest to the newest.
  explicit StepRateEstimator(int window = 20) : window_(window) {}

  // A sample: `step` reached at `time_seconds` (any fixed epoch). Samples
  // going back in step restart the estimate.
  void Add(int64_t step, double time_seconds);

  // Steps per second over the window; nullopt until two samples span
  // both some time and some steps.
  std::optional<double> StepsPerSecond() const;

  // Seconds until `total_steps` from `step` at the current rate; 0 when
  // done; nullopt when the total or the rate is unknown.
  std::optional<double> EtaSeconds(int64_t step, int64_t total_steps) const;

 private:
  int window_;
  std::deque<std::pair<int64_t, double>> samples_;  // (step, time).
};

// Decides when a non-interactive display (a log file, a pipe) prints a
// metrics line: the first step, each further `progress_fraction` of the
// total, the last step, and otherwise once `min_interval_seconds` passed
// since the previous line.
class PlainProgressThrottle {
 public:
  explicit PlainProgressThrottle(double min_interval_seconds = 5.0,
                                 double progress_fraction = 0.1)
      : min_interval_seconds_(min_interval_seconds),
        progress_fraction_(progress_fraction) {}

  // Whether to print a line for `step` of `total_steps` (<= 0: unknown) at
  // `now_seconds`; when it returns true it counts the line as printed.
  bool ShouldPrint(int64_t step, int64_t total_steps, double now_seconds);

 private:
  double min_interval_seconds_;
  double progress_fraction_;
  bool printed_any_ = false;
  double last_time_ = 0;
  int64_t last_bucket_ = -1;  // Progress bucket of the previous line.
  int64_t last_step_ = -1;
};

}  // namespace loraplex

#endif  // LORAPLEX_CLIENT_PROGRESS_BAR_H_
