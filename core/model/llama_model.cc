#include "core/model/llama_model.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/model/experts.h"
#include "core/model/layer_checkpoint.h"
#include "core/runtime/float_dtype.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {
namespace {

torch::Tensor Linear(const torch::Tensor& x, const LinearWeights& linear) {
  return torch::nn::functional::linear(x, linear.weight, linear.bias);
}

absl::Status TorchError(const c10::Error& e) {
  return absl::InternalError(
      absl::StrCat("model forward failed: ", e.what_without_backtrace()));
}

// Packed rows (ForwardOptions::segment_ids [B, T], lengths [B]): each
// token's position, its distance from the first token of its example, and
// its extent, the length of that example, by which LongRoPE picks its
// factors. Padding after a row's length counts as an example of its own.
std::pair<torch::Tensor, torch::Tensor> PackedPositions(
    const torch::Tensor& segments, const torch::Tensor& lengths) {
  const int64_t seq = segments.size(1);
  const torch::Tensor index =
      torch::arange(seq, segments.options()).expand_as(segments);
  // Whether an example ends after each token.
  torch::Tensor ends = torch::ones_like(segments, torch::kBool);
  ends.narrow(1, 0, seq - 1)
      .copy_(segments.narrow(1, 1, seq - 1) != segments.narrow(1, 0, seq - 1));
  ends = ends | (index == lengths.view({-1, 1}) - 1);
  torch::Tensor starts = torch::ones_like(ends);
  starts.narrow(1, 1, seq - 1).copy_(ends.narrow(1, 0, seq - 1));
  const torch::Tensor first = std::get<0>(
      torch::where(starts, index, torch::zeros_like(index)).cummax(1));
  const torch::Tensor last =
      std::get<0>(torch::where(ends, index, torch::full_like(index, seq))
                      .flip(1)
                      .cummin(1))
          .flip(1);
  return {index - first, last - first + 1};
}

// softmax over [q kᵀ · scale + mask, sink] per query, the sink column
// dropped, times v (transformers' gpt-oss eager attention): a learned logit
// per head (`sinks` [heads]) that takes a share of every query's weight and
// adds no value. SDPA has no such column, so this runs unfused, the softmax
// in fp32 (fp64 for fp64). q, k, v [B, H, Tq|Tk, D] with k and v repeated
// to H heads; `mask` as ScaledDotProductAttention's, undefined for causal
// (query i sees keys up to i + Tk - Tq).
torch::Tensor AttentionWithSinks(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v,
                                 const torch::Tensor& mask,
                                 const torch::Tensor& sinks,
                                 std::optional<double> scale) {
  const torch::ScalarType wide_type = Fp32OrFp64(q.scalar_type());
  const double logit_scale =
      scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  torch::Tensor logits =
      (torch::matmul(q, k.transpose(2, 3)) * logit_scale).to(wide_type);
  const int64_t queries = q.size(2);
  const int64_t keys = k.size(2);
  if (mask.defined()) {
    logits = logits + mask.to(wide_type);
  } else {
    auto index_options =
        torch::TensorOptions().dtype(torch::kInt64).device(q.device());
    torch::Tensor hidden =
        torch::arange(keys, index_options).view({1, keys}) >
        torch::arange(keys - queries, keys, index_options).view({queries, 1});
    logits =
        logits.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  }
  torch::Tensor sink_column = sinks.to(wide_type)
                                  .view({1, -1, 1, 1})
                                  .expand({q.size(0), -1, queries, 1});
  torch::Tensor combined = torch::cat({logits, sink_column}, -1);
  combined = combined - std::get<0>(combined.max(-1, /*keepdim=*/true));
  torch::Tensor probs = torch::softmax(combined, -1).narrow(-1, 0, keys);
  return torch::matmul(probs.to(v.scalar_type()), v);
}

}  // namespace

KvCache::KvCache(const ModelConfig& config, int64_t rows, int64_t capacity,
                 torch::ScalarType dtype, torch::Device device) {
  auto options = torch::TensorOptions().dtype(dtype).device(device);
  const std::vector<int64_t> shape = {rows, config.num_key_value_heads,
                                      capacity, config.head_dim};
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    keys_.push_back(torch::zeros(shape, options));
    values_.push_back(torch::zeros(shape, options));
  }
  auto index_options =
      torch::TensorOptions().dtype(torch::kInt64).device(device);
  positions_ = torch::full({rows, capacity}, -1, index_options);
  next_positions_ = torch::zeros({rows}, index_options);
}

