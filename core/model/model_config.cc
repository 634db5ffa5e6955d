#include "core/model/model_config.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/model/config_reader.h"
#include "core/model/model_family.h"

namespace loraplex {
namespace {

using nlohmann::json;

absl::Status ParseRope(const ConfigReader& reader, ModelConfig& config) {
  const json& root = reader.root();
  LORAPLEX_ASSIGN_OR_RETURN(bool per_layer_type,
                            ParsePerLayerTypeRope(reader, config));
  if (per_layer_type) return absl::OkStatus();
  // 5.x writes one "rope_parameters" object; 4.x writes rope_theta plus an
  // optional rope_scaling object.
  json scaling;
  std::string where;
  if (reader.Has("rope_parameters")) {
    scaling = root["rope_parameters"];
    where = "rope_parameters.";
  } else if (reader.Has("rope_scaling")) {
    scaling = root["rope_scaling"];
    where = "rope_scaling.";
  }
  if (!scaling.is_null() && !scaling.is_object()) {
    return reader.Error(where.substr(0, where.size() - 1), "must be an object");
  }
  if (scaling.is_null()) scaling = json::object();
  LORAPLEX_ASSIGN_OR_RETURN(
      double theta, reader.PositiveNumber(root, "rope_theta", 10000.0, ""));
  LORAPLEX_ASSIGN_OR_RETURN(
      config.rope,
      ParseRopeSettings(reader, scaling, where, theta, config.head_dim));
  // A top-level rope_theta wins over one inside the settings.
  if (reader.Has("rope_theta")) config.rope.theta = theta;
  return absl::OkStatus();
}

// A rotated fraction of each head only where the family's decoder does
// that (the fraction itself is read with the rope settings).
absl::Status CheckRotation(const ConfigReader& reader,
                           const ModelFamilySpec& family,
                           const ModelConfig& config) {
  for (const RopeConfig* rope :
       {&config.rope, config.sliding_rope ? &*config.sliding_rope : nullptr}) {
    if (rope != nullptr && rope->partial_rotary_factor != 1.0 &&
        !family.partial_rotary) {
      return reader.Error(
          "partial_rotary_factor",
          absl::StrCat("other than 1.0 is not supported for model_type ",
                       config.model_type));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseDtype(const ConfigReader& reader, ModelConfig& config) {
  const char* key = reader.Has("dtype") ? "dtype" : "torch_dtype";
  if (!reader.Has(key)) return absl::OkStatus();
  const json& value = reader.root()[key];
  const std::string name = value.is_string() ? value.get<std::string>() : "";
  if (name == "float32") {
    config.dtype = StoredDtype::kFloat32;
  } else if (name == "bfloat16") {
    config.dtype = StoredDtype::kBFloat16;
  } else if (name == "float16") {
    config.dtype = StoredDtype::kFloat16;
  } else {
    return reader.Error(key, absl::StrCat("must be float32, bfloat16 or "
                                          "float16, got ",
                                          DescribeJson(value)));
  }
  return absl::OkStatus();
}

absl::StatusOr<const ModelFamilySpec*> ParseFamily(const ConfigReader& reader,
                                                   ModelConfig& config) {
  if (!reader.Has("model_type") || !reader.root()["model_type"].is_string()) {
    return reader.Error("model_type", absl::StrCat("is required (",
                                                   SupportedModelTypes(), ")"));
  }
  const std::string model_type = reader.root()["model_type"];
  const ModelFamilySpec* family = FindModelFamily(model_type);
  if (family == nullptr) {
    return reader.Error(
        "model_type",
        absl::StrCat("\"", model_type, "\" is not supported (supported: ",
                     SupportedModelTypes(), ")"));
  }
  config.model_type = model_type;
  if (reader.Has("architectures")) {
    const json& archs = reader.root()["architectures"];
    if (!archs.is_array())
      return reader.Error("architectures", "must be a list");
    for (const json& arch : archs) {
      const bool known =
          arch.is_string() &&
          std::find(family->architectures.begin(), family->architectures.end(),
                    arch.get<std::string>()) != family->architectures.end();
      if (!known) {
        return reader.Error("architectures",
                            absl::StrCat("entry ", DescribeJson(arch),
                                         " is not supported with "
                                         "model_type \"",
                                         model_type, "\" (expected \"",
                                         family->architectures.front(), "\")"));
      }
    }
  }
  return family;
}

absl::Status ParseAttentionShape(const ConfigReader& reader,
                                 ModelConfig& config) {
  LORAPLEX_ASSIGN_OR_RETURN(config.num_attention_heads,
                            reader.PositiveInt("num_attention_heads"));
  LORAPLEX_ASSIGN_OR_RETURN(
      config.num_key_value_heads,
      reader.PositiveInt("num_key_value_heads", config.num_attention_heads));
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return reader.Error("num_key_value_heads",
                        absl::StrCat("(", config.num_key_value_heads,
                                     ") must divide num_attention_heads (",
                                     config.num_attention_heads, ")"));
  }
  if (reader.Has("head_dim")) {
    LORAPLEX_ASSIGN_OR_RETURN(config.head_dim, reader.PositiveInt("head_dim"));
  } else {
    if (config.hidden_size % config.num_attention_heads != 0) {
      return reader.Error(
          "hidden_size",
          absl::StrCat("(", config.hidden_size,
                       ") must be divisible by num_attention_heads (",
                       config.num_attention_heads, ") when head_dim is unset"));
    }
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  if (config.head_dim % 2 != 0) {
    return reader.Error("head_dim", absl::StrCat("must be even for rotary "
                                                 "embeddings, got ",
                                                 config.head_dim));
  }
  return absl::OkStatus();
}

absl::Status ParseActivation(const ConfigReader& reader, ModelConfig& config) {
  // Gemma names the key hidden_activation; the others hidden_act.
  for (const char* key : {"hidden_activation", "hidden_act"}) {
    if (!reader.Has(key)) continue;
    const json& value = reader.root()[key];
    if (value == "silu") {
      config.activation = MlpActivation::kSilu;
    } else if (value == "gelu_pytorch_tanh" || value == "gelu_tanh") {
      config.activation = MlpActivation::kGeluTanh;
    } else {
      return reader.Error(key, absl::StrCat("must be \"silu\" or "
                                            "\"gelu_pytorch_tanh\", got ",
                                            DescribeJson(value)));
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

// A quantized checkpoint is read only where the loader dequantizes it:
// gpt-oss's MXFP4 experts (model_weights.cc); any other method is refused
// by name.
absl::Status RefuseQuantization(const ConfigReader& reader) {
  if (!reader.Has("quantization_config")) return absl::OkStatus();
  const json& quantization = reader.root()["quantization_config"];
  const json method =
      quantization.is_object() && quantization.contains("quant_method")
          ? quantization["quant_method"]
          : json(nullptr);
  const json model_type =
      reader.Has("model_type") ? reader.root()["model_type"] : json(nullptr);
  if (method == "mxfp4" && model_type == "gpt_oss") return absl::OkStatus();
  if (method == "mxfp4") {
    return reader.Error("quantization_config.quant_method",
                        absl::StrCat("\"mxfp4\" is supported for model_type "
                                     "gpt_oss only, got model_type ",
                                     DescribeJson(model_type)));
  }
  if (method.is_string()) {
    return reader.Error(
        "quantization_config.quant_method",
        absl::StrCat(DescribeJson(method),
                     " is not supported (only gpt_oss's \"mxfp4\", "
                     "dequantized at load): load an unquantized (bf16, fp16 "
                     "or fp32) checkpoint"));
  }
  return reader.Error("quantization_config",
                      "is not supported without a quant_method (only "
                      "gpt_oss's \"mxfp4\"): load an unquantized (bf16, "
                      "fp16 or fp32) checkpoint");
}

// Keys that change the model in ways no family here implements: refused
// by name rather than ignored.
absl::Status RefuseUnsupportedFeatures(const ConfigReader& reader) {
  LORAPLEX_RETURN_IF_ERROR(RefuseQuantization(reader));
  LORAPLEX_RETURN_IF_ERROR(reader.RefuseUnlessNeutral(
      "attn_logit_softcapping", json(nullptr),
      "attention logit soft-capping is not implemented"));
  LORAPLEX_RETURN_IF_ERROR(reader.RefuseUnlessNeutral(
      "final_logit_softcapping", json(nullptr),
      "final logit soft-capping is not implemented"));
  LORAPLEX_RETURN_IF_ERROR(
      reader.RefuseUnlessNeutral("use_bidirectional_attention", json(false),
                                 "only causal decoders are supported"));
  return absl::OkStatus();
}

}  // namespace

int64_t RotaryDim(const RopeConfig& rope, int64_t head_dim) {
  return static_cast<int64_t>(static_cast<double>(head_dim) *
                              rope.partial_rotary_factor);
}

std::vector<Projection> LayerProjections(const ModelConfig& config) {
  if (config.fused_projections) {
    return {kFusedProjections.begin(), kFusedProjections.end()};
  }
  return {kAllProjections.begin(), kAllProjections.end()};
}

std::vector<Projection> LayerProjections(const ModelConfig& config,
                                         int64_t layer) {
  if (!LayerIsSparse(config, layer)) return LayerProjections(config);
  return {Projection::kQ, Projection::kK, Projection::kV, Projection::kO,
          Projection::kExpertGateUp, Projection::kExpertDown};
}

bool LayerIsSparse(const ModelConfig& config, int64_t layer) {
  if (config.moe.num_experts == 0) return false;
  if (config.moe.sparse_layers.empty()) return true;
  return layer >= 0 &&
         layer < static_cast<int64_t>(config.moe.sparse_layers.size()) &&
         config.moe.sparse_layers[layer];
}

bool HasDenseLayers(const ModelConfig& config) {
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (!LayerIsSparse(config, layer)) return true;
  }
  return false;
}

bool HasSparseLayers(const ModelConfig& config) {
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (LayerIsSparse(config, layer)) return true;
  }
  return false;
}

bool LayerIsSliding(const ModelConfig& config, int64_t layer) {
  if (!config.sliding_window.has_value()) return false;
  if (config.sliding_layers.empty()) return true;
  return layer >= 0 &&
         layer < static_cast<int64_t>(config.sliding_layers.size()) &&
         config.sliding_layers[layer];
}

namespace {

absl::StatusOr<ModelConfig> ModelConfigFromJson(const json& root,
                                                const std::string& label);

// A multimodal wrapper's config: text_config, completed with the text
// config class's defaults and the top-level keys transformers reads from
// the outer config, parsed by the text family. vision_config is not read.
absl::StatusOr<ModelConfig> WrappedConfigFromJson(const ConfigReader& reader,
                                                  const ModelFamilySpec& family,
                                                  const ModelConfig& outer) {
  const WrappedTextModel& wrapped = *family.wrapped;
  const json& root = reader.root();
  // Quantized checkpoints keep quantization_config at the top level.
  LORAPLEX_RETURN_IF_ERROR(RefuseUnsupportedFeatures(reader));
  if (reader.Has("text_config") && !root["text_config"].is_object()) {
    return reader.Error("text_config", "must be an object");
  }
  json text = json::parse(wrapped.text_defaults);
  text["model_type"] = std::string(wrapped.text_model_type);
  if (reader.Has("text_config")) {
    const json& given = root["text_config"];
    if (given.contains("model_type") &&
        given["model_type"] != std::string(wrapped.text_model_type)) {
      return reader.Error("text_config.model_type",
                          absl::StrCat("must be \"", wrapped.text_model_type,
                                       "\" for "
                                       "model_type \"",
                                       family.model_type, "\", got ",
                                       DescribeJson(given["model_type"])));
    }
    for (const auto& [key, value] : given.items()) {
      if (key != "architectures") text[key] = value;
    }
    // A default top-level rope_theta would win over the settings' own.
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
      if (!given.contains("rope_theta") && given.contains(key) &&
          given[key].is_object() && given[key].contains("rope_theta")) {
        text.erase("rope_theta");
      }
    }
  }
  for (absl::string_view key : wrapped.top_level_keys) {
    const std::string name(key);
    if (!reader.Has(name.c_str())) continue;
    if (name == "dtype" || name == "torch_dtype") {
      text.erase("dtype");
      text.erase("torch_dtype");
    }
    text[name] = root[name];
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      ModelConfig config,
      ModelConfigFromJson(text, absl::StrCat(reader.label(), ": text_config")));
  config.model_type = outer.model_type;
  config.name_or_path = outer.name_or_path;
  return config;
}

absl::StatusOr<ModelConfig> ModelConfigFromJson(const json& root,
                                                const std::string& label) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": must be a JSON object"));
  }
  ConfigReader reader(root, label);
  ModelConfig config;
  LORAPLEX_ASSIGN_OR_RETURN(const ModelFamilySpec* family,
                            ParseFamily(reader, config));
  if (auto it = root.find("_name_or_path");
      it != root.end() && it->is_string()) {
    config.name_or_path = it->get<std::string>();
  }
  if (family->wrapped != nullptr) {
    return WrappedConfigFromJson(reader, *family, config);
  }
  LORAPLEX_ASSIGN_OR_RETURN(config.vocab_size,
                            reader.PositiveInt("vocab_size"));
  LORAPLEX_ASSIGN_OR_RETURN(config.hidden_size,
                            reader.PositiveInt("hidden_size"));
  LORAPLEX_ASSIGN_OR_RETURN(config.intermediate_size,
                            reader.PositiveInt("intermediate_size"));
  LORAPLEX_ASSIGN_OR_RETURN(config.num_hidden_layers,
                            reader.PositiveInt("num_hidden_layers"));
  LORAPLEX_ASSIGN_OR_RETURN(
      config.max_position_embeddings,
      reader.PositiveInt("max_position_embeddings", 2048));
  LORAPLEX_RETURN_IF_ERROR(ParseAttentionShape(reader, config));
  LORAPLEX_RETURN_IF_ERROR(ParseActivation(reader, config));
  LORAPLEX_RETURN_IF_ERROR(RefuseUnsupportedFeatures(reader));
  LORAPLEX_ASSIGN_OR_RETURN(
      config.rms_norm_eps,
      reader.PositiveNumber(root, "rms_norm_eps", 1e-6, ""));
  LORAPLEX_RETURN_IF_ERROR(ParseRope(reader, config));
  LORAPLEX_ASSIGN_OR_RETURN(config.tie_word_embeddings,
                            reader.Bool("tie_word_embeddings", false));
  LORAPLEX_RETURN_IF_ERROR(family->parse(reader, config));
  if (!config.sliding_layers.empty() &&
      static_cast<int64_t>(config.sliding_layers.size()) !=
          config.num_hidden_layers) {
    return absl::InternalError(
        absl::StrCat(label, ": family ", config.model_type, " set ",
                     config.sliding_layers.size(), " layer types for ",
                     config.num_hidden_layers, " layers"));
  }
  LORAPLEX_RETURN_IF_ERROR(CheckRotation(reader, *family, config));
  LORAPLEX_RETURN_IF_ERROR(ParseDtype(reader, config));
  LORAPLEX_ASSIGN_OR_RETURN(config.bos_token_id,
                            reader.TokenId("bos_token_id"));
  LORAPLEX_ASSIGN_OR_RETURN(config.eos_token_id,
                            reader.TokenId("eos_token_id"));
  LORAPLEX_ASSIGN_OR_RETURN(config.pad_token_id,
                            reader.TokenId("pad_token_id"));
  for (const auto& [key, id] : {std::pair<const char*, std::optional<int64_t>>{
                                    "bos_token_id", config.bos_token_id},
                                {"eos_token_id", config.eos_token_id},
                                {"pad_token_id", config.pad_token_id}}) {
    if (id.has_value() && *id >= config.vocab_size) {
      return reader.Error(key, absl::StrCat("(", *id,
                                            ") must be below "
                                            "vocab_size (",
                                            config.vocab_size, ")"));
    }
  }
  return config;
}

}  // namespace

