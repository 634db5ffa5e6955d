// The trainer's sampling part (docs/DESIGN.md §11): the requests applied at
// one step boundary form a group that decodes together (one base GEMM for
// every row, each adapter on its rows), and decode steps interleave with
// training steps under a time share. Trainer thread only.
//
//   SamplingRunner sampling(model, tokenizer, /*share=*/0.5);
//   sampling.Prepare(job);         // before the plan: adapter files read
//   sampling.Add(std::move(job));  // applied at this step boundary
//   sampling.Run(train_seconds, limit, interrupted);  // after the step
//   sampling.Abandon(status);      // stopping
#ifndef LORAPLEX_SERVER_TRAINER_SAMPLING_RUNNER_H_
#define LORAPLEX_SERVER_TRAINER_SAMPLING_RUNNER_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "adapters/slot_pool.h"
#include "core/model/llama_model.h"
#include "core/sample/batch_generator.h"
#include "server/trainer/trainer_commands.h"

namespace loraplex {

class SamplingRunner {
 public:
  // `model` and `tokenizer` (null: requests with stop strings fail, texts
  // are empty) must outlive the runner. `share` in (0, 1): the part of the
  // trainer's time decoding takes while slots train.
  SamplingRunner(const LlamaModel& model, const Tokenizer* tokenizer,
                 double share);

  // Reads the adapter files the request names, if any, into job.weights
  // (or job.prepared says why not).
  void Prepare(SampleJob& job) const;
  // Takes the request into the next group; `running` is the slot of the
  // job whose current weights it samples (null: it names no job, or the
  // job holds no slot, which answers it NOT_FOUND).
  void Add(SampleJob job, const TrainingSlot* running);
  // Starts the group of the requests added since the last Run (each alone
  // if they fail together), then runs decode steps for every group for
  // the time share of a training step that took `train_seconds` (0:
  // nothing trained, so until every group is done or `interrupted`), never
  // longer than `limit` seconds; answers the requests of groups that
  // finish. `interrupted` is asked between decode steps.
  void Run(double train_seconds, std::optional<double> limit,
           const std::function<bool()>& interrupted);
  // Answers every request still waiting or decoding with `status`.
  void Abandon(const absl::Status& status);
  // Requests are decoding.
  bool busy() const { return !groups_.empty(); }

 private:
  struct Group {
    std::vector<SampleJob> jobs;
    std::unique_ptr<BatchGenerator> generator;
  };
  void StartArrivals();
  // Starts decoding `jobs` together; on failure a single job is answered,
  // several go back to arrivals_.
  absl::Status StartGroup(std::vector<SampleJob> jobs);
  // One decode step of every group; answers and drops the finished ones.
  void StepGroups();

  const LlamaModel& model_;
  const Tokenizer* tokenizer_;
  double share_;
  std::vector<SampleJob> arrivals_;
  std::vector<std::unique_ptr<Group>> groups_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_SAMPLING_RUNNER_H_
