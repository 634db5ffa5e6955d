// The sampling command (trainer_commands.h): a request reaches the
// trainer's SamplingRunner (sampling_runner.h) at a step boundary, with the
// current weights of the job it names, and decodes between training steps.
// Rank 0's alone.
#ifndef LORAPLEX_SERVER_TRAINER_COMMANDS_SAMPLE_JOB_H_
#define LORAPLEX_SERVER_TRAINER_COMMANDS_SAMPLE_JOB_H_

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "adapters/slot_pool.h"
#include "server/jobs/job_trainer.h"

namespace loraplex {

struct SampleJob {
  SampleCommand command;
  // Prepare: the adapter files' weights, or why they cannot be used.
  std::shared_ptr<LoraWeights> weights;
  absl::Status prepared;

  template <typename Parts>
  void Prepare(Parts& parts) {
    parts.sampling.Prepare(*this);
  }
  template <typename Parts>
  void Apply(Parts& parts) {
    const TrainingSlot* running = nullptr;
    if (!command.job_id.empty()) {
      const int slot = parts.jobs.SlotOf(command.job_id);
      if (slot >= 0 && parts.pool.state(slot) != SlotState::kFree) {
        running = &parts.pool.slot(slot);
      }
    }
    parts.sampling.Add(std::move(*this), running);
  }
  void Abandon(const absl::Status& status) {
    if (command.done) std::exchange(command.done, nullptr)(status, 0);
  }
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_COMMANDS_SAMPLE_JOB_H_
