#include "core/train/co_batch_step.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "core/common/split_mix.h"
#include "core/common/status_macros.h"
#include "core/common/test_faults.h"
#include "core/optim/grad_clip.h"
#include "core/train/micro_batch.h"

namespace loraplex {
namespace {

MicroBatchOptions MicroOptions(const CoBatchOptions& options) {
  return {options.loss_chunk_tokens, options.lora_kernel,
          options.checkpointing};
}

// Rows of every slot in order, each target token weighted by 1 / (the
// slot's target tokens): the slot's masked mean cross-entropy.
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
      const Sequence& seq = *batches[owner][i];
      Row row{
          owner, static_cast<int64_t>(i), &seq.input_ids, {}, &seq.segments};
      // Position t-1 predicts token t.
      for (size_t t = 1; t < seq.input_ids.size(); ++t) {
        if (seq.loss_mask[t] == 0) continue;
        row.targets.positions.push_back(static_cast<int64_t>(t) - 1);
        row.targets.labels.push_back(seq.input_ids[t]);
        row.targets.weights.push_back(weight);
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

// The rows of a forward/backward call: position i of each datum predicts
// its k target tokens, each with its own inputs.
void AppendCallRows(const ForwardBackwardCall& call, size_t owner,
                    std::vector<Row>& rows) {
  for (size_t d = 0; d < call.data->size(); ++d) {
    const Datum& datum = (*call.data)[d];
    const int64_t k = datum.targets_per_position;
    Row row{owner, static_cast<int64_t>(d), &datum.input_ids, {}};
    RowTargets& t = row.targets;
    for (int64_t i = 0; i < datum.positions(); ++i) {
      for (int64_t j = 0; j < k; ++j) {
        const size_t at = static_cast<size_t>(i * k + j);
        t.positions.push_back(i);
        t.labels.push_back(datum.target_tokens[at]);
        if (LossFnTakesWeights(call.loss.fn)) {
          t.weights.push_back(datum.weights[at]);
        }
        if (LossFnTakesSamplerInputs(call.loss.fn)) {
          t.sampler_logprobs.push_back(datum.sampler_logprobs[i]);
          t.advantages.push_back(datum.advantages[i]);
        }
      }
    }
    rows.push_back(std::move(row));
  }
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

// INVALID_ARGUMENT unless every call can run on `model` beside `slots`.
absl::Status CheckCalls(const LlamaModel& model,
                        const std::vector<TrainingSlot*>& slots,
                        const std::vector<ForwardBackwardCall>& calls) {
  if (calls.empty()) return absl::OkStatus();
  const ModelConfig& config = model.config();
  DatumLimits limits;
  limits.vocab_size = config.vocab_size;
  limits.max_positions = config.max_position_embeddings;
  for (size_t c = 0; c < calls.size(); ++c) {
    const ForwardBackwardCall& call = calls[c];
    const std::string what = absl::StrCat("call ", c, " of the pass");
    if (call.data == nullptr || call.data->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has no data"));
    }
    if (call.adapter == nullptr) {
      if (call.backward) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " has gradients but no adapter"));
      }
    } else {
      if (!call.adapter->bound()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, "'s adapter is not bound"));
      }
      LORAPLEX_RETURN_IF_ERROR(CheckAdapterFits(*call.adapter, config, c));
      for (const TrainingSlot* slot : slots) {
        if (&slot->weights == call.adapter) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, "'s adapter is a training slot's"));
        }
      }
    }
    for (size_t d = 0; d < call.data->size(); ++d) {
      LORAPLEX_RETURN_IF_ERROR(ValidateDatum((*call.data)[d], call.loss, limits,
                                             absl::StrCat("data[", d, "].")));
    }
  }
  return absl::OkStatus();
}

// The gradients the calls' adapters held before a pass, set aside while
// it runs: AddBack adds them to the pass's own, PutBack restores them.
class GradStash {
 public:
  explicit GradStash(const std::vector<ForwardBackwardCall>& calls) {
    for (const ForwardBackwardCall& call : calls) {
      if (!call.backward || call.adapter == nullptr) continue;
      for (const torch::Tensor& param : call.adapter->parameters()) {
        if (std::any_of(
                params_.begin(), params_.end(),
                [&](const torch::Tensor& t) { return t.is_same(param); })) {
          continue;  // Two calls of one adapter.
        }
        params_.push_back(param);
        saved_.push_back(param.grad());
        torch::Tensor p = param;
        p.mutable_grad() = torch::Tensor();
      }
    }
  }

