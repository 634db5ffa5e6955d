#include "adapters/slot_pool.h"

#include <torch/torch.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/optim/slot_optimizer.h"
#include "core/runtime/exception_message.h"

namespace loraplex {
namespace {

// Drops a job's schedule, data and counters. The weights and the optimizer
// are left to the caller: Retire keeps the zeroed optimizer.
void ForgetJob(TrainingSlot& slot) {
  slot.scheduler.reset();
  slot.cursor.reset();
  slot.data = nullptr;
  slot.counters = SlotCounters{};
  slot.total_steps = 0;
}

}  // namespace

SlotPool::SlotPool(const ModelConfig& model, const SlotPoolOptions& options)
    : model_(model), options_(options) {
  slots_.resize(std::max(options.capacity, 0));
  for (Entry& entry : slots_) {
    entry.training =
        std::make_unique<TrainingSlot>(model_, options_.device, options_.dtype);
  }
}

absl::string_view SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kFree:
      return "free";
    case SlotState::kTraining:
      return "training";
    case SlotState::kEvaluating:
      return "evaluating";
    case SlotState::kSession:
      return "session";
    case SlotState::kTrained:
      return "trained";
    case SlotState::kRetiring:
      return "retiring";
  }
  return "unknown";
}

int SlotPool::num_attached() const {
  int count = 0;
  for (const Entry& entry : slots_) count += entry.state != SlotState::kFree;
  return count;
}

SlotState SlotPool::state(int slot) const {
  const Entry& entry = slots_.at(slot);
  if (entry.state == SlotState::kTraining && entry.training->done()) {
    return SlotState::kTrained;
  }
  return entry.state;
}

std::vector<int> SlotPool::SlotsIn(SlotState wanted) const {
  std::vector<int> ids;
  for (int i = 0; i < capacity(); ++i) {
    if (state(i) == wanted) ids.push_back(i);
  }
  return ids;
}

absl::Status SlotPool::CheckSequence(const Sequence& sequence,
                                     size_t index) const {
  auto invalid = [&](absl::string_view reason) {
    return absl::InvalidArgumentError(
        absl::StrCat("training sequence ", index, " ", reason));
  };
  const size_t length = sequence.input_ids.size();
  if (length < 2 || sequence.loss_mask.size() != length) {
    return invalid(
        "must have at least 2 tokens and one loss_mask value per token");
  }
  bool any_target = false;
  for (size_t t = 0; t < length; ++t) {
    const int64_t id = sequence.input_ids[t];
    if (id < 0 || id >= model_.vocab_size) {
      return invalid(absl::StrCat("has token id ", id, " at position ", t,
                                  ", outside the vocabulary [0, ",
                                  model_.vocab_size, ")"));
    }
    any_target |= t > 0 && sequence.loss_mask[t] != 0;
  }
  if (!any_target) return invalid("has no target token");
  return absl::OkStatus();
}

absl::Status SlotPool::CheckRequest(const SlotAttachRequest& request) const {
  const LoraConfig& lora =
      request.initial_weights ? request.initial_weights->config : request.lora;
  LORAPLEX_RETURN_IF_ERROR(ValidateLoraConfig(lora));
  if (lora.rank > options_.max_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.rank must be at most this server's max_rank ",
                     options_.max_rank, ", got ", lora.rank));
  }
  LORAPLEX_RETURN_IF_ERROR(ValidateOptimizerConfig(request.optimizer));
  LORAPLEX_RETURN_IF_ERROR(ValidateLrScheduleConfig(request.schedule));
  LORAPLEX_RETURN_IF_ERROR(ValidateTrainingConfig(request.training));
  if (request.session && request.data != nullptr) {
    return absl::InvalidArgumentError("a session's slot takes no data");
  }
  if (request.data != nullptr) {
    const std::vector<Sequence>& sequences = request.data->sequences;
    if (sequences.empty()) {
      return absl::InvalidArgumentError("the training data has no sequences");
    }
    for (size_t i = 0; i < sequences.size(); ++i) {
      LORAPLEX_RETURN_IF_ERROR(CheckSequence(sequences[i], i));
    }
  }
  return absl::OkStatus();
}

void SlotPool::ReleaseClaims(int index) {
  if (!slots_[index].claimed) return;
  options_.claims->Release(index);
  slots_[index].claimed = false;
}

