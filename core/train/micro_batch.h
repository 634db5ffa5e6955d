// The pieces of a co-batched forward/backward shared by the job step and
// client-driven forward/backward calls (co_batch_step.h): rows of many
// owners (an owner is one adapter with its loss), cut into micro-batches
// under a token budget, run through the base once per micro-batch with
// every owner's LoRA, and each target token's loss. Internal to
// core/train.
#ifndef LORAPLEX_CORE_TRAIN_MICRO_BATCH_H_
#define LORAPLEX_CORE_TRAIN_MICRO_BATCH_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/lora/lora_weights.h"
#include "core/lora/multi_lora.h"
#include "core/model/llama_model.h"
#include "core/train/loss_fn.h"
#include "core/train/token_budget.h"

namespace loraplex {

// The target tokens of one row: position positions[i]'s logits predict
// labels[i]. The per-token inputs the owner's loss takes are filled, the
// others empty.
struct RowTargets {
  std::vector<int64_t> positions;
  std::vector<int64_t> labels;
  std::vector<double> weights;
  std::vector<double> sampler_logprobs;
  std::vector<double> advantages;

  size_t size() const { return labels.size(); }
};

// One sequence of the co-batch.
struct Row {
  size_t owner = 0;    // Index of the owner it belongs to.
  int64_t row_id = 0;  // Its index in the owner's rows (dropout masks).
  const std::vector<int64_t>* input_ids = nullptr;
  RowTargets targets;
  // Lengths of the examples packed into it (Sequence::segments); null or
  // empty: one example.
  const std::vector<int64_t>* segments = nullptr;
};

// Consecutive rows of one owner inside a micro-batch.
struct Piece {
  size_t owner = 0;
  std::vector<const Row*> rows;
  int64_t longest = 0;
};

// Cuts each owner's rows (in order) into pieces under `budget` padded
// tokens (0: no limit), then packs consecutive pieces into micro-batches.
// A piece depends only on its owner's rows, so an owner is cut the same way
// whoever else trains. The pieces point into `rows`.
std::vector<std::vector<Piece>> PlanMicroBatches(const std::vector<Row>& rows,
                                                 int64_t budget);

// Every owner of a pass: its adapter (nullptr: the base alone), dropout
// seed and loss.
struct PassOwners {
  std::vector<const LoraWeights*> adapters;
  std::vector<uint64_t> dropout_seeds;  // Empty: no dropout seeds.
  std::vector<LossFnSpec> losses;
};

// What a micro-batch adds to each owner: the sum of its target tokens'
// losses, and with `logprobs` set, each target token's log-probability in
// row order (appended to logprobs[owner]).
struct PassSums {
  std::vector<double> losses;
  std::vector<std::vector<double>>* logprobs = nullptr;
  // On a mixture-of-experts base, the tokens each expert received from each
  // owner's real tokens, summed over the sparse layers (ExpertTokenCounter);
  // left empty on a dense base.
  std::vector<std::vector<int64_t>> expert_tokens = {};
};

// How every micro-batch of a pass runs.
struct MicroBatchOptions {
  // Target tokens per chunk of the LM head and loss.
  int64_t loss_chunk_tokens = 2048;
  LoraKernel kernel = LoraKernel::kGrouped;
  // Which decoder layers recompute their forward in the backward pass,
  // decided per micro-batch from its padded tokens.
  CheckpointPolicy checkpointing = {};
};

// Runs one micro-batch; with `backward`, the gradients of its summed loss
// accumulate in the owners' LoRA parameters. The LM head runs in chunks of
// `loss_chunk_tokens` target tokens, each differentiated on its own, so
// only one chunk of logits is alive at once. `kernel` computes the LoRA
// terms (multi_lora.h). Packed rows (Row::segments) attend within each of
// their examples only.
absl::Status RunMicroBatch(const LlamaModel& model,
                           const std::vector<Piece>& pieces,
                           const PassOwners& owners, bool backward,
                           const MicroBatchOptions& options, PassSums& sums);

// Each target token's loss (docs/DESIGN.md §12) from its log-probability `p`
// and the per-token inputs the loss takes (undefined tensors for the others),
// differentiable in `p`. All tensors are 1-D of one length.
torch::Tensor TokenLosses(const LossFnSpec& loss, const torch::Tensor& p,
                          const torch::Tensor& weights,
                          const torch::Tensor& sampler_logprobs,
                          const torch::Tensor& advantages);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TRAIN_MICRO_BATCH_H_