  void AddBack() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor& grad = params_[i].mutable_grad();
      if (!saved_[i].defined()) continue;
      if (grad.defined()) {
        saved_[i].add_(grad);
      }
      grad = saved_[i];
    }
    params_.clear();
    saved_.clear();
  }

  void PutBack() {
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].mutable_grad() = saved_[i];
    }
    params_.clear();
    saved_.clear();
  }

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> saved_;
};

// A call's output: its loss, and its logprobs cut per datum.
ForwardBackwardOutput CallOutput(const std::vector<Datum>& data, double loss,
                                 std::vector<double> logprobs) {
  ForwardBackwardOutput out;
  out.loss = loss;
  size_t at = 0;
  for (const Datum& datum : data) {
    const size_t n = datum.target_tokens.size();
    out.logprobs.emplace_back(logprobs.begin() + at, logprobs.begin() + at + n);
    at += n;
    out.tokens += datum.positions();
  }
  return out;
}

// Drops the gradients of all the slot's weights (a data-parallel rank's
// optimizer holds only the parameters it owns, so its own zero_grad would
// not do). Dropped rather than zeroed: the backward pass then takes each
// new gradient as it is, where a zeroed one costs a kernel to zero and one
// to add into per parameter and step (10,000s per step on a GPU).
void DropGrads(TrainingSlot& slot) {
  for (torch::Tensor param : slot.weights.parameters()) {
    param.mutable_grad() = torch::Tensor();
  }
}

// Zero gradients for the slot's weights the pass gave none (as if they had
// been zeroed before it), so its optimizer steps every parameter.
void ZeroMissingGrads(TrainingSlot& slot) {
  for (torch::Tensor param : slot.weights.parameters()) {
    if (!param.grad().defined()) {
      param.mutable_grad() = torch::zeros_like(param);
    }
  }
}

constexpr absl::string_view kUnchangedPayload =
    "loraplex.dev/step-left-slots-unchanged";

// `status`, marked as having left every slot of the step as it was.
absl::Status Unchanged(absl::Status status) {
  status.SetPayload(kUnchangedPayload, absl::Cord("1"));
  return status;
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

// The checks before anything of a pass changes.
absl::Status CheckPass(const LlamaModel& model,
                       const std::vector<TrainingSlot*>& slots,
                       const std::vector<ForwardBackwardCall>& calls,
                       const StepSync* sync) {
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
  if (const ShardedBase* base = model.sharded_base();
      base != nullptr && base->world_size() > 1 &&
      (sync == nullptr || sync->world_size != base->world_size() ||
       sync->rank != base->rank())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the base is sharded over ", base->world_size(),
        " ranks: a pass needs data parallel over those ranks (StepSync)"));
  }
  return CheckCalls(model, slots, calls);
}

bool Distributed(const StepSync* sync) {
  return sync != nullptr && sync->world_size > 1;
}

// One pass's rows and what its micro-batches add up, carried from phase to
// phase. Neither copied nor moved: sums points at logprobs.
struct PassRows {
  PassRows() = default;
  PassRows(const PassRows&) = delete;
  PassRows& operator=(const PassRows&) = delete;

  std::vector<DataCursor> cursors;  // Each slot's cursor before the pass.
  std::vector<int64_t> targets;     // Target tokens of each slot's batch.
  std::vector<int64_t> tokens;      // Tokens of each slot's batch.
  PassOwners owners;                // The slots, then the calls.
  // This rank's rows of the slots, then the rows of the calls with
  // gradients: they run with autograd.
  std::vector<Row> rows;
  std::vector<Row> forward_rows;  // This rank's rows of forward-only calls.
  // Data parallel: row r of owner o runs on rank (first_row[o] + r) %
  // world size (the ranks take turns over the rows of the whole pass).
  std::vector<int64_t> first_row;
  std::vector<std::vector<double>> logprobs;  // Per owner.
  PassSums sums;
  std::vector<double> losses;  // Each slot's loss.
  // A sharded base: the most micro-batches (with backward or forward-only)
  // any rank runs.
  int64_t most_micro_batches = 0;
};

