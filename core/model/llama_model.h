// The frozen decoder every adapter trains on (docs/DESIGN.md §2): the Llama
// layout and the variants the model families describe (model_family.h: norm
// placement and style, q/k norms, GELU-tanh MLPs, scaled embeddings,
// sliding-window layers with their own RoPE).
//
// Loads a Hugging Face checkpoint directory (config.json + safetensors, single
// or sharded) and runs the decoder over right-padded batches:
//
//   LORAPLEX_ASSIGN_OR_RETURN(auto model, LlamaModel::Load(dir, {}));
//   LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor logits,
//                             model->Forward(input_ids, lengths));
//
// RMSNorm is computed in fp32, attention softmax in fp32 (fp64 for an fp64
// model); weights stay in the compute dtype and never require gradients.
// The compute dtype is fp32 or bf16 for training; fp64 runs the same math
// beyond fp32 rounding, for checks of the engine's identities.
#ifndef LORAPLEX_CORE_MODEL_LLAMA_MODEL_H_
#define LORAPLEX_CORE_MODEL_LLAMA_MODEL_H_

#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/model_config.h"
#include "core/model/model_weights.h"
#include "core/model/rope.h"
#include "core/model/sharded_base.h"

namespace loraplex {

struct ExpertRouting;

// Adds adapter terms to the outputs of the frozen projections. The model
// calls it once per group of projections that share an input (q/k/v,
// o, gate/up, down), right after computing their base outputs.
class ProjectionDelta {
 public:
  virtual ~ProjectionDelta() = default;
  // x: the group's input [batch, seq, in]; outputs[i]: the base output of
  // projections[i], [batch, seq, out_i], replaced by output + adapter term.
  virtual void AddTo(int layer, const torch::Tensor& x,
                     const std::vector<Projection>& projections,
                     std::vector<torch::Tensor>& outputs) const = 0;
  // A mixture-of-experts layer's experts (experts.h): x [pairs, in] the
  // inputs of the (token, expert) pairs grouped by expert (`counts[e]` pairs
  // of expert e, in expert order), rows int64 [pairs] each pair's row in the
  // batch, output [pairs, out] the experts' base outputs of `projection`
  // (kExpertGateUp or kExpertDown), replaced by output + adapter terms.
  virtual void AddToExperts(int /*layer*/, Projection /*projection*/,
                            const torch::Tensor& /*x*/,
                            const std::vector<int64_t>& /*counts*/,
                            const torch::Tensor& /*rows*/,
                            torch::Tensor& /*output*/) const {}
  // A mixture-of-experts layer's routing of the batch's tokens (experts.h:
  // routing.tokens index the [rows, seq] positions row-major, padding
  // included), seen once per forward pass of the layer, and again when a
  // checkpointed layer recomputes it in the backward pass.
  virtual void ObserveRouting(int /*layer*/,
                              const ExpertRouting& /*routing*/) const {}
  // Returns `logits` [rows, ..., vocab], the base LM head's output on
  // `hidden` [rows, ..., hidden], plus the adapters' LM-head terms. Those
  // rows are the batch's rows first_row, first_row + 1, ...
  virtual torch::Tensor AddToLogits(const torch::Tensor& /*hidden*/,
                                    const torch::Tensor& logits,
                                    int64_t /*first_row*/) const {
    return logits;
  }
};

// Keys and values of every position each row of a batch has seen, so that
// decoding a token costs one token's forward pass (docs/DESIGN.md §11).
//
//   KvCache cache(model.config(), rows, capacity, model.dtype(), device);
//   model.ForwardCached(prompts, prompt_valid, cache);   // prefill
//   model.ForwardCached(next_tokens, {}, cache);          // decode, per token
//
// Column c of row b holds the keys of position positions[b][c], or padding
// (position -1) — prompts of different lengths are left-padded, so every row
// appends its next token in the same column. Keys are stored after RoPE and
// before grouped-query heads are repeated.
class KvCache {
 public:
  KvCache(const ModelConfig& config, int64_t rows, int64_t capacity,
          torch::ScalarType dtype, torch::Device device);

  int64_t rows() const { return positions_.size(0); }
  // Columns written so far.
  int64_t columns() const { return columns_; }
  // Position the next token of each row takes: int64 [rows].
  const torch::Tensor& next_positions() const { return next_positions_; }

  // Keeps `rows` (indices into the current rows, in that order), e.g. to drop
  // rows that finished decoding.
  void KeepRows(const std::vector<int64_t>& rows);

 private:
  friend class LlamaModel;
  // Makes room for `count` more columns.
  void Reserve(int64_t count);

