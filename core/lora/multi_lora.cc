#include "core/lora/multi_lora.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "core/common/split_mix.h"
#include "core/lora/dropout_mask.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {
MultiLoraDelta::MultiLoraDelta(std::vector<LoraSegment> segments,
                               LoraKernel kernel)
    : segments_(std::move(segments)), kernel_(kernel) {
  sizes_.reserve(segments_.size());
  for (const LoraSegment& s : segments_) sizes_.push_back(s.rows);
}

bool MultiLoraDelta::UsesDropout(const LoraSegment& segment) const {
  return segment.training && segment.weights != nullptr &&
         segment.weights->config().dropout > 0.0;
}

namespace {

// Appends the dropout seeds of `segment`'s rows for (layer, projection).
void AppendRowSeeds(const LoraSegment& segment, int layer,
                    Projection projection, std::vector<uint64_t>& seeds) {
  TORCH_CHECK(static_cast<int64_t>(segment.row_ids.size()) == segment.rows,
              "a dropout segment needs a row id for each row");
  for (int64_t i = 0; i < segment.rows; ++i) {
    seeds.push_back(
        SplitMix64(SplitMix64(SplitMix64(segment.dropout_seed ^
                                         SplitMix64(segment.row_ids[i])) ^
                              static_cast<uint64_t>(layer)) ^
                   static_cast<uint64_t>(projection)));
  }
}

// x [rows, seq, width] times the mask of `row_seeds` (one per row). Made on
// x's device, in fp32 whatever x's dtype, so the masks are the same on every
// device and in fp64.
torch::Tensor ApplyDropout(const torch::Tensor& x,
                           const std::vector<uint64_t>& row_seeds, double p) {
  const torch::Tensor mask =
      ScaledDropoutMask(row_seeds, x.size(1), x.size(2), 1.0 - p, x.device());
  return x * mask.to(x.scalar_type());
}

}  // namespace

torch::Tensor MultiLoraDelta::Dropout(const LoraSegment& segment,
                                      const torch::Tensor& x, int layer,
                                      Projection projection) const {
  std::vector<uint64_t> row_seeds;
  AppendRowSeeds(segment, layer, projection, row_seeds);
  return ApplyDropout(x, row_seeds, segment.weights->config().dropout);
}

void MultiLoraDelta::AddTo(int layer, const torch::Tensor& x,
                           const std::vector<Projection>& projections,
                           std::vector<torch::Tensor>& outputs) const {
  const size_t n = projections.size();
  int64_t rows = 0;
  for (int64_t size : sizes_) rows += size;
  TORCH_CHECK(rows == x.size(0), "the adapter segments cover ", rows,
              " rows but the batch has ", x.size(0));
  // modules[s][j]: segment s's module for projections[j], or nullptr.
  ModuleTable modules(segments_.size());
  std::vector<bool> adapted(n, false);
  bool any = false;
  for (size_t s = 0; s < segments_.size(); ++s) {
    modules[s].assign(n, nullptr);
    if (segments_[s].weights == nullptr) continue;
    for (size_t j = 0; j < n; ++j) {
      modules[s][j] = segments_[s].weights->Find(layer, projections[j]);
      if (modules[s][j] != nullptr) adapted[j] = any = true;
    }
  }
  if (!any) return;

  // LoRA math is in the adapters' dtype (fp32 whatever the base dtype, or
  // fp64 over an fp64 base).
  torch::ScalarType dtype = torch::kFloat32;
  for (const LoraSegment& segment : segments_) {
    if (segment.weights != nullptr) dtype = segment.weights->dtype();
  }
  if (kernel_ == LoraKernel::kPerSlot) {
    AddPerSlot(layer, x, projections, modules, adapted, dtype, outputs);
  } else {
    AddGrouped(layer, x, projections, modules, adapted, dtype, outputs);
  }
}

