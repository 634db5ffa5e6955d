#include "core/model/config_reader.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

using nlohmann::json;

// Bound on every size in a config, far above any real model; it keeps
// products such as heads * head_dim well inside int64.
constexpr int64_t kMaxSize = int64_t{1} << 24;

}  // namespace

bool ConfigReader::Has(const char* key) const {
  return root_.contains(key) && !root_[key].is_null();
}

absl::Status ConfigReader::Error(const std::string& key,
                                 const std::string& reason) const {
  return absl::InvalidArgumentError(
      absl::StrCat(label_, ": ", key, " ", reason));
}

absl::StatusOr<int64_t> ConfigReader::PositiveInt(const char* key) const {
  if (!Has(key)) return Error(key, "is required");
  return PositiveIntValue(root_[key], key);
}

absl::StatusOr<int64_t> ConfigReader::PositiveInt(const char* key,
                                                  int64_t default_value) const {
  if (!Has(key)) return default_value;
  return PositiveIntValue(root_[key], key);
}

absl::StatusOr<int64_t> ConfigReader::PositiveIntValue(
    const json& value, const std::string& key) const {
  if (!value.is_number_integer() || value.get<int64_t>() <= 0 ||
      value.get<int64_t>() > kMaxSize) {
    return Error(key, absl::StrCat("must be a positive integer of at most ",
                                   kMaxSize, ", got ", DescribeJson(value)));
  }
  return value.get<int64_t>();
}

absl::StatusOr<double> ConfigReader::PositiveNumber(
    const json& object, const char* key, double default_value,
    const std::string& where) const {
  if (!object.contains(key) || object[key].is_null()) return default_value;
  const json& value = object[key];
  if (!value.is_number() || value.get<double>() <= 0) {
    return Error(where + key, absl::StrCat("must be a positive number, got ",
                                           DescribeJson(value)));
  }
  return value.get<double>();
}

absl::StatusOr<bool> ConfigReader::Bool(const char* key,
                                        bool default_value) const {
  if (!Has(key)) return default_value;
  if (!root_[key].is_boolean()) {
    return Error(key, absl::StrCat("must be true or false, got ",
                                   DescribeJson(root_[key])));
  }
  return root_[key].get<bool>();
}

absl::StatusOr<std::optional<int64_t>> ConfigReader::TokenId(
    const char* key) const {
  if (!Has(key)) return std::optional<int64_t>();
  json value = root_[key];
  if (value.is_array() && !value.empty()) value = value[0];
  if (!value.is_number_integer() || value.get<int64_t>() < 0) {
    return Error(key, absl::StrCat("must be a non-negative integer, got ",
                                   DescribeJson(root_[key])));
  }
  return std::optional<int64_t>(value.get<int64_t>());
}

absl::Status ConfigReader::RefuseUnlessNeutral(const char* key,
                                               const json& neutral,
                                               const std::string& why) const {
  if (!Has(key) || root_[key] == neutral) return absl::OkStatus();
  return Error(
      key, absl::StrCat(DescribeJson(root_[key]), " is not supported: ", why));
}

