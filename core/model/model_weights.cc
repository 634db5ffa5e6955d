#include "core/model/model_weights.h"

#include <torch/torch.h>

#include <functional>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/model/model_family.h"
#include "core/safetensors/safetensors.h"

namespace loraplex {
namespace {

std::string LayerPrefix(int64_t layer) {
  return absl::StrCat("model.layers.", layer, ".");
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Tensors some exporters write that carry no weights of ours: RoPE
// tables, a tied LM head's copy, a multimodal model's other towers.
bool IsIgnorable(const std::string& name, const ModelConfig& config,
                 const std::string& lm_head_name) {
  if (absl::EndsWith(name, "rotary_emb.inv_freq")) return true;
  if (const WrappedTextModel* wrapped = WrappedTextModelOf(config)) {
    for (absl::string_view prefix : wrapped->other_prefixes) {
      if (absl::StartsWith(name, prefix)) return true;
    }
  }
  return config.tie_word_embeddings && name == lm_head_name;
}

// How the checkpoint names a text-model tensor: as is, or under the
// layout of a multimodal wrapper whose embeddings the checkpoint holds
// (the first layout when none matches, for the error messages).
std::function<std::string(const std::string&)> CheckpointNames(
    const ModelConfig& config, const SafetensorsCheckpoint& checkpoint) {
  const WrappedTextModel* wrapped = WrappedTextModelOf(config);
  if (wrapped == nullptr) {
    return [](const std::string& name) { return name; };
  }
  WrappedTextModel::Layout layout = wrapped->layouts.front();
  for (const WrappedTextModel::Layout& candidate : wrapped->layouts) {
    if (checkpoint.Find(WrappedName(candidate, "model.embed_tokens.weight"))) {
      layout = candidate;
      break;
    }
  }
  return
      [layout](const std::string& name) { return WrappedName(layout, name); };
}

}  // namespace

torch::ScalarType TorchScalarType(StoredDtype dtype) {
  switch (dtype) {
    case StoredDtype::kFloat32:
      break;
    case StoredDtype::kBFloat16:
      return torch::kBFloat16;
    case StoredDtype::kFloat16:
      return torch::kFloat16;
  }
  return torch::kFloat32;
}

std::array<int64_t, 2> ProjectionShape(const ModelConfig& config,
                                       Projection projection) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_width = config.num_attention_heads * config.head_dim;
  const int64_t kv_width = config.num_key_value_heads * config.head_dim;
  switch (projection) {
    case Projection::kQ:
      return {q_width, hidden};
    case Projection::kK:
    case Projection::kV:
      return {kv_width, hidden};
    case Projection::kO:
      return {hidden, q_width};
    case Projection::kGate:
    case Projection::kUp:
      return {config.intermediate_size, hidden};
    case Projection::kDown:
      return {hidden, config.intermediate_size};
    case Projection::kQkv:
      return {q_width + 2 * kv_width, hidden};
    case Projection::kGateUp:
      return {2 * config.intermediate_size, hidden};
    case Projection::kLmHead:
      return {config.vocab_size, hidden};
  }
  return {0, 0};
}

bool ProjectionHasBias(const ModelConfig& config, Projection projection) {
  switch (projection) {
    case Projection::kQ:
    case Projection::kK:
    case Projection::kV:
    case Projection::kQkv:
      return config.qkv_bias;
    case Projection::kO:
      return config.o_bias;
    case Projection::kLmHead:
      return false;
    default:
      return config.mlp_bias;
  }
}

namespace {

// A layer's norm tensors with the field of LayerWeights each fills, in
// checkpoint order.
struct LayerNorm {
  const char* module;
  torch::Tensor LayerWeights::*field;
  int64_t width;
};

std::vector<LayerNorm> LayerNorms(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  std::vector<LayerNorm> norms;
  if (config.norm_placement != NormPlacement::kPostNorm) {
    norms.push_back({"input_layernorm", &LayerWeights::input_norm, hidden});
  }
  norms.push_back(
      {"post_attention_layernorm", &LayerWeights::post_attention_norm, hidden});
  if (config.norm_placement == NormPlacement::kSandwich) {
    norms.push_back({"pre_feedforward_layernorm",
                     &LayerWeights::pre_feedforward_norm, hidden});
  }
  if (config.norm_placement != NormPlacement::kPreNorm) {
    norms.push_back({"post_feedforward_layernorm",
                     &LayerWeights::post_feedforward_norm, hidden});
  }
  switch (config.qk_norm) {
    case QkNorm::kNone:
      break;
    case QkNorm::kPerHead:
      norms.push_back(
          {"self_attn.q_norm", &LayerWeights::q_norm, config.head_dim});
      norms.push_back(
          {"self_attn.k_norm", &LayerWeights::k_norm, config.head_dim});
      break;
    case QkNorm::kWholeProjection:
      norms.push_back({"self_attn.q_norm", &LayerWeights::q_norm,
                       config.num_attention_heads * config.head_dim});
      norms.push_back({"self_attn.k_norm", &LayerWeights::k_norm,
                       config.num_key_value_heads * config.head_dim});
      break;
  }
  return norms;
}

}  // namespace

std::vector<TensorSpec> ModelTensorSpecs(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {config.vocab_size, hidden}});
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string prefix = LayerPrefix(layer);
    for (const LayerNorm& norm : LayerNorms(config)) {
      specs.push_back(
          {absl::StrCat(prefix, norm.module, ".weight"), {norm.width}});
    }
    for (Projection p : LayerProjections(config)) {
      const auto [out, in] = ProjectionShape(config, p);
      const std::string module = prefix + std::string(ProjectionModule(p));
      specs.push_back({module + ".weight", {out, in}});
      if (ProjectionHasBias(config, p))
        specs.push_back({module + ".bias", {out}});
    }
  }
  specs.push_back({"model.norm.weight", {hidden}});
  if (!config.tie_word_embeddings) {
    specs.push_back({"lm_head.weight", {config.vocab_size, hidden}});
  }
  return specs;
}