void MultiLoraDelta::AddPerSlot(int layer, const torch::Tensor& x,
                                const std::vector<Projection>& projections,
                                const ModuleTable& modules,
                                const std::vector<bool>& adapted,
                                torch::ScalarType dtype,
                                std::vector<torch::Tensor>& outputs) const {
  const size_t n = projections.size();
  std::vector<torch::Tensor> x_parts = x.to(dtype).split_with_sizes(sizes_, 0);
  std::vector<std::vector<torch::Tensor>> y_parts(n);
  for (size_t j = 0; j < n; ++j) {
    if (adapted[j]) y_parts[j] = outputs[j].split_with_sizes(sizes_, 0);
  }
  for (size_t s = 0; s < segments_.size(); ++s) {
    const LoraSegment& segment = segments_[s];
    std::vector<size_t> used;
    for (size_t j = 0; j < n; ++j) {
      if (modules[s][j] != nullptr) used.push_back(j);
    }
    if (used.empty() || segment.rows == 0) continue;
    const double scale = segment.weights->scale();
    std::vector<torch::Tensor> low(n);  // scale · x Aᵀ, per projection.
    if (UsesDropout(segment)) {
      for (size_t j : used) {
        low[j] = Dropout(segment, x_parts[s], layer, projections[j])
                     .matmul(modules[s][j]->a.t())
                     .mul(scale);
      }
    } else if (used.size() == 1) {
      low[used[0]] = x_parts[s].matmul(modules[s][used[0]]->a.t()).mul(scale);
    } else {
      std::vector<torch::Tensor> a_list;
      std::vector<int64_t> ranks;
      for (size_t j : used) {
        a_list.push_back(modules[s][j]->a);
        ranks.push_back(modules[s][j]->a.size(0));
      }
      std::vector<torch::Tensor> pieces = x_parts[s]
                                              .matmul(torch::cat(a_list, 0).t())
                                              .mul(scale)
                                              .split_with_sizes(ranks, -1);
      for (size_t k = 0; k < used.size(); ++k) low[used[k]] = pieces[k];
    }
    for (size_t j : used) {
      torch::Tensor delta = low[j].matmul(modules[s][j]->b.t());
      y_parts[j][s] = y_parts[j][s] + delta.to(y_parts[j][s].scalar_type());
    }
  }
  for (size_t j = 0; j < n; ++j) {
    if (adapted[j]) outputs[j] = torch::cat(y_parts[j], 0);
  }
}

namespace {

// What the segments of one bucket of the grouped kernel share.
struct BucketKey {
  int64_t rows = 0;
  double dropout = 0.0;        // 0 when the segment draws no dropout.
  std::vector<int64_t> ranks;  // Per projection; 0 where not targeted.

  bool operator<(const BucketKey& other) const {
    return std::tie(rows, dropout, ranks) <
           std::tie(other.rows, other.dropout, other.ranks);
  }
};

// The LoRA matrices of a bucket as one bmm operand. apply(matrices, count)
// takes `count` members' matrices, member-major (m0 p0, m0 p1, …, m1 p0, …),
// part p's matrix [rows_p, cols] in every member. It returns
// [count, cols, R], R = Σ rows_p: per member, its parts joined by rows and
// transposed. Forward is one cat, and the result a view of it.
//
// Why not stack, cat and transpose: through those, each matrix's gradient
// arrives transposed, and AccumulateGrad copies it into the parameter's
// layout: one kernel per LoRA matrix and step (5,376 for 16 slots of a
// 24-layer model with all seven targets). Here backward transposes the
// operand's gradient back into one contiguous [count, R, cols] tensor (a
// single kernel) and hands each matrix a contiguous view of its rows, which
// has its parameter's layout, so autograd keeps it as the .grad as it is.
class JoinTransposedFunction
    : public torch::autograd::Function<JoinTransposedFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               torch::TensorList matrices, int64_t count) {
    const size_t parts = matrices.size() / static_cast<size_t>(count);
    std::vector<int64_t> rows;
    int64_t total = 0;
    for (size_t p = 0; p < parts; ++p) {
      rows.push_back(matrices[p].size(0));
      total += rows.back();
    }
    ctx->saved_data["count"] = count;
    ctx->saved_data["rows"] = rows;
    return torch::cat(matrices, 0)
        .view({count, total, matrices[0].size(1)})
        .transpose(1, 2);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const int64_t count = ctx->saved_data["count"].toInt();
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    // [count, Σ rows, cols], contiguous: each matrix's rows are then a
    // contiguous block in its own layout.
    const torch::Tensor joined = grads[0].transpose(1, 2).contiguous();
    torch::autograd::variable_list out;
    for (int64_t k = 0; k < count; ++k) {
      const torch::Tensor member = joined.select(0, k);
      int64_t offset = 0;
      for (int64_t part_rows : rows) {
        out.push_back(member.narrow(0, offset, part_rows));
        offset += part_rows;
      }
    }
    out.emplace_back();  // count
    return out;
  }
};

// [count, cols, Σ rows_p] from the member-major matrices of `count` members,
// as JoinTransposedFunction; a view when there is a single matrix.
torch::Tensor JoinTransposed(const std::vector<torch::Tensor>& matrices,
                             int64_t count) {
  if (matrices.size() == 1) return matrices.front().t().unsqueeze(0);
  // As a TensorList: autograd tracks the tensors of a list argument, not of
  // a std::vector.
  return JoinTransposedFunction::apply(torch::TensorList(matrices), count);
}

}  // namespace

