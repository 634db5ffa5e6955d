#include "core/train/micro_batch.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "core/common/status_macros.h"
#include "core/lora/multi_lora.h"
#include "core/train/expert_token_counter.h"

namespace loraplex {
namespace {

int64_t Length(const Row& row) {
  return static_cast<int64_t>(row.input_ids->size());
}

bool Fits(int64_t rows, int64_t longest, int64_t budget) {
  return budget <= 0 || rows * longest <= budget;
}

// A micro-batch as tensors. Its target tokens are in row order, so each
// owner's are one consecutive range.
struct MicroBatch {
  torch::Tensor input_ids;  // [rows, longest]
  torch::Tensor lengths;    // [rows]
  // [rows, longest] example index of each token when some row is packed
  // (ForwardOptions::segment_ids); undefined otherwise.
  torch::Tensor segment_ids;
  torch::Tensor target_index;   // [targets] flat positions that predict
  torch::Tensor target_labels;  // [targets]
  // [targets] in the logits' dtype; undefined when no owner's loss takes
  // them.
  torch::Tensor weights;
  torch::Tensor sampler_logprobs;
  torch::Tensor advantages;
  // Consecutive target ranges of one owner: (owner, first, count), from the
  // piece (its index, first row and row count) that holds them.
  struct Range {
    size_t owner;
    int64_t first;
    int64_t count;
    size_t piece;
    int64_t first_row;
    int64_t rows;
  };
  std::vector<Range> ranges;
};

MicroBatch BuildMicroBatch(const std::vector<Piece>& pieces,
                           const PassOwners& owners, int64_t pad_id,
                           torch::Device device, torch::ScalarType dtype) {
  int64_t rows = 0;
  int64_t longest = 0;
  for (const Piece& p : pieces) {
    rows += static_cast<int64_t>(p.rows.size());
    longest = std::max(longest, p.longest);
  }
  std::vector<int64_t> ids(rows * longest, pad_id);
  // Filled once a row is packed; zeros (one example) for the others.
  std::vector<int64_t> segment_ids;
  std::vector<int64_t> lengths;
  std::vector<int64_t> index;
  std::vector<int64_t> labels;
  std::vector<double> weights;
  std::vector<double> sampler_logprobs;
  std::vector<double> advantages;
  MicroBatch batch;
  int64_t r = 0;
  for (size_t piece = 0; piece < pieces.size(); ++piece) {
    const Piece& p = pieces[piece];
    const LossFn fn = owners.losses[p.owner].fn;
    const int64_t first = static_cast<int64_t>(index.size());
    const int64_t first_row = r;
    for (const Row* row : p.rows) {
      const RowTargets& t = row->targets;
      std::copy(row->input_ids->begin(), row->input_ids->end(),
                ids.begin() + r * longest);
      lengths.push_back(Length(*row));
      if (row->segments != nullptr && row->segments->size() > 1) {
        if (segment_ids.empty()) segment_ids.assign(rows * longest, 0);
        // Padding after the last example is one more segment; its queries
        // are ignored whatever they see.
        int64_t at = r * longest;
        int64_t segment = 0;
        for (int64_t length : *row->segments) {
          std::fill_n(segment_ids.begin() + at, length, segment++);
          at += length;
        }
        std::fill(segment_ids.begin() + at,
                  segment_ids.begin() + (r + 1) * longest, segment);
      }
      for (size_t i = 0; i < t.size(); ++i) {
        index.push_back(r * longest + t.positions[i]);
        labels.push_back(t.labels[i]);
        // Zeros stand in for the inputs a loss does not take, so that each
        // input stays aligned with the targets.
        weights.push_back(LossFnTakesWeights(fn) ? t.weights[i] : 0.0);
        const bool rl = LossFnTakesSamplerInputs(fn);
        sampler_logprobs.push_back(rl ? t.sampler_logprobs[i] : 0.0);
        advantages.push_back(rl ? t.advantages[i] : 0.0);
      }
      ++r;
    }
    const int64_t count = static_cast<int64_t>(index.size()) - first;
    if (count > 0) {
      batch.ranges.push_back(
          {p.owner, first, count, piece, first_row, r - first_row});
    }
  }
  auto to_device = [&](std::vector<int64_t>& values,
                       std::vector<int64_t> shape) {
    return torch::from_blob(values.data(), shape, torch::kInt64)
        .to(device, torch::kInt64, false, true);
  };
  const int64_t targets = static_cast<int64_t>(index.size());
  auto to_dtype = [&](std::vector<double>& values) {
    return torch::from_blob(values.data(), {targets}, torch::kFloat64)
        .to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
  };
  batch.input_ids = to_device(ids, {rows, longest});
  batch.lengths = to_device(lengths, {rows});
  if (!segment_ids.empty()) {
    batch.segment_ids = to_device(segment_ids, {rows, longest});
  }
  batch.target_index = to_device(index, {targets});
  batch.target_labels = to_device(labels, {targets});
  bool any_weights = false;
  bool any_rl = false;
  for (const MicroBatch::Range& range : batch.ranges) {
    any_weights |= LossFnTakesWeights(owners.losses[range.owner].fn);
    any_rl |= LossFnTakesSamplerInputs(owners.losses[range.owner].fn);
  }
  if (any_weights) batch.weights = to_dtype(weights);
  if (any_rl) {
    batch.sampler_logprobs = to_dtype(sampler_logprobs);
    batch.advantages = to_dtype(advantages);
  }
  return batch;
}

std::vector<LoraSegment> Segments(const std::vector<Piece>& pieces,
                                  const PassOwners& owners, bool training) {
  std::vector<LoraSegment> segments;
  for (const Piece& p : pieces) {
    LoraSegment segment;
    segment.weights = owners.adapters[p.owner];
    segment.rows = static_cast<int64_t>(p.rows.size());
    segment.training = training;
    segment.dropout_seed =
        owners.dropout_seeds.empty() ? 0 : owners.dropout_seeds[p.owner];
    for (const Row* row : p.rows) segment.row_ids.push_back(row->row_id);
    segments.push_back(std::move(segment));
  }
  return segments;
}

torch::Tensor Slice(const torch::Tensor& t, int64_t first, int64_t count) {
  return t.defined() ? t.narrow(0, first, count) : t;
}

// The LM-head LoRA term of one range of target tokens whose adapter adapts
// the LM head: low = scale · x Aᵀ [count, rank] at its targets, x the final
// hidden states as the delta gives them (dropped out in training). The
// loss chunks continue from `leaf`, a detached copy, as they continue from
// the detached hidden states; its gradient flows back through `low`.
struct LmHeadTerm {
  const LoraModule* module = nullptr;
  torch::Tensor low;
  torch::Tensor leaf;
};

std::vector<LmHeadTerm> LmHeadTerms(const MicroBatch& batch,
                                    const MultiLoraDelta& delta,
                                    const torch::Tensor& hidden,
                                    bool backward) {
  std::vector<LmHeadTerm> terms(batch.ranges.size());
  const int64_t longest = hidden.size(1);
  for (size_t i = 0; i < batch.ranges.size(); ++i) {
    const MicroBatch::Range& range = batch.ranges[i];
    const LoraModule* module = delta.LmHead(range.piece);
    if (module == nullptr) continue;
    const torch::Tensor x = delta.LmHeadInput(
        range.piece, hidden.narrow(0, range.first_row, range.rows));
    const torch::Tensor local =
        batch.target_index.narrow(0, range.first, range.count) -
        range.first_row * longest;
    const double scale = delta.segments()[range.piece].weights->scale();
    LmHeadTerm& term = terms[i];
    term.module = module;
    term.low = x.reshape({-1, x.size(-1)})
                   .index_select(0, local)
                   .matmul(module->a.t())
                   .mul(scale);
    term.leaf = term.low.detach();
    if (backward) term.leaf.requires_grad_(true);
  }
  return terms;
}

// `logits` [n, vocab] of target tokens start.. start + n - 1 plus the LM-head
// terms of the ranges that have one.
torch::Tensor WithLmHeadTerms(const torch::Tensor& logits, int64_t start,
                              const MicroBatch& batch,
                              const std::vector<LmHeadTerm>& terms) {
  const int64_t n = logits.size(0);
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < batch.ranges.size(); ++i) {
    const MicroBatch::Range& range = batch.ranges[i];
    const int64_t first = std::max(range.first, start);
    const int64_t last = std::min(range.first + range.count, start + n);
    if (first >= last) continue;
    torch::Tensor part = logits.narrow(0, first - start, last - first);
    if (terms[i].module != nullptr) {
      part = part + terms[i]
                        .leaf.narrow(0, first - range.first, last - first)
                        .matmul(terms[i].module->b.t())
                        .to(part.scalar_type());
    }
    parts.push_back(part);
  }
  return torch::cat(parts, 0);
}

// Consecutive targets of a chunk that take one loss.
struct LossSpan {
  const LossFnSpec* loss;
  int64_t first;
  int64_t count;
};

}  // namespace

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
    last->rows.push_back(&row);
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

