// The architecture description of a Llama-family base model.
//
// Parsed from a Hugging Face `config.json` (Llama, Qwen2 and Mistral layouts;
// both the 4.x `rope_theta`/`rope_scaling` keys and the 5.x `rope_parameters`
// key are understood) and validated, so that an unsupported or inconsistent
// checkpoint is rejected up front with the offending key in the message.
//
//   LORAPLEX_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
#ifndef LORAPLEX_CORE_MODEL_MODEL_CONFIG_H_
#define LORAPLEX_CORE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loraplex {

// Which Hugging Face layout a checkpoint uses. The three share module names
// and differ only in biases and attention windowing.
enum class ModelFamily {
  kLlama,    // model_type "llama": optional attention_bias / mlp_bias.
  kQwen2,    // model_type "qwen2": q/k/v projections always carry biases.
  kMistral,  // model_type "mistral": optional sliding-window attention.
};

// How rotary frequencies are derived from rope_theta.
enum class RopeType {
  kDefault,  // Plain RoPE.
  kLinear,   // Position interpolation: frequencies divided by `factor`.
  kLlama3,   // Llama 3.1 band-wise frequency scaling.
};

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;                              // kLinear and kLlama3.
  double low_freq_factor = 1.0;                     // kLlama3.
  double high_freq_factor = 4.0;                    // kLlama3.
  int64_t original_max_position_embeddings = 8192;  // kLlama3.
};

// How a checkpoint stores its weights (config.json's dtype / torch_dtype).
enum class StoredDtype {
  kFloat32,
  kBFloat16,
  kFloat16,  // Computed in float32 (see LlamaModel::Load).
};

// "float32", "bfloat16", "float16": config.json's spelling.
absl::string_view StoredDtypeName(StoredDtype dtype);

struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
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
  // Keys further back than this are hidden (Mistral); unset = full causal.
  std::optional<int64_t> sliding_window;
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

absl::string_view ModelFamilyName(ModelFamily family);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_MODEL_CONFIG_H_
