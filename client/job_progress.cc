#include "client/job_progress.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/display_format.h"
#include "client/progress_bar.h"
#include "core/common/resource_names.h"

namespace loraplex {
namespace {

// Interactive redraws at most this often, so replayed history does not
// flood the terminal.
constexpr double kRedrawIntervalSeconds = 0.1;

double SteadySeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The lines of all watched jobs and their output; thread-safe.
class ProgressBoard {
 public:
  ProgressBoard(const std::vector<WatchedJob>& jobs,
                const JobProgressOptions& options, std::ostream& out)
      : options_(options), out_(out) {
    size_t label_width = 0;
    for (const WatchedJob& job : jobs) {
      Row row;
      row.label = job.label.empty() ? job.name : job.label;
      row.throttle = PlainProgressThrottle(options.plain_interval_seconds);
      label_width = std::max(label_width, row.label.size());
      rows_.push_back(std::move(row));
    }
    // Equal-width labels line up the bars and columns of several jobs.
    for (Row& row : rows_) row.label.resize(label_width, ' ');
  }

  // Takes the job's state from GetJob: its total steps, and with
  // `authoritative` (the final state) its status and latest metrics too.
  // Before that, metrics come only from events, which replay from the
  // first step.
  void SetJob(size_t index, const v1::Job& job, bool authoritative) {
    std::lock_guard<std::mutex> lock(mu_);
    Row& row = rows_[index];
    if (job.total_steps() > 0) row.total_steps = job.total_steps();
    if (authoritative || row.status == v1::JOB_STATUS_UNSPECIFIED) {
      row.status = job.status();
    }
    if (authoritative) {
      if (job.has_metrics() && job.metrics().step() >= row.step) {
        TakeMetricsLocked(row, job.metrics(), /*time_seconds=*/std::nullopt);
      }
      RedrawLocked(/*force=*/true);
    }
  }

  // Shows one event; returns true when the job's total steps are still
  // unknown after a status change (the caller then asks GetJob).
  bool OnEvent(size_t index, const v1::JobEvent& event) {
    std::lock_guard<std::mutex> lock(mu_);
    Row& row = rows_[index];
    if (event.has_status_change()) {
      const v1::JobStatusChange& change = event.status_change();
      row.status = change.status();
      std::string line =
          absl::StrCat(row.label, "  ", JobStatusName(change.status()));
      if (!change.message().empty())
        absl::StrAppend(&line, ": ", change.message());
      if (change.has_error() && !change.error().code().empty()) {
        absl::StrAppend(&line, " (", change.error().code(), ": ",
                        change.error().message(), ")");
      }
      PrintLineLocked(line);
      return row.total_steps <= 0;
    }
    if (event.has_metrics()) {
      TakeMetricsLocked(row, event.metrics(),
                        event.has_time() ? std::optional<double>(
                                               TimestampSeconds(event.time()))
                                         : std::nullopt);
      if (options_.interactive) {
        RedrawLocked(/*force=*/false);
      } else if (row.throttle.ShouldPrint(row.step, row.total_steps,
                                          SteadySeconds())) {
        ProgressSnapshot snapshot = SnapshotLocked(row);
        snapshot.status.clear();
        PrintLineLocked(FormatProgressText(snapshot));
      }
    }
    return false;
  }

  bool IsFinished(size_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    return IsTerminalJobStatus(rows_[index].status);
  }

  void FillResult(size_t index, JobProgressResult* result) {
    std::lock_guard<std::mutex> lock(mu_);
    result->first_loss = rows_[index].first_loss;
    result->last_loss = rows_[index].last_loss;
  }

  // Draws the final lines and leaves the cursor below them.
  void Finish() {
    std::lock_guard<std::mutex> lock(mu_);
    if (options_.quiet || !options_.interactive) return;
    RedrawLocked(/*force=*/true);
    out_ << "\n" << std::flush;
    drawn_ = false;
  }

 private:
  struct Row {
    std::string label;
    v1::JobStatus status = v1::JOB_STATUS_UNSPECIFIED;
    int64_t step = 0;
    int64_t total_steps = 0;
    std::optional<double> loss;
    std::optional<double> lr;
    std::optional<double> tokens_per_second;
    std::optional<double> validation_loss;
    std::optional<double> first_loss;
    std::optional<double> last_loss;
    StepRateEstimator rate;
    PlainProgressThrottle throttle;
  };

  // Step 0 metrics (e.g. of an evaluation-only job) carry no training loss.
  void TakeMetricsLocked(Row& row, const v1::JobMetrics& metrics,
                         std::optional<double> time_seconds) {
    row.step = metrics.step();
    if (metrics.has_validation_loss()) {
      row.validation_loss = metrics.validation_loss();
    }
    if (metrics.step() <= 0) return;
    row.loss = metrics.loss();
    row.lr = metrics.lr();
    row.tokens_per_second = metrics.tokens_per_second();
    if (!row.first_loss.has_value()) row.first_loss = metrics.loss();
    row.last_loss = metrics.loss();
    if (time_seconds.has_value()) row.rate.Add(metrics.step(), *time_seconds);
  }

  ProgressSnapshot SnapshotLocked(const Row& row) const {
    ProgressSnapshot snapshot;
    snapshot.label = row.label;
    snapshot.status = row.status == v1::JOB_STATUS_UNSPECIFIED
                          ? ""
                          : JobStatusName(row.status);
    snapshot.step = row.step;
    snapshot.total_steps = row.total_steps;
    snapshot.loss = row.loss;
    snapshot.lr = row.lr;
    snapshot.tokens_per_second = row.tokens_per_second;
    snapshot.validation_loss = row.validation_loss;
    if (row.status == v1::JOB_STATUS_RUNNING) {
      snapshot.eta_seconds = row.rate.EtaSeconds(row.step, row.total_steps);
    }
    return snapshot;
  }

