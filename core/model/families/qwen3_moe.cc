// model_type "qwen3_moe" (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention
// (per-head q/k norms, optional sliding window) with a mixture-of-experts
// MLP: a linear router (mlp.gate), softmax over num_experts, the top
// num_experts_per_tok renormalised when norm_topk_prob, each expert a SwiGLU
// of width moe_intermediate_size. Layer i's MLP is the experts when
// (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers; the
// others are dense MLPs of width intermediate_size.
#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/model/model_family.h"

namespace loraplex {
namespace {

absl::Status ParseQwen3Moe(const ConfigReader& reader, ModelConfig& config) {
  LORAPLEX_RETURN_IF_ERROR(FindModelFamily("qwen3")->parse(reader, config));
  LORAPLEX_RETURN_IF_ERROR(
      ParseMoeSizes(reader, "moe_intermediate_size", config));
  MoeConfig& moe = config.moe;
  moe.router = RouterStyle::kSoftmaxThenTopK;
  moe.activation = ExpertActivation::kSiluHalves;
  LORAPLEX_ASSIGN_OR_RETURN(moe.norm_topk_prob,
                            reader.Bool("norm_topk_prob", false));
  LORAPLEX_ASSIGN_OR_RETURN(int64_t step,
                            reader.PositiveInt("decoder_sparse_step", 1));
  const int64_t layers = config.num_hidden_layers;
  moe.sparse_layers.assign(layers, false);
  for (int64_t i = 0; i < layers; ++i) {
    moe.sparse_layers[i] = (i + 1) % step == 0;
  }
  if (reader.Has("mlp_only_layers")) {
    const nlohmann::json& dense = reader.root()["mlp_only_layers"];
    if (!dense.is_array()) {
      return reader.Error("mlp_only_layers", "must be a list of layer indices");
    }
    for (size_t i = 0; i < dense.size(); ++i) {
      const nlohmann::json& layer = dense[i];
      if (!layer.is_number_integer() || layer.get<int64_t>() < 0 ||
          layer.get<int64_t>() >= layers) {
        return reader.Error(
            absl::StrCat("mlp_only_layers[", i, "]"),
            absl::StrCat("must be a layer index in [0, ", layers, "), got ",
                         DescribeJson(layer)));
      }
      moe.sparse_layers[layer.get<int64_t>()] = false;
    }
  }
  return absl::OkStatus();
}

void WriteQwen3Moe(const ModelConfig& config, nlohmann::json& out) {
  FindModelFamily("qwen3")->write(config, out);
  const MoeConfig& moe = config.moe;
  out["num_experts"] = moe.num_experts;
  out["num_experts_per_tok"] = moe.top_k;
  out["moe_intermediate_size"] = moe.intermediate_size;
  out["norm_topk_prob"] = moe.norm_topk_prob;
  out["decoder_sparse_step"] = 1;
  nlohmann::json dense = nlohmann::json::array();
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    if (!LayerIsSparse(config, i)) dense.push_back(i);
  }
  out["mlp_only_layers"] = dense;
}

}  // namespace

const ModelFamilySpec& Qwen3MoeFamily() {
  static const ModelFamilySpec spec{
      "qwen3_moe", {"Qwen3MoeForCausalLM"}, ParseQwen3Moe, WriteQwen3Moe};
  return spec;
}

}  // namespace loraplex