namespace {

// LongRoPE's factor lists, its original context and its attention factor,
// with transformers' defaults: the original context from the top level when
// the settings have none, and, without attention_factor,
// sqrt(1 + ln(s) / ln(original)) for s = factor (or max positions /
// original) above 1.
absl::StatusOr<RopeConfig> ParseLongRope(const ConfigReader& reader,
                                         const json& settings,
                                         const std::string& where,
                                         int64_t head_dim, RopeConfig rope) {
  rope.type = RopeType::kLongRope;
  const int64_t pairs = RotaryDim(rope, head_dim) / 2;
  for (auto [key, factors] : {std::pair<const char*, std::vector<double>*>{
                                  "short_factor", &rope.short_factor},
                              {"long_factor", &rope.long_factor}}) {
    auto it = settings.find(key);
    if (it == settings.end() || !it->is_array() || it->empty()) {
      return reader.Error(where + key,
                          "must be a non-empty list of numbers for "
                          "rope_type longrope");
    }
    for (const json& value : *it) {
      if (!value.is_number() || !(value.get<double>() > 0)) {
        return reader.Error(where + key, "must hold positive numbers only");
      }
      factors->push_back(value.get<double>());
    }
    if (static_cast<int64_t>(factors->size()) != pairs) {
      return reader.Error(
          where + key,
          absl::StrCat("must have ", pairs,
                       " entries (half the rotated head dimensions), got ",
                       factors->size()));
    }
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      int64_t top_original,
      reader.PositiveInt("original_max_position_embeddings", 4096));
  LORAPLEX_ASSIGN_OR_RETURN(
      double original,
      reader.PositiveNumber(settings, "original_max_position_embeddings",
                            static_cast<double>(top_original), where));
  rope.original_max_position_embeddings = static_cast<int64_t>(original);
  LORAPLEX_ASSIGN_OR_RETURN(
      int64_t max_positions,
      reader.PositiveInt("max_position_embeddings", 2048));
  LORAPLEX_ASSIGN_OR_RETURN(
      rope.factor, reader.PositiveNumber(
                       settings, "factor",
                       static_cast<double>(max_positions) / original, where));
  const double fallback =
      rope.factor <= 1.0
          ? 1.0
          : std::sqrt(1.0 + std::log(rope.factor) / std::log(original));
  LORAPLEX_ASSIGN_OR_RETURN(
      rope.attention_factor,
      reader.PositiveNumber(settings, "attention_factor", fallback, where));
  return rope;
}

// Whether the root's rope_parameters holds one settings object per layer
// type (transformers 5), as ParsePerLayerTypeRope reads it.
bool PerLayerTypeRope(const ConfigReader& reader) {
  if (!reader.Has("rope_parameters")) return false;
  const json& params = reader.root()["rope_parameters"];
  return params.is_object() && params.contains("full_attention");
}

// transformers' get_mscale: 0.1 · mscale · ln(factor) + 1, or 1 for factors
// up to 1.
double YarnMscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// YaRN's settings with transformers' (5.24) defaults: the original context
// from the top-level original_max_position_embeddings (one settings object
// only: standardize_rope_params moves it in over the settings' own), else
// the settings', else max_position_embeddings; beta_fast 32, beta_slow 1,
// truncate true; without attention_factor, get_mscale(factor, mscale) /
// get_mscale(factor, mscale_all_dim) when both are given, else
// get_mscale(factor).
absl::StatusOr<RopeConfig> ParseYarn(const ConfigReader& reader,
                                     const json& settings,
                                     const std::string& where,
                                     RopeConfig rope) {
  rope.type = RopeType::kYarn;
  LORAPLEX_ASSIGN_OR_RETURN(
      rope.factor, reader.PositiveNumber(settings, "factor", 0, where));
  if (rope.factor <= 0) {
    return reader.Error(where + "factor", "is required for rope_type yarn");
  }
  const bool per_layer_type = PerLayerTypeRope(reader);
  const std::string original_key = "original_max_position_embeddings";
  if (!per_layer_type && reader.Has(original_key.c_str())) {
    LORAPLEX_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                              reader.PositiveInt(original_key.c_str()));
  } else if (settings.contains(original_key) &&
             !settings[original_key].is_null()) {
    LORAPLEX_ASSIGN_OR_RETURN(
        rope.original_max_position_embeddings,
        reader.PositiveIntValue(settings[original_key], where + original_key));
  } else if (reader.Has("max_position_embeddings")) {
    LORAPLEX_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                              reader.PositiveInt("max_position_embeddings"));
  } else {
    return reader.Error(where + original_key,
                        "is required for rope_type yarn (or a top-level "
                        "max_position_embeddings)");
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      rope.beta_fast, reader.PositiveNumber(settings, "beta_fast", 32, where));
  LORAPLEX_ASSIGN_OR_RETURN(
      rope.beta_slow, reader.PositiveNumber(settings, "beta_slow", 1, where));
  if (rope.beta_fast < rope.beta_slow) {
    return reader.Error(
        where + "beta_fast",
        absl::StrCat("(", rope.beta_fast, ") must be at least beta_slow (",
                     rope.beta_slow, ")"));
  }
  if (settings.contains("truncate") && !settings["truncate"].is_null()) {
    if (!settings["truncate"].is_boolean()) {
      return reader.Error(where + "truncate",
                          absl::StrCat("must be true or false, got ",
                                       DescribeJson(settings["truncate"])));
    }
    rope.truncate = settings["truncate"].get<bool>();
  }
  if (per_layer_type && !rope.truncate) {
    // transformers 5.24 looks truncate up in rope_parameters itself, not in
    // the layer type's entry, so there it always truncates.
    return reader.Error(where + "truncate",
                        "false is not supported in per-layer-type "
                        "rope_parameters (transformers ignores it there)");
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      const double mscale, reader.PositiveNumber(settings, "mscale", 0, where));
  LORAPLEX_ASSIGN_OR_RETURN(
      const double mscale_all_dim,
      reader.PositiveNumber(settings, "mscale_all_dim", 0, where));
  const double fallback = mscale > 0 && mscale_all_dim > 0
                              ? YarnMscale(rope.factor, mscale) /
                                    YarnMscale(rope.factor, mscale_all_dim)
                              : YarnMscale(rope.factor, 1.0);
  LORAPLEX_ASSIGN_OR_RETURN(
      rope.attention_factor,
      reader.PositiveNumber(settings, "attention_factor", fallback, where));
  return rope;
}

}  // namespace