void KvCache::KeepRows(const std::vector<int64_t>& rows) {
  torch::Tensor index =
      torch::tensor(rows, torch::TensorOptions().dtype(torch::kInt64))
          .to(positions_.device());
  for (torch::Tensor& t : keys_) t = t.index_select(0, index);
  for (torch::Tensor& t : values_) t = t.index_select(0, index);
  positions_ = positions_.index_select(0, index);
  next_positions_ = next_positions_.index_select(0, index);
}

void KvCache::Reserve(int64_t count) {
  const int64_t capacity = positions_.size(1);
  if (columns_ + count <= capacity) return;
  const int64_t grown = std::max(columns_ + count, 2 * capacity);
  auto grow = [&](torch::Tensor& t, int64_t dim, double fill) {
    std::vector<int64_t> shape = t.sizes().vec();
    shape[dim] = grown - capacity;
    t = torch::cat({t, torch::full(shape, fill, t.options())}, dim);
  };
  for (torch::Tensor& t : keys_) grow(t, 2, 0.0);
  for (torch::Tensor& t : values_) grow(t, 2, 0.0);
  grow(positions_, 1, -1.0);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(
    const std::string& dir, const ModelLoadOptions& options) {
  LORAPLEX_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  torch::ScalarType dtype = options.dtype.value_or(
      config.dtype == StoredDtype::kFloat16 ? torch::kFloat32
                                            : TorchScalarType(config.dtype));
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 &&
      dtype != torch::kFloat64) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute dtype must be float32, bfloat16 or float64, got ",
                     c10::toString(dtype)));
  }
  try {
    if (options.shard_base.has_value()) {
      LORAPLEX_ASSIGN_OR_RETURN(
          ShardedModelWeights sharded,
          LoadShardedModelWeights(dir, config, dtype, options.device,
                                  *options.shard_base));
      return std::make_unique<LlamaModel>(
          std::move(config), std::move(sharded.replicated), dtype,
          options.device, std::move(sharded.sharded));
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        ModelWeights weights,
        LoadModelWeights(dir, config, dtype, options.device));
    return std::make_unique<LlamaModel>(std::move(config), std::move(weights),
                                        dtype, options.device);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(dir, ": cannot place weights on ",
                                            options.device.str(), ": ",
                                            e.what_without_backtrace()));
  }
}

LlamaModel::LlamaModel(ModelConfig config, ModelWeights weights,
                       torch::ScalarType dtype, torch::Device device,
                       std::unique_ptr<ShardedBase> sharded)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      dtype_(dtype),
      device_(device),
      rotary_(config_.rope, config_.head_dim),
      sliding_rotary_(config_.sliding_rope.value_or(config_.rope),
                      config_.head_dim),
      sharded_(std::move(sharded)) {}

int64_t LlamaModel::FrozenWeightBytes() const {
  int64_t bytes = StorageBytes(weights_);
  if (sharded_ != nullptr) {
    bytes += sharded_->ShardBytes() + sharded_->BufferBytes();
  }
  return bytes;
}

const LayerWeights& LlamaModel::LayerAt(int layer) const {
  return sharded_ != nullptr ? sharded_->Gathered(layer)
                             : weights_.layers[layer];
}

absl::Status LlamaModel::CheckShardedForward() const {
  if (sharded_ == nullptr || sharded_->CanForward()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the base is sharded over ", sharded_->world_size(),
      " ranks: a forward needs every rank at once (a data-parallel training "
      "step, or rank 0's forwards while the others serve its gathers)"));
}

bool LlamaModel::HasSlidingLayers() const {
  for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer) {
    if (LayerIsSliding(config_, layer)) return true;
  }
  return false;
}