bool RunsOnRank(const PassRows& pass, const Row& row, int rank, int world) {
  return (pass.first_row[row.owner] + row.row_id) % world == rank;
}

// The rows of `rows` rank `rank` of `world` runs.
std::vector<Row> RowsOfRank(const PassRows& pass, const std::vector<Row>& rows,
                            int rank, int world) {
  std::vector<Row> kept;
  for (const Row& row : rows) {
    if (RunsOnRank(pass, row, rank, world)) kept.push_back(row);
  }
  return kept;
}

// Every call's logprobs over all its data, in datum order: this rank's
// values where it ran the datum, zeros where another rank did (so that the
// sum over the ranks is every datum's own values).
std::vector<double> SpreadCallLogprobs(
    const std::vector<ForwardBackwardCall>& calls, size_t num_slots,
    const PassRows& pass, const StepSync& sync) {
  std::vector<double> spread;
  for (size_t c = 0; c < calls.size(); ++c) {
    const size_t owner = num_slots + c;
    const std::vector<double>& local = pass.logprobs[owner];
    size_t at = 0;
    for (size_t d = 0; d < calls[c].data->size(); ++d) {
      const size_t n = (*calls[c].data)[d].target_tokens.size();
      Row row;
      row.owner = owner;
      row.row_id = static_cast<int64_t>(d);
      // (A rank whose part failed may have fewer: the pass fails anyway.)
      if (RunsOnRank(pass, row, sync.rank, sync.world_size) &&
          at + n <= local.size()) {
        spread.insert(spread.end(), local.begin() + at, local.begin() + at + n);
        at += n;
      } else {
        spread.insert(spread.end(), n, 0.0);
      }
    }
  }
  return spread;
}

// Sums every slot's gradients (zeros where this rank had no rows of it),
// the slots' and the calls' loss sums, the calls' logprobs, the router
// statistics and the ranks' failure flags over the ranks. The calls'
// gradients stay this rank's part (StepAccumulated sums them).
// FAILED_PRECONDITION when any rank's part of the step failed.
absl::Status SumOverRanks(const StepSync& sync, torch::Device device,
                          const std::vector<TrainingSlot*>& slots,
                          const std::vector<ForwardBackwardCall>& calls,
                          PassRows& pass, bool failed_here) {
  std::vector<torch::Tensor> tensors;
  for (TrainingSlot* slot : slots) {
    ZeroMissingGrads(*slot);
    for (const torch::Tensor& param : slot->weights.parameters()) {
      tensors.push_back(param.grad());
    }
  }
  std::vector<double>& losses = pass.losses;
  std::vector<std::vector<int64_t>>& expert_tokens = pass.sums.expert_tokens;
  const size_t num_slots = slots.size();
  std::vector<double> values = losses;
  values.push_back(failed_here ? 1.0 : 0.0);
  // The slots' router statistics (exact as doubles up to 2^53 tokens).
  for (size_t i = 0; i < num_slots && i < expert_tokens.size(); ++i) {
    values.insert(values.end(), expert_tokens[i].begin(),
                  expert_tokens[i].end());
  }
  const size_t calls_at = values.size();
  for (size_t c = 0; c < calls.size(); ++c) {
    values.push_back(pass.sums.losses[num_slots + c]);
  }
  if (!calls.empty()) {
    const std::vector<double> spread =
        SpreadCallLogprobs(calls, num_slots, pass, sync);
    values.insert(values.end(), spread.begin(), spread.end());
  }
  tensors.push_back(torch::tensor(values, torch::kDouble).to(device));
  LORAPLEX_RETURN_IF_ERROR(sync.sum(tensors));
  const torch::Tensor summed = tensors.back().cpu().contiguous();
  const double* sums = summed.data_ptr<double>();
  if (sums[losses.size()] > 0) {
    return absl::FailedPreconditionError(
        "the step failed on another rank; no slot changed");
  }
  for (size_t i = 0; i < losses.size(); ++i) losses[i] = sums[i];
  size_t at = losses.size() + 1;
  for (size_t i = 0; i < num_slots && i < expert_tokens.size(); ++i) {
    for (int64_t& count : expert_tokens[i]) {
      count = static_cast<int64_t>(sums[at++]);
    }
  }
  at = calls_at;
  for (size_t c = 0; c < calls.size(); ++c) {
    pass.sums.losses[num_slots + c] = sums[at++];
  }
  for (size_t c = 0; c < calls.size(); ++c) {
    std::vector<double>& logprobs = pass.logprobs[num_slots + c];
    size_t n = 0;
    for (const Datum& datum : *calls[c].data) n += datum.target_tokens.size();
    logprobs.assign(sums + at, sums + at + n);
    at += n;
  }
  return absl::OkStatus();
}

