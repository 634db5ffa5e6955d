// The trainer's part for jobs (trainer.h): the slots that train jobs from
// the scheduler. It attaches a job (resuming its newest checkpoint that
// verifies), records each step's outcome and reports it, validates at the
// job's interval, checkpoints the pool when a job is due one (every
// training slot at the same step boundary), pauses, retires and exports
// jobs, and finishes a job whose last step is trained (validated, adapter
// exported, slot retired, then reported). The files go through the
// checkpoint writer (pool_checkpointer.h), its reports through the report
// gate. Data parallel, every rank's JobSlots does the same at the same
// step boundary; rank 0's alone reads and writes files and reports.
// Trainer thread only, except ReadFiles (the writer's thread) and
// AddStats (any).
//
// Its files: job_slots.cc (slots, step outcomes, pause and retire, the
// ranks' agreement), job_attach.cc, job_finish.cc, job_checkpoints.cc.
#ifndef LORAPLEX_SERVER_TRAINER_JOB_SLOTS_H_
#define LORAPLEX_SERVER_TRAINER_JOB_SLOTS_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "adapters/slot_pool.h"
#include "core/model/llama_model.h"
#include "core/train/co_batch_step.h"
#include "server/checkpoints/pool_checkpointer.h"
#include "server/jobs/job_trainer.h"
#include "server/trainer/rank_coordinator.h"
#include "server/trainer/report_gate.h"
#include "server/trainer/slot_owners.h"
#include "server/trainer/step_plan.h"
#include "server/trainer/trainer_commands.h"

namespace loraplex {

struct JobSlotsOptions {
  // base_model_name_or_path written into exported adapter configs.
  std::string base_model_name;
  // The checkpoint policy and where the writer writes.
  PoolCheckpointerOptions checkpoints;
};

class JobSlots {
 public:
  // The references are the trainer's and must outlive this; `co_batch`
  // is what validation uses; `slots_changed` runs after a slot was freed.
  JobSlots(const LlamaModel& model, SlotPool& pool, SlotOwners& owners,
           RankCoordinator& ranks, ReportGate& reports,
           const CoBatchOptions& co_batch, JobSlotsOptions options,
           std::function<void()> slots_changed);

  // The checkpoint writer: the trainer posts its commands that read files
  // through it, flushes and stops it.
  PoolCheckpointer& checkpoints() { return checkpoints_; }

  // The job commands (trainer_commands.h). ReadFiles runs on the
  // checkpoint writer's thread and uses only the writer; Prepare runs on
  // rank 0 before the plan.
  void ReadFiles(AttachJob& command);
  void Prepare(AttachJob& command);
  void Attach(AttachJob& command);
  void Retire(RetireJob& command);
  void Pause(PauseJob& command);
  void Export(ExportJob& command);
  // Applies attaches that go back to a slot (their checkpoint's) before
  // the other attaches next to them.
  void OrderAttaches(std::deque<TrainerCommand>& batch) const;

  // The slot holding `job_id`'s job, or -1.
  int SlotOf(const std::string& job_id) const;
  // Jobs' slots that train, and those of them not kept from stepping by
  // a test hold (held ones are still checkpointed with the pool).
  std::vector<int> Trainable() const;
  std::vector<int> Steppable() const;
  // Retires the kRetiring slots again (a failed retire is retried every
  // iteration), and evaluates the jobs that only evaluate.
  void RetryRetires();
  void EvaluateWaiting();
  // After a pass that took `slots` (outcomes[i] for slots[i]) and lasted
  // `seconds`: counts, reports and validates each step, finishes the jobs
  // that failed or trained their last step; returns the slots that
  // stepped and are still attached.
  std::vector<int> RecordSteps(
      const std::vector<int>& slots,
      std::vector<absl::StatusOr<SlotStepMetrics>>& outcomes, double seconds);
  // Whether a slot that stepped reached a multiple of its job's
  // checkpoint interval.
  bool CheckpointDue(const std::vector<int>& stepped) const;
  // Checkpoints every training slot at this step boundary, then records
  // the group as the pool's last complete checkpoint.
  void CheckpointPool();

  // Data parallel: the slot rank 0 holds, as the plan describes it; and
  // on the other ranks, frees the slots whose jobs rank 0 no longer has
  // and checks the others are where rank 0's are (else the ranks break).
  StepPlan::Active Held(int slot) const;
  void FollowActive(const std::map<int, StepPlan::Active>& active);

  // Adds the checkpoint counts to `stats`. Any thread.
  void AddStats(TrainerStats& stats) const;

 private:
  // Hands the report to the gate (rank 0, ranks not broken).
  void Report(TrainerReport report);
  // Delivers what the writer finished (ReportGate::Flush).
  void ReportWritten();
  // Waits until the job's queued checkpoints and export are written, then
  // ReportWritten().
  void ReportWrittenFor(const std::string& job_id);
  // A report of `kind` with the slot's job, step and token counts.
  TrainerReport ProgressReport(TrainerReport::Kind kind, int slot) const;
  // Retires the slot and forgets its job; on failure the slot stays
  // kRetiring (retried every iteration), and when data parallel the ranks
  // are broken (their pools would differ).
  absl::Status RetireSlot(int slot);
  // Retires a slot attached for `job_id` that the trainer did not take.
  void FreeSlot(int slot, const std::string& job_id);
  void EvaluateOnly(int slot);
  void FinishJob(int slot, absl::Status status);
  absl::StatusOr<double> Validate(int slot);
  // Copies the slot's adapter and queues its export into `dir` for the
  // writer thread; `done` gets the outcome there (at once, on this thread,
  // if the copy fails).
  void ExportSlot(int slot, const std::string& dir,
                  std::function<void(absl::Status)> done);
  // ReadFiles' work: finds the checkpoint to resume (the newest that
  // verifies) and reads its state.
  absl::Status ReadAttachFiles(AttachJob& command);
  // Attaches the prepared command, restoring its checkpoint.
  absl::StatusOr<int> AttachPrepared(AttachJob& command,
                                     std::optional<int64_t>& tokens);
  // Data parallel: an attach stands only if it succeeded on every rank;
  // then rank 0's weights become every rank's.
  absl::StatusOr<int> AgreeOnAttach(absl::StatusOr<int> slot);
  // Saves the slot's state and queues its checkpoint for the writer,
  // reported as kCheckpoint once written. With `wait`, returns once it is
  // written, with the outcome; else OK once queued.
  absl::Status CheckpointSlot(int slot, bool wait);
  // Counts a checkpoint started at `start` (a failure when `status` is
  // not OK). Any thread.
  void CountCheckpoint(std::chrono::steady_clock::time_point start,
                       const absl::Status& status);

  const LlamaModel& model_;
  SlotPool& pool_;
  SlotOwners& owners_;
  RankCoordinator& ranks_;
  ReportGate& reports_;
  const CoBatchOptions& co_batch_;
  JobSlotsOptions options_;
  std::function<void()> slots_changed_;
  mutable absl::Mutex stats_mu_;
  TrainerStats stats_ ABSL_GUARDED_BY(stats_mu_);  // Checkpoint counts.
  // Last: stopped (its queued tasks, which count checkpoints, run) before
  // the members above go.
  PoolCheckpointer checkpoints_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_JOB_SLOTS_H_