absl::Status LlamaModel::CheckTokenIds(const torch::Tensor& input_ids) const {
  const int64_t min_id = input_ids.min().item<int64_t>();
  const int64_t max_id = input_ids.max().item<int64_t>();
  if (min_id < 0 || max_id >= config_.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ids must lie in [0, ", config_.vocab_size,
                     "), got [", min_id, ", ", max_id, "]"));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::ValidateBatch(const torch::Tensor& input_ids,
                                       const torch::Tensor& lengths) const {
  if (!input_ids.defined() || input_ids.dim() != 2 ||
      input_ids.scalar_type() != torch::kInt64 || input_ids.numel() == 0) {
    return absl::InvalidArgumentError(
        "input_ids must be a non-empty int64 tensor of shape [batch, seq]");
  }
  const int64_t batch = input_ids.size(0);
  const int64_t seq = input_ids.size(1);
  if (!lengths.defined() || lengths.dim() != 1 || lengths.size(0) != batch ||
      lengths.scalar_type() != torch::kInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat("lengths must be an int64 tensor of shape [", batch, "]"));
  }
  const int64_t min_len = lengths.min().item<int64_t>();
  const int64_t max_len = lengths.max().item<int64_t>();
  if (min_len < 1 || max_len > seq) {
    return absl::InvalidArgumentError(absl::StrCat("lengths must lie in [1, ",
                                                   seq, "], got [", min_len,
                                                   ", ", max_len, "]"));
  }
  LORAPLEX_RETURN_IF_ERROR(CheckTokenIds(input_ids));
  if (seq > config_.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence length ", seq, " exceeds max_position_embeddings ",
        config_.max_position_embeddings));
  }
  return absl::OkStatus();
}

torch::Tensor LlamaModel::AttentionMask(
    const torch::Tensor& lengths, int64_t seq_len,
    std::optional<int64_t> window, const torch::Tensor& segment_ids) const {
  const bool plain_causal =
      !segment_ids.defined() && (!window.has_value() || seq_len <= *window);
  const bool flash_eligible =
      device_.is_cuda() &&
      (dtype_ == torch::kBFloat16 || dtype_ == torch::kHalf);
  // A long row on the CPU: the mask alone would take seq_len² elements (4
  // GiB in fp32 for 32k tokens) and the unfused kernel as many per head.
  const bool long_unpadded_cpu_rows = !device_.is_cuda() &&
                                      seq_len >= kCpuCausalKernelTokens &&
                                      lengths.min().item<int64_t>() == seq_len;
  if (plain_causal && (flash_eligible || long_unpadded_cpu_rows)) {
    // Causal attention without a mask, so the GPU's flash kernel can run.
    // Rows are right-padded: a valid query sees only earlier keys, all
    // valid, so its result is the masked one; padding queries see earlier
    // tokens (never nothing), and their results are ignored. On the CPU
    // only for long rows without padding: there LibTorch's causal kernel
    // (2.15) returns 0, not NaN, for a NaN query in rows shorter than 16
    // tokens, which would hide a broken adapter's NaN loss.
    return {};
  }
  auto index_options =
      torch::TensorOptions().dtype(torch::kInt64).device(device_);
  torch::Tensor positions = torch::arange(seq_len, index_options);
  torch::Tensor query = positions.view({seq_len, 1});
  torch::Tensor key = positions.view({1, seq_len});
  torch::Tensor visible = key <= query;
  if (window.has_value()) visible = visible & (query - key < *window);
  visible = visible.unsqueeze(0);  // [1, T, T]
  if (segment_ids.defined()) {
    // Packed examples: each query sees keys of its own example only.
    const torch::Tensor segments = segment_ids.to(device_);
    visible = visible & (segments.unsqueeze(2) == segments.unsqueeze(1));
  }
  // Keys past a row's length are padding and hidden from every query.
  // A padding query sees only itself: with a sliding window it could
  // otherwise see nothing, and the NaN of an empty softmax would reach valid
  // positions through the next layer (0 * NaN is NaN).
  torch::Tensor valid =
      positions.view({1, seq_len}) <
      lengths.to(device_).view({lengths.size(0), 1});    // [B, T]
  torch::Tensor diagonal = (key == query).unsqueeze(0);  // [1, T, T]
  visible = (visible & valid.unsqueeze(1)) |
            (diagonal & valid.logical_not().unsqueeze(2));  // [B, T, T]
  return AdditiveMask(visible);
}

