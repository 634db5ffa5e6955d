#include "core/train/co_batch_step.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/split_mix.h"
#include "core/common/status_macros.h"
#include "core/lora/multi_lora.h"
#include "core/optim/grad_clip.h"

namespace loraplex {
namespace {

// One sequence of the co-batch.
struct Row {
  size_t owner = 0;    // Index of the slot (or adapter) it belongs to.
  int64_t row_id = 0;  // Its index in the owner's batch (dropout masks).
  const Sequence* sequence = nullptr;
  double weight = 0.0;  // Loss weight per target token: 1 / owner's targets.
};

// Consecutive rows of one owner inside a micro-batch.
struct Piece {
  size_t owner = 0;
  std::vector<Row> rows;
  int64_t longest = 0;
};

int64_t Length(const Row& row) {
  return static_cast<int64_t>(row.sequence->input_ids.size());
}

bool Fits(int64_t rows, int64_t longest, int64_t budget) {
  return budget <= 0 || rows * longest <= budget;
}

// Cuts each owner's rows (in order) into pieces under the budget, then packs
// consecutive pieces into micro-batches. A piece depends only on its owner's
// rows, so a slot is cut the same way whoever else trains.
std::vector<std::vector<Piece>> PlanMicroBatches(const std::vector<Row>& rows,
                                                 int64_t budget) {
  std::vector<Piece> pieces;
  for (const Row& row : rows) {
    const int64_t len = Length(row);
    Piece* last = pieces.empty() ? nullptr : &pieces.back();
    if (last == nullptr || last->owner != row.owner ||
        !Fits(static_cast<int64_t>(last->rows.size()) + 1,
              std::max(last->longest, len), budget)) {
      pieces.push_back(Piece{row.owner, {}, 0});
      last = &pieces.back();
    }
    last->rows.push_back(row);
    last->longest = std::max(last->longest, len);
  }
  std::vector<std::vector<Piece>> batches;
  int64_t batch_rows = 0;
  int64_t batch_longest = 0;
  for (Piece& piece : pieces) {
    const int64_t rows_after =
        batch_rows + static_cast<int64_t>(piece.rows.size());
    const int64_t longest_after = std::max(batch_longest, piece.longest);
    if (batches.empty() || !Fits(rows_after, longest_after, budget)) {
      batches.emplace_back();
      batch_rows = 0;
      batch_longest = 0;
    }
    batch_rows += static_cast<int64_t>(piece.rows.size());
    batch_longest = std::max(batch_longest, piece.longest);
    batches.back().push_back(std::move(piece));
  }
  return batches;
}

// A micro-batch as tensors, plus which owner each target token belongs to.
struct MicroBatch {
  torch::Tensor input_ids;       // [rows, longest]
  torch::Tensor lengths;         // [rows]
  torch::Tensor target_index;    // [targets] flat positions that predict
  torch::Tensor target_labels;   // [targets]
  torch::Tensor target_weights;  // [targets] in the logits' dtype
  std::vector<size_t> target_owner;
};

MicroBatch BuildMicroBatch(const std::vector<Piece>& pieces, int64_t pad_id,
                           torch::Device device,
                           torch::ScalarType weight_dtype) {
  int64_t rows = 0;
  int64_t longest = 0;
  for (const Piece& p : pieces) {
    rows += static_cast<int64_t>(p.rows.size());
    longest = std::max(longest, p.longest);
  }
  std::vector<int64_t> ids(rows * longest, pad_id);
  std::vector<int64_t> lengths;
  std::vector<int64_t> index;
  std::vector<int64_t> labels;
  std::vector<double> weights;
  MicroBatch batch;
  int64_t r = 0;
  for (const Piece& p : pieces) {
    for (const Row& row : p.rows) {
      const Sequence& seq = *row.sequence;
      const int64_t len = Length(row);
      std::copy(seq.input_ids.begin(), seq.input_ids.end(),
                ids.begin() + r * longest);
      lengths.push_back(len);
      // Position t-1 predicts token t.
      for (int64_t t = 1; t < len; ++t) {
        if (seq.loss_mask[t] == 0) continue;
        index.push_back(r * longest + t - 1);
        labels.push_back(seq.input_ids[t]);
        weights.push_back(row.weight);
        batch.target_owner.push_back(row.owner);
      }
      ++r;
    }
  }
  auto to_device = [&](auto& values, torch::ScalarType dtype,
                       std::vector<int64_t> shape) {
    return torch::from_blob(values.data(), shape, dtype)
        .to(device, dtype, false, true);
  };
  const int64_t targets = static_cast<int64_t>(index.size());
  batch.input_ids = to_device(ids, torch::kInt64, {rows, longest});
  batch.lengths = to_device(lengths, torch::kInt64, {rows});
  batch.target_index = to_device(index, torch::kInt64, {targets});
  batch.target_labels = to_device(labels, torch::kInt64, {targets});
  batch.target_weights =
      torch::from_blob(weights.data(), {targets}, torch::kFloat64)
          .to(device, weight_dtype, /*non_blocking=*/false, /*copy=*/true);
  return batch;
}

std::vector<LoraSegment> Segments(const std::vector<Piece>& pieces,
                                  const std::vector<const LoraWeights*>& owners,
                                  const std::vector<uint64_t>& dropout_seeds,
                                  bool training) {
  std::vector<LoraSegment> segments;
  for (const Piece& p : pieces) {
    LoraSegment segment;
    segment.weights = owners[p.owner];
    segment.rows = static_cast<int64_t>(p.rows.size());
    segment.training = training;
    segment.dropout_seed = dropout_seeds.empty() ? 0 : dropout_seeds[p.owner];
    for (const Row& row : p.rows) {
      segment.row_ids.push_back(row.row_id);
      segment.row_lengths.push_back(Length(row));
    }
    segments.push_back(std::move(segment));
  }
  return segments;
}

// Runs one micro-batch and adds each owner's weighted loss to `losses`.
// With `backward`, gradients of the weighted loss accumulate in the LoRA
// parameters. The LM head runs in chunks of target tokens, each chunk
// differentiated on its own, so only one chunk of logits is alive at once.
absl::Status RunMicroBatch(const LlamaModel& model,
                           const std::vector<Piece>& pieces,
                           const std::vector<const LoraWeights*>& owners,
                           const std::vector<uint64_t>& dropout_seeds,
                           bool backward, const CoBatchOptions& options,
                           std::vector<double>& losses) {
  const MicroBatch batch = BuildMicroBatch(pieces, /*pad_id=*/0, model.device(),
                                           model.logits_dtype());
  const MultiLoraDelta delta(
      Segments(pieces, owners, dropout_seeds, /*training=*/backward));
  LORAPLEX_ASSIGN_OR_RETURN(
      torch::Tensor hidden,
      model.ForwardHidden(batch.input_ids, batch.lengths, &delta));
  torch::Tensor targets =
      hidden.reshape({-1, hidden.size(-1)}).index_select(0, batch.target_index);
  const int64_t chunk = std::max<int64_t>(1, options.loss_chunk_tokens);
  std::vector<torch::Tensor> chunks = targets.detach().split(chunk, 0);
  std::vector<torch::Tensor> grads;
  std::vector<torch::Tensor> contributions;
  int64_t start = 0;
  for (torch::Tensor& part : chunks) {
    const int64_t n = part.size(0);
    if (backward) part.requires_grad_(true);
    torch::Tensor logits = model.Logits(part);
    torch::Tensor ce = torch::nn::functional::cross_entropy(
        logits, batch.target_labels.narrow(0, start, n),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(
            torch::kNone));
    torch::Tensor contribution = ce * batch.target_weights.narrow(0, start, n);
    if (backward) {
      contribution.sum().backward();
      grads.push_back(part.grad());
    }
    contributions.push_back(contribution.detach());
    start += n;
  }
  if (backward) {
    targets.backward(torch::cat(grads, 0).to(targets.scalar_type()));
  }
  torch::Tensor per_token =
      torch::cat(contributions, 0).to(torch::kCPU, torch::kFloat64);
  const double* values = per_token.data_ptr<double>();
  for (size_t i = 0; i < batch.target_owner.size(); ++i) {
    losses[batch.target_owner[i]] += values[i];
  }
  return absl::OkStatus();
}

// Rows of every owner in order, each weighted by 1 / (owner's targets).
std::vector<Row> WeightedRows(
    const std::vector<std::vector<const Sequence*>>& batches,
    std::vector<int64_t>& targets, std::vector<int64_t>& tokens) {
  std::vector<Row> rows;
  targets.assign(batches.size(), 0);
  tokens.assign(batches.size(), 0);
  for (size_t owner = 0; owner < batches.size(); ++owner) {
    for (const Sequence* seq : batches[owner]) {
      tokens[owner] += static_cast<int64_t>(seq->input_ids.size());
      for (size_t t = 1; t < seq->loss_mask.size(); ++t) {
        targets[owner] += seq->loss_mask[t] != 0;
      }
    }
    const double weight =
        targets[owner] > 0 ? 1.0 / static_cast<double>(targets[owner]) : 0.0;
    for (size_t i = 0; i < batches[owner].size(); ++i) {
      rows.push_back(
          Row{owner, static_cast<int64_t>(i), batches[owner][i], weight});
    }
  }
  return rows;
}

// INVALID_ARGUMENT unless `weights` were shaped for a model like `model`.
absl::Status CheckAdapterFits(const LoraWeights& weights,
                              const ModelConfig& model, size_t index) {
  const ModelConfig& bound = weights.model_config();
  if (bound.num_hidden_layers != model.num_hidden_layers ||
      bound.hidden_size != model.hidden_size ||
      bound.intermediate_size != model.intermediate_size ||
      bound.num_attention_heads != model.num_attention_heads ||
      bound.num_key_value_heads != model.num_key_value_heads ||
      bound.head_dim != model.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter ", index, " was shaped for another base model"));
  }
  return absl::OkStatus();
}

// Zeroes the gradients of all the slot's weights in place: a data-parallel
// rank's optimizer holds only the parameters it owns.
void ZeroGrads(TrainingSlot& slot) {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& param : slot.weights.parameters()) {
    if (param.grad().defined()) param.grad().zero_();
  }
}

// Sums every slot's gradients (zeros where this rank had no rows of it),
// the loss sums and the ranks' failure flags over the ranks.
// FAILED_PRECONDITION when any rank's part of the step failed.
absl::Status SumOverRanks(const StepSync& sync,
                          const std::vector<TrainingSlot*>& slots,
                          std::vector<double>& losses, bool failed_here) {
  std::vector<torch::Tensor> tensors;
  torch::Device device = torch::kCPU;
  for (TrainingSlot* slot : slots) {
    for (torch::Tensor param : slot->weights.parameters()) {
      if (!param.grad().defined()) {
        param.mutable_grad() = torch::zeros_like(param);
      }
      tensors.push_back(param.grad());
      device = param.device();
    }
  }
  std::vector<double> values = losses;
  values.push_back(failed_here ? 1.0 : 0.0);
  tensors.push_back(torch::tensor(values, torch::kDouble).to(device));
  LORAPLEX_RETURN_IF_ERROR(sync.sum(tensors));
  const torch::Tensor summed = tensors.back().cpu();
  if (summed[static_cast<int64_t>(losses.size())].item<double>() > 0) {
    return absl::FailedPreconditionError(
        "the step failed on another rank; no slot changed");
  }
  for (size_t i = 0; i < losses.size(); ++i) {
    losses[i] = summed[static_cast<int64_t>(i)].item<double>();
  }
  return absl::OkStatus();
}

absl::Status TorchError(absl::string_view what, const c10::Error& e) {
  return absl::InternalError(
      absl::StrCat(what, ": ", e.what_without_backtrace()));
}

// A failure of this rank after the sum over the ranks: the others go on to
// the parameter sync without it.
absl::Status AfterSum(const StepSync* sync, absl::Status status) {
  if (sync == nullptr || sync->world_size <= 1) return status;
  return absl::AbortedError(
      absl::StrCat(status.message(), " on rank ", sync->rank,
                   " after the gradient sum: the ranks' slots now differ"));
}

}  // namespace

