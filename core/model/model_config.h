// The architecture description of a decoder-only base model.
//
// Parsed from a Hugging Face `config.json` and validated, so that an
// unsupported or inconsistent checkpoint is rejected up front with the
// offending key in the message. The keys every family shares (sizes, heads,
// RoPE in both the 4.x `rope_theta`/`rope_scaling` and the 5.x
// `rope_parameters` spelling, dtype, token ids) are read here; the keys of
// one family, and the architecture features they set, are read by that
// family's description (core/model/model_family.h, one file per family under
// core/model/families/).
//
//   LORAPLEX_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
#ifndef LORAPLEX_CORE_MODEL_MODEL_CONFIG_H_
#define LORAPLEX_CORE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/projection.h"

namespace loraplex {

// How rotary frequencies are derived from rope_theta.
enum class RopeType {
  kDefault,  // Plain RoPE.
  kLinear,   // Position interpolation: frequencies divided by `factor`.
  kLlama3,   // Llama 3.1 band-wise frequency scaling.
  // LongRoPE (Phi-3.5, Phi-4-mini): frequencies divided per dimension by
  // short_factor, or by long_factor when a pass reaches past
  // original_max_position_embeddings; cos and sin scaled by
  // attention_factor.
  kLongRope,
  // YaRN (gpt-oss): frequencies blended between interpolated (÷ factor) and
  // original by a ramp over the dimensions whose wavelengths fall between
  // beta_fast and beta_slow rotations in original_max_position_embeddings;
  // cos and sin scaled by attention_factor (default 0.1·ln(factor) + 1).
  kYarn,
};

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;                              // kLinear and kLlama3.
  double low_freq_factor = 1.0;                     // kLlama3.
  double high_freq_factor = 4.0;                    // kLlama3.
  int64_t original_max_position_embeddings = 8192;  // kLlama3, kLongRope.
  std::vector<double> short_factor;                 // kLongRope.
  std::vector<double> long_factor;                  // kLongRope.
  double attention_factor = 1.0;                    // kLongRope, kYarn.
  double beta_fast = 32.0;                          // kYarn.
  double beta_slow = 1.0;                           // kYarn.
  // kYarn: whether the ramp's ends are rounded to whole dimensions.
  bool truncate = true;
  // The leading fraction of head_dim that is rotated; the rest passes
  // through (Phi-4-mini: 0.75).
  double partial_rotary_factor = 1.0;
};

// The rotated dimensions of a head: int(head_dim · partial_rotary_factor),
// as transformers computes it.
int64_t RotaryDim(const RopeConfig& rope, int64_t head_dim);

// How a checkpoint stores its weights (config.json's dtype / torch_dtype).
enum class StoredDtype {
  kFloat32,
  kBFloat16,
  kFloat16,  // Computed in float32 (see LlamaModel::Load).
};

// "float32", "bfloat16", "float16": config.json's spelling.
absl::string_view StoredDtypeName(StoredDtype dtype);

// How an RMSNorm applies its weight w to the normalised x̂ (computed in
// fp32, or fp64 for an fp64 model).
enum class NormStyle {
  kCastThenScale,  // w · x̂.to(dtype) (Llama, Qwen).
  kScaleThenCast,  // (w · x̂).to(dtype) (OLMo 2/3).
  kOnePlusWeight,  // (x̂ · (1 + w)).to(dtype) (Gemma; stored w is 0 at 1).
};

// Where a decoder layer's norms sit around attention and the MLP.
enum class NormPlacement {
  // x += attn(input_norm(x)); x += mlp(post_attention_norm(x)).
  kPreNorm,
  // x += post_attention_norm(attn(x)); x += post_feedforward_norm(mlp(x))
  // (OLMo 2/3: no input norm).
  kPostNorm,
  // x += post_attention_norm(attn(input_norm(x)));
  // x += post_feedforward_norm(mlp(pre_feedforward_norm(x))) (Gemma 2/3).
  kSandwich,
};

// RMSNorm on queries and keys, after their projections, before RoPE.
enum class QkNorm {
  kNone,
  kPerHead,          // q_norm / k_norm of width head_dim (Qwen3, Gemma 3).
  kWholeProjection,  // Widths heads·head_dim and kv_heads·head_dim (OLMo).
};

// The MLP's gate activation: act(gate(x)) · up(x).
enum class MlpActivation {
  kSilu,      // "silu" (SwiGLU).
  kGeluTanh,  // "gelu_pytorch_tanh" / "gelu_tanh" (GeGLU, Gemma).
};

// How a mixture-of-experts router turns its logits into expert weights.
enum class RouterStyle {
  // softmax over all experts, then the top k (renormalised to sum 1 when
  // norm_topk_prob): Qwen3-MoE.
  kSoftmaxThenTopK,
  // The top k logits, then softmax over them: gpt-oss.
  kTopKThenSoftmax,
};

