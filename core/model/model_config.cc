#include "core/model/model_config.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

using nlohmann::json;

struct FamilyRow {
  ModelFamily family;
  absl::string_view model_type;
  absl::string_view architecture;
};

constexpr FamilyRow kFamilies[] = {
    {ModelFamily::kLlama, "llama", "LlamaForCausalLM"},
    {ModelFamily::kQwen2, "qwen2", "Qwen2ForCausalLM"},
    {ModelFamily::kMistral, "mistral", "MistralForCausalLM"},
};

// Bound on every size in a config, far above any real model; it keeps
// products such as heads * head_dim well inside int64.
constexpr int64_t kMaxSize = int64_t{1} << 24;

// Reads config fields with uniform error messages: "<label>: <key> ...".
class ConfigReader {
 public:
  ConfigReader(const json& root, const std::string& label)
      : root_(root), label_(label) {}

  bool Has(const char* key) const {
    return root_.contains(key) && !root_[key].is_null();
  }

  absl::Status Error(const std::string& key, const std::string& reason) const {
    return absl::InvalidArgumentError(
        absl::StrCat(label_, ": ", key, " ", reason));
  }

  absl::StatusOr<int64_t> PositiveInt(const char* key) const {
    if (!Has(key)) return Error(key, "is required");
    return PositiveIntValue(root_[key], key);
  }

  absl::StatusOr<int64_t> PositiveInt(const char* key,
                                      int64_t default_value) const {
    if (!Has(key)) return default_value;
    return PositiveIntValue(root_[key], key);
  }

  absl::StatusOr<int64_t> PositiveIntValue(const json& value,
                                           const std::string& key) const {
    if (!value.is_number_integer() || value.get<int64_t>() <= 0 ||
        value.get<int64_t>() > kMaxSize) {
      return Error(key, absl::StrCat("must be a positive integer of at most ",
                                     kMaxSize, ", got ", DescribeJson(value)));
    }
    return value.get<int64_t>();
  }

  absl::StatusOr<double> PositiveNumber(const json& object, const char* key,
                                        double default_value,
                                        const std::string& where) const {
    if (!object.contains(key) || object[key].is_null()) return default_value;
    const json& value = object[key];
    if (!value.is_number() || value.get<double>() <= 0) {
      return Error(where + key, absl::StrCat("must be a positive number, got ",
                                             DescribeJson(value)));
    }
    return value.get<double>();
  }

  absl::StatusOr<bool> Bool(const char* key, bool default_value) const {
    if (!Has(key)) return default_value;
    if (!root_[key].is_boolean()) {
      return Error(key, absl::StrCat("must be true or false, got ",
                                     DescribeJson(root_[key])));
    }
    return root_[key].get<bool>();
  }

  // Token ids may be an int or a list of ints (the first is used).
  absl::StatusOr<std::optional<int64_t>> TokenId(const char* key) const {
    if (!Has(key)) return std::optional<int64_t>();
    json value = root_[key];
    if (value.is_array() && !value.empty()) value = value[0];
    if (!value.is_number_integer() || value.get<int64_t>() < 0) {
      return Error(key, absl::StrCat("must be a non-negative integer, got ",
                                     DescribeJson(root_[key])));
    }
    return std::optional<int64_t>(value.get<int64_t>());
  }

  const json& root() const { return root_; }

 private:
  const json& root_;
  const std::string& label_;
};

absl::Status ParseRope(const ConfigReader& reader, ModelConfig& config) {
  const json& root = reader.root();
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
      config.rope.theta,
      reader.PositiveNumber(reader.Has("rope_theta") ? root : scaling,
                            "rope_theta", 10000.0,
                            reader.Has("rope_theta") ? "" : where));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (scaling.contains(key) && scaling[key].is_string()) {
      type = scaling[key].get<std::string>();
      break;
    }
  }
  if (scaling.contains("partial_rotary_factor") &&
      scaling["partial_rotary_factor"] != 1.0) {
    return reader.Error(where + "partial_rotary_factor",
                        "other than 1.0 is not supported");
  }
  if (type == "default") {
    config.rope.type = RopeType::kDefault;
    return absl::OkStatus();
  }
  if (type != "linear" && type != "llama3") {
    return reader.Error(
        where + "rope_type",
        absl::StrCat("\"", type,
                     "\" is not supported (supported: default, linear, "
                     "llama3)"));
  }
  LORAPLEX_ASSIGN_OR_RETURN(config.rope.factor,
                            reader.PositiveNumber(scaling, "factor", 0, where));
  if (config.rope.factor <= 0) {
    return reader.Error(where + "factor", "is required for rope_type " + type);
  }
  if (type == "linear") {
    config.rope.type = RopeType::kLinear;
    return absl::OkStatus();
  }
  config.rope.type = RopeType::kLlama3;
  LORAPLEX_ASSIGN_OR_RETURN(
      config.rope.low_freq_factor,
      reader.PositiveNumber(scaling, "low_freq_factor", 1.0, where));
  LORAPLEX_ASSIGN_OR_RETURN(
      config.rope.high_freq_factor,
      reader.PositiveNumber(scaling, "high_freq_factor", 4.0, where));
  if (config.rope.high_freq_factor <= config.rope.low_freq_factor) {
    return reader.Error(where + "high_freq_factor",
                        "must be larger than low_freq_factor");
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      double original,
      reader.PositiveNumber(scaling, "original_max_position_embeddings", 8192,
                            where));
  config.rope.original_max_position_embeddings = static_cast<int64_t>(original);
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

