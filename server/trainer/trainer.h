// The trainer thread: the only thread that touches tensors (docs/DESIGN.md §1).
// It owns the frozen base model and the slot pool, applies commands from
// one thread-safe queue between steps, trains every active slot together
// one co-batched step at a time, and reports what happened to a sink.
//
//   Trainer trainer(std::move(model), options, [&](TrainerReport r) {...});
//   trainer.Start();
//   trainer.Attach(std::move(command));      // reported as kAttached
//   ... kStep reports, then kFinished when the job's last step is done ...
//   trainer.Stop();
//
// Commands never block the caller and go straight to the trainer's inbox;
// only an attach that resumes from a checkpoint goes through the checkpoint
// writer's queue first, which reads its files on its thread (commands sent
// while it is on its way follow it, keeping their order), so no other
// command waits behind a checkpoint being written. The sink runs on the
// trainer thread and
// must return quickly (queue the report elsewhere). When a job trains its
// last step the trainer evaluates it, exports its adapter (PEFT files in
// final_adapter_dir, written to a temporary directory and renamed into
// place), retires the slot, and only then reports kFinished.
//
// Checkpoints are pool-consistent (pool_checkpointer.h): when a step
// completes a multiple of any job's checkpoint interval, every training
// slot is checkpointed at that same step boundary. A job is also
// checkpointed when it is paused or retired, and every job when the trainer
// stops. The trainer encodes a checkpoint's files in memory and the
// checkpointer's writer thread writes them, so training goes on while they
// are fsynced and hashed; a pause, a retire, a job's end and the trainer's
// stop wait for the job's (or every) checkpoint to be on disk before they
// are reported.
//
// Data parallel (docs/DESIGN.md §6): with TrainerOptions::dist of more than one
// rank, every rank runs a trainer over the same base model. Rank 0's takes
// the commands and, before each iteration, broadcasts the plan of what
// changes at that step boundary (step_plan.h); the others Follow() it, so
// all ranks attach, retire and checkpoint the same slots at the same steps
// and train their shares of every slot's rows together. Only rank 0 reads
// and writes files and reports. RankCoordinator (rank_coordinator.h) is the
// one place that knows which of these roles a process has.
//
// The loop (trainer.cc): collect the commands, plan the iteration, apply
// each command by handing it to its part, run the co-batched pass of the
// jobs' step and the sessions' calls, sample, publish the slots. The
// commands are trainer_commands.h: a new command is one header in
// commands/ (its struct, its planning, its Apply) and its name in the
// TrainerCommand variant there; Post() sends it. The parts, each
// with its own header and state: who holds each slot (slot_owners.h), the
// jobs' slots with their checkpoint writer (job_slots.h), the sessions'
// slots with theirs (session_slots.h), the sampling runner
// (sampling_runner.h) and the report gate that holds reports behind pool
// checkpoints being written (report_gate.h); the ranks are
// rank_coordinator.h.
#ifndef LORAPLEX_SERVER_TRAINER_TRAINER_H_
#define LORAPLEX_SERVER_TRAINER_TRAINER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "adapters/data_parallel_slots.h"
#include "adapters/slot_pool.h"
#include "core/dist/process_group.h"
#include "core/model/llama_model.h"
#include "core/sample/batch_generator.h"
#include "core/train/co_batch_step.h"
#include "server/checkpoints/pool_checkpointer.h"
#include "server/jobs/job_trainer.h"
#include "server/trainer/job_slots.h"
#include "server/trainer/rank_coordinator.h"
#include "server/trainer/report_gate.h"
#include "server/trainer/sampling_runner.h"
#include "server/trainer/session_slots.h"
#include "server/trainer/slot_owners.h"
#include "server/trainer/step_plan.h"
#include "server/trainer/trainer_commands.h"
#include "server/trainer/trainer_parts.h"

namespace loraplex {

struct TrainerOptions {
  SlotPoolOptions pool;
  CoBatchOptions co_batch;
  // base_model_name_or_path written into exported adapter configs.
  std::string base_model_name;
  // Checkpoints go to <checkpoint_root>/<job id>/; empty: none are taken.
  std::string checkpoint_root;
  // Steps between checkpoints of jobs whose config leaves it at 0; 0: only
  // on pause, retire and stop.
  int64_t checkpoint_interval = 0;
  // Checkpoints kept per job (the newest).
  int keep_checkpoints = 3;
  // Training sessions' checkpoints go to <session_checkpoint_root>/<session
  // id>/ (session_checkpoints.h), after every session_checkpoint_interval-th
  // optimizer step and at Stop(); empty root or interval 0: only at Stop()
  // (empty root: never).
  std::string session_checkpoint_root;
  int64_t session_checkpoint_interval = 1;
  // Told of each session checkpoint written or failed (on the checkpoint
  // writer's thread; a failed one leaves the previous one in place).
  std::function<void(const std::string& session_id, int64_t seq_id,
                     const absl::Status& written)>
      on_session_checkpoint;
  // Trains data parallel over the ranks of `dist` when it has more than one
  // (it must outlive the trainer): rank 0's trainer is Start()ed and takes
  // the commands, every other rank's Follow()s it.
  DistContext* dist = nullptr;
  // Ranks other than 0: whether rank 0 writes checkpoints (the others take
  // part in gathering the optimizer state).
  bool leader_checkpoints = false;
  // The share of the trainer's time that decoding takes while jobs train,
  // in (0, 1): after each training step, sampling runs decode steps until
  // it has used share / (1 - share) of that step's time (at least one step).
  // With nothing to train, decoding runs alone.
  double sample_share = 0.5;
  // Decodes sampled text and stop strings (must outlive the trainer); null:
  // requests with stop strings fail, texts are empty.
  const Tokenizer* tokenizer = nullptr;
  // Called on the trainer thread when the ranks can no longer train together
  // (a collective failed: a rank died or stopped answering). The thread then
  // ends without reporting more; every rank should be restarted, and the
  // jobs resume from their checkpoints.
  std::function<void(const absl::Status&)> on_fatal;
};

class Trainer : public JobTrainer {
 public:
  Trainer(std::unique_ptr<LlamaModel> model, const TrainerOptions& options,
          ReportSink sink);
  ~Trainer();  // Stops the thread.
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void Start();
  // Ranks other than 0, instead of Start(): applies rank 0's plans on this
  // thread until rank 0 stops (OK) or the ranks fail (the error).
  absl::Status Follow();
  // Finishes the current step, checkpoints every training slot (on every
  // rank, when data parallel: the other ranks' Follow() then returns),
  // drops pending commands and joins the thread. Slots keep their jobs
  // (nothing is reported for them).
  void Stop();

