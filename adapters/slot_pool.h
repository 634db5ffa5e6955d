// The fixed pool of adapter slots the trainer thread owns (docs/DESIGN.md §5).
//
//   SlotPool pool(model.config(), {.capacity = 16, .device = torch::kCPU});
//   LORAPLEX_ASSIGN_OR_RETURN(int slot, pool.Attach(request));
//   ... TrainCoBatchStep(model, pool.ActiveSlots(), options) ...
//   LORAPLEX_RETURN_IF_ERROR(pool.Retire(slot));
//
// Each slot moves through one lifecycle, SlotState. Attach binds the slot's
// LoRA weights (reusing its storage when the rank fits), initialises them
// as PEFT does (or copies an imported adapter), builds the optimizer
// children and the schedule, and positions the data cursor. Retire zeroes
// the Adam moments, Muon momentum buffers, step counters, weights and
// gradients in place, drops the schedule and data, and frees the slot.
// Neither touches the base model or any other slot. Not thread-safe: one
// thread owns it.
#ifndef LORAPLEX_ADAPTERS_SLOT_POOL_H_
#define LORAPLEX_ADAPTERS_SLOT_POOL_H_

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "adapters/peft_adapter.h"
#include "core/data/sequences.h"
#include "core/lora/lora_config.h"
#include "core/optim/lr_scheduler.h"
#include "core/optim/optimizer_config.h"
#include "core/train/dist_hooks.h"
#include "core/train/training_config.h"
#include "core/train/training_slot.h"

namespace loraplex {

// docs/DESIGN.md §5: kFree → kTraining → kTrained → kRetiring → kFree,
// kFree → kEvaluating → kRetiring → kFree, or kFree → kSession → kRetiring
// → kFree. A retire that succeeds goes
// straight to kFree from any attached state; kRetiring is where a slot
// stays while zeroing it keeps failing.
enum class SlotState {
  kFree,        // Holds no job; its storage waits for the next attach.
  kTraining,    // Holds a job with steps left: it trains in every co-batch.
  kEvaluating,  // Holds an adapter attached for evaluation only (no data,
                // no optimizer): evaluated, never trained.
  kSession,     // Holds a client-driven training session's adapter and
                // optimizer (no data, no schedule): it trains only through
                // the session's forward/backward calls and steps.
  kTrained,     // Its job has trained its last step (the counters reached
                // total_steps): no more steps; it waits to be validated,
                // exported and retired.
  kRetiring,    // Its job is over, but zeroing the slot failed (e.g. a
                // device error): it holds no job, takes no attach and no
                // step, and Retire is to be tried again.
};

absl::string_view SlotStateName(SlotState state);  // "free", "training", ...

struct SlotPoolOptions {
  int capacity = 16;
  // Largest rank a slot accepts (at most kMaxLoraRank).
  int64_t max_rank = kMaxLoraRank;
  torch::Device device = torch::kCPU;
  // The base's compute dtype; LoRA weights take Fp32OrFp64 of it.
  torch::ScalarType dtype = torch::kFloat32;
  // Data parallel: which parameters of each training slot this process
  // keeps optimizer state for and steps (the others' owners do). nullptr:
  // all of them. Must outlive the pool.
  ParamClaims* claims = nullptr;
};

struct SlotAttachRequest {
  std::string job_id;
  LoraConfig lora;
  OptimizerConfig optimizer;
  LrScheduleConfig schedule;
  TrainingConfig training;
  // Training sequences; nullptr attaches the adapter for evaluation only.
  std::shared_ptr<const SequenceSet> data;
  // Start from these weights (its config replaces `lora`) instead of
  // PEFT's initialisation seeded with training.seed.
  std::shared_ptr<const PeftAdapter> initial_weights;
  // A training session's slot (kSession): weights and the optimizer, no
  // data (which must be null) and no schedule.
  bool session = false;
  // The slot to take when it is free, else the lowest free one (-1). A job
  // resumed from a checkpoint goes back to its slot, so the rows of a
  // co-batch keep their order.
  int preferred_slot = -1;
};

class SlotPool {
 public:
  SlotPool(const ModelConfig& model, const SlotPoolOptions& options);
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // The preferred slot when it is free, else the lowest free slot.
  // RESOURCE_EXHAUSTED when every slot is in use,
  // INVALID_ARGUMENT naming the field for a bad config (e.g. a rank above
  // max_rank). On error no slot changes.
  absl::StatusOr<int> Attach(const SlotAttachRequest& request);
  // Zeroes the slot and frees it (kFree). When zeroing fails the slot is
  // kRetiring and the error returned: retire it again later. INVALID_ARGUMENT
  // for a slot index out of range, FAILED_PRECONDITION for a free slot.
  absl::Status Retire(int slot);

  int capacity() const { return static_cast<int>(slots_.size()); }
  const ModelConfig& model_config() const { return model_; }
  // Slots not kFree.
  int num_attached() const;
  // Slots in `state`, in slot order.
  std::vector<int> SlotsIn(SlotState state) const;
  // Accessors for slot ids in [0, capacity()) (std::out_of_range else).
  SlotState state(int slot) const;
  const std::string& job_id(int slot) const { return slots_.at(slot).job_id; }
  TrainingSlot& slot(int slot) { return *slots_.at(slot).training; }
  const TrainingSlot& slot(int slot) const { return *slots_.at(slot).training; }

  // kTraining slots, in slot order.
  std::vector<int> ActiveSlotIds() const {
    return SlotsIn(SlotState::kTraining);
  }
  std::vector<TrainingSlot*> ActiveSlots();

 private:
  struct Entry {
    // kTraining stands for kTrained too: state() tells them apart by the
    // slot's counters, which the training step advances.
    SlotState state = SlotState::kFree;
    std::string job_id;
    std::unique_ptr<TrainingSlot> training;
    bool claimed = false;  // options_.claims holds its parameters.
  };

  absl::Status CheckRequest(const SlotAttachRequest& request) const;
  absl::Status CheckSequence(const Sequence& sequence, size_t index) const;
  absl::Status Prepare(const SlotAttachRequest& request, int index);
  void ReleaseClaims(int index);

  ModelConfig model_;
  SlotPoolOptions options_;
  std::vector<Entry> slots_;
};

}  // namespace loraplex

#endif  // LORAPLEX_ADAPTERS_SLOT_POOL_H_