torch::Tensor LlamaModel::RmsNorm(const torch::Tensor& x,
                                  const torch::Tensor& weight) const {
  const torch::ScalarType wide_type = Fp32OrFp64(x.scalar_type());
  torch::Tensor wide = x.to(wide_type);
  torch::Tensor variance = wide.pow(2).mean(-1, /*keepdim=*/true);
  wide = wide * torch::rsqrt(variance + config_.rms_norm_eps);
  switch (config_.norm_style) {
    case NormStyle::kCastThenScale:
      break;
    case NormStyle::kScaleThenCast:
      return (weight.to(wide_type) * wide).to(x.scalar_type());
    case NormStyle::kOnePlusWeight:
      return (wide * (weight.to(wide_type) + 1.0)).to(x.scalar_type());
  }
  return weight * wide.to(x.scalar_type());
}

std::vector<torch::Tensor> LlamaModel::Project(
    int layer, const torch::Tensor& x,
    const std::vector<Projection>& projections,
    const ProjectionDelta* delta) const {
  const LayerWeights& weights = LayerAt(layer);
  std::vector<torch::Tensor> outputs;
  outputs.reserve(projections.size());
  for (Projection p : projections) {
    outputs.push_back(Linear(x, weights.at(p)));
  }
  if (delta != nullptr) delta->AddTo(layer, x, projections, outputs);
  return outputs;
}

torch::Tensor LlamaModel::AdditiveMask(const torch::Tensor& visible) const {
  return torch::zeros(visible.sizes(),
                      torch::TensorOptions().dtype(dtype_).device(device_))
      .masked_fill(visible.logical_not(),
                   -std::numeric_limits<float>::infinity())
      .unsqueeze(1);
}

torch::Tensor LlamaModel::CachedAttentionMask(
    const KvCache& cache, const torch::Tensor& positions,
    std::optional<int64_t> window) const {
  const int64_t seq = positions.size(1);
  const int64_t columns = cache.columns_;
  torch::Tensor key = cache.positions_.narrow(1, 0, columns).unsqueeze(1);
  torch::Tensor query = positions.unsqueeze(2);  // [rows, seq, 1]
  torch::Tensor visible = (key >= 0) & (key <= query);
  if (window.has_value()) visible = visible & (query - key < *window);
  // A padding query sees only its own column, so its softmax is never empty
  // (see AttentionMask).
  auto index_options =
      torch::TensorOptions().dtype(torch::kInt64).device(device_);
  torch::Tensor own_column =
      torch::arange(columns, index_options).view({1, 1, columns}) ==
      torch::arange(columns - seq, columns, index_options).view({1, seq, 1});
  visible = visible | (own_column & (query < 0));
  return AdditiveMask(visible);
}

