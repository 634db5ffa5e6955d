// model_type "gpt_oss" (gpt-oss-20b, gpt-oss-120b): grouped-query attention
// with biases and a learned sink logit per head (self_attn.sinks), layers
// alternating sliding-window (128 by default) and full attention, YaRN RoPE,
// RMSNorm weights applied before the cast back, and every layer's MLP a
// mixture of experts: a linear router with a bias (mlp.router) whose top
// num_experts_per_tok logits are softmaxed, each expert a clamped SwiGLU
// over interleaved gate/up columns with biases, stored as [in, out]
// (mlp.experts.gate_up_proj [E, hidden, 2 * intermediate_size]). Released
// checkpoints store the experts in MXFP4 (model_weights.cc dequantizes
// them). Defaults are transformers' GptOssConfig's.
#include <nlohmann/json.hpp>

#include "core/common/status_macros.h"
#include "core/model/model_family.h"

namespace loraplex {
namespace {

using nlohmann::json;

// GptOssConfig.default_theta.
constexpr double kGptOssTheta = 150000.0;

// The RoPE transformers builds when config.json gives no rope settings
// (GptOssConfig.__post_init__), and GptOssConfig's rope_theta default where
// the settings give none.
absl::Status ParseGptOssRope(const ConfigReader& reader, ModelConfig& config) {
  const json& root = reader.root();
  LORAPLEX_ASSIGN_OR_RETURN(
      const double theta,
      reader.PositiveNumber(root, "rope_theta", kGptOssTheta, ""));
  if (!reader.Has("rope_parameters") && !reader.Has("rope_scaling")) {
    const json defaults = {
        {"rope_type", "yarn"}, {"factor", 32.0},
        {"beta_fast", 32.0},   {"beta_slow", 1.0},
        {"truncate", false},   {"original_max_position_embeddings", 4096}};
    LORAPLEX_ASSIGN_OR_RETURN(
        config.rope, ParseRopeSettings(reader, defaults, "rope_parameters.",
                                       theta, config.head_dim));
    return absl::OkStatus();
  }
  if (reader.Has("rope_theta")) return absl::OkStatus();
  // The common parser fell back to 10000 where the settings name no theta.
  const json& settings = reader.Has("rope_parameters") ? root["rope_parameters"]
                                                       : root["rope_scaling"];
  if (!settings.is_object()) return absl::OkStatus();
  if (settings.contains("full_attention")) {
    for (const auto& [type, entry] : settings.items()) {
      if (entry.is_object() && entry.contains("rope_theta")) continue;
      RopeConfig& rope =
          type == "full_attention" ? config.rope : *config.sliding_rope;
      rope.theta = kGptOssTheta;
    }
  } else if (!settings.contains("rope_theta")) {
    config.rope.theta = kGptOssTheta;
  }
  return absl::OkStatus();
}

absl::Status ParseGptOss(const ConfigReader& reader, ModelConfig& config) {
  const json& root = reader.root();
  // GptOssConfig's own defaults where they differ from the common parser's.
  if (!reader.Has("rms_norm_eps")) config.rms_norm_eps = 1e-5;
  if (!reader.Has("max_position_embeddings")) {
    config.max_position_embeddings = 131072;
  }
  if (!reader.Has("head_dim")) config.head_dim = 64;
  LORAPLEX_RETURN_IF_ERROR(ParseGptOssRope(reader, config));
  LORAPLEX_ASSIGN_OR_RETURN(const bool bias,
                            reader.Bool("attention_bias", true));
  config.qkv_bias = bias;
  config.o_bias = bias;
  config.attention_sinks = true;
  // GptOssRMSNorm: (weight * x̂).to(dtype).
  config.norm_style = NormStyle::kScaleThenCast;
  LORAPLEX_RETURN_IF_ERROR(ParseSlidingWindow(reader, config));
  if (!root.contains("sliding_window")) config.sliding_window = 128;
  LORAPLEX_RETURN_IF_ERROR(ParseLayerTypes(reader, /*period=*/2, config));
  LORAPLEX_RETURN_IF_ERROR(ParseMoeSizes(reader, "intermediate_size", config));
  MoeConfig& moe = config.moe;
  moe.router = RouterStyle::kTopKThenSoftmax;
  moe.router_bias = true;
  moe.expert_bias = true;
  moe.activation = ExpertActivation::kClampedSwigluInterleaved;
  moe.router_module = "mlp.router";
  moe.experts_transposed = true;
  moe.sparse_layers.clear();  // Every layer's MLP is the experts.
  LORAPLEX_ASSIGN_OR_RETURN(
      moe.swiglu_alpha, reader.PositiveNumber(root, "swiglu_alpha", 1.702, ""));
  LORAPLEX_ASSIGN_OR_RETURN(
      moe.swiglu_limit, reader.PositiveNumber(root, "swiglu_limit", 7.0, ""));
  return absl::OkStatus();
}

void WriteGptOss(const ModelConfig& config, nlohmann::json& out) {
  const MoeConfig& moe = config.moe;
  out["attention_bias"] = config.qkv_bias;
  out["num_local_experts"] = moe.num_experts;
  out["num_experts_per_tok"] = moe.top_k;
  out["intermediate_size"] = moe.intermediate_size;
  out["swiglu_alpha"] = moe.swiglu_alpha;
  out["swiglu_limit"] = moe.swiglu_limit;
  out["output_router_logits"] = false;
}

}  // namespace

const ModelFamilySpec& GptOssFamily() {
  static const ModelFamilySpec spec{
      "gpt_oss", {"GptOssForCausalLM"}, ParseGptOss, WriteGptOss};
  return spec;
}

}  // namespace loraplex
