// The job slots' bookkeeping (job_slots.h): which slot holds which job,
// each step's outcome, pausing and retiring, and the ranks' agreement on
// the slots they hold.
#include "server/trainer/job_slots.h"

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/test_faults.h"
#include "core/runtime/exception_message.h"

namespace loraplex {
namespace {

// A report about `job_id`, which `slot` holds (-1: none).
TrainerReport JobReport(TrainerReport::Kind kind, const std::string& job_id,
                        int slot) {
  TrainerReport report;
  report.kind = kind;
  report.job_id = job_id;
  report.slot = slot;
  return report;
}

}  // namespace

JobSlots::JobSlots(const LlamaModel& model, SlotPool& pool, SlotOwners& owners,
                   RankCoordinator& ranks, ReportGate& reports,
                   const CoBatchOptions& co_batch, JobSlotsOptions options,
                   std::function<void()> slots_changed)
    : model_(model),
      pool_(pool),
      owners_(owners),
      ranks_(ranks),
      reports_(reports),
      co_batch_(co_batch),
      options_(std::move(options)),
      slots_changed_(std::move(slots_changed)),
      checkpoints_(options_.checkpoints) {}

void JobSlots::RetryRetires() {
  for (int slot : pool_.SlotsIn(SlotState::kRetiring)) {
    RetireSlot(slot).IgnoreError();  // Still kRetiring on error.
  }
}

void JobSlots::EvaluateWaiting() {
  for (int slot : pool_.SlotsIn(SlotState::kEvaluating)) {
    if (owners_.job(slot)) EvaluateOnly(slot);
  }
}

StepPlan::Active JobSlots::Held(int slot) const {
  StepPlan::Active held;
  held.job_id = owners_.job(slot)->job_id;
  if (pool_.state(slot) != SlotState::kFree) {
    const TrainingSlot& training = pool_.slot(slot);
    held.step = training.counters.steps;
    if (training.cursor) held.cursor = training.cursor->state();
  }
  return held;
}

void JobSlots::FollowActive(const std::map<int, StepPlan::Active>& active) {
  for (int slot : owners_.JobSlots()) {
    auto held = active.find(slot);
    if (held == active.end() ||
        held->second.job_id != owners_.job(slot)->job_id) {
      RetireSlot(slot).IgnoreError();
    }
  }
  for (const auto& [slot, expected] : active) {
    if (!ranks_.failure().ok()) return;
    if (slot < 0 || slot >= pool_.capacity()) {
      ranks_.Fail(absl::InternalError(
          absl::StrCat("rank 0 holds slot ", slot, " but rank ", ranks_.rank(),
                       " has ", pool_.capacity(), " slots")));
      continue;
    }
    if (!owners_.job(slot)) {
      ranks_.Fail(absl::InternalError(
          absl::StrCat("rank ", ranks_.rank(), " holds no job in slot ", slot,
                       " where rank 0 holds job ", expected.job_id)));
      continue;
    }
    const StepPlan::Active mine = Held(slot);
    const bool same =
        mine.step == expected.step &&
        mine.cursor.has_value() == expected.cursor.has_value() &&
        (!mine.cursor || (mine.cursor->seed == expected.cursor->seed &&
                          mine.cursor->epoch == expected.cursor->epoch &&
                          mine.cursor->position == expected.cursor->position));
    if (!same) {
      const auto describe = [](const StepPlan::Active& held) {
        return held.cursor ? absl::StrCat("step ", held.step, ", epoch ",
                                          held.cursor->epoch, ", position ",
                                          held.cursor->position)
                           : absl::StrCat("step ", held.step);
      };
      ranks_.Fail(absl::InternalError(absl::StrCat(
          "rank ", ranks_.rank(), "'s slot ", slot, " (job ", mine.job_id,
          ") is at ", describe(mine), ", rank 0's at ", describe(expected),
          ": the ranks diverged")));
    }
  }
}

int JobSlots::SlotOf(const std::string& job_id) const {
  return owners_.SlotOfJob(job_id);
}

void JobSlots::Pause(PauseJob& command) {
  const int slot = SlotOf(command.job_id);
  TrainerReport report =
      JobReport(TrainerReport::Kind::kPaused, command.job_id, slot);
  if (slot < 0 || pool_.state(slot) != SlotState::kTraining) {
    // A job that just ended is reported so (after its export) first.
    ReportWrittenFor(command.job_id);
    report.status = absl::FailedPreconditionError(
        absl::StrCat("job \"", command.job_id, "\" is not training in a slot"));
  } else {
    owners_.job(slot)->held = false;  // Trains on if the pause fails.
    // Every rank takes part in the checkpoint; a fault only fails the
    // pause (the ranks agree on it below).
    const absl::Status fault = TestFault(TestFaultPoint::kPauseCheckpoint,
                                         pool_.slot(slot).training.seed);
    report.status = CheckpointSlot(slot, /*wait=*/true);
    if (report.status.ok()) report.status = fault;
    // Rank 0 alone writes the checkpoint: all pause or none does.
    absl::StatusOr<int> failed = ranks_.CountFailed(!report.status.ok());
    if (!failed.ok()) return;  // Broken.
    if (*failed > 0 && report.status.ok()) {
      report.status = absl::InternalError(
          "its checkpoint failed on another rank (see its log)");
    }
    report.step = pool_.slot(slot).counters.steps;
    report.checkpoint_dir = checkpoints_.StepDir(command.job_id, report.step);
    // Paused once its checkpoint is committed; a failed retire only leaves
    // the slot kRetiring.
    if (report.status.ok()) RetireSlot(slot).IgnoreError();
  }
  Report(std::move(report));
}

void JobSlots::Retire(RetireJob& command) {
  const int slot = SlotOf(command.job_id);
  TrainerReport report =
      JobReport(TrainerReport::Kind::kRetired, command.job_id, slot);
  if (slot < 0) {
    // A job that just ended is reported so (after its export) first.
    ReportWrittenFor(command.job_id);
    // Reported all the same, so the scheduler lets go of the job.
    report.status = absl::NotFoundError(
        absl::StrCat("job \"", command.job_id, "\" is not in a slot"));
    Report(std::move(report));
    return;
  }
  // The job's state up to here stays available (export, a new job).
  if (pool_.state(slot) == SlotState::kTraining) {
    CheckpointSlot(slot, /*wait=*/true).IgnoreError();
  }
  if (pool_.state(slot) != SlotState::kFree) {
    // The steps it trained since its last step report (the scheduler drops
    // those of a cancelled job), so its record matches its checkpoint.
    const TrainerReport progress = ProgressReport(report.kind, slot);
    report.step = progress.step;
    report.tokens = progress.tokens;
  }
  report.status = RetireSlot(slot);
  Report(std::move(report));
}

std::vector<int> JobSlots::Trainable() const {
  std::vector<int> ids;
  for (int slot : pool_.SlotsIn(SlotState::kTraining)) {
    if (owners_.job(slot)) ids.push_back(slot);
  }
  return ids;
}

std::vector<int> JobSlots::Steppable() const {
  std::vector<int> ids;
  for (int slot : Trainable()) {
    if (!owners_.job(slot)->held) ids.push_back(slot);
  }
  return ids;
}

absl::Status JobSlots::RetireSlot(int slot) {
  absl::Status status =
      CatchTorch("retire", [&] { return pool_.Retire(slot); });
  // Whether or not zeroing worked, the job has left its slot (a failed
  // retire leaves the slot kRetiring, holding no job). Resumed later, the
  // job continues from its newest checkpoint.
  if (const SlotJob* job = owners_.job(slot)) {
    checkpoints_.Forget(job->job_id);
    owners_.Release(slot);
  }
  if (!status.ok()) {
    ranks_.FailIfDistributed(absl::InternalError(absl::StrCat(
        "freeing slot ", slot, " failed on rank ", ranks_.rank(), " (",
        status.message(), "); the ranks' pools would differ")));
  }
  // Seen free (ListSlots) before the retire, pause or end is reported.
  slots_changed_();
  return status;
}

TrainerReport JobSlots::ProgressReport(TrainerReport::Kind kind,
                                       int slot) const {
  const SlotJob& job = *owners_.job(slot);
  const TrainingSlot& training = pool_.slot(slot);
  TrainerReport report;
  report.kind = kind;
  report.job_id = job.job_id;
  report.slot = slot;
  report.step = training.counters.steps;
  report.total_steps = training.total_steps;
  report.tokens = job.tokens;
  report.skipped_steps = training.counters.skipped_steps;
  return report;
}

std::vector<int> JobSlots::RecordSteps(
    const std::vector<int>& ids,
    std::vector<absl::StatusOr<SlotStepMetrics>>& outcomes, double seconds) {
  std::vector<int> stepped;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int slot = ids[i];
    if (!outcomes[i].ok()) {
      FinishJob(slot, outcomes[i].status());
      continue;
    }
    if (!outcomes[i]->failure.empty()) {
      FinishJob(slot, absl::InternalError(outcomes[i]->failure));
      continue;
    }
    SlotJob& job = *owners_.job(slot);
    const TrainingSlot& training = pool_.slot(slot);
    const SlotStepMetrics& step = *outcomes[i];
    job.tokens += step.tokens;
    job.last_metrics.emplace();
    job.last_metrics->loss = step.loss;
    job.last_metrics->lr = step.lr;
    job.last_metrics->grad_norm = step.grad_norm;
    const double rate = seconds > 0 ? step.tokens / seconds : 0.0;
    // A short moving average: single steps are noisy on a shared machine.
    job.tokens_per_second = job.tokens_per_second == 0.0
                                ? rate
                                : 0.7 * job.tokens_per_second + 0.3 * rate;
    TrainerReport report = ProgressReport(TrainerReport::Kind::kStep, slot);
    report.metrics = step;
    report.tokens_per_second = job.tokens_per_second;
    const bool interval_eval = ranks_.leader() && job.validation &&
                               job.eval_interval > 0 &&
                               pool_.state(slot) == SlotState::kTraining &&
                               training.counters.steps % job.eval_interval == 0;
    if (interval_eval) {
      absl::StatusOr<double> loss = Validate(slot);
      if (!loss.ok()) {
        FinishJob(slot, loss.status());
        continue;
      }
      report.validation_loss = *loss;
      job.last_metrics->validation_loss = *loss;
    }
    Report(std::move(report));
    if (pool_.state(slot) == SlotState::kTrained) {
      FinishJob(slot, absl::OkStatus());
    } else {
      stepped.push_back(slot);
      // Test only; single-process servers (the release by an export is
      // rank 0's alone, which the other ranks' plans would not follow).
      if (!ranks_.distributed() &&
          TestHold(training.training.seed, training.counters.steps)) {
        job.held = true;
      }
    }
  }
  return stepped;
}

}  // namespace loraplex
