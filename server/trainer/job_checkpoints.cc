// Jobs' checkpoints (job_slots.h): when the pool is due one, encoding each
// slot's checkpoint for the checkpoint writer, and counting them; the
// reports go through the report gate (report_gate.h).
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "server/common/clock.h"
#include "server/trainer/checkpoint.h"
#include "server/trainer/job_slots.h"

namespace loraplex {

void JobSlots::Report(TrainerReport report) {
  if (!ranks_.leader() || ranks_.Broken()) return;
  reports_.Report(std::move(report));
}

bool JobSlots::CheckpointDue(const std::vector<int>& stepped) const {
  if (!checkpoints_.enabled()) return false;
  for (int slot : stepped) {
    const int64_t interval = owners_.job(slot)->checkpoint_interval;
    if (interval > 0 && pool_.slot(slot).counters.steps % interval == 0) {
      return true;
    }
  }
  return false;
}

void JobSlots::CheckpointPool() {
  if (!checkpoints_.enabled()) return;
  std::vector<std::string> held;
  for (int slot : owners_.JobSlots()) {
    held.push_back(owners_.job(slot)->job_id);
  }
  std::map<std::string, int64_t> queued;
  for (int slot : Trainable()) {
    // On other ranks: takes part in gathering the optimizer states.
    if (CheckpointSlot(slot, /*wait=*/false).ok()) {
      queued[owners_.job(slot)->job_id] = pool_.slot(slot).counters.steps;
    }
  }
  // Recorded once the checkpoints queued before it are written.
  if (ranks_.leader()) {
    checkpoints_.RecordGroup(std::move(held), std::move(queued),
                             reports_.QueueGroup());
  }
}

absl::Status JobSlots::CheckpointSlot(int slot, bool wait) {
  if (!checkpoints_.enabled()) {
    return absl::FailedPreconditionError("checkpoints are disabled");
  }
  const TrainingSlot& training = pool_.slot(slot);
  const auto start = std::chrono::steady_clock::now();
  // Collective when data parallel: every rank gathers the owners' states.
  absl::StatusOr<std::string> state =
      SaveTrainingState(training, ranks_.data_parallel());
  // It may have failed before its collective, which the others are in.
  if (!state.ok()) ranks_.FailIfDistributed(state.status());
  if (!ranks_.leader()) return state.status();
  const SlotJob& job = *owners_.job(slot);
  CheckpointInfo info;
  info.job_id = job.job_id;
  info.time_ms = NowMillis();
  info.slot = slot;
  info.total_steps = training.total_steps;
  info.counters = training.counters;
  info.tokens = job.tokens;
  info.cursor = training.cursor->state();
  info.metrics = job.last_metrics;
  info.job_spec = job.job_spec;
  TrainerReport report = ProgressReport(TrainerReport::Kind::kCheckpoint, slot);
  report.checkpoint_dir = checkpoints_.StepDir(job.job_id, info.step());
  absl::StatusOr<CheckpointContents> contents =
      !state.ok()
          ? state.status()
          : EncodeCheckpoint(training, std::move(info), *std::move(state),
                             options_.base_model_name);
  if (!contents.ok()) {
    CountCheckpoint(start, contents.status());
    report.status = contents.status();
    Report(std::move(report));
    return contents.status();
  }
  // The outcome, for a caller that waits.
  struct Outcome {
    absl::Notification written;
    absl::Status status;
  };
  auto outcome = std::make_shared<Outcome>();
  checkpoints_.Write(*std::move(contents),
                     [this, report = std::move(report), outcome,
                      start](absl::Status status) mutable {
                       CountCheckpoint(start, status);
                       report.status = status;
                       outcome->status = status;
                       reports_.Written(std::move(report));
                       outcome->written.Notify();
                     });
  if (!wait) return absl::OkStatus();
  outcome->written.WaitForNotification();
  ReportWritten();
  return outcome->status;
}

void JobSlots::CountCheckpoint(std::chrono::steady_clock::time_point start,
                               const absl::Status& status) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  absl::MutexLock lock(&stats_mu_);
  if (!status.ok()) {
    ++stats_.checkpoint_failures;
    return;
  }
  ++stats_.checkpoints;
  stats_.checkpoint_seconds += seconds;
  stats_.last_checkpoint_seconds = seconds;
}

void JobSlots::ReportWritten() { reports_.Flush(ranks_.leader()); }

void JobSlots::AddStats(TrainerStats& stats) const {
  absl::MutexLock lock(&stats_mu_);
  stats.checkpoints = stats_.checkpoints;
  stats.checkpoint_seconds = stats_.checkpoint_seconds;
  stats.last_checkpoint_seconds = stats_.last_checkpoint_seconds;
  stats.checkpoint_failures = stats_.checkpoint_failures;
}

void JobSlots::ReportWrittenFor(const std::string& job_id) {
  checkpoints_.WaitForJob(job_id);
  ReportWritten();
}

}  // namespace loraplex