// Phase 1. Takes each slot's next batch (its cursor moves on; `pass` keeps
// the old one) and each call's data; gives `pass` its owners, the rows
// this rank runs and zeroed sums (router statistics of `experts` experts
// when the base has them).
void GatherRows(const std::vector<TrainingSlot*>& slots,
                const std::vector<ForwardBackwardCall>& calls,
                const StepSync* sync, int64_t experts, PassRows& pass,
                const LlamaModel& model, int64_t token_budget) {
  std::vector<std::vector<const Sequence*>> batches;
  PassOwners& owners = pass.owners;
  int64_t turn = 0;
  for (TrainingSlot* slot : slots) {
    pass.cursors.push_back(*slot->cursor);
    std::vector<const Sequence*> batch;
    for (int64_t index : slot->cursor->NextBatch(slot->training.batch_size)) {
      batch.push_back(&slot->data->sequences[index]);
    }
    pass.first_row.push_back(turn);
    turn += static_cast<int64_t>(batch.size());
    batches.push_back(std::move(batch));
    owners.adapters.push_back(&slot->weights);
    // Dropout seed of this step: a function of the job's seed and step.
    owners.dropout_seeds.push_back(
        SplitMix64(slot->training.seed ^
                   SplitMix64(static_cast<uint64_t>(slot->counters.steps))));
    owners.losses.push_back(LossFnSpec{});
  }
  pass.rows = WeightedRows(batches, pass.targets, pass.tokens);
  // Calls with gradients train beside the slots; forward-only calls run
  // after them without autograd.
  for (size_t c = 0; c < calls.size(); ++c) {
    owners.adapters.push_back(calls[c].adapter);
    owners.dropout_seeds.push_back(calls[c].dropout_seed);
    owners.losses.push_back(calls[c].loss);
    AppendCallRows(calls[c], slots.size() + c,
                   calls[c].backward ? pass.rows : pass.forward_rows);
    pass.first_row.push_back(turn);
    turn += static_cast<int64_t>(calls[c].data->size());
  }
  if (Distributed(sync)) {
    const int world = sync->world_size;
    if (model.sharded_base() != nullptr) {
      // Every rank plans every rank's micro-batches: the same count on all.
      for (int rank = 0; rank < world; ++rank) {
        const int64_t count =
            static_cast<int64_t>(
                PlanMicroBatches(RowsOfRank(pass, pass.rows, rank, world),
                                 token_budget)
                    .size()) +
            static_cast<int64_t>(
                PlanMicroBatches(
                    RowsOfRank(pass, pass.forward_rows, rank, world),
                    token_budget)
                    .size());
        pass.most_micro_batches = std::max(pass.most_micro_batches, count);
      }
    }
    pass.rows = RowsOfRank(pass, pass.rows, sync->rank, world);
    pass.forward_rows = RowsOfRank(pass, pass.forward_rows, sync->rank, world);
  }
  pass.logprobs.resize(owners.adapters.size());
  pass.sums = PassSums{std::vector<double>(owners.adapters.size(), 0.0),
                       calls.empty() ? nullptr : &pass.logprobs};
  if (experts > 0) {
    // Zeros for every owner, so that the ranks sum lists of one length.
    pass.sums.expert_tokens.assign(owners.adapters.size(),
                                   std::vector<int64_t>(experts, 0));
  }
  pass.losses.assign(slots.size(), 0.0);
}