  // Runs `work` on the checkpoint writer's thread after every checkpoint
  // queued so far is written (at once without a writer). Any thread.
  void AfterQueuedCheckpoints(std::function<void()> work) {
    jobs_.checkpoints().Post(std::move(work));
  }

  // JobTrainer (job_trainer.h).
  void AttachAll(std::vector<AttachCommand> commands) override;
  void Retire(const std::string& job_id) override;
  void Pause(const std::string& job_id) override;
  void Export(const std::string& job_id, const std::string& dir,
              std::function<void(absl::Status)> done) override;
  void Sample(SampleCommand command) override;
  void OpenSession(SessionOpenCommand command) override;
  void RunSessionOp(SessionOp op) override;
  // The pool's slots, less any kRetiring after a failed retire.
  int capacity() const override { return pool_.capacity() - retiring_.load(); }
  std::vector<SlotInfo> Slots() const override;
  TrainerStats Stats() const override;

  void Attach(AttachCommand command);
  // Sends any command (trainer_commands.h) to the trainer; never blocks.
  // A command that will not be applied (stopping) is Abandon()ed.
  void Post(TrainerCommand command);
  const ModelConfig& model_config() const { return model_->config(); }

 private:
  void Run();
  // Rank 0: waits for commands (or, data parallel, a heartbeat's time) and
  // takes them; false when stopping.
  bool NextBatch(std::deque<TrainerCommand>& batch);
  // The iteration's plan for the other ranks, with the sessions' `round`.
  StepPlan PlanOf(const std::deque<TrainerCommand>& batch, bool stopping,
                  const std::vector<StepPlan::SessionStep>& round) const;
  // The iteration every rank runs alike, the sessions' `round` included;
  // false when the loop ends.
  bool Iterate(std::deque<TrainerCommand>& batch, bool stopping,
               bool checkpoint, std::vector<StepPlan::SessionStep>& round);
  // Posts `commands` in order (a batch of attaches, which OrderAttaches
  // may reorder among themselves).
  void Enqueue(std::vector<TrainerCommand> commands);

  // Trains the jobs' step together with the sessions' `calls` (answered
  // here); returns the slots that trained a step and are still attached.
  std::vector<int> TrainStep(std::vector<SessionCall>& calls);
  // The jobs' step of `slots` (outcomes[i] for slots[i]) after the step of
  // all of them failed leaving them as they were: tried in halves, and
  // halves of the halves that fail, so only the slots that fail alone fail
  // (with their own error) and the others train their step. Every rank
  // takes the same halves: a step's outcome is agreed over the ranks.
  void StepInParts(const std::vector<TrainingSlot*>& slots, size_t begin,
                   size_t end, bool failed_together,
                   std::vector<absl::StatusOr<SlotStepMetrics>>& outcomes);
  // Delivers what the checkpoint writer finished (ReportGate::Flush).
  void ReportWritten();
  // After a part took or freed a slot: counts the kRetiring ones and
  // publishes the slots.
  void SlotsChanged();
  void PublishSlots();

  std::unique_ptr<LlamaModel> model_;
  TrainerOptions options_;
  RankCoordinator ranks_;
  SlotPool pool_;  // Trainer thread only.
  StepSync sync_;  // Data parallel.
  // Rank 0: the last step was a checkpoint step of some job; the pool is
  // checkpointed at the start of the next iteration, on every rank.
  bool pending_checkpoint_ = false;
  // The parts (trainer thread only, but for what their headers say).
  SlotOwners owners_;
  ReportGate reports_;
  JobSlots jobs_;
  SessionSlots sessions_;
  SamplingRunner sampling_;
  // The parts as the commands' hooks get them (trainer_commands.h).
  TrainerParts parts_;
  // Slots kRetiring (read by other threads through capacity()).
  std::atomic<int> retiring_{0};

  // Taken by callers of the commands and Slots(), and by the trainer
  // thread between steps; never held while training. Lock order:
  // server/README.md.
  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  std::deque<TrainerCommand> commands_ ABSL_GUARDED_BY(mu_);
  // Batches of commands on their way through the checkpoint writer
  // (Enqueue): while any is, later commands follow them there.
  int64_t via_writer_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<SlotInfo> slots_ ABSL_GUARDED_BY(mu_);  // Published snapshot.
  TrainerStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_TRAINER_H_
