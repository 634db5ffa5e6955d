// A base-model family (Llama, Qwen3, OLMo 3, Gemma 3, ...) as a small
// description: the config.json model_type and architectures it accepts, and
// how its own keys set the architecture features of ModelConfig (norms,
// q/k norms, MLP activation, attention windows, RoPE per layer type). The
// decoder (llama_model.h), its weight names (model_weights.h) and the LoRA
// targets follow from those features, so a family is one file under
// core/model/families/ plus one line in model_families.cc:
//
//   const ModelFamilySpec* family = FindModelFamily("qwen3");
//   LORAPLEX_RETURN_IF_ERROR(family->parse(reader, config));
#ifndef LORAPLEX_CORE_MODEL_MODEL_FAMILY_H_
#define LORAPLEX_CORE_MODEL_MODEL_FAMILY_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/model/config_reader.h"
#include "core/model/model_config.h"

namespace loraplex {

// A multimodal model_type (gemma3: Gemma3ForConditionalGeneration) whose
// text model is trained alone: config.json nests the text model's keys
// under text_config, parsed by the family `text_model_type`; the vision
// tower and projector are loaded by nobody and refused in adapters.
struct WrappedTextModel {
  // The family that parses text_config, e.g. "gemma3_text".
  absl::string_view text_model_type;
  // JSON object of the text config class's defaults: transformers writes
  // only a sub-config's non-default keys, so text_config omits them.
  absl::string_view text_defaults;
  // Top-level keys that override text_config's (transformers reads them
  // from the outer config: tie_word_embeddings, dtype, token ids).
  std::vector<absl::string_view> top_level_keys;
  // Where the text model's tensors sit in a checkpoint: `model_prefix`
  // replaces the text model's leading "model." and `lm_head` its
  // "lm_head". The first is transformers 5's module path (PEFT exports use
  // it); the others are older layouts accepted on import.
  struct Layout {
    absl::string_view model_prefix;
    absl::string_view lm_head;
  };
  std::vector<Layout> layouts;
  // Prefixes of the other towers' tensors and modules (vision tower,
  // projector), in every layout: skipped in checkpoints, refused in
  // adapters.
  std::vector<absl::string_view> other_prefixes;
};

// A text model's tensor or module name ("model.layers.0.mlp.up_proj",
// "lm_head.weight") as `layout` stores it.
std::string WrappedName(const WrappedTextModel::Layout& layout,
                        absl::string_view name);

struct ModelFamilySpec {
  // config.json's model_type, e.g. "qwen3".
  absl::string_view model_type;
  // The architectures entry transformers writes (the first is written by
  // ModelConfigToJson), e.g. "Qwen3ForCausalLM"; config.json may name any.
  std::vector<absl::string_view> architectures;
  // Reads the family's own keys into `config` and sets its architecture
  // features. Runs after the keys every family shares were read (sizes,
  // heads, head_dim, rope, dtype, token ids, tie_word_embeddings).
  absl::Status (*parse)(const ConfigReader& reader, ModelConfig& config);
  // Writes the family's own keys of `config` (for ModelConfigToJson).
  void (*write)(const ModelConfig& config, nlohmann::json& out);
  // Whether the family's attention rotates only a leading fraction of each
  // head (partial_rotary_factor below 1); refused elsewhere.
  bool partial_rotary = false;
  // Set for a multimodal wrapper of a text family; parse and write are
  // then the text family's.
  const WrappedTextModel* wrapped = nullptr;
};

// The wrapper description of config.model_type, or nullptr for a text
// family.
const WrappedTextModel* WrappedTextModelOf(const ModelConfig& config);

// Every supported family, in a fixed order.
const std::vector<const ModelFamilySpec*>& ModelFamilies();

// The family with this model_type, or nullptr.
const ModelFamilySpec* FindModelFamily(absl::string_view model_type);

// "llama, qwen2, ...": the supported model_types, for error messages.
std::string SupportedModelTypes();

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_MODEL_FAMILY_H_