absl::string_view StoredDtypeName(StoredDtype dtype) {
  switch (dtype) {
    case StoredDtype::kFloat32:
      break;
    case StoredDtype::kBFloat16:
      return "bfloat16";
    case StoredDtype::kFloat16:
      return "float16";
  }
  return "float32";
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             const std::string& label) {
  LORAPLEX_ASSIGN_OR_RETURN(json root, ParseUntrustedJson(json_text, label));
  return ModelConfigFromJson(root, label);
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path =
      (std::filesystem::path(dir) / "config.json").string();
  LORAPLEX_ASSIGN_OR_RETURN(json root, ReadUntrustedJsonFile(path));
  return ModelConfigFromJson(root, path);
}

namespace {

json RopeToJson(const RopeConfig& rope) {
  switch (rope.type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear:
      return {{"rope_type", "linear"},
              {"rope_theta", rope.theta},
              {"factor", rope.factor}};
    case RopeType::kLlama3:
      return {{"rope_type", "llama3"},
              {"rope_theta", rope.theta},
              {"factor", rope.factor},
              {"low_freq_factor", rope.low_freq_factor},
              {"high_freq_factor", rope.high_freq_factor},
              {"original_max_position_embeddings",
               rope.original_max_position_embeddings}};
    case RopeType::kLongRope:
      return {{"rope_type", "longrope"},
              {"rope_theta", rope.theta},
              {"short_factor", rope.short_factor},
              {"long_factor", rope.long_factor},
              {"attention_factor", rope.attention_factor},
              {"original_max_position_embeddings",
               rope.original_max_position_embeddings}};
    case RopeType::kYarn:
      return {{"rope_type", "yarn"},
              {"rope_theta", rope.theta},
              {"factor", rope.factor},
              {"original_max_position_embeddings",
               rope.original_max_position_embeddings},
              {"beta_fast", rope.beta_fast},
              {"beta_slow", rope.beta_slow},
              {"truncate", rope.truncate},
              {"attention_factor", rope.attention_factor}};
  }
  return {{"rope_type", "default"}, {"rope_theta", rope.theta}};
}

}  // namespace