torch::Tensor LlamaModel::Attention(int layer, const torch::Tensor& x,
                                    const RopeTables& rope,
                                    const torch::Tensor& mask,
                                    const ProjectionDelta* delta,
                                    KvCache* cache) const {
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  const int64_t head_dim = config_.head_dim;
  auto heads = [&](const torch::Tensor& t, int64_t count) {
    return t.view({batch, seq, count, head_dim}).transpose(1, 2);
  };
  static const std::vector<Projection> kQkv = {Projection::kQ, Projection::kK,
                                               Projection::kV};
  static const std::vector<Projection> kFusedQkv = {Projection::kQkv};
  static const std::vector<Projection> kOut = {Projection::kO};
  std::vector<torch::Tensor> qkv;
  if (config_.fused_projections) {
    // One matrix: q, k and v side by side in its output.
    const int64_t kv_width = config_.num_key_value_heads * head_dim;
    qkv = Project(layer, x, kFusedQkv, delta)[0].split_with_sizes(
        {config_.num_attention_heads * head_dim, kv_width, kv_width}, -1);
  } else {
    qkv = Project(layer, x, kQkv, delta);
  }
  const LayerWeights& weights = LayerAt(layer);
  torch::Tensor q, k;
  switch (config_.qk_norm) {
    case QkNorm::kNone:
      q = heads(qkv[0], config_.num_attention_heads);
      k = heads(qkv[1], config_.num_key_value_heads);
      break;
    case QkNorm::kPerHead:  // Over each head's head_dim values.
      q = RmsNorm(qkv[0].view({batch, seq, -1, head_dim}), weights.q_norm)
              .transpose(1, 2);
      k = RmsNorm(qkv[1].view({batch, seq, -1, head_dim}), weights.k_norm)
              .transpose(1, 2);
      break;
    case QkNorm::kWholeProjection:
      q = heads(RmsNorm(qkv[0], weights.q_norm), config_.num_attention_heads);
      k = heads(RmsNorm(qkv[1], weights.k_norm), config_.num_key_value_heads);
      break;
  }
  torch::Tensor v = heads(qkv[2], config_.num_key_value_heads);
  q = RotaryEmbedding::Apply(q, rope);
  k = RotaryEmbedding::Apply(k, rope);
  if (cache != nullptr) {
    const int64_t first = cache->columns_ - seq;
    cache->keys_[layer].narrow(2, first, seq).copy_(k);
    cache->values_[layer].narrow(2, first, seq).copy_(v);
    k = cache->keys_[layer].narrow(2, 0, cache->columns_);
    v = cache->values_[layer].narrow(2, 0, cache->columns_);
  }
  const int64_t groups =
      config_.num_attention_heads / config_.num_key_value_heads;
  if (groups > 1) {
    k = k.repeat_interleave(groups, /*dim=*/1);
    v = v.repeat_interleave(groups, /*dim=*/1);
  }
  torch::Tensor attended =
      weights.sinks.defined()
          ? AttentionWithSinks(q, k, v, mask, weights.sinks,
                               config_.attention_scale)
          : ScaledDotProductAttention(q, k, v, mask, config_.attention_scale);
  attended = attended.transpose(1, 2).reshape(
      {batch, seq, config_.num_attention_heads * head_dim});
  return Project(layer, attended, kOut, delta)[0];
}

torch::Tensor LlamaModel::Mlp(int layer, const torch::Tensor& x,
                              const ProjectionDelta* delta) const {
  if (LayerIsSparse(config_, layer)) {
    const LayerWeights& weights = LayerAt(layer);
    torch::Tensor tokens = x.reshape({-1, x.size(-1)});
    torch::Tensor rows =
        torch::arange(
            x.size(0),
            torch::TensorOptions().dtype(torch::kInt64).device(x.device()))
            .repeat_interleave(x.size(1));
    ExpertRouting routing = RouteTokens(config_, weights.router, tokens);
    return RunExperts(config_, layer, weights, tokens, routing, rows, delta)
        .view(x.sizes());
  }
  static const std::vector<Projection> kGateUp = {Projection::kGate,
                                                  Projection::kUp};
  static const std::vector<Projection> kFusedGateUp = {Projection::kGateUp};
  static const std::vector<Projection> kDown = {Projection::kDown};
  // A fused matrix holds gate, then up.
  std::vector<torch::Tensor> gate_up =
      config_.fused_projections
          ? Project(layer, x, kFusedGateUp, delta)[0].chunk(2, -1)
          : Project(layer, x, kGateUp, delta);
  torch::Tensor gate = config_.activation == MlpActivation::kGeluTanh
                           ? torch::gelu(gate_up[0], "tanh")
                           : torch::silu(gate_up[0]);
  return Project(layer, gate * gate_up[1], kDown, delta)[0];
}

torch::Tensor LlamaModel::HiddenStates(const torch::Tensor& input_ids,
                                       const torch::Tensor& lengths,
                                       const ProjectionDelta* delta,
                                       const ForwardOptions& options) const {
  const int64_t seq = input_ids.size(1);
  const torch::Tensor& segments = options.segment_ids;
  torch::Tensor positions;
  torch::Tensor extents;
  if (segments.defined()) {
    std::tie(positions, extents) =
        PackedPositions(segments.to(device_), lengths.to(device_));
  }
  auto tables = [&](const RotaryEmbedding& rotary) {
    return positions.defined()
               ? rotary.TablesAt(positions, dtype_, device_, extents)
               : rotary.Tables(lengths, seq, dtype_, device_);
  };
  LayerInputs inputs;
  inputs.rope = tables(rotary_);
  inputs.mask = AttentionMask(lengths, seq, std::nullopt, segments);
  if (HasSlidingLayers()) {
    inputs.sliding_rope = config_.sliding_rope.has_value()
                              ? tables(sliding_rotary_)
                              : inputs.rope;
    inputs.sliding_mask =
        AttentionMask(lengths, seq, config_.sliding_window, segments);
  }
  return Decoder(input_ids, inputs, delta, nullptr, options.checkpoint_every);
}