void MultiLoraDelta::AddGrouped(int layer, const torch::Tensor& x,
                                const std::vector<Projection>& projections,
                                const ModuleTable& modules,
                                const std::vector<bool>& adapted,
                                torch::ScalarType dtype,
                                std::vector<torch::Tensor>& outputs) const {
  const size_t n = projections.size();
  std::map<BucketKey, std::vector<size_t>> buckets;
  for (size_t s = 0; s < segments_.size(); ++s) {
    const LoraSegment& segment = segments_[s];
    if (segment.weights == nullptr || segment.rows == 0) continue;
    BucketKey key;
    key.rows = segment.rows;
    key.dropout = UsesDropout(segment) ? segment.weights->config().dropout : 0;
    bool targeted = false;
    for (size_t j = 0; j < n; ++j) {
      key.ranks.push_back(modules[s][j] == nullptr ? 0
                                                   : modules[s][j]->a.size(0));
      targeted = targeted || modules[s][j] != nullptr;
    }
    if (targeted) buckets[std::move(key)].push_back(s);
  }

  const int64_t seq = x.size(1);
  const int64_t in = x.size(2);
  const torch::Tensor wide = x.to(dtype);
  std::vector<torch::Tensor> x_parts;  // Split only when a bucket needs it.
  // pieces[j][s]: segment s's term for projections[j], [rows, seq, out].
  std::vector<std::vector<torch::Tensor>> pieces(
      n, std::vector<torch::Tensor>(segments_.size()));
  std::vector<bool> done(n, false);  // outputs[j] has its terms already.
  for (const auto& bucket : buckets) {
    // Named references, not a structured binding: lambdas below capture
    // them, which C++17 allows only for variables.
    const BucketKey& key = bucket.first;
    const std::vector<size_t>& members = bucket.second;
    const int64_t count = static_cast<int64_t>(members.size());
    const int64_t tokens = key.rows * seq;
    std::vector<size_t> used;
    for (size_t j = 0; j < n; ++j) {
      if (key.ranks[j] > 0) used.push_back(j);
    }
    std::vector<double> scales;
    for (size_t s : members) scales.push_back(segments_[s].weights->scale());
    // The common case: one bucket holds every row of the batch, in order
    // (members ascend, so its rows are all of x's exactly when they add up
    // to them). x is then its input as it is, and its terms add to whole
    // outputs: no split, cat or their backward copies.
    const bool whole = count * key.rows == x.size(0);
    // [count · rows, seq, in], the bucket's rows in member order.
    torch::Tensor bucket_x = wide;
    if (!whole) {
      if (x_parts.empty()) x_parts = wide.split_with_sizes(sizes_, 0);
      std::vector<torch::Tensor> inputs;
      for (size_t s : members) inputs.push_back(x_parts[s]);
      bucket_x = count == 1 ? inputs.front() : torch::cat(inputs, 0);
    }
    const bool one_scale =
        std::all_of(scales.begin(), scales.end(),
                    [&](double scale) { return scale == scales.front(); });
    auto scaled = [&](const torch::Tensor& low) {
      if (one_scale) return low.mul(scales.front());
      return low.mul(torch::tensor(scales, low.options()).view({count, 1, 1}));
    };
    // [count, in, Σ ranks]: each member's A matrices of `projs`, joined
    // and transposed (one cat, whatever the number of members).
    auto a_t = [&](const std::vector<size_t>& projs) {
      std::vector<torch::Tensor> matrices;
      for (size_t s : members) {
        for (size_t j : projs) matrices.push_back(modules[s][j]->a);
      }
      return JoinTransposed(matrices, count);
    };
    std::vector<torch::Tensor> low(n);  // scale · x Aᵀ, [count, tokens, r].
    if (key.dropout > 0) {
      for (size_t j : used) {
        std::vector<uint64_t> seeds;
        for (size_t s : members) {
          AppendRowSeeds(segments_[s], layer, projections[j], seeds);
        }
        const torch::Tensor dropped = ApplyDropout(bucket_x, seeds, key.dropout)
                                          .reshape({count, tokens, in});
        low[j] = scaled(at::bmm(dropped, a_t({j})));
      }
    } else {
      // Projections that share this input read it once. Split, not
      // narrowed: backward then joins the pieces' gradients with one cat,
      // where each narrow's backward fills a full-size zero tensor.
      const torch::Tensor all =
          scaled(at::bmm(bucket_x.reshape({count, tokens, in}), a_t(used)));
      std::vector<int64_t> ranks;
      for (size_t j : used) ranks.push_back(key.ranks[j]);
      const std::vector<torch::Tensor> parts = all.split_with_sizes(ranks, 2);
      for (size_t k = 0; k < used.size(); ++k) low[used[k]] = parts[k];
    }
    for (size_t j : used) {
      std::vector<torch::Tensor> b_list;
      for (size_t s : members) b_list.push_back(modules[s][j]->b);
      const torch::Tensor b_t = JoinTransposed(b_list, count);
      if (whole) {
        torch::Tensor& out = outputs[j];
        out =
            out + at::bmm(low[j], b_t).view(out.sizes()).to(out.scalar_type());
        done[j] = true;
        continue;
      }
      const torch::Tensor delta =
          at::bmm(low[j], b_t).reshape({count * key.rows, seq, -1});
      if (count == 1) {
        pieces[j][members.front()] = delta;
        continue;
      }
      std::vector<torch::Tensor> split = delta.split(key.rows, 0);
      for (int64_t k = 0; k < count; ++k) pieces[j][members[k]] = split[k];
    }
  }

  for (size_t j = 0; j < n; ++j) {
    if (!adapted[j] || done[j]) continue;
    const torch::ScalarType out_dtype = outputs[j].scalar_type();
    bool every_row = true;
    for (size_t s = 0; s < segments_.size(); ++s) {
      if (!pieces[j][s].defined() && segments_[s].rows > 0) every_row = false;
    }
    if (every_row) {
      // One addition over all rows (rows-0 segments add nothing).
      std::vector<torch::Tensor> terms;
      for (const torch::Tensor& piece : pieces[j]) {
        if (piece.defined()) terms.push_back(piece);
      }
      const torch::Tensor term =
          terms.size() == 1 ? terms.front() : torch::cat(terms, 0);
      outputs[j] = outputs[j] + term.to(out_dtype);
      continue;
    }
    std::vector<torch::Tensor> y_parts = outputs[j].split_with_sizes(sizes_, 0);
    for (size_t s = 0; s < segments_.size(); ++s) {
      if (pieces[j][s].defined()) {
        y_parts[s] = y_parts[s] + pieces[j][s].to(out_dtype);
      }
    }
    outputs[j] = torch::cat(y_parts, 0);
  }
}