absl::StatusOr<std::vector<SlotStepMetrics>> TrainCoBatchStep(
    const LlamaModel& model, const std::vector<TrainingSlot*>& slots,
    const CoBatchOptions& options) {
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i]->trainable() || slots[i]->done()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "slot ", i, " of the step is not ready to train (",
          slots[i]->trainable() ? "its steps are done" : "nothing attached",
          ")"));
    }
    LORAPLEX_RETURN_IF_ERROR(
        CheckAdapterFits(slots[i]->weights, model.config(), i));
    for (size_t j = 0; j < i; ++j) {
      if (slots[j] == slots[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("slot ", i, " of the step repeats slot ", j));
      }
    }
  }
  std::vector<DataCursor> cursors;
  std::vector<std::vector<const Sequence*>> batches;
  std::vector<const LoraWeights*> owners;
  std::vector<uint64_t> seeds;
  for (TrainingSlot* slot : slots) {
    cursors.push_back(*slot->cursor);
    std::vector<const Sequence*> batch;
    for (int64_t index : slot->cursor->NextBatch(slot->training.batch_size)) {
      batch.push_back(&slot->data->sequences[index]);
    }
    batches.push_back(std::move(batch));
    owners.push_back(&slot->weights);
    // Dropout seed of this step: a function of the job's seed and step.
    seeds.push_back(
        SplitMix64(slot->training.seed ^
                   SplitMix64(static_cast<uint64_t>(slot->counters.steps))));
  }
  std::vector<int64_t> targets;
  std::vector<int64_t> tokens;
  std::vector<Row> rows = WeightedRows(batches, targets, tokens);
  const StepSync* sync = options.sync;
  if (sync != nullptr && sync->world_size > 1) {
    // Row r of slot i goes to rank (rows of slots before i + r) % world:
    // the ranks take turns across the whole co-batch, so leftover rows do
    // not all land on rank 0.
    std::vector<int64_t> offset(slots.size() + 1, 0);
    for (size_t i = 0; i < slots.size(); ++i) {
      offset[i + 1] = offset[i] + static_cast<int64_t>(batches[i].size());
    }
    rows.erase(std::remove_if(rows.begin(), rows.end(),
                              [&](const Row& row) {
                                return (offset[row.owner] + row.row_id) %
                                           sync->world_size !=
                                       sync->rank;
                              }),
               rows.end());
  }
  std::vector<double> losses(slots.size(), 0.0);

  auto restore = [&]() {
    for (size_t i = 0; i < slots.size(); ++i) {
      ZeroGrads(*slots[i]);
      *slots[i]->cursor = cursors[i];
    }
  };
  absl::Status local;
  try {
    for (TrainingSlot* slot : slots) ZeroGrads(*slot);
    for (const std::vector<Piece>& micro :
         PlanMicroBatches(rows, options.token_budget)) {
      local = RunMicroBatch(model, micro, owners, seeds,
                            /*backward=*/true, options, losses);
      if (!local.ok()) break;
    }
  } catch (const c10::Error& e) {
    local = TorchError("training step failed", e);
  }
  if (sync != nullptr) {
    // Every rank takes part in the sum even when its own part failed, and
    // then all of them fail together: none is left waiting.
    absl::Status summed;
    try {
      if (!local.ok()) {
        for (TrainingSlot* slot : slots) ZeroGrads(*slot);
      }
      summed = SumOverRanks(*sync, slots, losses, !local.ok());
    } catch (const c10::Error& e) {
      summed = TorchError("summing over the ranks failed", e);
    }
    if (local.ok()) local = summed;
  }
  if (!local.ok()) {
    restore();
    return local;
  }

  // Decide every slot's fate (and clip) before any optimizer steps, so a
  // failure up to here leaves every slot as it was.
  std::vector<SlotStepMetrics> metrics(slots.size());
  try {
    for (size_t i = 0; i < slots.size(); ++i) {
      TrainingSlot& slot = *slots[i];
      SlotStepMetrics& m = metrics[i];
      m.loss = losses[i];
      m.lr = slot.scheduler->lr();
      m.target_tokens = targets[i];
      m.tokens = tokens[i];
      if (targets[i] == 0) {
        m.skipped = true;
        m.skip_reason = "no target tokens in the batch";
      } else if (!std::isfinite(m.loss)) {
        m.skipped = true;
        m.skip_reason = "loss is not finite";
      } else {
        const GradNorm norm =
            ClipGradNorm(slot.weights.parameters(), slot.training.grad_clip);
        m.grad_norm = norm.norm;
        if (!norm.finite) {
          m.skipped = true;
          m.skip_reason = "gradient norm is not finite";
        }
      }
    }
  } catch (const c10::Error& e) {
    restore();
    return AfterSum(sync, TorchError("gradient clipping failed", e));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    TrainingSlot& slot = *slots[i];
    try {
      if (!metrics[i].skipped) {
        slot.scheduler->ApplyTo(*slot.optimizer);
        slot.optimizer->Step();
        slot.scheduler->Step(*slot.optimizer);
      }
      ZeroGrads(slot);
    } catch (const c10::Error& e) {
      // Slots before i have stepped; slot i and later have not.
      for (size_t j = i; j < slots.size(); ++j) {
        ZeroGrads(*slots[j]);
        *slots[j]->cursor = cursors[j];
      }
      return AfterSum(sync,
                      TorchError(absl::StrCat("optimizer step of slot ", i,
                                              " failed (earlier slots "
                                              "stepped)"),
                                 e));
    }
    if (metrics[i].skipped) ++slot.counters.skipped_steps;
    ++slot.counters.steps;
    slot.counters.target_tokens += targets[i];
  }
  if (sync != nullptr && sync->after_step) {
    // A failure here leaves the ranks' weights apart: the run must go back
    // to a checkpoint.
    absl::Status status = sync->after_step(slots);
    if (!status.ok()) {
      return absl::Status(
          status.code(),
          absl::StrCat("syncing the updated parameters over the ranks "
                       "failed (resume from a checkpoint): ",
                       status.message()));
    }
  }
  return metrics;
}

