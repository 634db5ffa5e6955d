// The sampling part of the trainer (sampling_runner.h). A request's weights
// are those of one step boundary: a running job's adapter is copied when
// the request is added, adapter files are read before.
#include "server/trainer/sampling_runner.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"

namespace loraplex {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A copy of `weights` that training no longer changes.
std::shared_ptr<LoraWeights> Snapshot(const LoraWeights& weights,
                                      torch::ScalarType dtype) {
  auto copy = std::make_shared<LoraWeights>(weights.model_config(),
                                            weights.device(), dtype);
  if (!copy->Bind(weights.config()).ok()) return nullptr;
  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor> from = weights.parameters();
  const std::vector<torch::Tensor> to = copy->parameters();
  for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  return copy;
}

void Answer(SampleJob& job, absl::StatusOr<SampleResult> result) {
  if (job.command.done) {
    std::exchange(job.command.done, nullptr)(std::move(result),
                                             job.command.weights_step);
  }
}

}  // namespace

SamplingRunner::SamplingRunner(const LlamaModel& model,
                               const Tokenizer* tokenizer, double share)
    : model_(model),
      tokenizer_(tokenizer),
      share_(std::clamp(share, 0.01, 0.99)) {}

void SamplingRunner::Prepare(SampleJob& job) const {
  if (job.command.adapter_dir.empty()) return;
  job.prepared = [&]() -> absl::Status {
    absl::StatusOr<PeftAdapter> adapter =
        LoadPeftAdapter(job.command.adapter_dir, model_.config());
    if (!adapter.ok()) return adapter.status();
    auto weights = std::make_shared<LoraWeights>(
        model_.config(), model_.device(), model_.dtype());
    absl::Status status = weights->Bind(adapter->config).status();
    if (status.ok()) status = CopyPeftAdapter(*adapter, *weights);
    if (!status.ok()) return status;
    job.weights = std::move(weights);
    return absl::OkStatus();
  }();
}

void SamplingRunner::Add(SampleJob job, const TrainingSlot* running) {
  if (!job.prepared.ok()) {
    Answer(job, job.prepared);
    return;
  }
  if (!job.command.job_id.empty()) {
    if (running == nullptr || !running->weights.bound()) {
      Answer(job, absl::NotFoundError(absl::StrCat("job \"", job.command.job_id,
                                                   "\" holds no slot now")));
      return;
    }
    job.weights = Snapshot(running->weights, model_.dtype());
    job.command.weights_step = running->counters.steps;
    if (job.weights == nullptr) {
      Answer(job, absl::InternalError("cannot copy the job's adapter"));
      return;
    }
  }
  arrivals_.push_back(std::move(job));
}

void SamplingRunner::StartArrivals() {
  if (arrivals_.empty()) return;
  std::vector<SampleJob> arrivals = std::move(arrivals_);
  arrivals_.clear();
  const size_t count = arrivals.size();
  absl::Status together = StartGroup(std::move(arrivals));
  if (together.ok() || count == 1) return;
  // One request must not fail the others: each alone then (the group gave
  // its jobs back).
  std::vector<SampleJob> singles = std::move(arrivals_);
  arrivals_.clear();
  for (SampleJob& job : singles) {
    std::vector<SampleJob> one;
    one.push_back(std::move(job));
    StartGroup(std::move(one)).IgnoreError();
  }
}

absl::Status SamplingRunner::StartGroup(std::vector<SampleJob> jobs) {
  auto group = std::make_unique<Group>();
  group->jobs = std::move(jobs);
  std::vector<SampleRequest> requests;
  for (const SampleJob& job : group->jobs) {
    requests.push_back({.prompt = job.command.prompt,
                        .adapter = job.weights.get(),
                        .params = job.command.params,
                        .n = job.command.n});
  }
  Group* raw = group.get();
  auto listener = [raw](size_t request, int64_t sample,
                        const GeneratedSample& so_far) {
    const SampleCommand& command = raw->jobs[request].command;
    if (command.on_token) command.on_token(sample, so_far);
  };
  absl::StatusOr<std::unique_ptr<BatchGenerator>> generator =
      BatchGenerator::Start(model_, std::move(requests), tokenizer_, listener);
  if (!generator.ok()) {
    if (group->jobs.size() > 1) {
      // Back to the caller, to start one by one.
      for (SampleJob& job : group->jobs) arrivals_.push_back(std::move(job));
    } else {
      Answer(group->jobs[0], generator.status());
    }
    return generator.status();
  }
  group->generator = *std::move(generator);
  groups_.push_back(std::move(group));
  return absl::OkStatus();
}

void SamplingRunner::Run(double train_seconds, std::optional<double> limit,
                         const std::function<bool()>& interrupted) {
  StartArrivals();
  if (groups_.empty()) return;
  // With nothing to train, decoding goes on until a command waits.
  double budget = train_seconds > 0 ? train_seconds * share_ / (1.0 - share_)
                                    : std::numeric_limits<double>::infinity();
  if (limit) budget = std::min(budget, *limit);
  const Clock::time_point start = Clock::now();
  for (bool first = true; !groups_.empty(); first = false) {
    if (!first && (SecondsSince(start) >= budget || interrupted())) return;
    StepGroups();
  }
}

void SamplingRunner::StepGroups() {
  for (auto it = groups_.begin(); it != groups_.end();) {
    Group& group = **it;
    for (size_t i = 0; i < group.jobs.size(); ++i) {
      SampleJob& job = group.jobs[i];
      if (job.command.done && job.command.cancelled &&
          job.command.cancelled()) {
        group.generator->Cancel(i);
        Answer(job, absl::CancelledError("the caller cancelled the sample"));
      }
    }
    absl::Status stepped =
        group.generator->done() ? absl::OkStatus() : group.generator->Step();
    if (!stepped.ok()) {
      for (SampleJob& job : group.jobs) Answer(job, stepped);
      it = groups_.erase(it);
      continue;
    }
    if (group.generator->done()) {
      std::vector<SampleResult> results = group.generator->TakeResults();
      for (size_t i = 0; i < group.jobs.size(); ++i) {
        Answer(group.jobs[i], std::move(results[i]));
      }
      it = groups_.erase(it);
      continue;
    }
    ++it;
  }
}

void SamplingRunner::Abandon(const absl::Status& status) {
  for (SampleJob& job : arrivals_) Answer(job, status);
  arrivals_.clear();
  for (auto& group : groups_) {
    for (SampleJob& job : group->jobs) Answer(job, status);
  }
  groups_.clear();
}

}  // namespace loraplex