absl::Status ParseFamily(const ConfigReader& reader, ModelConfig& config) {
  if (!reader.Has("model_type") || !reader.root()["model_type"].is_string()) {
    return reader.Error("model_type", "is required (llama, qwen2 or mistral)");
  }
  const std::string model_type = reader.root()["model_type"];
  const FamilyRow* row = nullptr;
  for (const FamilyRow& candidate : kFamilies) {
    if (candidate.model_type == model_type) row = &candidate;
  }
  if (row == nullptr) {
    return reader.Error("model_type",
                        absl::StrCat("\"", model_type,
                                     "\" is not supported (supported: llama, "
                                     "qwen2, mistral)"));
  }
  config.family = row->family;
  if (reader.Has("architectures")) {
    const json& archs = reader.root()["architectures"];
    if (!archs.is_array())
      return reader.Error("architectures", "must be a list");
    for (const json& arch : archs) {
      if (!arch.is_string() || arch.get<std::string>() != row->architecture) {
        return reader.Error("architectures",
                            absl::StrCat("entry ", DescribeJson(arch),
                                         " is not supported with "
                                         "model_type \"",
                                         model_type, "\" (expected \"",
                                         row->architecture, "\")"));
      }
    }
  }
  return absl::OkStatus();
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

absl::Status ParseBiasesAndWindow(const ConfigReader& reader,
                                  ModelConfig& config) {
  switch (config.family) {
    case ModelFamily::kLlama: {
      LORAPLEX_ASSIGN_OR_RETURN(bool attention_bias,
                                reader.Bool("attention_bias", false));
      config.qkv_bias = attention_bias;
      config.o_bias = attention_bias;
      LORAPLEX_ASSIGN_OR_RETURN(config.mlp_bias,
                                reader.Bool("mlp_bias", false));
      break;
    }
    case ModelFamily::kQwen2: {
      config.qkv_bias = true;
      LORAPLEX_ASSIGN_OR_RETURN(bool windowed,
                                reader.Bool("use_sliding_window", false));
      if (windowed) {
        return reader.Error("use_sliding_window",
                            "true is not supported for qwen2");
      }
      break;
    }
    case ModelFamily::kMistral:
      if (reader.Has("sliding_window")) {
        LORAPLEX_ASSIGN_OR_RETURN(int64_t window,
                                  reader.PositiveInt("sliding_window"));
        config.sliding_window = window;
      }
      break;
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view ModelFamilyName(ModelFamily family) {
  for (const FamilyRow& row : kFamilies) {
    if (row.family == family) return row.model_type;
  }
  return "unknown";
}

namespace {

absl::StatusOr<ModelConfig> ModelConfigFromJson(const json& root,
                                                const std::string& label) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": must be a JSON object"));
  }
  ConfigReader reader(root, label);
  ModelConfig config;
  LORAPLEX_RETURN_IF_ERROR(ParseFamily(reader, config));
  if (auto it = root.find("_name_or_path");
      it != root.end() && it->is_string()) {
    config.name_or_path = it->get<std::string>();
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
  if (reader.Has("hidden_act") && root["hidden_act"] != "silu") {
    return reader.Error("hidden_act",
                        absl::StrCat("must be \"silu\", got ",
                                     DescribeJson(root["hidden_act"])));
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      config.rms_norm_eps,
      reader.PositiveNumber(root, "rms_norm_eps", 1e-6, ""));
  LORAPLEX_RETURN_IF_ERROR(ParseRope(reader, config));
  LORAPLEX_ASSIGN_OR_RETURN(config.tie_word_embeddings,
                            reader.Bool("tie_word_embeddings", false));
  LORAPLEX_RETURN_IF_ERROR(ParseBiasesAndWindow(reader, config));
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

std::string ModelConfigToJson(const ModelConfig& config) {
  json out;
  for (const FamilyRow& row : kFamilies) {
    if (row.family == config.family) {
      out["model_type"] = row.model_type;
      out["architectures"] = {row.architecture};
    }
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
  out["hidden_act"] = "silu";
  out["rope_theta"] = config.rope.theta;
  switch (config.rope.type) {
    case RopeType::kDefault:
      out["rope_scaling"] = nullptr;
      break;
    case RopeType::kLinear:
      out["rope_scaling"] = {{"rope_type", "linear"},
                             {"factor", config.rope.factor}};
      break;
    case RopeType::kLlama3:
      out["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", config.rope.factor},
                             {"low_freq_factor", config.rope.low_freq_factor},
                             {"high_freq_factor", config.rope.high_freq_factor},
                             {"original_max_position_embeddings",
                              config.rope.original_max_position_embeddings}};
      break;
  }
  out["tie_word_embeddings"] = config.tie_word_embeddings;
  if (config.family == ModelFamily::kLlama) {
    out["attention_bias"] = config.qkv_bias;
    out["mlp_bias"] = config.mlp_bias;
  }
  if (config.family == ModelFamily::kMistral) {
    out["sliding_window"] = config.sliding_window.has_value()
                                ? json(*config.sliding_window)
                                : json(nullptr);
  }
  out["torch_dtype"] = std::string(StoredDtypeName(config.dtype));
  if (config.bos_token_id) out["bos_token_id"] = *config.bos_token_id;
  if (config.eos_token_id) out["eos_token_id"] = *config.eos_token_id;
  if (config.pad_token_id) out["pad_token_id"] = *config.pad_token_id;
  return out.dump(2) + "\n";
}

}  // namespace loraplex