torch::Tensor LlamaModel::Layer(int layer, const torch::Tensor& x,
                                const LayerInputs& inputs,
                                const ProjectionDelta* delta,
                                KvCache* cache) const {
  const NormPlacement placement = config_.norm_placement;
  const LayerWeights& weights = LayerAt(layer);
  const bool sliding = LayerIsSliding(config_, layer);
  torch::Tensor h = placement == NormPlacement::kPostNorm
                        ? x
                        : RmsNorm(x, weights.input_norm);
  h = Attention(layer, h, sliding ? inputs.sliding_rope : inputs.rope,
                sliding ? inputs.sliding_mask : inputs.mask, delta, cache);
  if (placement != NormPlacement::kPreNorm) {
    h = RmsNorm(h, weights.post_attention_norm);
  }
  torch::Tensor out = x + h;
  switch (placement) {
    case NormPlacement::kPreNorm:
      h = RmsNorm(out, weights.post_attention_norm);
      break;
    case NormPlacement::kPostNorm:
      h = out;
      break;
    case NormPlacement::kSandwich:
      h = RmsNorm(out, weights.pre_feedforward_norm);
      break;
  }
  h = Mlp(layer, h, delta);
  if (placement != NormPlacement::kPreNorm) {
    h = RmsNorm(h, weights.post_feedforward_norm);
  }
  return out + h;
}

torch::Tensor LlamaModel::Decoder(const torch::Tensor& input_ids,
                                  const LayerInputs& inputs,
                                  const ProjectionDelta* delta, KvCache* cache,
                                  int64_t checkpoint_every) const {
  torch::Tensor x =
      torch::embedding(weights_.embed_tokens, input_ids.to(device_));
  if (config_.scale_embeddings) {
    // sqrt(hidden) rounded to the weights' dtype first, as transformers
    // scales Gemma's embeddings.
    x = x * torch::scalar_tensor(
                std::sqrt(static_cast<double>(config_.hidden_size)),
                torch::kFloat32)
                .to(x.scalar_type());
  }
  for (int layer = 0; layer < static_cast<int>(weights_.layers.size());
       ++layer) {
    if (sharded_ != nullptr && cache != nullptr) {
      sharded_->Gather(layer);  // Decoding: no backward pass.
      x = Layer(layer, x, inputs, delta, cache);
    } else if (sharded_ != nullptr) {
      // Gathered before its forward and again before its recomputation in
      // the backward pass.
      x = CheckpointedLayer(
          [this, layer, inputs, delta](const torch::Tensor& in) {
            sharded_->Gather(layer);
            return Layer(layer, in, inputs, delta, nullptr);
          },
          x);
    } else if (cache == nullptr && checkpoint_every > 0 &&
               layer % checkpoint_every == 0) {
      // The closure holds its own copy of the tables and masks: the
      // recomputation runs after this pass has returned.
      x = CheckpointedLayer(
          [this, layer, inputs, delta](const torch::Tensor& in) {
            return Layer(layer, in, inputs, delta, nullptr);
          },
          x);
    } else {
      x = Layer(layer, x, inputs, delta, cache);
    }
  }
  return RmsNorm(x, weights_.final_norm);
}

