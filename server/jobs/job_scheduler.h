// Moves jobs through their lifecycle (docs/DESIGN.md §8): queued jobs go into
// free slots first come, first served, under a per-tenant slot quota (a job
// over quota waits; it never fails for it); the trainer's reports become
// stored status changes and per-step metrics; finished jobs free their
// slots for the next ones.
//
//   JobScheduler scheduler(&store, &datasets, &hub, &logger, options);
//   Trainer trainer(std::move(model), trainer_options,
//                   [&](TrainerReport r) { scheduler.OnTrainerReport(r); });
//   LORAPLEX_RETURN_IF_ERROR(scheduler.Start(&trainer));  // requeues jobs
//   LORAPLEX_ASSIGN_OR_RETURN(JobRecord job,
//                             scheduler.Submit(record, spec, data));
//
// Every change is written to the store before it is visible through the
// API. Reports are handled on the scheduler's own thread, so the trainer
// never waits for the disk. Thread-safe. No LibTorch here: the trainer is
// reached through JobTrainer (job_trainer.h). The reports are handled in
// job_scheduler_reports.cc.
#ifndef LORAPLEX_SERVER_JOBS_JOB_SCHEDULER_H_
#define LORAPLEX_SERVER_JOBS_JOB_SCHEDULER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/common/logger.h"
#include "server/jobs/job_data.h"
#include "server/jobs/job_event_hub.h"
#include "server/jobs/job_lifecycle.h"
#include "server/jobs/job_spec.h"
#include "server/jobs/job_trainer.h"
#include "server/store/job_store.h"

namespace loraplex {

struct SchedulerOptions {
  // Adapters live in <state_dir>/adapters/<adapter id>/.
  std::string state_dir;
  // Slots one tenant's jobs may hold at once.
  int slots_per_tenant = 1 << 30;
  // Seconds between throughput lines in the log; 0: none.
  double throughput_log_seconds = 30.0;
  // Store writes that may fail in a row before `on_store_failure` is called
  // (the server then stops: what it does could no longer be recorded).
  int max_store_failures = 5;
  std::function<void(const absl::Status&)> on_store_failure;
  // Called with a job's id once it has finished and left the trainer (its
  // checkpoints are all written): the retention of its files.
  std::function<void(const std::string& job_id)> on_job_finished;
};

class JobScheduler {
 public:
  JobScheduler(JobStore* store, DatasetLoader* datasets, JobEventHub* hub,
               Logger* logger, const SchedulerOptions& options);
  ~JobScheduler();  // Stops the thread.
  JobScheduler(const JobScheduler&) = delete;
  JobScheduler& operator=(const JobScheduler&) = delete;

  // Queues again the jobs a previous run left queued, validating or running
  // (each continues from its newest valid checkpoint; those that were
  // running go first, back into their slots, all at the same step
  // boundary), keeps paused ones paused, then starts scheduling onto
  // `trainer`. `first` runs once the trainer is set and before any job is
  // queued again: restored training sessions take their slots back there
  // (SessionManager::Restore).
  absl::Status Start(JobTrainer* trainer,
                     const std::function<void()>& first = nullptr);
  // Stores what the trainer reported so far and stops scheduling; jobs keep
  // their stored status (running ones are queued again by the next Start).
  // Stop the trainer first, so nothing it finished is left unrecorded.
  void Stop();
  // The trainer has stopped, or is about to: from now on every call that
  // changes a job (submit, cancel, pause, resume, export of a running job,
  // sample, a session's slot) is refused with `why` (UNAVAILABLE), and the
  // pauses waiting for the trainer are answered with it.
  void RefuseCommands(const absl::Status& why);
  // Whether the job is still the scheduler's (not finished, or finished but
  // still leaving the trainer: its last checkpoint may be being written).
  bool Holds(const std::string& job_id);

  // Stores `job` as QUEUED, with `spec` (validated at the edge) as its
  // stored spec, and queues it with `data` (prepared from the spec).
  // Returns the stored record.
  // With `request`, the request is recorded with the job (ALREADY_EXISTS,
  // nothing stored, when it already is: JobStore::InsertJob).
  absl::StatusOr<JobRecord> Submit(
      JobRecord job, JobSpec spec, JobData data,
      const std::optional<RequestKey>& request = std::nullopt);
  // CANCELLED with `reason`; the slot of a running job is retired.
  // FAILED_PRECONDITION when the job already finished.
  absl::StatusOr<JobRecord> Cancel(const std::string& tenant,
                                   const std::string& job_id,
                                   const std::string& reason);
  // Pauses a queued job at once, or has the trainer checkpoint and retire a
  // running one; `done` gets the PAUSED record then (on the scheduler's
  // thread), or the reason it was not paused. Errors: NOT_FOUND,
  // FAILED_PRECONDITION (finished, already paused, a pause pending),
  // UNAVAILABLE at shutdown, or the checkpoint's error (the job trains on).
  void Pause(const std::string& tenant, const std::string& job_id,
             std::function<void(absl::StatusOr<JobRecord>)> done);
  // Queues a PAUSED job again. FAILED_PRECONDITION if it is not paused.
  absl::StatusOr<JobRecord> Resume(const std::string& tenant,
                                   const std::string& job_id);
  // <state_dir>/checkpoints/<job_id>.
  std::string CheckpointDir(const std::string& job_id) const;
  // Writes a running job's current adapter into `dir`; `done` runs on a
  // trainer's thread. NOT_FOUND (through `done`) if it is not in a slot.
  void ExportRunning(const std::string& job_id, const std::string& dir,
                     std::function<void(absl::Status)> done);
  // Samples on the trainer (JobTrainer::Sample).
  void Sample(SampleCommand command);
  std::string AdapterDir(const std::string& adapter_id) const;
  // Training sessions (session_manager.h) hold slots beside the jobs: one
  // for a new session of `tenant` if the pool and the tenant's quota have
  // one, else RESOURCE_EXHAUSTED. Queued jobs wait while sessions hold the
  // slots.
  absl::Status ReserveSessionSlot(const std::string& tenant);
  // The session's slot is free again (its close was applied, or it never
  // opened).
  void ReleaseSessionSlot(const std::string& tenant);
  // The trainer's slots as of its last iteration.
  std::vector<SlotInfo> Slots() const { return trainer_->Slots(); }
  TrainerStats Stats() const { return trainer_->Stats(); }