absl::Status SlotPool::Prepare(const SlotAttachRequest& request, int index) {
  TrainingSlot& slot = *slots_[index].training;
  const LoraConfig& lora =
      request.initial_weights ? request.initial_weights->config : request.lora;
  LORAPLEX_RETURN_IF_ERROR(slot.weights.Bind(lora).status());
  if (request.initial_weights) {
    LORAPLEX_RETURN_IF_ERROR(
        CopyPeftAdapter(*request.initial_weights, slot.weights));
  } else {
    slot.weights.InitPeft(request.training.seed);
  }
  slot.training = request.training;
  slot.optimizer.reset();
  ForgetJob(slot);
  if (request.data == nullptr && !request.session) return absl::OkStatus();

  std::vector<torch::Tensor> owned = slot.weights.parameters();
  std::vector<ParamLayout> owned_layouts = slot.weights.parameter_layouts();
  if (options_.claims != nullptr) {
    const std::vector<bool> mine =
        options_.claims->Claim(index, owned, owned_layouts, request.optimizer);
    slots_[index].claimed = true;
    std::vector<torch::Tensor> all = std::move(owned);
    std::vector<ParamLayout> all_layouts = std::move(owned_layouts);
    owned.clear();
    owned_layouts.clear();
    for (size_t i = 0; i < all.size() && i < mine.size(); ++i) {
      if (!mine[i]) continue;
      owned.push_back(all[i]);
      owned_layouts.push_back(all_layouts[i]);
    }
  }
  // A data-parallel rank may own none of the slot's parameters.
  absl::StatusOr<SlotOptimizer> built =
      owned.empty() && options_.claims != nullptr
          ? EmptySlotOptimizer(request.optimizer)
          : BuildSlotOptimizer(request.optimizer, owned, owned_layouts);
  LORAPLEX_RETURN_IF_ERROR(built.status());
  SlotOptimizer optimizer = *std::move(built);
  if (request.session) {
    slot.optimizer.emplace(std::move(optimizer));
    return absl::OkStatus();
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      LrScheduler scheduler,
      LrScheduler::Create(request.schedule, request.optimizer.lr));
  LORAPLEX_ASSIGN_OR_RETURN(
      DataCursor cursor,
      DataCursor::Create(static_cast<int64_t>(request.data->sequences.size()),
                         DataCursorState{request.training.seed, 0, 0}));
  scheduler.ApplyTo(optimizer);
  slot.optimizer.emplace(std::move(optimizer));
  slot.scheduler.emplace(std::move(scheduler));
  slot.cursor.emplace(std::move(cursor));
  slot.data = request.data;
  slot.total_steps = TotalSteps(
      request.training, static_cast<int64_t>(request.data->sequences.size()));
  return absl::OkStatus();
}

absl::StatusOr<int> SlotPool::Attach(const SlotAttachRequest& request) {
  LORAPLEX_RETURN_IF_ERROR(CheckRequest(request));
  int free = -1;
  if (request.preferred_slot >= 0 && request.preferred_slot < capacity() &&
      slots_[request.preferred_slot].state == SlotState::kFree) {
    free = request.preferred_slot;
  }
  for (int i = 0; i < capacity() && free < 0; ++i) {
    if (slots_[i].state == SlotState::kFree) {
      free = i;
      break;
    }
  }
  if (free < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "all ", capacity(), " adapter slots are in use; retire one first"));
  }
  Entry& entry = slots_[free];
  absl::Status status;
  try {
    status = Prepare(request, free);
  } catch (const c10::Error& e) {
    status = absl::InternalError(absl::StrCat("attaching the adapter failed: ",
                                              e.what_without_backtrace()));
  }
  if (!status.ok()) {
    ReleaseClaims(free);
    TrainingSlot& slot = *entry.training;
    slot.weights.Unbind();
    slot.optimizer.reset();
    ForgetJob(slot);
    return status;
  }
  entry.state = request.session           ? SlotState::kSession
                : request.data == nullptr ? SlotState::kEvaluating
                                          : SlotState::kTraining;
  entry.job_id = request.job_id;
  return free;
}

absl::Status SlotPool::Retire(int slot) {
  if (slot < 0 || slot >= capacity()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot must be in [0, ", capacity(), "), got ", slot));
  }
  Entry& entry = slots_[slot];
  if (entry.state == SlotState::kFree) {
    return absl::FailedPreconditionError(
        absl::StrCat("slot ", slot, " is not attached"));
  }
  TrainingSlot& training = *entry.training;
  // Zeroed in place, so nothing of this job survives in memory a later job
  // could see. The optimizer stays (zeroed) until the next attach replaces
  // it.
  try {
    if (training.optimizer.has_value()) {
      training.optimizer->ZeroState();
      training.optimizer->ZeroGrad();
    }
    training.weights.Zero();
  } catch (const std::exception& e) {
    // Better a retire that can be retried than a free slot holding a job's
    // state.
    entry.state = SlotState::kRetiring;
    return absl::InternalError(
        absl::StrCat("zeroing slot ", slot, " failed: ", ExceptionMessage(e)));
  }
  training.weights.Unbind();
  ForgetJob(training);
  ReleaseClaims(slot);
  entry.state = SlotState::kFree;
  entry.job_id.clear();
  return absl::OkStatus();
}

std::vector<TrainingSlot*> SlotPool::ActiveSlots() {
  std::vector<TrainingSlot*> active;
  for (int id : ActiveSlotIds()) active.push_back(slots_[id].training.get());
  return active;
}

}  // namespace loraplex