torch::Tensor TokenLosses(const LossFnSpec& loss, const torch::Tensor& p,
                          const torch::Tensor& weights,
                          const torch::Tensor& sampler_logprobs,
                          const torch::Tensor& advantages) {
  switch (loss.fn) {
    case LossFn::kCrossEntropy:
      return -(weights * p);
    case LossFn::kImportanceSampling:
      return -((p - sampler_logprobs).exp() * advantages);
    case LossFn::kPpo: {
      const torch::Tensor ratio = (p - sampler_logprobs).exp();
      return -torch::min(
          ratio * advantages,
          ratio.clamp(loss.clip_low, loss.clip_high) * advantages);
    }
    case LossFn::kCispo: {
      const torch::Tensor clipped = (p - sampler_logprobs)
                                        .exp()
                                        .clamp(loss.clip_low, loss.clip_high)
                                        .detach();
      return -(clipped * advantages * p);
    }
    case LossFn::kDro: {
      const torch::Tensor gap = p - sampler_logprobs;
      return -(p * advantages - 0.5 * loss.beta * gap * gap);
    }
  }
  return p * 0;
}

absl::Status RunMicroBatch(const LlamaModel& model,
                           const std::vector<Piece>& pieces,
                           const PassOwners& owners, bool backward,
                           const MicroBatchOptions& options, PassSums& sums) {
  const MicroBatch batch = BuildMicroBatch(
      pieces, owners, /*pad_id=*/0, model.device(), model.logits_dtype());
  if (batch.ranges.empty()) return absl::OkStatus();  // No target tokens.
  // Lives until the backward pass below, which checkpointed layers rerun.
  MultiLoraDelta delta(Segments(pieces, owners, /*training=*/backward),
                       options.kernel);
  // Router statistics; lives as long as the delta.
  std::optional<ExpertTokenCounter> counter;
  if (model.config().moe.num_experts > 0) {
    std::vector<int64_t> row_owner;
    for (const Piece& p : pieces) {
      row_owner.insert(row_owner.end(), p.rows.size(),
                       static_cast<int64_t>(p.owner));
    }
    counter.emplace(model.config(), batch.lengths, batch.input_ids.size(1),
                    row_owner, static_cast<int64_t>(owners.adapters.size()));
    delta.set_routing_observer(&*counter);
  }
  ForwardOptions forward;
  forward.segment_ids = batch.segment_ids;
  if (backward) {
    forward.checkpoint_every = CheckpointEveryFor(
        options.checkpointing, model.config(), batch.input_ids.numel());
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      torch::Tensor hidden,
      model.ForwardHidden(batch.input_ids, batch.lengths, &delta, forward));
  torch::Tensor targets =
      hidden.reshape({-1, hidden.size(-1)}).index_select(0, batch.target_index);
  const std::vector<LmHeadTerm> heads =
      LmHeadTerms(batch, delta, hidden, backward);
  const bool any_head =
      std::any_of(heads.begin(), heads.end(),
                  [](const LmHeadTerm& t) { return t.module != nullptr; });
  const int64_t chunk = std::max<int64_t>(1, options.loss_chunk_tokens);
  std::vector<torch::Tensor> chunks = targets.detach().split(chunk, 0);
  std::vector<torch::Tensor> grads;
  std::vector<torch::Tensor> contributions;
  std::vector<torch::Tensor> logprobs;
  int64_t start = 0;
  for (torch::Tensor& part : chunks) {
    const int64_t n = part.size(0);
    if (backward) part.requires_grad_(true);
    torch::Tensor logits = model.Logits(part);
    if (any_head) logits = WithLmHeadTerms(logits, start, batch, heads);
    // log p of each target: minus its cross-entropy.
    torch::Tensor p = -torch::nn::functional::cross_entropy(
        logits, batch.target_labels.narrow(0, start, n),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(
            torch::kNone));
    // Each owner's targets in this chunk, through its own loss. The ranges
    // tile the targets in order; neighbours with the same loss form one span
    // (the losses are per token), and p is split into the spans: one op,
    // whose backward is one cat (a narrow's backward would fill a
    // chunk-sized zero tensor per owner).
    std::vector<LossSpan> spans;
    for (const MicroBatch::Range& range : batch.ranges) {
      const int64_t first = std::max(range.first, start);
      const int64_t last = std::min(range.first + range.count, start + n);
      if (first >= last) continue;
      const LossFnSpec& loss = owners.losses[range.owner];
      if (!spans.empty() && *spans.back().loss == loss) {
        spans.back().count += last - first;
      } else {
        spans.push_back({&loss, first, last - first});
      }
    }
    std::vector<int64_t> sizes;
    for (const LossSpan& span : spans) sizes.push_back(span.count);
    const std::vector<torch::Tensor> span_p = p.split_with_sizes(sizes, 0);
    std::vector<torch::Tensor> parts;
    for (size_t i = 0; i < spans.size(); ++i) {
      const LossSpan& span = spans[i];
      parts.push_back(TokenLosses(
          *span.loss, span_p[i], Slice(batch.weights, span.first, span.count),
          Slice(batch.sampler_logprobs, span.first, span.count),
          Slice(batch.advantages, span.first, span.count)));
    }
    torch::Tensor contribution =
        parts.size() == 1 ? parts.front() : torch::cat(parts, 0);
    if (backward) {
      contribution.sum().backward();
      grads.push_back(part.grad());
    }
    contributions.push_back(contribution.detach());
    if (sums.logprobs != nullptr) logprobs.push_back(p.detach());
    start += n;
  }
  if (backward) {
    std::vector<torch::Tensor> outputs = {targets};
    std::vector<torch::Tensor> output_grads = {
        torch::cat(grads, 0).to(targets.scalar_type())};
    for (const LmHeadTerm& term : heads) {
      if (term.module == nullptr) continue;
      outputs.push_back(term.low);
      output_grads.push_back(term.leaf.grad());
    }
    torch::autograd::backward(outputs, output_grads);
  }
  if (counter) counter->AddTo(sums.expert_tokens);
  auto values_of = [](const std::vector<torch::Tensor>& parts) {
    return torch::cat(parts, 0).to(torch::kCPU, torch::kFloat64).contiguous();
  };
  const torch::Tensor per_token = values_of(contributions);
  const double* values = per_token.data_ptr<double>();
  for (const MicroBatch::Range& range : batch.ranges) {
    for (int64_t i = range.first; i < range.first + range.count; ++i) {
      sums.losses[range.owner] += values[i];
    }
  }
  if (sums.logprobs != nullptr) {
    const torch::Tensor all = values_of(logprobs);
    const double* p = all.data_ptr<double>();
    for (const MicroBatch::Range& range : batch.ranges) {
      std::vector<double>& out = (*sums.logprobs)[range.owner];
      out.insert(out.end(), p + range.first, p + range.first + range.count);
    }
  }
  return absl::OkStatus();
}

}  // namespace loraplex
