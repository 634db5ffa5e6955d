#include "core/train/token_budget.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace loraplex {
namespace {

int64_t HeadDim(const ModelConfig& config) {
  if (config.head_dim > 0) return config.head_dim;
  return config.num_attention_heads > 0
             ? config.hidden_size / config.num_attention_heads
             : 0;
}

}  // namespace

namespace {

// Elements of one layer's weights other than its MLP's.
int64_t AttentionParameterCount(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t q = config.num_attention_heads * HeadDim(config);
  const int64_t kv = config.num_key_value_heads * HeadDim(config);
  int64_t count = hidden * (q + 2 * kv) + q * hidden + 2 * hidden;
  if (config.qkv_bias) count += q + 2 * kv;
  if (config.o_bias) count += hidden;
  switch (config.qk_norm) {
    case QkNorm::kNone:
      break;
    case QkNorm::kPerHead:
      count += 2 * HeadDim(config);
      break;
    case QkNorm::kWholeProjection:
      count += q + kv;
      break;
  }
  if (config.norm_placement == NormPlacement::kSandwich) count += 2 * hidden;
  if (config.attention_sinks) count += config.num_attention_heads;
  return count;
}

// Elements of layer `layer`'s MLP, counting `experts` of a mixture's
// experts (and its whole router).
int64_t MlpParameterCount(const ModelConfig& config, int64_t layer,
                          int64_t experts) {
  const int64_t hidden = config.hidden_size;
  if (!LayerIsSparse(config, layer)) {
    const int64_t intermediate = config.intermediate_size;
    int64_t count = 3 * hidden * intermediate;
    if (config.mlp_bias) count += 2 * intermediate + hidden;
    return count;
  }
  const MoeConfig& moe = config.moe;
  int64_t expert = 3 * hidden * moe.intermediate_size;
  if (moe.expert_bias) expert += 2 * moe.intermediate_size + hidden;
  int64_t router = moe.num_experts * hidden;
  if (moe.router_bias) router += moe.num_experts;
  return experts * expert + router;
}

int64_t ParameterCount(const ModelConfig& config, bool active) {
  int64_t count = 0;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    count +=
        AttentionParameterCount(config) +
        MlpParameterCount(config, layer,
                          active ? config.moe.top_k : config.moe.num_experts);
  }
  const int64_t embeddings = config.vocab_size * config.hidden_size *
                             (config.tie_word_embeddings ? 1 : 2);
  return count + embeddings + config.hidden_size;
}

}  // namespace

int64_t BaseParameterCount(const ModelConfig& config) {
  return ParameterCount(config, /*active=*/false);
}

int64_t ActiveParameterCount(const ModelConfig& config) {
  return ParameterCount(config, /*active=*/true);
}

int64_t SavedActivationsPerTokenPerLayer(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t q = config.num_attention_heads * HeadDim(config);
  const int64_t kv = config.num_key_value_heads * HeadDim(config);
  const int64_t keys_values =
      config.num_key_value_heads < config.num_attention_heads ? 2 * q : 2 * kv;
  // A mixture's experts keep, per routed copy of a token, its input, the
  // gate_up output, the activation's two halves and output, the down
  // output and its weighted copy; the router its logits and
  // probabilities. The larger of a dense and an experts layer counts.
  int64_t mlp = HasDenseLayers(config) ? 4 * config.intermediate_size : 0;
  if (HasSparseLayers(config)) {
    const MoeConfig& moe = config.moe;
    // Adapted experts keep their inputs once more, in fp32 (twice a bf16
    // element), padded per (adapter, expert) group: counted at no padding.
    mlp = std::max(mlp, moe.top_k * (3 * hidden + 4 * moe.intermediate_size) +
                            2 * moe.num_experts +
                            2 * moe.top_k * (hidden + moe.intermediate_size));
  }
  return 4 * hidden + q + keys_values + 2 * q + mlp;
}