absl::StatusOr<torch::Tensor> LlamaModel::ForwardHidden(
    const torch::Tensor& input_ids, const torch::Tensor& lengths,
    const ProjectionDelta* delta, const ForwardOptions& options) const {
  LORAPLEX_RETURN_IF_ERROR(ValidateBatch(input_ids, lengths));
  LORAPLEX_RETURN_IF_ERROR(CheckShardedForward());
  if (options.checkpoint_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint_every must be >= 0, got ", options.checkpoint_every));
  }
  if (options.segment_ids.defined() &&
      (options.segment_ids.sizes() != input_ids.sizes() ||
       options.segment_ids.scalar_type() != torch::kInt64)) {
    return absl::InvalidArgumentError(
        "segment_ids must be an int64 tensor shaped as input_ids");
  }
  try {
    return HiddenStates(input_ids, lengths, delta, options);
  } catch (const c10::Error& e) {
    return TorchError(e);
  }
}

absl::StatusOr<torch::Tensor> LlamaModel::ForwardCached(
    const torch::Tensor& input_ids, const torch::Tensor& valid, KvCache& cache,
    const ProjectionDelta* delta) const {
  if (!input_ids.defined() || input_ids.dim() != 2 ||
      input_ids.scalar_type() != torch::kInt64 || input_ids.numel() == 0 ||
      input_ids.size(0) != cache.rows()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_ids must be a non-empty int64 tensor of shape [",
                     cache.rows(), ", seq]"));
  }
  if (valid.defined() && (valid.sizes() != input_ids.sizes() ||
                          valid.scalar_type() != torch::kBool)) {
    return absl::InvalidArgumentError(
        "valid must be a bool tensor shaped as input_ids");
  }
  LORAPLEX_RETURN_IF_ERROR(CheckTokenIds(input_ids));
  LORAPLEX_RETURN_IF_ERROR(CheckShardedForward());
  try {
    const int64_t seq = input_ids.size(1);
    torch::Tensor real =
        valid.defined()
            ? valid.to(device_)
            : torch::ones(
                  input_ids.sizes(),
                  torch::TensorOptions().dtype(torch::kBool).device(device_));
    torch::Tensor counts = real.to(torch::kInt64).cumsum(1);
    torch::Tensor positions =
        torch::where(real, cache.next_positions_.unsqueeze(1) + counts - 1,
                     torch::full_like(counts, -1));
    const int64_t last = positions.max().item<int64_t>();
    if (last >= config_.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("position ", last, " exceeds max_position_embeddings ",
                       config_.max_position_embeddings));
    }
    cache.Reserve(seq);
    cache.positions_.narrow(1, cache.columns_, seq).copy_(positions);
    cache.columns_ += seq;
    cache.next_positions_ = cache.next_positions_ + counts.select(1, seq - 1);

    const torch::Tensor clamped = positions.clamp_min(0);
    LayerInputs inputs;
    inputs.rope = rotary_.TablesAt(clamped, dtype_, device_);
    inputs.mask = CachedAttentionMask(cache, positions, std::nullopt);
    if (HasSlidingLayers()) {
      inputs.sliding_rope =
          config_.sliding_rope.has_value()
              ? sliding_rotary_.TablesAt(clamped, dtype_, device_)
              : inputs.rope;
      inputs.sliding_mask =
          CachedAttentionMask(cache, positions, config_.sliding_window);
    }
    return Decoder(input_ids, inputs, delta, &cache);
  } catch (const c10::Error& e) {
    return TorchError(e);
  }
}

torch::Tensor LlamaModel::Logits(const torch::Tensor& hidden,
                                 const ProjectionDelta* delta,
                                 int64_t first_row) const {
  torch::Tensor logits = torch::nn::functional::linear(hidden, weights_.lm_head)
                             .to(logits_dtype());
  if (delta == nullptr) return logits;
  return delta->AddToLogits(hidden, logits, first_row);
}

torch::ScalarType LlamaModel::logits_dtype() const {
  return Fp32OrFp64(dtype_);
}

absl::StatusOr<torch::Tensor> LlamaModel::Forward(
    const torch::Tensor& input_ids, const torch::Tensor& lengths) const {
  return Forward(input_ids, lengths, nullptr);
}

absl::StatusOr<torch::Tensor> LlamaModel::Forward(
    const torch::Tensor& input_ids, const torch::Tensor& lengths,
    const ProjectionDelta* delta) const {
  LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor hidden,
                            ForwardHidden(input_ids, lengths, delta));
  try {
    return Logits(hidden, delta);
  } catch (const c10::Error& e) {
    return TorchError(e);
  }
}

}  // namespace loraplex