absl::StatusOr<RopeConfig> ParseRopeSettings(const ConfigReader& reader,
                                             const json& settings,
                                             const std::string& where,
                                             double theta, int64_t head_dim) {
  RopeConfig rope;
  LORAPLEX_ASSIGN_OR_RETURN(
      rope.theta, reader.PositiveNumber(settings, "rope_theta", theta, where));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (settings.contains(key) && settings[key].is_string()) {
      type = settings[key].get<std::string>();
      break;
    }
  }
  // Top-level (4.x) or in the settings (5.x); whether the family rotates a
  // fraction of each head is checked by the common parser.
  LORAPLEX_ASSIGN_OR_RETURN(
      const double top_partial,
      reader.PositiveNumber(reader.root(), "partial_rotary_factor", 1.0, ""));
  LORAPLEX_ASSIGN_OR_RETURN(
      rope.partial_rotary_factor,
      reader.PositiveNumber(settings, "partial_rotary_factor", top_partial,
                            where));
  if (rope.partial_rotary_factor > 1.0) {
    return reader.Error(where + "partial_rotary_factor", "must be at most 1");
  }
  const int64_t rotary_dim = RotaryDim(rope, head_dim);
  if (rotary_dim < 2 || rotary_dim % 2 != 0) {
    return reader.Error(
        where + "partial_rotary_factor",
        absl::StrCat("(", rope.partial_rotary_factor,
                     ") must rotate an even number of a head's ", head_dim,
                     " dimensions, got ", rotary_dim));
  }
  if (type == "default") return rope;
  if (type == "longrope") {
    return ParseLongRope(reader, settings, where, head_dim, rope);
  }
  if (type == "yarn") return ParseYarn(reader, settings, where, rope);
  if (type != "linear" && type != "llama3") {
    return reader.Error(
        where + "rope_type",
        absl::StrCat("\"", type,
                     "\" is not supported (supported: default, linear, "
                     "llama3, longrope, yarn)"));
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      rope.factor, reader.PositiveNumber(settings, "factor", 0, where));
  if (rope.factor <= 0) {
    return reader.Error(where + "factor", "is required for rope_type " + type);
  }
  if (type == "linear") {
    rope.type = RopeType::kLinear;
    return rope;
  }
  rope.type = RopeType::kLlama3;
  LORAPLEX_ASSIGN_OR_RETURN(
      rope.low_freq_factor,
      reader.PositiveNumber(settings, "low_freq_factor", 1.0, where));
  LORAPLEX_ASSIGN_OR_RETURN(
      rope.high_freq_factor,
      reader.PositiveNumber(settings, "high_freq_factor", 4.0, where));
  if (rope.high_freq_factor <= rope.low_freq_factor) {
    return reader.Error(where + "high_freq_factor",
                        "must be larger than low_freq_factor");
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      double original,
      reader.PositiveNumber(settings, "original_max_position_embeddings", 8192,
                            where));
  rope.original_max_position_embeddings = static_cast<int64_t>(original);
  return rope;
}