// Phase 2. Drops the slots' gradients, then runs `pass`'s rows in
// micro-batches: the trained ones with backward, then the forward-only
// ones without autograd. Gives this rank's status; `pass.sums` and
// `pass.losses` hold what this rank added up. With `all_ranks` (a sharded
// base), each forward-only micro-batch pads its gathers to a whole training
// pass's (layers 0..L-1, then L-1..0), so that every rank's gathers follow
// that one order however its micro-batches are mixed.
absl::Status RunForwardBackward(const LlamaModel& model,
                                const std::vector<TrainingSlot*>& slots,
                                const CoBatchOptions& options, PassRows& pass,
                                ShardedBase::AllRanks* all_ranks = nullptr) {
  absl::Status local;
  try {
    for (TrainingSlot* slot : slots) DropGrads(*slot);
    for (TrainingSlot* slot : slots) {
      local = TestFault(TestFaultPoint::kForward, slot->training.seed);
      if (!local.ok()) break;
    }
    for (const std::vector<Piece>& micro :
         PlanMicroBatches(pass.rows, options.token_budget)) {
      if (!local.ok()) break;
      local = RunMicroBatch(model, micro, pass.owners, /*backward=*/true,
                            MicroOptions(options), pass.sums);
    }
    if (local.ok() && !pass.forward_rows.empty()) {
      torch::NoGradGuard no_grad;
      for (const std::vector<Piece>& micro :
           PlanMicroBatches(pass.forward_rows, options.token_budget)) {
        local = RunMicroBatch(model, micro, pass.owners, /*backward=*/false,
                              MicroOptions(options), pass.sums);
        if (local.ok() && all_ranks != nullptr) {
          const int64_t per_pass =
              model.sharded_base()->GathersPerTrainingPass();
          local = all_ranks->PadTo((all_ranks->gathers() + per_pass - 1) /
                                   per_pass * per_pass);
        }
        if (!local.ok()) break;
      }
    }
  } catch (const c10::Error& e) {
    local = TorchError("training step failed", e);
  }
  std::copy(pass.sums.losses.begin(), pass.sums.losses.begin() + slots.size(),
            pass.losses.begin());
  return local;
}

// Phase 2 on a base sharded over the ranks, whose layers every rank gathers
// together: each rank then pads its gathers to those of the most
// micro-batches any rank runs, whether it ran fewer (fewer rows, none, a
// micro-batch without targets) or stopped early on an error.
absl::Status RunForwardBackwardSharded(const LlamaModel& model,
                                       const std::vector<TrainingSlot*>& slots,
                                       const CoBatchOptions& options,
                                       PassRows& pass) {
  ShardedBase& base = *model.sharded_base();
  ShardedBase::AllRanks all_ranks(base);
  absl::Status local =
      RunForwardBackward(model, slots, options, pass, &all_ranks);
  absl::Status padded =
      all_ranks.PadTo(pass.most_micro_batches * base.GathersPerTrainingPass());
  return local.ok() ? padded : local;
}

// Phase 3. Takes this rank's status of phase 2; sums the slots' gradients,
// the losses and the calls' logprobs over the ranks, then adds the calls'
// earlier gradients from `stash` to the pass's. Gives the status of the pass so
// far: on an error the caller puts everything back.
absl::Status AddUpGradients(const StepSync* sync, torch::Device device,
                            const std::vector<TrainingSlot*>& slots,
                            const std::vector<ForwardBackwardCall>& calls,
                            absl::Status local, GradStash& stash,
                            PassRows& pass) {
  if (sync != nullptr) {
    // Every rank takes part in the sum even when its own part failed, and
    // then all of them fail together: none is left waiting.
    absl::Status summed;
    try {
      if (!local.ok()) {
        for (TrainingSlot* slot : slots) DropGrads(*slot);
      }
      summed = SumOverRanks(*sync, device, slots, calls, pass, !local.ok());
    } catch (const c10::Error& e) {
      summed = TorchError("summing over the ranks failed", e);
    }
    if (local.ok()) local = summed;
  }
  if (local.ok()) {
    try {
      stash.AddBack();
    } catch (const c10::Error& e) {
      local = TorchError("adding up the calls' gradients failed", e);
    }
  }
  return local;
}

// Puts every slot back as it was before the pass: no gradients, its cursor.
void RestoreSlots(const std::vector<TrainingSlot*>& slots,
                  const std::vector<DataCursor>& cursors) {
  for (size_t i = 0; i < slots.size(); ++i) {
    DropGrads(*slots[i]);
    *slots[i]->cursor = cursors[i];
  }
}