ModelWeights AssembleModelWeights(
    const ModelConfig& config,
    const std::function<torch::Tensor(const std::string&)>& fetch) {
  ModelWeights weights;
  weights.embed_tokens = fetch("model.embed_tokens.weight");
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string prefix = LayerPrefix(layer);
    LayerWeights lw;
    for (const LayerNorm& norm : LayerNorms(config)) {
      lw.*norm.field = fetch(absl::StrCat(prefix, norm.module, ".weight"));
    }
    for (Projection p : LayerProjections(config)) {
      const std::string module = prefix + std::string(ProjectionModule(p));
      LinearWeights& linear = lw.projections[static_cast<int>(p)];
      linear.weight = fetch(module + ".weight");
      if (ProjectionHasBias(config, p)) linear.bias = fetch(module + ".bias");
    }
    weights.layers.push_back(std::move(lw));
  }
  weights.final_norm = fetch("model.norm.weight");
  weights.lm_head = config.tie_word_embeddings ? weights.embed_tokens
                                               : fetch("lm_head.weight");
  return weights;
}

absl::StatusOr<ModelWeights> LoadModelWeights(const std::string& dir,
                                              const ModelConfig& config,
                                              torch::ScalarType dtype,
                                              torch::Device device) {
  LORAPLEX_ASSIGN_OR_RETURN(SafetensorsCheckpoint checkpoint,
                            SafetensorsCheckpoint::OpenDirectory(dir));
  std::vector<TensorSpec> specs = ModelTensorSpecs(config);
  const auto stored_name = CheckpointNames(config, checkpoint);
  for (TensorSpec& spec : specs) spec.name = stored_name(spec.name);
  std::vector<std::string> missing, misshapen, unexpected, bad_dtype;
  std::set<std::string> expected;
  for (const TensorSpec& spec : specs) {
    expected.insert(spec.name);
    const SafetensorsTensorInfo* info = checkpoint.Find(spec.name);
    if (info == nullptr) {
      missing.push_back(spec.name);
    } else if (info->shape != spec.shape) {
      misshapen.push_back(absl::StrCat(spec.name, " is ",
                                       ShapeText(info->shape), ", expected ",
                                       ShapeText(spec.shape)));
    } else if (!torch::isFloatingType(ToScalarType(info->dtype))) {
      bad_dtype.push_back(
          absl::StrCat(spec.name, " is ", SafetensorsDtypeName(info->dtype)));
    }
  }
  for (const std::string& name : checkpoint.names()) {
    if (!expected.count(name) &&
        !IsIgnorable(name, config, stored_name("lm_head.weight"))) {
      unexpected.push_back(name);
    }
  }
  std::vector<std::string> problems;
  if (!missing.empty()) {
    problems.push_back(absl::StrCat(
        missing.size(), " missing tensor(s): ", absl::StrJoin(missing, ", ")));
  }
  if (!misshapen.empty()) {
    problems.push_back(absl::StrCat(
        misshapen.size(),
        " tensor(s) with the wrong shape: ", absl::StrJoin(misshapen, ", ")));
  }
  if (!bad_dtype.empty()) {
    problems.push_back(absl::StrCat(bad_dtype.size(),
                                    " tensor(s) that are not floating point: ",
                                    absl::StrJoin(bad_dtype, ", ")));
  }
  if (!unexpected.empty()) {
    problems.push_back(absl::StrCat(
        unexpected.size(),
        " unexpected tensor(s): ", absl::StrJoin(unexpected, ", ")));
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": checkpoint does not match config.json (",
                     config.model_type, ", ", config.num_hidden_layers,
                     " layers): ", absl::StrJoin(problems, "; ")));
  }

  absl::Status load_status;
  ModelWeights weights = AssembleModelWeights(
      config, [&](const std::string& name) -> torch::Tensor {
        auto tensor = checkpoint.Load(stored_name(name));
        if (!tensor.ok()) {
          if (load_status.ok()) load_status = tensor.status();
          return torch::Tensor();
        }
        return tensor->to(device, dtype).set_requires_grad(false);
      });
  LORAPLEX_RETURN_IF_ERROR(load_status);
  return weights;
}

}  // namespace loraplex
