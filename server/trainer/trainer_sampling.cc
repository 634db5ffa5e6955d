// Sampling on the trainer thread (docs/DESIGN.md §11): the requests applied at
// one step boundary form a group that decodes together (one base GEMM for
// every row, each adapter on its rows), and decode steps interleave with
// training steps under TrainerOptions::sample_share. A request's weights
// are those of one step boundary: a running job's adapter is copied when
// the request is applied, adapter files are read before.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "core/runtime/exception_message.h"
#include "server/trainer/trainer.h"

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

void Trainer::Sample(SampleCommand command) {
  std::vector<TrainerCommand> entry;
  SampleJob job;
  job.command = std::move(command);
  entry.push_back(std::move(job));
  Enqueue(std::move(entry));
}

void Trainer::Prepare(SampleJob& job) {
  if (job.command.adapter_dir.empty()) return;
  job.prepared = [&]() -> absl::Status {
    absl::StatusOr<PeftAdapter> adapter =
        LoadPeftAdapter(job.command.adapter_dir, model_->config());
    if (!adapter.ok()) return adapter.status();
    auto weights = std::make_shared<LoraWeights>(
        model_->config(), model_->device(), model_->dtype());
    absl::Status status = weights->Bind(adapter->config).status();
    if (status.ok()) status = CopyPeftAdapter(*adapter, *weights);
    if (!status.ok()) return status;
    job.weights = std::move(weights);
    return absl::OkStatus();
  }();
}

void Trainer::Apply(SampleJob& job) {
  if (!job.prepared.ok()) {
    Answer(job, job.prepared);
    return;
  }
  if (!job.command.job_id.empty()) {
    const int slot = SlotOf(job.command.job_id);
    if (slot < 0 || pool_.state(slot) == SlotState::kFree ||
        !pool_.slot(slot).weights.bound()) {
      Answer(job, absl::NotFoundError(absl::StrCat("job \"", job.command.job_id,
                                                   "\" holds no slot now")));
      return;
    }
    const TrainingSlot& training = pool_.slot(slot);
    job.weights = Snapshot(training.weights, model_->dtype());
    job.command.weights_step = training.counters.steps;
    if (job.weights == nullptr) {
      Answer(job, absl::InternalError("cannot copy the job's adapter"));
      return;
    }
  }
  sample_arrivals_.push_back(std::move(job));
}

void Trainer::StartSampling() {
  if (sample_arrivals_.empty()) return;
  std::vector<SampleJob> arrivals = std::move(sample_arrivals_);
  sample_arrivals_.clear();
  const size_t count = arrivals.size();
  absl::Status together = StartGroup(std::move(arrivals));
  if (together.ok() || count == 1) return;
  // One request must not fail the others: each alone then (the group gave
  // its jobs back).
  std::vector<SampleJob> singles = std::move(sample_arrivals_);
  sample_arrivals_.clear();
  for (SampleJob& job : singles) {
    std::vector<SampleJob> one;
    one.push_back(std::move(job));
    StartGroup(std::move(one)).IgnoreError();
  }
}

absl::Status Trainer::StartGroup(std::vector<SampleJob> jobs) {
  auto group = std::make_unique<SamplingGroup>();
  group->jobs = std::move(jobs);
  std::vector<SampleRequest> requests;
  for (const SampleJob& job : group->jobs) {
    requests.push_back({.prompt = job.command.prompt,
                        .adapter = job.weights.get(),
                        .params = job.command.params,
                        .n = job.command.n});
  }
  SamplingGroup* raw = group.get();
  auto listener = [raw](size_t request, int64_t sample,
                        const GeneratedSample& so_far) {
    const SampleCommand& command = raw->jobs[request].command;
    if (command.on_token) command.on_token(sample, so_far);
  };
  absl::StatusOr<std::unique_ptr<BatchGenerator>> generator =
      BatchGenerator::Start(*model_, std::move(requests), options_.tokenizer,
                            listener);
  if (!generator.ok()) {
    if (group->jobs.size() > 1) {
      // Back to the caller, to start one by one.
      for (SampleJob& job : group->jobs) {
        sample_arrivals_.push_back(std::move(job));
      }
    } else {
      Answer(group->jobs[0], generator.status());
    }
    return generator.status();
  }
  group->generator = *std::move(generator);
  sampling_.push_back(std::move(group));
  return absl::OkStatus();
}

void Trainer::RunSampling(double train_seconds) {
  StartSampling();
  if (sampling_.empty()) return;
  const double share = std::clamp(options_.sample_share, 0.01, 0.99);
  // With nothing to train, decoding goes on until a command waits; data
  // parallel, rank 0 still plans within half a heartbeat, so the other
  // ranks never take it for dead.
  double limit = train_seconds > 0 ? train_seconds * share / (1.0 - share)
                                   : std::numeric_limits<double>::infinity();
  if (const auto heartbeat = ranks_.HeartbeatInterval()) {
    limit = std::min(limit,
                     0.5 * std::chrono::duration<double>(*heartbeat).count());
  }
  const Clock::time_point start = Clock::now();
  for (bool first = true;; first = false) {
    if (!first) {
      if (SecondsSince(start) >= limit) return;
      absl::MutexLock lock(&mu_);
      if (stop_ || !commands_.empty()) return;
    }
    for (auto it = sampling_.begin(); it != sampling_.end();) {
      SamplingGroup& group = **it;
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
        it = sampling_.erase(it);
        continue;
      }
      if (group.generator->done()) {
        std::vector<SampleResult> results = group.generator->TakeResults();
        for (size_t i = 0; i < group.jobs.size(); ++i) {
          Answer(group.jobs[i], std::move(results[i]));
        }
        it = sampling_.erase(it);
        continue;
      }
      ++it;
    }
    if (sampling_.empty()) return;
  }
}

void Trainer::AbandonSampling(const absl::Status& status) {
  for (SampleJob& job : sample_arrivals_) Answer(job, status);
  sample_arrivals_.clear();
  for (auto& group : sampling_) {
    for (SampleJob& job : group->jobs) Answer(job, status);
  }
  sampling_.clear();
}

}  // namespace loraplex
