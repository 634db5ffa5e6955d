// What a micro-batch's activations cost and what fits: the default token
// budget of a micro-batch (CoBatchOptions::token_budget) for the device the
// server trains on, the activation checkpointing a micro-batch needs
// (CheckpointPolicy), and the longest row that can train at all.
#ifndef LORAPLEX_CORE_TRAIN_TOKEN_BUDGET_H_
#define LORAPLEX_CORE_TRAIN_TOKEN_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/model/model_config.h"

namespace loraplex {

inline constexpr int64_t kCpuTokenBudget = 2048;
inline constexpr int64_t kMaxDefaultTokenBudget = 65536;

// The base's weights, in elements (every expert of a mixture's).
int64_t BaseParameterCount(const ModelConfig& config);
// The weights one token runs through: a mixture's top_k experts of each
// experts layer (and its whole router) instead of all of them. For a dense
// model BaseParameterCount.
int64_t ActiveParameterCount(const ModelConfig& config);

// Elements one token's activations keep per layer for the backward pass,
// as autograd saves them: the inputs and outputs of the two norms, the
// rotated queries, keys and values as attention takes them (repeated to
// every query head under grouped-query attention), the attention's output
// and its copy into o_proj, the MLP's gate, up, activated gate and their
// product (a mixture's experts: see the .cc; estimated, not measured).
// Measured with loraplex-bench-long-rows on dense models: this and
// SavedActivationElements are within 5% above what a step allocates.
int64_t SavedActivationsPerTokenPerLayer(const ModelConfig& config);

// On the CPU kCpuTokenBudget (on 2 cores as fast as no limit for the small
// model while bounding activation memory). On a GPU with
// `device_memory_bytes`: as many tokens as half the memory the base weights
// leave holds activations for (`element_bytes` each, the compute dtype's),
// rounded down to a power of two, within [kCpuTokenBudget,
// kMaxDefaultTokenBudget]; with layers 0, k, 2k, ... always checkpointed
// (k = checkpoint_every, CheckpointMode::kEvery) at what they keep then.
// `weight_bytes`: what the base's weights take on the device (-1: the whole
// base's, from the config; less for a base sharded over the ranks).
int64_t DefaultTokenBudget(const ModelConfig& config, bool on_gpu,
                           int64_t device_memory_bytes, int64_t element_bytes,
                           int64_t checkpoint_every = 0,
                           int64_t weight_bytes = -1);

// The memory one micro-batch's activations may take on a device of
// `memory_bytes` (GPU memory, or the host's for the CPU): three quarters of
// what the base's weights leave, the rest for the loss chunk's logits, the
// adapters and their optimizer state, the CUDA context and fragmentation;
// 0 when the weights leave nothing (no limit is then known).
// `weight_bytes` as for DefaultTokenBudget.
int64_t ActivationMemoryBytes(const ModelConfig& config, int64_t memory_bytes,
                              int64_t element_bytes, int64_t weight_bytes = -1);

// Elements a training step of `tokens` tokens holds at its peak with
// layers 0, k, 2k, ... checkpointed (k = checkpoint_every, 0: none;
// layer_checkpoint.h): a kept layer's SavedActivationsPerTokenPerLayer, a
// checkpointed layer's input (hidden_size), while a checkpointed layer is
// recomputed its whole activations once more, and beyond the layers the
// final norm's input and output and the gradients of the layer the
// backward pass is in (2·hidden + 2·intermediate + the query width).
int64_t SavedActivationElements(const ModelConfig& config, int64_t tokens,
                                int64_t checkpoint_every);

// When a micro-batch's decoder layers are checkpointed
// (ForwardOptions::checkpoint_every).
enum class CheckpointMode {
  kOff,    // Never: every layer keeps its activations.
  kAuto,   // Only a micro-batch whose saved activations would not fit
           // activation_bytes: every k-th layer with k as large as fits,
           // every layer when nothing less does.
  kEvery,  // Every micro-batch: layers 0, k, 2k, ... (k = every).
};

struct CheckpointPolicy {
  CheckpointMode mode = CheckpointMode::kAuto;
  int64_t every = 1;  // kEvery's k, >= 1.
  // kAuto: the bytes a micro-batch's saved activations may take; 0: no
  // limit known, never checkpoint.
  int64_t activation_bytes = 0;
  int64_t element_bytes = 4;  // Of the compute dtype.
};

// "off", "auto", "all" (every layer) or "every:K"; INVALID_ARGUMENT
// otherwise. The policy's other fields are left as given.
absl::Status ParseCheckpointMode(absl::string_view text,
                                 CheckpointPolicy* policy);
std::string CheckpointModeName(const CheckpointPolicy& policy);

// ForwardOptions::checkpoint_every for a micro-batch of `tokens` padded
// tokens.
int64_t CheckpointEveryFor(const CheckpointPolicy& policy,
                           const ModelConfig& config, int64_t tokens);

// The most tokens a row may have for a micro-batch of it alone to fit the
// policy's activation_bytes with the most checkpointing the policy allows
// (auto: every layer); 0 when activation_bytes is 0 (no limit known).
int64_t MaxRowTokens(const CheckpointPolicy& policy, const ModelConfig& config);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TRAIN_TOKEN_BUDGET_H_