absl::Status ParseLayerTypes(const ConfigReader& reader, int64_t period,
                             ModelConfig& config) {
  const int64_t layers = config.num_hidden_layers;
  config.sliding_layers.assign(layers, false);
  if (!reader.Has("layer_types")) {
    for (int64_t i = 0; i < layers && period > 0; ++i) {
      config.sliding_layers[i] = (i + 1) % period != 0;
    }
    return absl::OkStatus();
  }
  const json& types = reader.root()["layer_types"];
  if (!types.is_array() || static_cast<int64_t>(types.size()) != layers) {
    return reader.Error("layer_types",
                        absl::StrCat("must be a list of num_hidden_layers (",
                                     layers, ") entries"));
  }
  for (int64_t i = 0; i < layers; ++i) {
    const json& type = types[i];
    if (type == "sliding_attention") {
      config.sliding_layers[i] = true;
    } else if (type != "full_attention") {
      return reader.Error(absl::StrCat("layer_types[", i, "]"),
                          absl::StrCat(DescribeJson(type),
                                       " is not supported (full_attention or "
                                       "sliding_attention)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseAttentionBias(const ConfigReader& reader,
                                ModelConfig& config) {
  LORAPLEX_ASSIGN_OR_RETURN(bool bias, reader.Bool("attention_bias", false));
  config.qkv_bias = bias;
  config.o_bias = bias;
  return absl::OkStatus();
}

absl::Status ParseSlidingWindow(const ConfigReader& reader,
                                ModelConfig& config) {
  if (!reader.Has("sliding_window")) {
    config.sliding_window.reset();
    return absl::OkStatus();
  }
  LORAPLEX_ASSIGN_OR_RETURN(int64_t window,
                            reader.PositiveInt("sliding_window"));
  config.sliding_window = window;
  return absl::OkStatus();
}

absl::StatusOr<bool> ParsePerLayerTypeRope(const ConfigReader& reader,
                                           ModelConfig& config) {
  if (!reader.Has("rope_parameters")) return false;
  const json& params = reader.root()["rope_parameters"];
  if (!params.is_object() || !params.contains("full_attention")) return false;
  for (const auto& [type, settings] : params.items()) {
    if (type != "full_attention" && type != "sliding_attention") {
      return reader.Error("rope_parameters." + type,
                          "is not a layer type (full_attention or "
                          "sliding_attention)");
    }
    if (!settings.is_object()) {
      return reader.Error("rope_parameters." + type, "must be an object");
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        RopeConfig rope,
        ParseRopeSettings(reader, settings, "rope_parameters." + type + ".",
                          config.rope.theta, config.head_dim));
    if (type == "full_attention") {
      config.rope = rope;
    } else {
      config.sliding_rope = rope;
    }
  }
  return true;
}

absl::Status ParseMoeSizes(const ConfigReader& reader, const char* width_key,
                           ModelConfig& config) {
  MoeConfig& moe = config.moe;
  const char* experts_key =
      reader.Has("num_local_experts") ? "num_local_experts" : "num_experts";
  LORAPLEX_ASSIGN_OR_RETURN(moe.num_experts, reader.PositiveInt(experts_key));
  LORAPLEX_ASSIGN_OR_RETURN(moe.top_k,
                            reader.PositiveInt("num_experts_per_tok"));
  if (moe.top_k > moe.num_experts) {
    return reader.Error(
        "num_experts_per_tok",
        absl::StrCat("must be at most ", experts_key, " (", moe.num_experts,
                     "), got ", moe.top_k));
  }
  LORAPLEX_ASSIGN_OR_RETURN(moe.intermediate_size,
                            reader.PositiveInt(width_key));
  for (const char* key : {"shared_expert_intermediate_size",
                          "n_shared_experts", "num_shared_experts"}) {
    LORAPLEX_RETURN_IF_ERROR(reader.RefuseUnlessNeutral(
        key, json(nullptr), "shared experts are not supported"));
  }
  return reader.RefuseUnlessNeutral(
      "output_router_logits", json(false),
      "the router's auxiliary loss is not supported (the router is frozen)");
}

}  // namespace loraplex
