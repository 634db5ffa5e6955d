// The slot the training benchmarks attach: rank-`rank` LoRA (alpha 32) on
// all seven projections, AdamW at a constant 1e-4, seeded by its index.
#ifndef LORAPLEX_BENCH_SLOT_REQUESTS_H_
#define LORAPLEX_BENCH_SLOT_REQUESTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "adapters/slot_pool.h"

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

}  // namespace loraplex

#endif  // LORAPLEX_BENCH_SLOT_REQUESTS_H_