  std::vector<torch::Tensor> keys_;    // Per layer [rows, kv_heads, cap, d].
  std::vector<torch::Tensor> values_;  // Per layer [rows, kv_heads, cap, d].
  torch::Tensor positions_;            // int64 [rows, cap]; -1: padding.
  torch::Tensor next_positions_;       // int64 [rows].
  int64_t columns_ = 0;
};

// On the CPU, rows without padding of at least this many tokens attend
// through LibTorch's causal kernel instead of a [seq, seq] mask.
inline constexpr int64_t kCpuCausalKernelTokens = 1024;

// How a training forward pass runs beyond its inputs.
struct ForwardOptions {
  // Activation checkpointing (layer_checkpoint.h): 0 keeps every layer's
  // activations for the backward pass; k >= 1 keeps only the input of layers
  // 0, k, 2k, ... and recomputes their forward in the backward pass (1:
  // every layer). Gradients are the same bit for bit either way.
  int64_t checkpoint_every = 0;
  // Packed rows: int64 [batch, seq], the example each token belongs to,
  // non-decreasing along a row (undefined: one example per row). A token
  // attends only to earlier tokens of its own example, and positions restart
  // at 0 with each example, so a packed row computes what its examples
  // compute one by one.
  torch::Tensor segment_ids = {};
};

struct ModelLoadOptions {
  torch::Device device = torch::kCPU;
  // Compute dtype (fp32, bf16 or fp64). Unset: the checkpoint's dtype, with
  // fp16 checkpoints computed in fp32.
  std::optional<torch::ScalarType> dtype;
  // Set: each rank keeps only its shard of the decoder layers' frozen
  // tensors (sharded_base.h); every forward then needs every rank: inside
  // the base's AllRanks scope, or rank 0's Leading scope while the others
  // serve its gathers.
  std::optional<BaseSharding> shard_base = std::nullopt;
};

class LlamaModel {
 public:
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(
      const std::string& dir, const ModelLoadOptions& options);

  // With `sharded`, weights.layers are empty and the layers' tensors come
  // from it.
  LlamaModel(ModelConfig config, ModelWeights weights, torch::ScalarType dtype,
             torch::Device device,
             std::unique_ptr<ShardedBase> sharded = nullptr);

  const ModelConfig& config() const { return config_; }
  // With a sharded base, its layers are empty (sharded_base()).
  const ModelWeights& weights() const { return weights_; }
  // nullptr unless the base is sharded over the ranks.
  ShardedBase* sharded_base() const { return sharded_.get(); }
  // Bytes of frozen base weights this process holds: every tensor's
  // storage once, and with a sharded base its shards and gather buffer.
  int64_t FrozenWeightBytes() const;
  torch::ScalarType dtype() const { return dtype_; }
  torch::Device device() const { return device_; }

  // input_ids: int64 [batch, seq], right-padded, every id in [0, vocab).
  // lengths: int64 [batch], each in [1, seq]: the valid prefix of each row.
  // Returns logits [batch, seq, vocab] in logits_dtype(); rows past their
  // length hold values that must be ignored.
  absl::StatusOr<torch::Tensor> Forward(const torch::Tensor& input_ids,
                                        const torch::Tensor& lengths) const;

  // With `delta`, every projection's output goes through it (adapters).
  absl::StatusOr<torch::Tensor> Forward(const torch::Tensor& input_ids,
                                        const torch::Tensor& lengths,
                                        const ProjectionDelta* delta) const;

  // As Forward, but returns the final normed hidden states [batch, seq,
  // hidden] in the compute dtype, for losses computed in chunks. With
  // checkpointing, `delta` must outlive the backward pass.
  absl::StatusOr<torch::Tensor> ForwardHidden(
      const torch::Tensor& input_ids, const torch::Tensor& lengths,
      const ProjectionDelta* delta = nullptr,
      const ForwardOptions& options = {}) const;

  // Runs the tokens `input_ids` [rows, seq] through the model after what
  // `cache` holds, and appends them to it. `valid` (bool [rows, seq], or
  // undefined for all true) marks real tokens; padding must come before a
  // row's real tokens (left padding), and a row's real tokens take positions
  // next_positions()[row], +1, ... Returns the final normed hidden states
  // [rows, seq, hidden]; those of padding must be ignored.
  absl::StatusOr<torch::Tensor> ForwardCached(
      const torch::Tensor& input_ids, const torch::Tensor& valid,
      KvCache& cache, const ProjectionDelta* delta = nullptr) const;