// An expert's gated activation on its gate_up output.
enum class ExpertActivation {
  // act(gate) · up with gate and up the two halves of gate_up (Qwen3-MoE).
  kSiluHalves,
  // gpt-oss: gate and up interleaved (even and odd columns); g =
  // min(gate, limit), u = clamp(up, -limit, limit), (u + 1) · g·σ(alpha·g).
  kClampedSwigluInterleaved,
};

// A mixture-of-experts MLP: per token a router picks top_k of num_experts
// experts, each a gated MLP of width intermediate_size, and the MLP's output
// is their outputs weighted by the router.
struct MoeConfig {
  int64_t num_experts = 0;  // 0: every layer's MLP is dense.
  int64_t top_k = 0;
  int64_t intermediate_size = 0;  // Each expert's.
  RouterStyle router = RouterStyle::kSoftmaxThenTopK;
  bool norm_topk_prob = false;  // kSoftmaxThenTopK only.
  bool router_bias = false;     // mlp.router.bias (gpt-oss).
  bool expert_bias = false;     // gate_up_proj_bias, down_proj_bias.
  ExpertActivation activation = ExpertActivation::kSiluHalves;
  double swiglu_alpha = 1.702;  // kClampedSwigluInterleaved.
  double swiglu_limit = 7.0;    // kClampedSwigluInterleaved.
  // Per layer: true where the MLP is the experts (Qwen3-MoE's
  // decoder_sparse_step and mlp_only_layers); empty: every layer.
  std::vector<bool> sparse_layers;
  // The router's module in a layer: "mlp.gate" (Qwen3-MoE), "mlp.router"
  // (gpt-oss).
  std::string router_module = "mlp.gate";
  // Checkpoints store each expert's weight as [in, out] (gpt-oss) instead
  // of a linear layer's [out, in].
  bool experts_transposed = false;
};

struct ModelConfig {
  // config.json's model_type, e.g. "qwen3": the family whose description
  // parsed this config (model_family.h).
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Biases on q_proj, k_proj, v_proj.
  bool o_bias = false;    // Bias on o_proj.
  bool mlp_bias = false;  // Biases on gate_proj, up_proj, down_proj.
  // q/k/v and gate/up stored as one matrix each (qkv_proj, gate_up_proj:
  // kFusedProjections), adapted as PEFT adapts those modules (Phi-3).
  bool fused_projections = false;
  // Keys further back than this are hidden in the sliding-window layers;
  // unset = every layer full causal.
  std::optional<int64_t> sliding_window;
  // Per layer: true where the layer attends through sliding_window
  // (config.json's layer_types "sliding_attention"). Empty means every layer
  // when sliding_window is set (Mistral).
  std::vector<bool> sliding_layers;
  // RoPE of the sliding-window layers where it differs from `rope`
  // (Gemma 3's rope_local_base_freq; 5.x per-layer-type rope_parameters).
  std::optional<RopeConfig> sliding_rope;
  NormStyle norm_style = NormStyle::kCastThenScale;
  NormPlacement norm_placement = NormPlacement::kPreNorm;
  QkNorm qk_norm = QkNorm::kNone;
  MlpActivation activation = MlpActivation::kSilu;
  // Embeddings multiplied by sqrt(hidden_size), rounded to the compute
  // dtype (Gemma).
  bool scale_embeddings = false;
  // Attention logits' scale; unset = 1/sqrt(head_dim). Gemma 3 uses
  // query_pre_attn_scalar^-0.5.
  std::optional<double> attention_scale;
  // A learned logit per attention head that joins every softmax as one more
  // key with no value (self_attn.sinks, gpt-oss).
  bool attention_sinks = false;
  // Mixture-of-experts MLPs; moe.num_experts 0 for a dense model.
  MoeConfig moe;
  StoredDtype dtype = StoredDtype::kFloat32;  // As stored in the checkpoint.
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;
  std::optional<int64_t> pad_token_id;
  // `_name_or_path`: the Hub id (or path) transformers saved the checkpoint
  // from; empty when config.json has none.
  std::string name_or_path;
};

// Parses config.json text. `label` names the source in error messages.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             const std::string& label);

// Reads and parses `dir`/config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

// A config.json (Hugging Face 4.x keys) describing `config`.
std::string ModelConfigToJson(const ModelConfig& config);

// The projections of each decoder layer: kAllProjections, or
// kFusedProjections for a fused layout. For a mixture-of-experts model, a
// dense layer's (use the overload with a layer for a given layer).
std::vector<Projection> LayerProjections(const ModelConfig& config);
// The projections of decoder layer `layer`: on an experts layer the
// attention's and kExpertGateUp, kExpertDown.
std::vector<Projection> LayerProjections(const ModelConfig& config,
                                         int64_t layer);

// Whether decoder layer `layer`'s MLP is the experts.
bool LayerIsSparse(const ModelConfig& config, int64_t layer);
// Whether some layer's MLP is dense / the experts.
bool HasDenseLayers(const ModelConfig& config);
bool HasSparseLayers(const ModelConfig& config);

// Whether decoder layer `layer` attends through the sliding window.
bool LayerIsSliding(const ModelConfig& config, int64_t layer);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_MODEL_CONFIG_H_