const LoraModule* MultiLoraDelta::LmHead(size_t s) const {
  const LoraWeights* weights = segments_[s].weights;
  return weights == nullptr ? nullptr : weights->lm_head();
}

torch::Tensor MultiLoraDelta::LmHeadInput(size_t s,
                                          const torch::Tensor& x) const {
  const LoraSegment& segment = segments_[s];
  torch::Tensor wide = x.to(segment.weights->dtype());
  if (!UsesDropout(segment)) return wide;
  return Dropout(segment, wide, kLmHeadLayer, Projection::kLmHead);
}

torch::Tensor MultiLoraDelta::AddToLogits(const torch::Tensor& hidden,
                                          const torch::Tensor& logits,
                                          int64_t first_row) const {
  const int64_t rows = hidden.size(0);
  std::vector<torch::Tensor> parts;
  bool any = false;
  int64_t segment_first = 0;
  for (size_t s = 0; s < segments_.size(); ++s) {
    const LoraSegment& segment = segments_[s];
    const int64_t first = std::max(segment_first, first_row);
    const int64_t last =
        std::min(segment_first + segment.rows, first_row + rows);
    segment_first += segment.rows;
    if (first >= last) continue;
    torch::Tensor part = logits.narrow(0, first - first_row, last - first);
    if (const LoraModule* module = LmHead(s)) {
      torch::Tensor x = hidden.narrow(0, first - first_row, last - first);
      // Dropout masks are drawn per row over its positions.
      TORCH_CHECK(!UsesDropout(segment) ||
                      (x.dim() == 3 && last - first == segment.rows),
                  "LM-head dropout needs a segment's whole rows");
      const double scale = segment.weights->scale();
      torch::Tensor delta = LmHeadInput(s, x)
                                .matmul(module->a.t())
                                .mul(scale)
                                .matmul(module->b.t());
      part = part + delta.to(part.scalar_type());
      any = true;
    }
    parts.push_back(part);
  }
  TORCH_CHECK(segment_first >= first_row + rows, "the adapter segments cover ",
              segment_first, " rows but the logits reach row ",
              first_row + rows);
  return any ? torch::cat(parts, 0) : logits;
}

}  // namespace loraplex
