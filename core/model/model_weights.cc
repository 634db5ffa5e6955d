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
#include "core/model/mxfp4.h"
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

// A tensor of ModelTensorSpecs as the checkpoint stores it: the stored
// tensors it is made of, and how they make it (unset: the one part as is).
struct StoredTensor {
  std::vector<TensorSpec> parts;
  std::function<torch::Tensor(std::vector<torch::Tensor>)> assemble;
  // The parts are MXFP4 blocks and scales: uint8, passed to `assemble` as
  // stored instead of in the compute dtype.
  bool mxfp4 = false;
  // Why the tensor cannot be read as stored, when it cannot.
  std::string problem;
};

// The experts' stacked weight `spec` ([experts, out, in]) of layer `layer`
// as `checkpoint` stores it: under its own name (transposed when the family
// stores [in, out]), in MXFP4 (`<name>_blocks` [experts, out, in / 32, 16]
// and `<name>_scales` [experts, out, in / 32], released gpt-oss
// checkpoints: dequantized into `dtype` as transformers does, which gives
// the [in, out] layout), or as one linear layer per expert.
StoredTensor StoredExperts(const ModelConfig& config,
                           const SafetensorsCheckpoint& checkpoint,
                           int64_t layer, Projection projection,
                           const TensorSpec& spec, torch::ScalarType dtype) {
  const int64_t experts = spec.shape[0];
  const int64_t out = spec.shape[1];
  const int64_t in = spec.shape[2];
  if (config.moe.experts_transposed &&
      checkpoint.Find(spec.name + "_blocks") != nullptr) {
    const int64_t groups = in / (2 * kMxfp4BlockBytes);
    if (in % (2 * kMxfp4BlockBytes) != 0) {
      StoredTensor stored{{}, nullptr};
      stored.problem = absl::StrCat(
          spec.name, "_blocks is MXFP4, whose blocks hold 32 values, but the ",
          "config makes its rows ", in, " wide, not a multiple of 32");
      return stored;
    }
    StoredTensor stored{
        {{spec.name + "_blocks", {experts, out, groups, kMxfp4BlockBytes}},
         {spec.name + "_scales", {experts, out, groups}}},
        [dtype](std::vector<torch::Tensor> parts) {
          return DequantizeMxfp4(parts[0], parts[1], dtype).transpose(1, 2);
        }};
    stored.mxfp4 = true;
    return stored;
  }
  if (checkpoint.Find(spec.name) != nullptr || config.moe.experts_transposed) {
    if (!config.moe.experts_transposed) return {{spec}, nullptr};
    return {{{spec.name, {experts, in, out}}},
            [](std::vector<torch::Tensor> parts) {
              return parts[0].transpose(1, 2);
            }};
  }
  const std::string prefix = absl::StrCat(LayerPrefix(layer), "mlp.experts.");
  const bool gate_up = projection == Projection::kExpertGateUp;
  if (checkpoint.Find(absl::StrCat(
          prefix, "0.", gate_up ? "gate_proj" : "down_proj", ".weight")) ==
      nullptr) {
    return {{spec}, nullptr};  // Reported missing under its own name.
  }
  StoredTensor stored;
  for (int64_t e = 0; e < experts; ++e) {
    if (gate_up) {
      for (const char* half : {"gate_proj", "up_proj"}) {
        stored.parts.push_back(
            {absl::StrCat(prefix, e, ".", half, ".weight"), {out / 2, in}});
      }
    } else {
      stored.parts.push_back(
          {absl::StrCat(prefix, e, ".down_proj.weight"), {out, in}});
    }
  }
  stored.assemble = [gate_up](std::vector<torch::Tensor> parts) {
    if (!gate_up) return torch::stack(parts);
    std::vector<torch::Tensor> experts;
    for (size_t i = 0; i < parts.size(); i += 2) {
      experts.push_back(torch::cat({parts[i], parts[i + 1]}));
    }
    return torch::stack(experts);
  };
  return stored;
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
    case Projection::kExpertGateUp:
      return {2 * config.moe.intermediate_size, hidden};
    case Projection::kExpertDown:
      return {hidden, config.moe.intermediate_size};
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
    case Projection::kExpertGateUp:
    case Projection::kExpertDown:
      return config.moe.expert_bias;
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

std::string ProjectionWeightName(int64_t layer, Projection projection) {
  const std::string module =
      LayerPrefix(layer) + std::string(ProjectionModule(projection));
  // The experts are stacked parameters of one module, not linear layers.
  return IsExpertProjection(projection) ? module : module + ".weight";
}

std::string ProjectionBiasName(int64_t layer, Projection projection) {
  const std::string module =
      LayerPrefix(layer) + std::string(ProjectionModule(projection));
  return IsExpertProjection(projection) ? module + "_bias" : module + ".bias";
}

std::vector<TensorSpec> ModelTensorSpecs(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t experts = config.moe.num_experts;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {config.vocab_size, hidden}});
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string prefix = LayerPrefix(layer);
    for (const LayerNorm& norm : LayerNorms(config)) {
      specs.push_back(
          {absl::StrCat(prefix, norm.module, ".weight"), {norm.width}});
    }
    if (config.attention_sinks) {
      specs.push_back(
          {prefix + "self_attn.sinks", {config.num_attention_heads}});
    }
    if (LayerIsSparse(config, layer)) {
      const std::string router = prefix + config.moe.router_module;
      specs.push_back({router + ".weight", {experts, hidden}});
      if (config.moe.router_bias)
        specs.push_back({router + ".bias", {experts}});
    }
    for (Projection p : LayerProjections(config, layer)) {
      const auto [out, in] = ProjectionShape(config, p);
      const bool stacked = IsExpertProjection(p);
      specs.push_back({ProjectionWeightName(layer, p),
                       stacked ? std::vector<int64_t>{experts, out, in}
                               : std::vector<int64_t>{out, in}});
      if (ProjectionHasBias(config, p)) {
        specs.push_back({ProjectionBiasName(layer, p),
                         stacked ? std::vector<int64_t>{experts, out}
                                 : std::vector<int64_t>{out}});
      }
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
    if (config.attention_sinks) lw.sinks = fetch(prefix + "self_attn.sinks");
    if (LayerIsSparse(config, layer)) {
      const std::string router = prefix + config.moe.router_module;
      lw.router.weight = fetch(router + ".weight");
      if (config.moe.router_bias) lw.router.bias = fetch(router + ".bias");
    }
    for (Projection p : LayerProjections(config, layer)) {
      LinearWeights& linear = lw.projections[static_cast<int>(p)];
      linear.weight = fetch(ProjectionWeightName(layer, p));
      if (ProjectionHasBias(config, p)) {
        linear.bias = fetch(ProjectionBiasName(layer, p));
      }
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
  const auto stored_name = CheckpointNames(config, checkpoint);
  std::map<std::string, StoredTensor> stored;
  std::vector<std::string> order;  // ModelTensorSpecs' order, for messages.
  for (const TensorSpec& spec : ModelTensorSpecs(config)) {
    stored[spec.name] = {{{stored_name(spec.name), spec.shape}}, nullptr};
    order.push_back(spec.name);
  }
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (!LayerIsSparse(config, layer)) continue;
    for (Projection p : {Projection::kExpertGateUp, Projection::kExpertDown}) {
      StoredTensor& tensor = stored[ProjectionWeightName(layer, p)];
      tensor =
          StoredExperts(config, checkpoint, layer, p, tensor.parts[0], dtype);
    }
  }
  std::vector<std::string> missing, misshapen, unexpected, bad_dtype;
  std::set<std::string> expected;
  std::vector<std::string> unreadable;
  for (const std::string& name : order) {
    if (!stored[name].problem.empty()) {
      unreadable.push_back(stored[name].problem);
      expected.insert(name + "_blocks");
      expected.insert(name + "_scales");
    }
    const bool mxfp4 = stored[name].mxfp4;
    for (const TensorSpec& spec : stored[name].parts) {
      expected.insert(spec.name);
      const SafetensorsTensorInfo* info = checkpoint.Find(spec.name);
      if (info == nullptr) {
        missing.push_back(spec.name);
      } else if (info->shape != spec.shape) {
        misshapen.push_back(absl::StrCat(spec.name, " is ",
                                         ShapeText(info->shape), ", expected ",
                                         ShapeText(spec.shape)));
      } else if (mxfp4 ? ToScalarType(info->dtype) != torch::kUInt8
                       : !torch::isFloatingType(ToScalarType(info->dtype))) {
        bad_dtype.push_back(absl::StrCat(
            spec.name, " is ", SafetensorsDtypeName(info->dtype),
            mxfp4 ? ", MXFP4 needs U8" : ", expected floating point"));
      }
    }
  }
  for (const std::string& name : checkpoint.names()) {
    if (!expected.count(name) &&
        !IsIgnorable(name, config, stored_name("lm_head.weight"))) {
      unexpected.push_back(name);
    }
  }
  std::vector<std::string> problems = unreadable;
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
    problems.push_back(absl::StrCat(
        bad_dtype.size(),
        " tensor(s) of the wrong dtype: ", absl::StrJoin(bad_dtype, ", ")));
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
        const StoredTensor& tensor = stored.at(name);
        std::vector<torch::Tensor> parts;
        for (const TensorSpec& part : tensor.parts) {
          auto loaded = checkpoint.Load(part.name);
          if (!loaded.ok()) {
            if (load_status.ok()) load_status = loaded.status();
            return torch::Tensor();
          }
          parts.push_back(tensor.mxfp4 ? loaded->to(device)
                                       : loaded->to(device, dtype));
        }
        torch::Tensor whole = tensor.assemble
                                  ? tensor.assemble(std::move(parts))
                                  : std::move(parts[0]);
        return whole.set_requires_grad(false);
      });
  LORAPLEX_RETURN_IF_ERROR(load_status);
  return weights;
}

}  // namespace loraplex