// Phase 4. Each call's output, from the sums and logprobs of `pass` (moved
// out of it).
std::vector<ForwardBackwardOutput> CallOutputs(
    const std::vector<ForwardBackwardCall>& calls, size_t num_slots,
    PassRows& pass) {
  std::vector<ForwardBackwardOutput> outputs;
  for (size_t c = 0; c < calls.size(); ++c) {
    outputs.push_back(CallOutput(*calls[c].data,
                                 pass.sums.losses[num_slots + c],
                                 std::move(pass.logprobs[num_slots + c])));
  }
  return outputs;
}

// Phase 5. Decides every slot's fate (skipped, or stepping with its
// gradients clipped) before any optimizer steps, so a failure up to here
// leaves every slot as it was. Gives each slot's metrics; on an error the
// slots are put back.
absl::StatusOr<std::vector<SlotStepMetrics>> ClipSlots(
    const std::vector<TrainingSlot*>& slots, const StepSync* sync,
    const PassRows& pass) {
  std::vector<SlotStepMetrics> metrics(slots.size());
  try {
    // The slots to clip, all measured together (one read from the device).
    std::vector<size_t> clipping;
    std::vector<std::vector<torch::Tensor>> clip_params;
    std::vector<double> clip_limits;
    for (size_t i = 0; i < slots.size(); ++i) {
      TrainingSlot& slot = *slots[i];
      SlotStepMetrics& m = metrics[i];
      m.loss = pass.losses[i];
      m.lr = slot.scheduler->lr();
      m.target_tokens = pass.targets[i];
      m.tokens = pass.tokens[i];
      if (i < pass.sums.expert_tokens.size()) {
        m.expert_tokens = pass.sums.expert_tokens[i];
      }
      if (pass.targets[i] == 0) {
        m.skipped = true;
        m.skip_reason = "no target tokens in the batch";
      } else if (!std::isfinite(m.loss)) {
        m.skipped = true;
        m.skip_reason = "loss is not finite";
      } else {
        ZeroMissingGrads(slot);
        clipping.push_back(i);
        clip_params.push_back(slot.weights.parameters());
        clip_limits.push_back(slot.training.grad_clip);
      }
    }
    const std::vector<GradNorm> norms = ClipGradNorms(clip_params, clip_limits);
    for (size_t k = 0; k < clipping.size(); ++k) {
      SlotStepMetrics& m = metrics[clipping[k]];
      m.grad_norm = norms[k].norm;
      if (!norms[k].finite) {
        m.skipped = true;
        m.skip_reason = "gradient norm is not finite";
      }
    }
  } catch (const c10::Error& e) {
    RestoreSlots(slots, pass.cursors);
    absl::Status failed = TorchError("gradient clipping failed", e);
    if (Distributed(sync)) return AfterSum(sync, std::move(failed));
    return Unchanged(std::move(failed));
  }
  return metrics;
}

// Phase 6. Steps the optimizer of every slot `metrics` does not skip, all
// in one call, so the Newton–Schulz of all Muon slots' same-shape matrices
// is batched across slots, and advances their schedules. Gives each slot's
// status (OK for a skipped one).
std::vector<absl::Status> StepOptimizers(
    const std::vector<TrainingSlot*>& slots,
    const std::vector<SlotStepMetrics>& metrics) {
  std::vector<absl::Status> stepped(slots.size());
  std::vector<SlotOptimizer*> optimizers;
  std::vector<size_t> stepping;  // The slot of each optimizer.
  for (size_t i = 0; i < slots.size(); ++i) {
    TrainingSlot& slot = *slots[i];
    if (metrics[i].skipped) continue;
    stepped[i] = TestFault(TestFaultPoint::kOptimizer, slot.training.seed);
    if (!stepped[i].ok()) continue;
    try {
      slot.scheduler->ApplyTo(*slot.optimizer);
      optimizers.push_back(&*slot.optimizer);
      stepping.push_back(i);
    } catch (const c10::Error& e) {
      stepped[i] = TorchError("optimizer step failed", e);
    }
  }
  const std::vector<absl::Status> results = StepSlotOptimizers(optimizers);
  for (size_t k = 0; k < stepping.size(); ++k) {
    const size_t i = stepping[k];
    if (!results[k].ok()) {
      stepped[i] = absl::Status(
          results[k].code(),
          absl::StrCat("optimizer step failed: ", results[k].message()));
      continue;
    }
    try {
      slots[i]->scheduler->Step(*slots[i]->optimizer);
    } catch (const c10::Error& e) {
      stepped[i] = TorchError("optimizer step failed", e);
    }
  }
  return stepped;
}