  // Moves the cursor to the start of the drawn block, if any.
  std::string BlockStartLocked() const {
    if (!drawn_) return "";
    std::string moves = "\r";
    if (rows_.size() > 1)
      absl::StrAppend(&moves, "\x1b[", rows_.size() - 1, "A");
    return moves;
  }

  void RedrawLocked(bool force) {
    if (options_.quiet || !options_.interactive) return;
    const double now = SteadySeconds();
    if (!force && drawn_ && now - last_redraw_ < kRedrawIntervalSeconds) {
      return;
    }
    last_redraw_ = now;
    // One column spare: writing the last column makes some terminals wrap.
    const int width = std::max(options_.width - 1, 20);
    std::string text = BlockStartLocked();
    for (size_t i = 0; i < rows_.size(); ++i) {
      absl::StrAppend(&text,
                      FormatProgressLine(SnapshotLocked(rows_[i]), width),
                      "\x1b[K", i + 1 < rows_.size() ? "\n" : "");
    }
    out_ << text << std::flush;
    drawn_ = true;
  }

  // A line that stays: above the redrawn block, or simply printed.
  void PrintLineLocked(const std::string& line) {
    if (options_.quiet) return;
    if (!options_.interactive) {
      out_ << line << "\n" << std::flush;
      return;
    }
    out_ << BlockStartLocked() << line << "\x1b[K\n";
    drawn_ = false;
    RedrawLocked(/*force=*/true);
  }

  const JobProgressOptions options_;
  std::ostream& out_;
  std::mutex mu_;
  std::vector<Row> rows_;
  bool drawn_ = false;
  double last_redraw_ = 0;
};

// Sleeps up to `seconds`, returning early once `stop` is cancelled.
void SleepUnlessStopped(double seconds, const WatchCancellation& stop) {
  const double end = SteadySeconds() + seconds;
  while (!stop.cancelled() && SteadySeconds() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Watches one job to its end; the result's job is its final state.
absl::StatusOr<JobProgressResult> WatchOne(LoraplexClient& client,
                                           const std::string& name,
                                           size_t index, ProgressBoard& board,
                                           const JobProgressOptions& options,
                                           WatchCancellation& stop) {
  absl::StatusOr<v1::Job> job = client.GetJob(name);
  if (!job.ok()) return job.status();
  board.SetJob(index, *job, /*authoritative=*/false);

  int64_t after_sequence = 0;
  int failures = 0;
  while (!stop.cancelled()) {
    const absl::Status status = client.WatchJob(
        name, after_sequence,
        [&](const v1::JobEvent& event) {
          if (stop.cancelled()) return false;
          after_sequence = std::max(after_sequence, event.sequence());
          failures = 0;
          if (board.OnEvent(index, event)) {
            absl::StatusOr<v1::Job> refreshed = client.GetJob(name);
            if (refreshed.ok()) {
              board.SetJob(index, *refreshed, /*authoritative=*/false);
            }
          }
          return true;
        },
        &stop);
    if (stop.cancelled() || board.IsFinished(index)) break;
    // A stream that ended without the job's final event, or broke: resume
    // unless the server refuses the watch itself.
    if (!IsResumableWatchStatus(status)) return status;
    if (++failures > options.max_reconnects) {
      if (!status.ok()) return status;
      return absl::UnavailableError(absl::StrCat(
          "the watch of ", name, " kept ending before the job finished"));
    }
    absl::StatusOr<v1::Job> current = client.GetJob(name);
    if (current.ok() && IsTerminalJobStatus(current->status())) break;
    SleepUnlessStopped(std::min(failures, 5), stop);
  }
  if (stop.cancelled()) return absl::CancelledError("watch stopped");

  JobProgressResult result;
  absl::StatusOr<v1::Job> final_job = client.GetJob(name);
  if (!final_job.ok()) return final_job.status();
  board.SetJob(index, *final_job, /*authoritative=*/true);
  result.job = *std::move(final_job);
  board.FillResult(index, &result);
  return result;
}

}  // namespace

bool IsResumableWatchStatus(const absl::Status& status) {
  return status.ok() || status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kInternal ||
         status.code() == absl::StatusCode::kAborted;
}

absl::StatusOr<std::vector<JobProgressResult>> WatchJobsWithProgress(
    LoraplexClient& client, const std::vector<WatchedJob>& jobs,
    const JobProgressOptions& options, std::ostream& out) {
  ProgressBoard board(jobs, options, out);
  // Cancelled when one watch fails; wakes the others blocked on their
  // streams.
  WatchCancellation stop;
  std::vector<absl::StatusOr<JobProgressResult>> results(
      jobs.size(), absl::UnknownError("not watched"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < jobs.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = WatchOne(client, jobs[i].name, i, board, options, stop);
      if (!results[i].ok()) stop.Cancel();
    });
  }
  for (std::thread& thread : threads) thread.join();
  board.Finish();

  std::vector<JobProgressResult> finished;
  // The first real error, not the CANCELLED of the watches it stopped.
  for (auto& result : results) {
    if (!result.ok() &&
        result.status().code() != absl::StatusCode::kCancelled) {
      return result.status();
    }
  }
  for (auto& result : results) {
    if (!result.ok()) return result.status();
    finished.push_back(*std::move(result));
  }
  return finished;
}

}  // namespace loraplex
