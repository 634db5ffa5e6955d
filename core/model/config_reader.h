// Reads the keys of a Hugging Face config.json with uniform error messages
// ("<label>: <key> <reason>"), for the common parser (model_config.cc) and
// each model family's description (model_family.h).
//
//   ConfigReader reader(root, "dir/config.json");
//   LORAPLEX_ASSIGN_OR_RETURN(int64_t heads,
//                             reader.PositiveInt("num_attention_heads"));
#ifndef LORAPLEX_CORE_MODEL_CONFIG_READER_H_
#define LORAPLEX_CORE_MODEL_CONFIG_READER_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/model/model_config.h"

namespace loraplex {

class ConfigReader {
 public:
  // `root` and `label` must outlive the reader.
  ConfigReader(const nlohmann::json& root, const std::string& label)
      : root_(root), label_(label) {}

  // Present and not null.
  bool Has(const char* key) const;

  // INVALID_ARGUMENT "<label>: <key> <reason>".
  absl::Status Error(const std::string& key, const std::string& reason) const;

  absl::StatusOr<int64_t> PositiveInt(const char* key) const;
  absl::StatusOr<int64_t> PositiveInt(const char* key,
                                      int64_t default_value) const;
  absl::StatusOr<int64_t> PositiveIntValue(const nlohmann::json& value,
                                           const std::string& key) const;
  // object[key] (named `where` + key in errors), or the default when absent.
  absl::StatusOr<double> PositiveNumber(const nlohmann::json& object,
                                        const char* key, double default_value,
                                        const std::string& where) const;
  absl::StatusOr<bool> Bool(const char* key, bool default_value) const;
  // Token ids may be an int or a list of ints (the first is used).
  absl::StatusOr<std::optional<int64_t>> TokenId(const char* key) const;

  // An error unless `key` is absent, null or equal to `neutral` (a feature
  // this project does not implement, such as a logit softcap: refused, never
  // ignored).
  absl::Status RefuseUnlessNeutral(const char* key,
                                   const nlohmann::json& neutral,
                                   const std::string& why) const;

  const nlohmann::json& root() const { return root_; }
  const std::string& label() const { return label_; }

 private:
  const nlohmann::json& root_;
  const std::string& label_;
};

// Reads one RoPE settings object (rope_scaling or rope_parameters, or one
// layer type's entry of rope_parameters), named `where` in errors. Its
// rope_theta wins over `theta`, the value read elsewhere (4.x rope_theta).
// `head_dim` bounds the rotated dimensions (partial_rotary_factor) and the
// LongRoPE factors, one per rotated pair.
absl::StatusOr<RopeConfig> ParseRopeSettings(const ConfigReader& reader,
                                             const nlohmann::json& settings,
                                             const std::string& where,
                                             double theta, int64_t head_dim);

// Reads layer_types ("full_attention" / "sliding_attention" per layer) into
// config.sliding_layers, or, when absent, marks every `period`-th layer full
// and the others sliding (period 0: all full). Needs num_hidden_layers.
absl::Status ParseLayerTypes(const ConfigReader& reader, int64_t period,
                             ModelConfig& config);

// Reads attention_bias (default false): biases on q, k, v and o.
absl::Status ParseAttentionBias(const ConfigReader& reader,
                                ModelConfig& config);

// Reads sliding_window (a positive int, or null for none).
absl::Status ParseSlidingWindow(const ConfigReader& reader,
                                ModelConfig& config);

// Reads 5.x per-layer-type rope_parameters ({"full_attention": {...},
// "sliding_attention": {...}}) into config.rope and config.sliding_rope;
// false (and nothing read) when rope_parameters is not of that form.
absl::StatusOr<bool> ParsePerLayerTypeRope(const ConfigReader& reader,
                                           ModelConfig& config);

// Reads a mixture-of-experts model's sizes into config.moe: the number of
// experts (num_local_experts, which transformers 5 writes, or num_experts),
// num_experts_per_tok (at most the experts) and each expert's width from
// `width_key`. Refuses what no family here runs: shared experts, and a
// router aux loss that training would add (output_router_logits).
absl::Status ParseMoeSizes(const ConfigReader& reader, const char* width_key,
                           ModelConfig& config);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_CONFIG_READER_H_
