#include "core/train/token_budget.h"

#include <algorithm>

namespace loraplex {
namespace {

int64_t HeadDim(const ModelConfig& config) {
  if (config.head_dim > 0) return config.head_dim;
  return config.num_attention_heads > 0
             ? config.hidden_size / config.num_attention_heads
             : 0;
}

}  // namespace

int64_t BaseParameterCount(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t q = config.num_attention_heads * HeadDim(config);
  const int64_t kv = config.num_key_value_heads * HeadDim(config);
  const int64_t intermediate = config.intermediate_size;
  int64_t per_layer = hidden * (q + 2 * kv) + q * hidden +
                      3 * hidden * intermediate +
                      2 * hidden;  // The two RMSNorm weights.
  if (config.qkv_bias) per_layer += q + 2 * kv;
  if (config.o_bias) per_layer += hidden;
  if (config.mlp_bias) per_layer += 2 * intermediate + hidden;
  const int64_t embeddings =
      config.vocab_size * hidden * (config.tie_word_embeddings ? 1 : 2);
  return config.num_hidden_layers * per_layer + embeddings + hidden;
}

int64_t SavedActivationsPerTokenPerLayer(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t q = config.num_attention_heads * HeadDim(config);
  const int64_t kv = config.num_key_value_heads * HeadDim(config);
  // Norm inputs and outputs (2 each), q/k/v, attention output, o_proj's
  // output; gate, up, their product (down_proj's input).
  return 4 * hidden + q + 2 * kv + q + hidden + 3 * config.intermediate_size;
}

int64_t DefaultTokenBudget(const ModelConfig& config, bool on_gpu,
                           int64_t device_memory_bytes, int64_t element_bytes) {
  if (!on_gpu) return kCpuTokenBudget;
  const int64_t weights = BaseParameterCount(config) * element_bytes;
  const int64_t per_token = config.num_hidden_layers *
                            SavedActivationsPerTokenPerLayer(config) *
                            element_bytes;
  if (per_token <= 0 || device_memory_bytes <= weights) return kCpuTokenBudget;
  const int64_t fits = (device_memory_bytes - weights) / 2 / per_token;
  int64_t budget = kCpuTokenBudget;
  while (budget * 2 <= std::min(fits, kMaxDefaultTokenBudget)) budget *= 2;
  return budget;
}

}  // namespace loraplex