int64_t DefaultTokenBudget(const ModelConfig& config, bool on_gpu,
                           int64_t device_memory_bytes, int64_t element_bytes,
                           int64_t checkpoint_every, int64_t weight_bytes) {
  if (!on_gpu) return kCpuTokenBudget;
  const int64_t weights = weight_bytes >= 0
                              ? weight_bytes
                              : BaseParameterCount(config) * element_bytes;
  const int64_t per_token =
      SavedActivationElements(config, 1, checkpoint_every) * element_bytes;
  if (per_token <= 0 || device_memory_bytes <= weights) return kCpuTokenBudget;
  const int64_t fits = (device_memory_bytes - weights) / 2 / per_token;
  int64_t budget = kCpuTokenBudget;
  while (budget * 2 <= std::min(fits, kMaxDefaultTokenBudget)) budget *= 2;
  return budget;
}

int64_t ActivationMemoryBytes(const ModelConfig& config, int64_t memory_bytes,
                              int64_t element_bytes, int64_t weight_bytes) {
  const int64_t weights = weight_bytes >= 0
                              ? weight_bytes
                              : BaseParameterCount(config) * element_bytes;
  return memory_bytes > weights ? (memory_bytes - weights) / 4 * 3 : 0;
}

int64_t SavedActivationElements(const ModelConfig& config, int64_t tokens,
                                int64_t checkpoint_every) {
  const int64_t layers = config.num_hidden_layers;
  const int64_t full = SavedActivationsPerTokenPerLayer(config);
  const int64_t beyond_layers = 4 * config.hidden_size +
                                2 * config.intermediate_size +
                                config.num_attention_heads * HeadDim(config);
  if (checkpoint_every <= 0) return tokens * (layers * full + beyond_layers);
  const int64_t checkpointed =
      (layers + checkpoint_every - 1) / checkpoint_every;
  return tokens * ((layers - checkpointed) * full +
                   checkpointed * config.hidden_size + full + beyond_layers);
}

absl::Status ParseCheckpointMode(absl::string_view text,
                                 CheckpointPolicy* policy) {
  if (text == "off") {
    policy->mode = CheckpointMode::kOff;
  } else if (text == "auto") {
    policy->mode = CheckpointMode::kAuto;
  } else if (text == "all") {
    policy->mode = CheckpointMode::kEvery;
    policy->every = 1;
  } else {
    int64_t every = 0;
    absl::string_view k = text;
    if (!absl::ConsumePrefix(&k, "every:") || !absl::SimpleAtoi(k, &every) ||
        every < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "activation checkpointing must be off, auto, all or every:K with K "
          ">= 1, got \"",
          text, "\""));
    }
    policy->mode = CheckpointMode::kEvery;
    policy->every = every;
  }
  return absl::OkStatus();
}

std::string CheckpointModeName(const CheckpointPolicy& policy) {
  switch (policy.mode) {
    case CheckpointMode::kOff:
      return "off";
    case CheckpointMode::kAuto:
      return "auto";
    case CheckpointMode::kEvery:
      return policy.every == 1 ? "all" : absl::StrCat("every:", policy.every);
  }
  return "auto";
}

int64_t CheckpointEveryFor(const CheckpointPolicy& policy,
                           const ModelConfig& config, int64_t tokens) {
  switch (policy.mode) {
    case CheckpointMode::kOff:
      return 0;
    case CheckpointMode::kEvery:
      return std::max<int64_t>(1, policy.every);
    case CheckpointMode::kAuto:
      break;
  }
  if (policy.activation_bytes <= 0) return 0;
  auto fits = [&](int64_t every) {
    return SavedActivationElements(config, tokens, every) *
               policy.element_bytes <=
           policy.activation_bytes;
  };
  if (fits(0)) return 0;
  for (int64_t every = config.num_hidden_layers; every > 1; --every) {
    if (fits(every)) return every;
  }
  return 1;
}

int64_t MaxRowTokens(const CheckpointPolicy& policy,
                     const ModelConfig& config) {
  if (policy.activation_bytes <= 0) return 0;
  int64_t every = 1;
  if (policy.mode == CheckpointMode::kOff) every = 0;
  if (policy.mode == CheckpointMode::kEvery) every = policy.every;
  const int64_t per_token =
      SavedActivationElements(config, 1, every) * policy.element_bytes;
  return per_token > 0 ? policy.activation_bytes / per_token : 0;
}

}  // namespace loraplex