std::string ModelConfigToJson(const ModelConfig& config) {
  const ModelFamilySpec* family = FindModelFamily(config.model_type);
  if (family != nullptr && family->wrapped != nullptr) {
    ModelConfig text_config = config;
    text_config.model_type = std::string(family->wrapped->text_model_type);
    json out = {{"model_type", config.model_type},
                {"architectures", {std::string(family->architectures.front())}},
                {"text_config", json::parse(ModelConfigToJson(text_config))},
                {"tie_word_embeddings", config.tie_word_embeddings},
                {"torch_dtype", std::string(StoredDtypeName(config.dtype))}};
    out["text_config"].erase("architectures");
    return out.dump(2) + "\n";
  }
  json out;
  out["model_type"] = config.model_type;
  if (family != nullptr) {
    out["architectures"] = {std::string(family->architectures.front())};
  }
  out["vocab_size"] = config.vocab_size;
  out["hidden_size"] = config.hidden_size;
  out["intermediate_size"] = config.intermediate_size;
  out["num_hidden_layers"] = config.num_hidden_layers;
  out["num_attention_heads"] = config.num_attention_heads;
  out["num_key_value_heads"] = config.num_key_value_heads;
  out["head_dim"] = config.head_dim;
  out["max_position_embeddings"] = config.max_position_embeddings;
  out["rms_norm_eps"] = config.rms_norm_eps;
  out["hidden_act"] =
      config.activation == MlpActivation::kSilu ? "silu" : "gelu_pytorch_tanh";
  if (config.sliding_rope.has_value()) {
    out["rope_parameters"] = {
        {"full_attention", RopeToJson(config.rope)},
        {"sliding_attention", RopeToJson(*config.sliding_rope)}};
  } else {
    out["rope_theta"] = config.rope.theta;
    out["rope_scaling"] = RopeToJson(config.rope);
    if (config.rope.type == RopeType::kDefault) out["rope_scaling"] = nullptr;
  }
  out["sliding_window"] = config.sliding_window.has_value()
                              ? json(*config.sliding_window)
                              : json(nullptr);
  if (!config.sliding_layers.empty()) {
    json types = json::array();
    for (bool sliding : config.sliding_layers) {
      types.push_back(sliding ? "sliding_attention" : "full_attention");
    }
    out["layer_types"] = types;
  }
  out["tie_word_embeddings"] = config.tie_word_embeddings;
  if (family != nullptr) family->write(config, out);
  out["torch_dtype"] = std::string(StoredDtypeName(config.dtype));
  if (config.bos_token_id) out["bos_token_id"] = *config.bos_token_id;
  if (config.eos_token_id) out["eos_token_id"] = *config.eos_token_id;
  if (config.pad_token_id) out["pad_token_id"] = *config.pad_token_id;
  return out.dump(2) + "\n";
}

}  // namespace loraplex