absl::StatusOr<double> EvalLoss(const LlamaModel& model,
                                const LoraWeights* adapter,
                                const std::vector<Sequence>& sequences,
                                const CoBatchOptions& options) {
  if (sequences.empty()) {
    return absl::InvalidArgumentError("evaluation needs at least one sequence");
  }
  if (adapter != nullptr) {
    LORAPLEX_RETURN_IF_ERROR(CheckAdapterFits(*adapter, model.config(), 0));
  }
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (sequences[i].input_ids.size() != sequences[i].loss_mask.size() ||
        sequences[i].input_ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "evaluation sequence ", i,
          " must have as many loss_mask values as input_ids, at least one"));
    }
  }
  std::vector<std::vector<const Sequence*>> batches(1);
  for (const Sequence& seq : sequences) batches[0].push_back(&seq);
  std::vector<int64_t> targets;
  std::vector<int64_t> tokens;
  const std::vector<Row> rows = WeightedRows(batches, targets, tokens);
  if (targets[0] == 0) {
    return absl::InvalidArgumentError("evaluation sequences have no targets");
  }
  std::vector<double> losses(1, 0.0);
  torch::NoGradGuard no_grad;
  try {
    for (const std::vector<Piece>& micro :
         PlanMicroBatches(rows, options.token_budget)) {
      LORAPLEX_RETURN_IF_ERROR(RunMicroBatch(model, micro, {adapter}, {},
                                             /*backward=*/false, options,
                                             losses));
    }
  } catch (const c10::Error& e) {
    return TorchError("evaluation failed", e);
  }
  return losses[0];
}

}  // namespace loraplex