  // LM head applied to hidden states; logits in logits_dtype(). With
  // `delta`, its LM-head terms are added; hidden's rows are the delta's rows
  // first_row, first_row + 1, ...
  torch::Tensor Logits(const torch::Tensor& hidden,
                       const ProjectionDelta* delta = nullptr,
                       int64_t first_row = 0) const;
  // fp32, or fp64 for an fp64 model: logits and losses are never computed
  // in bf16.
  torch::ScalarType logits_dtype() const;

 private:
  // What the layers of one forward pass share, per kind of layer: RoPE
  // tables and the additive attention mask (undefined: plain causal).
  struct LayerInputs {
    RopeTables rope;
    torch::Tensor mask;
    RopeTables sliding_rope;  // Of the sliding-window layers.
    torch::Tensor sliding_mask;
  };

  // INVALID_ARGUMENT unless every id is in [0, vocab).
  absl::Status CheckTokenIds(const torch::Tensor& input_ids) const;
  absl::Status ValidateBatch(const torch::Tensor& input_ids,
                             const torch::Tensor& lengths) const;
  // The additive mask of right-padded rows with `lengths`, keys at most
  // `window` - 1 back when set and only of the query's own example with
  // `segment_ids` (ForwardOptions), or undefined where plain causal
  // attention gives the same valid positions (no window shorter than
  // seq_len, no packing) and a fused kernel can run it: a GPU's flash
  // kernel (bf16 or fp16 on CUDA), or on the CPU rows without padding of at
  // least kCpuCausalKernelTokens, where a mask would cost seq_len² memory.
  torch::Tensor AttentionMask(const torch::Tensor& lengths, int64_t seq_len,
                              std::optional<int64_t> window,
                              const torch::Tensor& segment_ids) const;
  // RMSNorm over the last dimension, its weight applied as the config's
  // NormStyle says.
  torch::Tensor RmsNorm(const torch::Tensor& x,
                        const torch::Tensor& weight) const;
  // The base outputs of `projections` on x, passed through `delta`.
  std::vector<torch::Tensor> Project(int layer, const torch::Tensor& x,
                                     const std::vector<Projection>& projections,
                                     const ProjectionDelta* delta) const;
  // With `cache`, k and v are appended to it and attention runs over every
  // column it holds; `mask` then covers those columns.
  torch::Tensor Attention(int layer, const torch::Tensor& x,
                          const RopeTables& rope, const torch::Tensor& mask,
                          const ProjectionDelta* delta,
                          KvCache* cache = nullptr) const;
  // Additive mask [rows, 1, seq, columns] of the queries at `positions`
  // (int64 [rows, seq], -1 for padding) over the cache's columns, the new
  // ones included; keys at most `window` - 1 back when set.
  torch::Tensor CachedAttentionMask(const KvCache& cache,
                                    const torch::Tensor& positions,
                                    std::optional<int64_t> window) const;
  torch::Tensor Mlp(int layer, const torch::Tensor& x,
                    const ProjectionDelta* delta) const;
  // The -inf/0 mask [rows, 1, queries, keys] of bool `visible`.
  torch::Tensor AdditiveMask(const torch::Tensor& visible) const;
  // One decoder layer on the residual stream x.
  torch::Tensor Layer(int layer, const torch::Tensor& x,
                      const LayerInputs& inputs, const ProjectionDelta* delta,
                      KvCache* cache) const;
  // Embedding, every layer and the final norm, for the forward passes with
  // and without a cache; layers checkpointed as `checkpoint_every` says
  // (ForwardOptions; never with a cache).
  torch::Tensor Decoder(const torch::Tensor& input_ids,
                        const LayerInputs& inputs, const ProjectionDelta* delta,
                        KvCache* cache, int64_t checkpoint_every = 0) const;
  // Decoder layer `layer`'s weights: the gathered ones of a sharded base.
  const LayerWeights& LayerAt(int layer) const;
  // FAILED_PRECONDITION when the base is sharded and the caller has not
  // vouched that every rank runs this forward (ShardedBase::AllRanks).
  absl::Status CheckShardedForward() const;
  // True when some layer attends through the sliding window.
  bool HasSlidingLayers() const;
  torch::Tensor HiddenStates(const torch::Tensor& input_ids,
                             const torch::Tensor& lengths,
                             const ProjectionDelta* delta,
                             const ForwardOptions& options) const;

  ModelConfig config_;
  ModelWeights weights_;
  torch::ScalarType dtype_;
  torch::Device device_;
  RotaryEmbedding rotary_;
  RotaryEmbedding sliding_rotary_;  // The sliding-window layers' RoPE.
  // Shared by copies of the model (it holds the gather buffer).
  std::shared_ptr<ShardedBase> sharded_;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_LLAMA_MODEL_H_
