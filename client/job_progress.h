// Watching jobs until they finish while showing their progress: used by
// `loraplex jobs watch`, `jobs create --wait` and `quickstart`.
//
// On a terminal each job has one line (bar, step/total, loss, lr, tokens/s,
// ETA) redrawn in place, with status changes printed above the lines.
// Elsewhere (a pipe, a log file) each status change and a metrics line per
// 10% of progress or per few seconds are printed as plain lines.
//
//   JobProgressOptions options;
//   options.interactive = isatty(STDOUT_FILENO);
//   LORAPLEX_ASSIGN_OR_RETURN(
//       std::vector<JobProgressResult> results,
//       WatchJobsWithProgress(*client, {{"jobs/abc", "abc"}}, options,
//                             std::cout));
//   if (results[0].job.status() != v1::JOB_STATUS_SUCCEEDED) ...
//
// A watch stream that breaks (the server restarted, a proxy dropped it)
// is resumed from the last event seen.
#ifndef LORAPLEX_CLIENT_JOB_PROGRESS_H_
#define LORAPLEX_CLIENT_JOB_PROGRESS_H_

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace loraplex {

// A job to watch and the label its lines start with.
struct WatchedJob {
  std::string name;   // "jobs/{id}".
  std::string label;  // e.g. the ID; empty: the name.
};

struct JobProgressOptions {
  // Redraw the jobs' lines in place (stdout is a terminal).
  bool interactive = false;
  // Columns of the terminal.
  int width = 80;
  // Print nothing (e.g. for --json output).
  bool quiet = false;
  // Non-interactive: seconds between metrics lines when progress is slow.
  double plain_interval_seconds = 5;
  // Times a broken watch stream is reopened in a row before giving up.
  int max_reconnects = 30;
};

struct JobProgressResult {
  v1::Job job;  // The job's state once it finished.
  // Loss of the first and last training step seen.
  std::optional<double> first_loss;
  std::optional<double> last_loss;
};

// Watches every job (one stream each, concurrently) until all have
// finished, and returns them in the order given. Fails with the first
// stream error that reconnecting cannot fix (e.g. NOT_FOUND); that error
// cancels the other watches' streams (through a WatchCancellation), so
// they end at once instead of waiting for their next event.
// Whether a watch that ended with `status` (OK: the stream ended before
// the job's final event) is worth reopening: the stream broke, rather than
// the server refusing the watch (e.g. NOT_FOUND).
bool IsResumableWatchStatus(const absl::Status& status);

absl::StatusOr<std::vector<JobProgressResult>> WatchJobsWithProgress(
    LoraplexClient& client, const std::vector<WatchedJob>& jobs,
    const JobProgressOptions& options, std::ostream& out);

}  // namespace loraplex

#endif  // LORAPLEX_CLIENT_JOB_PROGRESS_H_
