#include "core/lora/multi_lora.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "core/common/split_mix.h"
#include "core/lora/dropout_mask.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {
MultiLoraDelta::MultiLoraDelta(std::vector<LoraSegment> segments)
    : segments_(std::move(segments)) {
  sizes_.reserve(segments_.size());
  for (const LoraSegment& s : segments_) sizes_.push_back(s.rows);
}

bool MultiLoraDelta::UsesDropout(const LoraSegment& segment) const {
  return segment.training && segment.weights != nullptr &&
         segment.weights->config().dropout > 0.0;
}

torch::Tensor MultiLoraDelta::Dropout(const LoraSegment& segment,
                                      const torch::Tensor& x, int layer,
                                      Projection projection) const {
  const double p = segment.weights->config().dropout;
  const int64_t seq = x.size(1);
  const int64_t width = x.size(2);
  TORCH_CHECK(static_cast<int64_t>(segment.row_ids.size()) == segment.rows,
              "a dropout segment needs a row id for each row");
  std::vector<uint64_t> row_seeds(segment.rows);
  for (int64_t i = 0; i < segment.rows; ++i) {
    row_seeds[i] =
        SplitMix64(SplitMix64(SplitMix64(segment.dropout_seed ^
                                         SplitMix64(segment.row_ids[i])) ^
                              static_cast<uint64_t>(layer)) ^
                   static_cast<uint64_t>(projection));
  }
  // Made on x's device, in fp32 whatever x's dtype, so the masks are the
  // same on every device and in fp64.
  const torch::Tensor mask =
      ScaledDropoutMask(row_seeds, seq, width, 1.0 - p, x.device());
  return x * mask.to(x.scalar_type());
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
  std::vector<std::vector<const LoraModule*>> modules(segments_.size());
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
