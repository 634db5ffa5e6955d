// One training step over every active slot at once (docs/DESIGN.md §3, §9).
//
//   std::vector<TrainingSlot*> active = ...;   // any set of trainable slots
//   LORAPLEX_ASSIGN_OR_RETURN(std::vector<SlotStepMetrics> metrics,
//                             TrainCoBatchStep(model, active, options));
//
// Each slot takes its next batch_size sequences. The rows, ordered by slot,
// run through the frozen base once with every slot's LoRA (MultiLoraDelta),
// cut into micro-batches under a token budget whose gradients accumulate.
// The objective is the sum over slots of each slot's masked mean token
// cross-entropy, so each slot's gradient is exactly its own. Then each slot
// clips its gradient norm, steps its optimizer children and advances its
// schedule; a slot whose loss or grad norm is not finite skips the update
// (counted; its schedule does not advance) while the others step normally.
//
// Results do not depend on which other slots share the step: a slot's
// micro-batch pieces, dropout masks and loss normalisation are functions of
// its own data and seed only.
#ifndef LORAPLEX_CORE_TRAIN_CO_BATCH_STEP_H_
#define LORAPLEX_CORE_TRAIN_CO_BATCH_STEP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/sequences.h"
#include "core/lora/lora_weights.h"
#include "core/lora/multi_lora.h"
#include "core/model/llama_model.h"
#include "core/train/dist_hooks.h"
#include "core/train/loss_fn.h"
#include "core/train/step_metrics.h"
#include "core/train/token_budget.h"
#include "core/train/training_slot.h"

