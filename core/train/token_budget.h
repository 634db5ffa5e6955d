// The default token budget of a micro-batch (CoBatchOptions::token_budget)
// for the device the server trains on.
#ifndef LORAPLEX_CORE_TRAIN_TOKEN_BUDGET_H_
#define LORAPLEX_CORE_TRAIN_TOKEN_BUDGET_H_

#include <cstdint>

#include "core/model/model_config.h"

namespace loraplex {

inline constexpr int64_t kCpuTokenBudget = 2048;
inline constexpr int64_t kMaxDefaultTokenBudget = 65536;

// The base's weights, in elements.
int64_t BaseParameterCount(const ModelConfig& config);

// Elements one token's activations keep per layer for the backward pass:
// the inputs of the seven projections and of the norms, the attention's
// q, k, v and output, the MLP's gate, up and their product.
int64_t SavedActivationsPerTokenPerLayer(const ModelConfig& config);

// On the CPU kCpuTokenBudget (on 2 cores as fast as no limit for the small
// model while bounding activation memory). On a GPU with
// `device_memory_bytes`: as many tokens as half the memory the base weights
// leave holds activations for (`element_bytes` each, the compute dtype's),
// rounded down to a power of two, within [kCpuTokenBudget,
// kMaxDefaultTokenBudget].
int64_t DefaultTokenBudget(const ModelConfig& config, bool on_gpu,
                           int64_t device_memory_bytes, int64_t element_bytes);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TRAIN_TOKEN_BUDGET_H_
