// The slots the training benchmarks attach: rank-`rank` LoRA (alpha 32) on
// all seven projections, AdamW at a constant 1e-4, seeded by its index.
#ifndef LORAPLEX_BENCH_SLOT_REQUESTS_H_
#define LORAPLEX_BENCH_SLOT_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "adapters/slot_pool.h"
#include "bench/timing.h"

namespace loraplex {

inline SlotAttachRequest BenchSlotRequest(
    int index, int64_t rank, int64_t batch_size, int64_t seq_len,
    std::shared_ptr<const SequenceSet> data) {
  SlotAttachRequest request;
  request.job_id = "bench-" + std::to_string(index);
  request.lora.rank = rank;
  request.lora.alpha = 32;
  request.optimizer.lr = 1e-4;
  request.schedule.kind = LrScheduleKind::kConstant;
  request.training.batch_size = batch_size;
  request.training.seq_len = seq_len;
  request.training.max_steps = int64_t{1} << 30;
  request.training.seed = static_cast<uint64_t>(index);
  request.data = std::move(data);
  return request;
}

// A pool (`options`) with `slots` slots attached as BenchSlotRequest does,
// each with its own `per_slot` random sequences of `seq_len` tokens and
// the optimizer `family`; nullptr when an attach fails.
inline std::unique_ptr<SlotPool> BenchPool(
    const ModelConfig& config, const SlotPoolOptions& options, int slots,
    int64_t rank, int64_t per_slot, int64_t seq_len,
    OptimizerFamily family = OptimizerFamily::kAdamW) {
  auto pool = std::make_unique<SlotPool>(config, options);
  for (int i = 0; i < slots; ++i) {
    SlotAttachRequest request =
        BenchSlotRequest(i, rank, per_slot, seq_len,
                         RandomSequences(per_slot, seq_len, config.vocab_size));
    request.optimizer.family = family;
    if (!pool->Attach(std::move(request)).ok()) return nullptr;
  }
  return pool;
}

// Random gradients of the shapes of `slots`' weights; each call of the
// returned function attaches them again (no device work). A co-batched step
// drops its gradients at its end, so optimizers timed alone step on these:
// the same work as inside the step.
inline std::function<void()> GradientAttacher(
    const std::vector<TrainingSlot*>& slots) {
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> grads;
  for (TrainingSlot* slot : slots) {
    for (const torch::Tensor& param : slot->weights.parameters()) {
      params.push_back(param);
      grads.push_back(torch::randn_like(param) * 1e-3);
    }
  }
  return [params, grads]() mutable {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = grads[i];
    }
  };
}

}  // namespace loraplex

#endif  // LORAPLEX_BENCH_SLOT_REQUESTS_H_