  // Called by the trainer (on its thread); only queues the report.
  void OnTrainerReport(TrainerReport report);

 private:
  struct LiveJob {
    JobRecord record;
    // The status the scheduler last stored or tried to (a failed write is
    // retried with the next one); each change of record.status is checked
    // against it (job_lifecycle.h) before it is stored.
    JobStatus stored_status = JobStatus::kQueued;
    JobPlace place = JobPlace::kWaiting;
    // The native spec; unset for a job read back from the store until its
    // stored JSON is parsed (once, when it is next scheduled).
    std::optional<JobSpec> spec;
    JobData data;  // Set from kPrepared on.
    std::string final_adapter_id;
    // Requeued by Start: the slot it had when the server stopped (-1:
    // none), to go back into; cleared once it is handed to the trainer.
    std::optional<int> restarted_in_slot;
    // kPausing: the PauseJob call waiting for the trainer.
    std::function<void(absl::StatusOr<JobRecord>)> pause_done;
  };

  void Run();
  void HandleReports(std::deque<TrainerReport> reports)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the next queued jobs to the trainer, once each has its data.
  void FillSlots() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The scheduler's thread: prepares the data of the jobs FillSlots marked
  // (datasets read and tokenized without holding mu_), then fills slots.
  void PrepareQueuedData() ABSL_LOCKS_EXCLUDED(mu_, inbox_mu_);
  // Stores the live job's record with `events` and notifies watchers; a
  // failed write is logged and counted (CountStoreWrite) and returned.
  absl::Status Commit(LiveJob& job, std::vector<JobEventRecord> events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INTERNAL (logged) unless the lifecycle allows the job's stored status
  // to become `to` (job_lifecycle.h).
  absl::Status CheckStatusChange(const LiveJob& job, JobStatus to);
  // A change a caller asked for: `updated` is stored with `events` first,
  // and becomes the live job's record only once it is (else the error,
  // and the live job as it was).
  absl::Status CommitChange(LiveJob& job, const JobRecord& updated,
                            std::vector<JobEventRecord> events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts store writes that failed in a row; past max_store_failures the
  // server is told to stop.
  void CountStoreWrite(const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobEventRecord StatusEvent(const JobRecord& job, JobStatus status,
                             const std::string& message);
  // Moves `job` to `place` (a move the table does not allow is a bug:
  // logged, and made all the same).
  void MoveTo(LiveJob& job, JobPlace place) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job that leaves the trainer frees its slot reservation.
  void Release(LiveJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(LiveJob& job, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnAttached(LiveJob& job, const TrainerReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnPaused(LiveJob& job, const TrainerReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnCheckpoint(const LiveJob& job, const TrainerReport& report);
  int store_failures_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status refused_ ABSL_GUARDED_BY(mu_);  // Set by RefuseCommands.
  // The live job of `tenant` (any tenant when empty) that is not finished,
  // else NOT_FOUND or FAILED_PRECONDITION from the store.
  absl::StatusOr<LiveJob*> ActiveJob(const std::string& tenant,
                                     const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the job out of the queue, if it is there.
  void Dequeue(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a finished job that the trainer no longer holds, answering a
  // pending pause.
  void Forget(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogThroughput() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobStore* store_;
  DatasetLoader* datasets_;
  JobEventHub* hub_;
  Logger* logger_;
  SchedulerOptions options_;
  JobTrainer* trainer_ = nullptr;

  // The trainer only ever takes this lock, never mu_, so it does not wait
  // for the store. Taken inside mu_ (never the other way round). Lock
  // order: server/README.md.
  absl::Mutex inbox_mu_;
  absl::CondVar wake_;
  bool stop_ ABSL_GUARDED_BY(inbox_mu_) = false;
  std::deque<TrainerReport> inbox_ ABSL_GUARDED_BY(inbox_mu_);
  // FillSlots found jobs whose data must be prepared first.
  bool prepare_requested_ ABSL_GUARDED_BY(inbox_mu_) = false;

  absl::Mutex mu_;
  // Not terminal.
  std::map<std::string, std::unique_ptr<LiveJob>> live_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);  // FIFO of QUEUED.
  int reserved_ ABSL_GUARDED_BY(mu_) = 0;               // Slots in use.
  std::map<std::string, int> reserved_by_tenant_ ABSL_GUARDED_BY(mu_);
  // Throughput since the last log line.
  int64_t window_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t window_steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_JOBS_JOB_SCHEDULER_H_
