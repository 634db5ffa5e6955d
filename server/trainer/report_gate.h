// The trainer's reports on their way to its sink, in order (trainer.h).
// Checkpoints are written off the trainer thread; a report made after a
// pool checkpoint was queued waits here until that checkpoint is on disk,
// so once a step is reported the pool's checkpoint before it is durable.
// What the writer finishes (a checkpoint, a job's export) is reported from
// the trainer thread at its next Flush().
//
//   ReportGate reports(sink, wake);
//   reports.Report(step);                    // delivered, or held
//   writer.RecordGroup(..., reports.QueueGroup());
//   ... writer thread: reports.Written(checkpoint_report) -> wake() ...
//   reports.Flush(/*deliver=*/true);         // trainer thread
#ifndef LORAPLEX_SERVER_TRAINER_REPORT_GATE_H_
#define LORAPLEX_SERVER_TRAINER_REPORT_GATE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/jobs/job_trainer.h"

namespace loraplex {

class ReportGate {
 public:
  // `sink` gets every report, on the trainer thread. `wake` is called on
  // the writer's thread, with no lock of the gate held, when Flush() has
  // something to do (the trainer's loop takes its own lock there: the
  // trainer's lock comes before the gate's).
  ReportGate(JobTrainer::ReportSink sink, std::function<void()> wake);

  // Trainer thread: delivers `report` now, or holds it (in order) until
  // the pool checkpoints queued before it are written.
  void Report(TrainerReport report);
  // Trainer thread: a pool checkpoint was queued; reports from now on wait
  // for it. The writer calls the returned function (any thread) once it is
  // written.
  std::function<void()> QueueGroup();
  // Any thread: the writer finished what `report` tells; reported at the
  // next Flush(), a checkpoint at once, anything else (a job's end) behind
  // the reports held before it.
  void Written(TrainerReport report);
  // Trainer thread: delivers the reports held for pool checkpoints now
  // written and what the writer finished; with `deliver` false (a rank
  // that does not report) only takes note of the written checkpoints.
  void Flush(bool deliver);
  // Trainer thread: Flush() has something to do.
  bool pending() const;

 private:
  JobTrainer::ReportSink sink_;
  std::function<void()> wake_;
  // Trainer thread: pool checkpoints queued and known written; reports
  // made after the n-th was queued wait in held_ until it is written.
  int64_t groups_queued_ = 0;
  int64_t groups_written_ = 0;
  std::deque<std::pair<int64_t, TrainerReport>> held_;

  mutable absl::Mutex mu_;
  std::vector<TrainerReport> written_ ABSL_GUARDED_BY(mu_);
  int64_t groups_done_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_REPORT_GATE_H_
