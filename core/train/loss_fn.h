// The losses a client-driven forward/backward computes (Tinker's semantics,
// docs/DESIGN.md §12), and the data it computes them on, as plain values
// validated once at the edge. No LibTorch here.
//
// Notation per target token: p = the learner's log-probability of the
// target token, q = the sampler's (`logprobs`), A = `advantages`,
// r = exp(p - q). Every loss is a plain sum over all target tokens of all
// datums, with no normalisation (clients normalise through `weights` or
// `advantages`):
//
//   cross_entropy        Σ -w·p
//   importance_sampling  Σ -r·A
//   ppo                  Σ -min(r·A, clip(r, lo, hi)·A)
//   cispo                Σ -sg(clip(r, lo, hi))·A·p     (sg: no gradient)
//   dro                  Σ -(A·p - ½·β·(p - q)²)
//
//   LORAPLEX_ASSIGN_OR_RETURN(LossFnSpec loss,
//                             LossFnSpecOf("ppo", {{"clip_low_threshold",
//                             0.9}}));
//   LORAPLEX_RETURN_IF_ERROR(ValidateDatum(datum, loss, limits, "data[0]."));
#ifndef LORAPLEX_CORE_TRAIN_LOSS_FN_H_
#define LORAPLEX_CORE_TRAIN_LOSS_FN_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loraplex {

enum class LossFn {
  kCrossEntropy,
  kImportanceSampling,
  kPpo,
  kCispo,
  kDro,
};
inline constexpr std::array<LossFn, 5> kAllLossFns = {
    LossFn::kCrossEntropy, LossFn::kImportanceSampling, LossFn::kPpo,
    LossFn::kCispo, LossFn::kDro};

// "cross_entropy", "importance_sampling", "ppo", "cispo", "dro".
absl::string_view LossFnName(LossFn fn);

struct LossFnSpec {
  LossFn fn = LossFn::kCrossEntropy;
  // The ratio's clip bounds (ppo: 0.8 and 1.2; cispo: 0 and 4 by default).
  double clip_low = 0.0;
  double clip_high = 0.0;
  double beta = 0.0;  // dro's penalty weight (required).

  // Every field: token losses under equal specs may be computed together.
  bool operator==(const LossFnSpec& other) const {
    return fn == other.fn && clip_low == other.clip_low &&
           clip_high == other.clip_high && beta == other.beta;
  }
};

// The loss `name` with `config` (loss_fn_config: clip_low_threshold and
// clip_high_threshold for ppo and cispo, beta for dro). INVALID_ARGUMENT
// naming "loss_fn" or "loss_fn_config.<key>" for an unknown loss, a key the
// loss does not take, a value that is not finite, clip bounds with
// lo > hi or lo < 0, or a dro without beta.
absl::StatusOr<LossFnSpec> LossFnSpecOf(
    absl::string_view name, const std::map<std::string, double>& config);

// The loss_fn_inputs a loss reads: cross_entropy target_tokens and weights;
// the others target_tokens, logprobs and advantages.
bool LossFnTakesWeights(LossFn fn);
bool LossFnTakesSamplerInputs(LossFn fn);

// One sequence of a forward/backward call: `input_ids` (N tokens) run through
// the model, and position i's logits predict `target_tokens` (N·k values,
// k per position, row-major [N, k]; k > 1 only for cross_entropy, where the
// k targets of a position carry their own weights: distillation on top-k
// soft targets).
struct Datum {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> target_tokens;
  int64_t targets_per_position = 1;      // k.
  std::vector<double> weights;           // N·k (cross_entropy).
  std::vector<double> sampler_logprobs;  // N (the RL losses): q.
  std::vector<double> advantages;        // N (the RL losses): A.

  int64_t positions() const { return static_cast<int64_t>(input_ids.size()); }
};

// What a forward/backward call computed.
struct ForwardBackwardOutput {
  // Per datum, log p of each target token (N·k values, as target_tokens).
  std::vector<std::vector<double>> logprobs;
  double loss = 0.0;   // The sum over every target token of every datum.
  int64_t tokens = 0;  // Input tokens of all datums.
};

struct DatumLimits {
  int64_t vocab_size = 0;
  int64_t max_positions = 0;  // The model's max_position_embeddings.
  // Tokens one row may have for its backward pass to fit the server's
  // activation memory even with checkpointing (MaxRowTokens); 0: no limit.
  int64_t max_row_tokens = 0;
  int64_t max_targets_per_position = 20;
};

// INVALID_ARGUMENT naming the field (after `prefix`, e.g. "data[3].") and the
// reason: no tokens, more than max_positions, a token id outside the
// vocabulary, an input the loss needs missing or of the wrong length, one it
// does not take present, or a value that is not finite.
absl::Status ValidateDatum(const Datum& datum, const LossFnSpec& loss,
                           const DatumLimits& limits,
                           const std::string& prefix);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TRAIN_LOSS_FN_H_
