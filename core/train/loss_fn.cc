#include "core/train/loss_fn.h"

#include <cmath>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/enum_names.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

constexpr absl::string_view kClipLow = "clip_low_threshold";
constexpr absl::string_view kClipHigh = "clip_high_threshold";
constexpr absl::string_view kBeta = "beta";

std::set<absl::string_view> ConfigKeys(LossFn fn) {
  switch (fn) {
    case LossFn::kPpo:
    case LossFn::kCispo:
      return {kClipLow, kClipHigh};
    case LossFn::kDro:
      return {kBeta};
    case LossFn::kCrossEntropy:
    case LossFn::kImportanceSampling:
      return {};
  }
  return {};
}

// INVALID_ARGUMENT unless `values` has `expected` finite values.
absl::Status CheckValues(const std::vector<double>& values, size_t expected,
                         const std::string& field) {
  if (values.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", values.size(), " values for ", expected,
                     values.size() > expected ? " (too many)" : " (too few)"));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] is not a finite number"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAbsent(const std::vector<double>& values,
                         const std::string& field, LossFn fn) {
  if (values.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " is not an input of loss_fn \"", LossFnName(fn), "\""));
}

absl::Status CheckTokens(const std::vector<int64_t>& ids, int64_t vocab_size,
                         const std::string& field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] = ", ids[i],
                       " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view LossFnName(LossFn fn) {
  switch (fn) {
    case LossFn::kCrossEntropy:
      return "cross_entropy";
    case LossFn::kImportanceSampling:
      return "importance_sampling";
    case LossFn::kPpo:
      return "ppo";
    case LossFn::kCispo:
      return "cispo";
    case LossFn::kDro:
      return "dro";
  }
  return "unknown";
}

bool LossFnTakesWeights(LossFn fn) { return fn == LossFn::kCrossEntropy; }

bool LossFnTakesSamplerInputs(LossFn fn) { return fn != LossFn::kCrossEntropy; }

absl::StatusOr<LossFnSpec> LossFnSpecOf(
    absl::string_view name, const std::map<std::string, double>& config) {
  const std::optional<LossFn> fn =
      ParseEnumName(name, kAllLossFns, &LossFnName);
  if (!fn) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss_fn: unknown loss \"", name,
        "\" (known: ", EnumNameList(kAllLossFns, &LossFnName), ")"));
  }
  LossFnSpec spec;
  spec.fn = *fn;
  if (*fn == LossFn::kPpo) {
    spec.clip_low = 0.8;
    spec.clip_high = 1.2;
  } else if (*fn == LossFn::kCispo) {
    spec.clip_low = 0.0;
    spec.clip_high = 4.0;
  }
  const std::set<absl::string_view> keys = ConfigKeys(*fn);
  bool has_beta = false;
  for (const auto& [key, value] : config) {
    const std::string field = absl::StrCat("loss_fn_config.", key);
    if (keys.count(key) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " is not a setting of loss_fn \"", name, "\"",
                       keys.empty() ? " (it has none)" : ""));
    }
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must be a finite number"));
    }
    if (key == kClipLow) spec.clip_low = value;
    if (key == kClipHigh) spec.clip_high = value;
    if (key == kBeta) {
      spec.beta = value;
      has_beta = true;
    }
  }
  if (keys.count(kClipLow) > 0) {
    if (spec.clip_low < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loss_fn_config.", kClipLow, " must be >= 0 (the ratio is)"));
    }
    if (spec.clip_low > spec.clip_high) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loss_fn_config.", kClipLow, " (", spec.clip_low,
          ") must not exceed ", kClipHigh, " (", spec.clip_high, ")"));
    }
  }
  if (*fn == LossFn::kDro) {
    if (!has_beta) {
      return absl::InvalidArgumentError(
          "loss_fn_config.beta is required for loss_fn \"dro\"");
    }
    if (spec.beta < 0) {
      return absl::InvalidArgumentError("loss_fn_config.beta must be >= 0");
    }
  }
  return spec;
}

absl::Status ValidateDatum(const Datum& datum, const LossFnSpec& loss,
                           const DatumLimits& limits,
                           const std::string& prefix) {
  const int64_t n = datum.positions();
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "model_input has no tokens"));
  }
  if (limits.max_positions > 0 && n > limits.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "model_input has ", n, " tokens; the model takes at most ",
        limits.max_positions));
  }
  if (limits.max_row_tokens > 0 && n > limits.max_row_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "model_input has ", n,
                     " tokens; a row this server trains may have at most ",
                     limits.max_row_tokens,
                     " (its activation memory holds no more, with the server's "
                     "activation checkpointing)"));
  }
  LORAPLEX_RETURN_IF_ERROR(
      CheckTokens(datum.input_ids, limits.vocab_size, prefix + "model_input"));
  const int64_t k = datum.targets_per_position;
  const std::string inputs = prefix + "loss_fn_inputs.";
  if (k < 1 || k > limits.max_targets_per_position) {
    return absl::InvalidArgumentError(absl::StrCat(
        inputs, "target_tokens: ", k, " targets per position; 1 to ",
        limits.max_targets_per_position, " are allowed"));
  }
  if (k > 1 && loss.fn != LossFn::kCrossEntropy) {
    return absl::InvalidArgumentError(absl::StrCat(
        inputs, "target_tokens: ", k,
        " targets per position are for loss_fn \"cross_entropy\" only"));
  }
  if (static_cast<int64_t>(datum.target_tokens.size()) != n * k) {
    return absl::InvalidArgumentError(absl::StrCat(
        inputs, "target_tokens: ", datum.target_tokens.size(), " values for ",
        n, " input tokens", k > 1 ? absl::StrCat(" × ", k) : ""));
  }
  LORAPLEX_RETURN_IF_ERROR(CheckTokens(datum.target_tokens, limits.vocab_size,
                                       inputs + "target_tokens"));
  const size_t targets = static_cast<size_t>(n * k);
  LORAPLEX_RETURN_IF_ERROR(
      LossFnTakesWeights(loss.fn)
          ? CheckValues(datum.weights, targets, inputs + "weights")
          : CheckAbsent(datum.weights, inputs + "weights", loss.fn));
  for (const auto& [values, name] :
       {std::pair{&datum.sampler_logprobs, "logprobs"},
        std::pair{&datum.advantages, "advantages"}}) {
    LORAPLEX_RETURN_IF_ERROR(
        LossFnTakesSamplerInputs(loss.fn)
            ? CheckValues(*values, static_cast<size_t>(n), inputs + name)
            : CheckAbsent(*values, inputs + name, loss.fn));
  }
  return absl::OkStatus();
}

}  // namespace loraplex
