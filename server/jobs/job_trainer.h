// The trainer as the job scheduler sees it (docs/DESIGN.md §1): commands into
// one queue, answered later by reports, and a snapshot of the slots. No
// LibTorch here: Trainer (server/trainer/trainer.h) implements it over the
// model and the slot pool, and the scheduler's tests drive a fake.
//
//   trainer.AttachAll(std::move(commands));  // reported as kAttached
//   ... kStep reports, then kFinished when the job's last step is done ...
//   trainer.Retire(job_id);                  // reported as kRetired
//
// Commands never block the caller and apply in the order they were given,
// between two training steps. Reports reach the sink the implementation
// was built with, on its thread.
#ifndef LORAPLEX_SERVER_JOBS_JOB_TRAINER_H_
#define LORAPLEX_SERVER_JOBS_JOB_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/data/sequences.h"
#include "core/lora/lora_config.h"
#include "core/optim/optimizer_config.h"
#include "core/sample/sample_output.h"
#include "core/sample/sampling_params.h"
#include "core/train/loss_fn.h"
#include "core/train/step_metrics.h"
#include "server/jobs/job_spec.h"

namespace loraplex {

// One job to put into a free slot.
struct AttachCommand {
  std::string job_id;
  std::string tenant;
  // What the slot trains (validated).
  JobSpec spec;
  // Training sequences; null: evaluate the adapter on `validation` and
  // finish.
  std::shared_ptr<const SequenceSet> data;
  std::shared_ptr<const SequenceSet> validation;  // May be null.
  // A stored PEFT adapter to start from (loaded by the trainer); empty for
  // PEFT's initialisation.
  std::string initial_adapter_dir;
  // Where the trained adapter goes; empty for an evaluation-only job.
  std::string final_adapter_dir;
  // The slot to take when it is free (-1: the lowest free one, or the slot
  // of the checkpoint it resumes).
  int preferred_slot = -1;
  // Continue from the job's newest checkpoint that verifies; start afresh
  // when it has none.
  bool resume = false;
  // Requeued by a restart: resume from the pool's last complete checkpoint
  // (the same co-batches as before the crash).
  bool recovering = false;
  // The job's configuration as stored, recorded in its checkpoints.
  nlohmann::json job_spec;
};

// One sampling request (docs/DESIGN.md §11), validated at the edge.
struct SampleCommand {
  std::string tenant;
  // The weights: a running job's current adapter (`job_id`), the PEFT files
  // in `adapter_dir` (a stored adapter, a finished job's, a checkpoint's),
  // or the base model (both empty).
  std::string job_id;
  std::string adapter_dir;
  // The step `adapter_dir`'s weights were taken at (a checkpoint's), to
  // report; a running job's is the trainer's to fill in.
  int64_t weights_step = 0;
  std::vector<int64_t> prompt;
  SamplingParams params;
  int64_t n = 1;
  // After each generated token, on the trainer's thread (may be empty; must
  // return quickly): the sample's index and the sample so far.
  std::function<void(int64_t sample, const GeneratedSample& so_far)> on_token;
  // Polled between decode steps (may be empty): true when the caller has
  // gone, so decoding stops and `done` gets CANCELLED.
  std::function<bool()> cancelled;
  // Once, with the result and the step of the weights sampled (on the
  // trainer's thread or the caller's; must return quickly).
  std::function<void(absl::StatusOr<SampleResult> result, int64_t step)> done;
};

// Opens a client-driven training session in a free slot (docs/DESIGN.md §12):
// its adapter (PEFT's initialisation seeded with `seed`) and optimizer,
// trained only by its own operations.
struct SessionOpenCommand {
  std::string session_id;
  std::string tenant;
  LoraConfig lora;  // Validated.
  OptimizerConfig optimizer;
  uint64_t seed = 0;
  // A session checkpoint to continue from (its weights, optimizer state,
  // counters and gradients: server/checkpoints/session_checkpoints.h);
  // empty: a fresh adapter.
  std::string restore_dir;
  // The slot to take when it is free (the one it had before a restart).
  int preferred_slot = -1;
  // With the slot, or why none was opened (on the trainer's thread).
  std::function<void(absl::StatusOr<int> slot)> done;
};

// The file of a saved session state (kSaveState) that describes it: a
// JSON object with its tenant, LoRA and optimizer configs, seed and steps.
inline constexpr char kSessionStateFile[] = "session_state.json";

// What a session operation returns.
struct SessionOpResult {
  ForwardBackwardOutput forward_backward;  // kForwardBackward, kForward.
  SlotStepMetrics step;                    // kOptimStep.
  int64_t steps = 0;                       // The session's optimizer steps.
};

// One operation of an open session. A session's operations apply in the
// order they were given; forward/backward calls of every session and the
// jobs' steps run as one co-batched pass per trainer iteration.
struct SessionOp {
  enum class Kind {
    kForwardBackward,  // Adds the gradients of `loss` over `data`.
    kForward,          // The same outputs, no gradients.
    kOptimStep,        // Steps on the gradients added since the last step.
    kSaveWeights,      // Writes the adapter as PEFT files into `dir`.
    kSaveState,        // Writes the adapter, the optimizer state and
                       // `state_meta` (with "steps" added) into `dir`.
    kLoadState,        // Loads the weights (with_optimizer: the optimizer
                       // state and steps too) saved in `dir`.
    kClose,            // Frees the slot (moments zeroed).
  };
  Kind kind = Kind::kForwardBackward;
  std::string session_id;
  // Its place in the session's order (recorded in session checkpoints); 0
  // for the server's own operations (the idle save and close).
  int64_t seq_id = 0;
  std::shared_ptr<const std::vector<Datum>> data;  // Validated.
  LossFnSpec loss;
  OptimizerConfig step;  // kOptimStep: this step's hyperparameters.
  double grad_clip = 0.0;
  std::string dir;              // kSaveWeights, kSaveState, kLoadState.
  std::string state_meta;       // kSaveState: a JSON object.
  bool with_optimizer = false;  // kLoadState.
  // Once, with the outcome (on a trainer's thread; must return quickly).
  std::function<void(absl::StatusOr<SessionOpResult>)> done;
};

// A snapshot of one slot, published after every trainer iteration.
struct SlotInfo {
  bool attached = false;
  std::string job_id;
  std::string session_id;  // Set instead of job_id for a session's slot.
  std::string tenant;
  int64_t rank = 0;
  std::string family;  // "adamw", "adam", "muon"; empty when evaluating.
  int64_t step = 0;
  int64_t total_steps = 0;
  double lr = 0.0;
  // The end of the trainer iteration in which the slot's step count last
  // moved (Unix ms; a job resumed at step N counts as moved when it
  // attaches); 0 before any step.
  int64_t last_step_time_ms = 0;
};

// Server-wide counters of the trainer (for /metrics). Seconds.
struct TrainerStats {
  int64_t steps = 0;  // Co-batched training passes (jobs' and sessions').
  double step_seconds = 0.0;       // Their wall time, together.
  double last_step_seconds = 0.0;  // The newest one's.
  int64_t checkpoints = 0;  // Slot checkpoints written (their files synced).
  // From the start of each checkpoint (gathering its state) to its files on
  // disk, together; and the newest one's.
  double checkpoint_seconds = 0.0;
  double last_checkpoint_seconds = 0.0;
  int64_t checkpoint_failures = 0;  // Checkpoints that could not be written.
};

struct TrainerReport {
  enum class Kind {
    kAttached,    // `status` says whether the job got `slot`.
    kStep,        // One step of the job (metrics).
    kFinished,    // The job is done and its slot free; `status` is the
                  // outcome (an error is the job's failure).
    kRetired,     // The job was retired on request; its slot is free.
    kCheckpoint,  // A checkpoint of the job at `step` was written, or
                  // writing it failed (`status`; the job trains on).
    kPaused,      // `status` OK: checkpointed at `step` and retired; else
                  // the job was not paused (it is not in a slot, or its
                  // checkpoint failed and it trains on).
  };
  Kind kind = Kind::kStep;
  std::string job_id;
  int slot = -1;
  absl::Status status;
  SlotStepMetrics metrics;  // kStep.
  int64_t step = 0;         // Steps done (kStep, kFinished).
  int64_t total_steps = 0;
  int64_t tokens = 0;  // Tokens trained so far.
  int64_t skipped_steps = 0;
  double tokens_per_second = 0.0;  // kStep: this job's rows over the step.
  std::optional<double> validation_loss;
  int64_t resumed_step = -1;  // kAttached: the checkpoint's step, or -1.
  // kAttached: newer checkpoints that did not verify, and why.
  std::vector<std::string> rejected_checkpoints;
  std::string checkpoint_dir;  // kCheckpoint, kPaused.
};

class JobTrainer {
 public:
  using ReportSink = std::function<void(TrainerReport)>;

