// The Tinker API's bodies (tinker==0.38.0; JSON, and the protobuf of
// proto/tinker/tinker_public.proto) to loraplex's native requests (those
// the gRPC API's parse into too, checked by the same functions) and from
// their native results. Pure conversions: no HTTP, no state. Errors are
// INVALID_ARGUMENT naming the field ("data[1].loss_fn_inputs.weights: ...").
//
//   LORAPLEX_ASSIGN_OR_RETURN(ForwardBackwardInput input,
//                             TinkerForwardBackwardInput(tinker_request));
//   LORAPLEX_ASSIGN_OR_RETURN(
//       SessionRequest request,
//       SessionForwardBackwardOf(context, std::move(input)));
#ifndef LORAPLEX_SERVER_TINKER_TINKER_CONVERT_H_
#define LORAPLEX_SERVER_TINKER_TINKER_CONVERT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/lora/lora_config.h"
#include "core/optim/optimizer_config.h"
#include "core/sample/sample_output.h"
#include "core/train/loss_fn.h"
#include "nlohmann/json.hpp"
#include "server/edges/sampling_request.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_requests.h"
#include "tinker/tinker_public.pb.h"

namespace loraplex {

// LoRA alpha of the adapters Tinker clients create: the API has no field
// for it, and 32 is what Tinker-compatible servers assume.
inline constexpr double kTinkerLoraAlpha = 32.0;

// A forward_backward body as loraplex's native request (its model_id and
// seq_id are the caller's). Text chunks are concatenated into the input
// ids; `target_tokens` (int64) and `weights`, `logprobs`, `advantages`
// (float32) are read as dense [N] or [N, K] arrays, sparse CSR ones are
// expanded. The v2 loss config wins over the legacy one; text values are
// refused.
absl::StatusOr<ForwardBackwardInput> TinkerForwardBackwardInput(
    const tinker_public::ForwardBackwardRequest& request);

// Per datum, its targets per position (K; 1 for [N] targets), to shape
// the outputs like the inputs.
std::vector<int64_t> TargetsPerPosition(const std::vector<Datum>& data);

// A forward/backward result as the SDK reads it: one ArrayRecord with a
// float32 `logprobs` field per datum ([N] or [N, K]) and the metric
// "loss:sum".
void TinkerForwardBackwardOutput(const ForwardBackwardOutput& output,
                                 const std::vector<int64_t>& targets,
                                 tinker_public::ForwardBackwardOutput* out);

// create_model's lora_config: rank, seed and the train_attn / train_mlp /
// train_unembed switches (all on by default) as the targets.
absl::StatusOr<LoraConfig> TinkerLoraConfig(const nlohmann::json& lora_config,
                                            uint64_t* seed);

// create_model's optimizer_config: {"type": "adamw"} (the default, also
// when absent), "adam", "dimuon" / "muon" for loraplex's Muon (with
// "scalar_optimizer": "adamw" or "lion"), "lion", or "soap" (with
// "scalar_optimizer" and SOAP's "shampoo_beta", "precondition_frequency",
// "max_precond_dim", "power_iter_steps", "use_eigh", "max_update_rms").
absl::StatusOr<OptimizerConfig> TinkerOptimizerConfig(
    const nlohmann::json* optimizer_config);

// optim_step's adam_params (Tinker's defaults: lr 1e-4, betas 0.9 and
// 0.95, eps 1e-12) or optimizer_params ({"type": "dimuon",
// "learning_rate", "beta1" (momentum), "grad_clip_norm"}, or {"type":
// "lion", "learning_rate", "beta1", "beta2" (0.9, 0.99), "weight_decay",
// "grad_clip_norm"}, or {"type": "soap", "learning_rate", "beta1", "beta2"
// (0.9, 0.95), "eps" (1e-8), "weight_decay", "shampoo_beta" (else the
// session's), "grad_clip_norm"}). `family` is the session's: the SDK sends
// adam_params whatever the optimizer, and a SOAP session takes their betas
// as SOAP's (its Adam runs in the eigenbasis) and keeps its own eps (Tinker's
// 1e-12 would amplify rounding noise in directions the factors do not span).
absl::StatusOr<OptimStepParams> TinkerOptimStep(const nlohmann::json& request,
                                                OptimizerFamily family);

// An asample body as loraplex's native request (the base model's weights:
// the sampler's are the caller's). `stop`: absent keeps EOS; [] stops on
// nothing; strings or token ids stop on those and on EOS. top_k -1 is off.
absl::StatusOr<SamplingRequest> TinkerSamplingRequest(
    const nlohmann::json& request);

// A sampling result as the SDK reads it: tokens and per-token logprobs per
// sequence, "stop" or "length", and prompt logprobs with NaN first.
void TinkerSampleResponse(const SampleResult& result, bool prompt_logprobs,
                          tinker_public::SampleResponse* out);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TINKER_TINKER_CONVERT_H_