// Phase 7. Takes each slot's optimizer status `stepped`; drops the slots'
// gradients and counts each step, or puts a failed slot's cursor back and
// records its failure in `metrics`. Data parallel, a failed slot fails
// the pass (ABORTED).
absl::Status CountSteps(const std::vector<TrainingSlot*>& slots,
                        const StepSync* sync, const PassRows& pass,
                        const std::vector<absl::Status>& stepped,
                        std::vector<SlotStepMetrics>& metrics) {
  for (size_t i = 0; i < slots.size(); ++i) {
    TrainingSlot& slot = *slots[i];
    DropGrads(slot);
    if (!stepped[i].ok()) {
      *slot.cursor = pass.cursors[i];
      if (Distributed(sync)) {
        // The other ranks step this slot: the ranks now differ.
        for (size_t j = i + 1; j < slots.size(); ++j) DropGrads(*slots[j]);
        return AfterSum(sync, absl::Status(stepped[i].code(),
                                           absl::StrCat("slot ", i, ": ",
                                                        stepped[i].message())));
      }
      // One process: this slot alone fails (its weights may be partly
      // updated); the others step as they would without it.
      metrics[i].failure = std::string(stepped[i].message());
      continue;
    }
    if (metrics[i].skipped) ++slot.counters.skipped_steps;
    ++slot.counters.steps;
    slot.counters.target_tokens += pass.targets[i];
  }
  return absl::OkStatus();
}

// Phase 8. Data parallel, syncs the slots' updated parameters over the
// ranks (sync->after_step).
absl::Status SyncUpdatedParameters(const StepSync* sync,
                                   const std::vector<TrainingSlot*>& slots) {
  if (sync == nullptr || !sync->after_step) return absl::OkStatus();
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
  return absl::OkStatus();
}

}  // namespace

bool StepLeftSlotsUnchanged(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kUnchangedPayload).has_value();
}

absl::StatusOr<CoBatchResult> RunCoBatchPass(
    const LlamaModel& model, const std::vector<TrainingSlot*>& slots,
    const std::vector<ForwardBackwardCall>& calls,
    const CoBatchOptions& options) {
  const StepSync* sync = options.sync;
  if (absl::Status checked = CheckPass(model, slots, calls, sync);
      !checked.ok()) {
    return Unchanged(std::move(checked));
  }
  PassRows pass;
  GatherRows(slots, calls, sync, model.config().moe.num_experts, pass, model,
             options.token_budget);
  // The calls' gradients of earlier calls wait aside while this pass adds
  // its own, so a failure can put them back untouched.
  GradStash stash(calls);
  absl::Status local =
      model.sharded_base() != nullptr
          ? RunForwardBackwardSharded(model, slots, options, pass)
          : RunForwardBackward(model, slots, options, pass);
  // The sums live where the model computes (the process group's device).
  local = AddUpGradients(sync, model.device(), slots, calls, std::move(local),
                         stash, pass);
  if (!local.ok()) {
    RestoreSlots(slots, pass.cursors);
    stash.PutBack();
    return Unchanged(std::move(local));
  }
  CoBatchResult result;
  result.calls = CallOutputs(calls, slots.size(), pass);
  // Past the sum over the ranks, a failure is this rank's alone (AfterSum).
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<SlotStepMetrics> metrics,
                            ClipSlots(slots, sync, pass));
  const std::vector<absl::Status> stepped = StepOptimizers(slots, metrics);
  LORAPLEX_RETURN_IF_ERROR(CountSteps(slots, sync, pass, stepped, metrics));
  LORAPLEX_RETURN_IF_ERROR(SyncUpdatedParameters(sync, slots));
  result.slots = std::move(metrics);
  return result;
}

