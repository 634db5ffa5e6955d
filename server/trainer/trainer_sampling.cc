// The sampling command (trainer.h): a request reaches the trainer's
// SamplingRunner (sampling_runner.h) at a step boundary, with the current
// weights of the job it names.
#include "server/trainer/trainer.h"

namespace loraplex {

void Trainer::Sample(SampleCommand command) {
  std::vector<TrainerCommand> entry;
  SampleJob job;
  job.command = std::move(command);
  entry.push_back(std::move(job));
  Enqueue(std::move(entry));
}

void Trainer::Prepare(SampleJob& job) { sampling_.Prepare(job); }

void Trainer::Apply(SampleJob& job) {
  const TrainingSlot* running = nullptr;
  if (!job.command.job_id.empty()) {
    const int slot = jobs_.SlotOf(job.command.job_id);
    if (slot >= 0 && pool_.state(slot) != SlotState::kFree) {
      running = &pool_.slot(slot);
    }
  }
  sampling_.Add(std::move(job), running);
}

}  // namespace loraplex