namespace loraplex {

struct CoBatchOptions {
  // Most padded tokens (rows × longest row) in one forward/backward. A
  // slot's batch is cut into pieces under it, and pieces of several slots
  // share a micro-batch when they fit together. 0: no limit. On 2 CPU
  // cores 2048 was as fast as no limit for the small model (bigger GEMMs
  // win over cache locality there) while bounding activation memory.
  // On a GPU the server picks a larger one (DefaultTokenBudget).
  int64_t token_budget = kCpuTokenBudget;
  // Target tokens per chunk of LM head + cross-entropy (bounds the logits
  // held in memory: chunk × vocab floats).
  int64_t loss_chunk_tokens = 2048;
  // How the LoRA terms are computed (multi_lora.h): batched over the slots
  // of a micro-batch, or slot by slot (the reference).
  LoraKernel lora_kernel = LoraKernel::kGrouped;
  // Activation checkpointing of each micro-batch's decoder layers
  // (token_budget.h). The default, auto with no memory limit, never
  // checkpoints; the server sets the limit from the device's memory.
  CheckpointPolicy checkpointing = {};
  // Data parallel (dist_hooks.h): this process trains the rows r of
  // each slot's batch with r % world_size == rank, every slot's loss still
  // normalised by the target tokens of its whole batch; gradients and
  // losses are summed over the ranks before clipping, so each slot clips
  // and steps on its full gradient. nullptr: one process.
  const StepSync* sync = nullptr;
};

// A client-driven forward (and backward) over `data` (docs/DESIGN.md §12): each
// datum's target tokens through `loss`, summed with no normalisation. With
// `backward`, the gradients of that sum are added to those already in
// `adapter`'s parameters (they add up over calls until the caller steps and
// zeroes them); without, nothing changes.
struct ForwardBackwardCall {
  LoraWeights* adapter = nullptr;  // Bound; nullptr: the base alone (forward).
  const std::vector<Datum>* data = nullptr;
  LossFnSpec loss;
  bool backward = true;
  // Seed of the call's dropout masks (row i of the call is row i of them).
  uint64_t dropout_seed = 0;
};

struct CoBatchResult {
  std::vector<SlotStepMetrics> slots;        // slots[i] of the pass.
  std::vector<ForwardBackwardOutput> calls;  // calls[i] of the pass.
};

// One co-batched pass: a training step of every slot in `slots` (as
// TrainCoBatchStep) together with every call in `calls` (each a valid
// Datum list for its loss, ValidateDatum), all rows through the base at
// once. A call's gradients are exactly its own, whichever slots and calls
// share the pass. An error before the slots' optimizer steps leaves every
// slot, and every call's gradients, as they were. Data parallel, the ranks
// take turns over the rows of the whole pass (the slots', then the calls'
// data), every rank gets every call's whole output (its loss and logprobs
// summed over the ranks), and each rank keeps the part of a call's
// gradients its rows gave (StepAccumulated sums them).
absl::StatusOr<CoBatchResult> RunCoBatchPass(
    const LlamaModel& model, const std::vector<TrainingSlot*>& slots,
    const std::vector<ForwardBackwardCall>& calls,
    const CoBatchOptions& options);

// Steps a client-driven slot (weights and optimizer, no data or schedule)
// on the gradients its forward/backward calls accumulated, with the
// hyperparameters `step` (its family must be the optimizer's): clips the
// gradient norm to `grad_clip` (0: no clipping), steps, and drops the
// gradients, so the next calls accumulate afresh. Skipped (the weights and
// optimizer state unchanged, the gradients dropped) when no call added
// gradients since the last step or their norm is not finite. Counts the
// step in slot.counters. INVALID_ARGUMENT for a bad `step` or grad_clip
// (nothing changes).
//
// Data parallel (`sync` over more than one rank; every rank calls it for the
// same slot): the ranks' accumulated gradients are summed first (a
// parameter no rank has a gradient for keeps none), each rank steps the
// parameters it owns, and the updated weights are synced (sync->after_step),
// so every rank ends with one process's result. A failure after the sum is
// ABORTED, as in TrainCoBatchStep.
absl::StatusOr<SlotStepMetrics> StepAccumulated(TrainingSlot& slot,
                                                const OptimizerConfig& step,
                                                double grad_clip,
                                                const StepSync* sync = nullptr);

// Data parallel: the slot's gradients accumulated by calls on each rank,
// summed over the ranks (undefined where no rank has one), in the order of
// slot.weights.parameters(); the slot's own are left as they are.
// Collective: every rank calls it for the same slot.
absl::StatusOr<std::vector<torch::Tensor>> SumAccumulatedGradients(
    const TrainingSlot& slot, const StepSync& sync);

// Trains one step of every slot in `slots` (each trainable(), not done(),
// listed once, shaped for `model`); metrics[i] belongs to slots[i]. An
// error in the forward/backward or clipping (e.g. a LibTorch failure)
// leaves every slot's weights, state, data cursor and counters as they
// were (StepLeftSlotsUnchanged), so the step can be tried again with fewer
// slots. A slot whose optimizer step fails fails alone: its metrics carry
// the failure (its weights may be partly updated; its counters and cursor
// are as they were) and the others step as they would without it.
// Data parallel, a rank's failure before the sum fails the step on every
// rank (FAILED_PRECONDITION on the others, also unchanged); a failure on
// one rank after it (clipping, an optimizer step) is ABORTED there: that
// rank skipped the parameter sync the others wait in, so the run must stop
// and go back to a checkpoint.
absl::StatusOr<std::vector<SlotStepMetrics>> TrainCoBatchStep(
    const LlamaModel& model, const std::vector<TrainingSlot*>& slots,
    const CoBatchOptions& options);

// Whether `status`, an error of RunCoBatchPass or TrainCoBatchStep, left
// every slot of the pass, and every call's gradients, as they were.
bool StepLeftSlotsUnchanged(const absl::Status& status);

// Masked mean token cross-entropy of base + `adapter` (nullptr: the base
// alone) over `sequences`, without gradients or dropout.
absl::StatusOr<double> EvalLoss(const LlamaModel& model,
                                const LoraWeights* adapter,
                                const std::vector<Sequence>& sequences,
                                const CoBatchOptions& options);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TRAIN_CO_BATCH_STEP_H_