absl::StatusOr<std::vector<torch::Tensor>> SumAccumulatedGradients(
    const TrainingSlot& slot, const StepSync& sync) {
  const std::vector<torch::Tensor> params = slot.weights.parameters();
  std::vector<torch::Tensor> tensors;
  std::vector<double> present;
  try {
    for (const torch::Tensor& param : params) {
      const bool has = param.grad().defined();
      present.push_back(has ? 1.0 : 0.0);
      tensors.push_back(has ? param.grad().clone() : torch::zeros_like(param));
    }
    const torch::Device device =
        params.empty() ? torch::Device(torch::kCPU) : params[0].device();
    tensors.push_back(torch::tensor(present, torch::kDouble).to(device));
    LORAPLEX_RETURN_IF_ERROR(sync.sum(tensors));
    const torch::Tensor counts = tensors.back().cpu().contiguous();
    tensors.pop_back();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!(counts.data_ptr<double>()[i] > 0)) tensors[i] = torch::Tensor();
    }
  } catch (const c10::Error& e) {
    return TorchError("summing the gradients over the ranks failed", e);
  }
  return tensors;
}

absl::StatusOr<SlotStepMetrics> StepAccumulated(TrainingSlot& slot,
                                                const OptimizerConfig& step,
                                                double grad_clip,
                                                const StepSync* sync) {
  if (!slot.weights.bound() || !slot.optimizer) {
    return absl::FailedPreconditionError("the slot has no optimizer");
  }
  if (!(grad_clip >= 0) || !std::isfinite(grad_clip)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grad_clip_norm must be a finite number >= 0, got ", grad_clip));
  }
  // Checked (and refused without change) before anything moves: the same
  // on every rank, so all of them refuse before the sum.
  LORAPLEX_RETURN_IF_ERROR(slot.optimizer->SetHyperparameters(step));
  std::vector<torch::Tensor> params = slot.weights.parameters();
  if (Distributed(sync)) {
    absl::StatusOr<std::vector<torch::Tensor>> summed =
        SumAccumulatedGradients(slot, *sync);
    if (!summed.ok()) {
      DropGrads(slot);
      return summed.status();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = (*summed)[i];
    }
  }
  const bool any =
      std::any_of(params.begin(), params.end(),
                  [](const torch::Tensor& p) { return p.grad().defined(); });
  SlotStepMetrics metrics;
  metrics.lr = step.lr;
  try {
    if (!any) {
      metrics.skipped = true;
      metrics.skip_reason = "no gradients since the last step";
    } else {
      const GradNorm norm = ClipGradNorm(params, grad_clip);
      metrics.grad_norm = norm.norm;
      if (!norm.finite) {
        metrics.skipped = true;
        metrics.skip_reason = "gradient norm is not finite";
      }
    }
    // Data parallel, this rank's optimizer holds the parameters it owns.
    if (!metrics.skipped) slot.optimizer->Step();
  } catch (const c10::Error& e) {
    DropGrads(slot);
    return AfterSum(sync, TorchError("optimizer step failed", e));
  }
  DropGrads(slot);
  if (metrics.skipped) ++slot.counters.skipped_steps;
  ++slot.counters.steps;
  if (!metrics.skipped) {
    // The other ranks may have their weights now: the ranks differ.
    if (absl::Status synced = SyncUpdatedParameters(sync, {&slot});
        !synced.ok()) {
      return AfterSum(sync, std::move(synced));
    }
  }
  return metrics;
}

absl::StatusOr<std::vector<SlotStepMetrics>> TrainCoBatchStep(
    const LlamaModel& model, const std::vector<TrainingSlot*>& slots,
    const CoBatchOptions& options) {
  LORAPLEX_ASSIGN_OR_RETURN(CoBatchResult result,
                            RunCoBatchPass(model, slots, {}, options));
  return std::move(result.slots);
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
  PassOwners owners{{adapter}, {}, {LossFnSpec{}}};
  PassSums sums{{0.0}};
  torch::NoGradGuard no_grad;
  try {
    for (const std::vector<Piece>& micro :
         PlanMicroBatches(rows, options.token_budget)) {
      LORAPLEX_RETURN_IF_ERROR(RunMicroBatch(model, micro, owners,
                                             /*backward=*/false,
                                             MicroOptions(options), sums));
    }
  } catch (const c10::Error& e) {
    return TorchError("evaluation failed", e);
  }
  return sums.losses[0];
}

}  // namespace loraplex