  virtual ~JobTrainer() = default;

  // Attaches all of `commands` at the same step boundary, in order; each is
  // reported as kAttached.
  virtual void AttachAll(std::vector<AttachCommand> commands) = 0;
  // Frees the job's slot (kRetired, also for a job in no slot). A Retire
  // sent after an Attach of the same job retires what that Attach put in a
  // slot.
  virtual void Retire(const std::string& job_id) = 0;
  // Checkpoints the job and frees its slot (kPaused).
  virtual void Pause(const std::string& job_id) = 0;
  // Writes the job's current adapter as PEFT files into `dir` and calls
  // `done` (on a thread of the trainer's; it must return quickly). NOT_FOUND
  // when no slot holds the job; UNAVAILABLE when the trainer stops first.
  virtual void Export(const std::string& job_id, const std::string& dir,
                      std::function<void(absl::Status)> done) = 0;

  // Samples from the command's weights between training steps and calls
  // its `done`: NOT_FOUND when no slot holds its job, INVALID_ARGUMENT when
  // its adapter files do not fit the base, UNAVAILABLE when the trainer
  // stops first.
  virtual void Sample(SampleCommand command) = 0;

  // Opens a session in a free slot; `done` gets the slot, or
  // RESOURCE_EXHAUSTED (no free slot), INVALID_ARGUMENT (its config),
  // ALREADY_EXISTS (it is open), UNAVAILABLE when the trainer stops first.
  virtual void OpenSession(SessionOpenCommand command) = 0;
  // Queues one operation of an open session (NOT_FOUND through `done` when
  // no slot holds the session).
  virtual void RunSessionOp(SessionOp op) = 0;

  // Slots that can take jobs. Thread-safe.
  virtual int capacity() const = 0;
  // The slots as of the end of the last iteration. Thread-safe.
  virtual std::vector<SlotInfo> Slots() const = 0;
  // The counters so far. Thread-safe.
  virtual TrainerStats Stats() const = 0;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_JOBS_JOB_TRAINER_H_
