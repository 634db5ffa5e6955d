#include "core/sample/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace loraplex {

absl::Status ValidateSamplingParams(const SamplingParams& params,
                                    int64_t prompt_tokens,
                                    const SamplingLimits& limits,
                                    const std::string& prefix) {
  auto bad = [&](const std::string& field, const std::string& reason) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, field, " ", reason));
  };
  if (prompt_tokens < 1) return bad("prompt", "must hold at least one token");
  if (params.max_tokens < 1 || params.max_tokens > limits.max_tokens) {
    return bad("max_tokens", absl::StrCat("must be in [1, ", limits.max_tokens,
                                          "], got ", params.max_tokens));
  }
  if (prompt_tokens + params.max_tokens > limits.max_positions) {
    return bad("max_tokens",
               absl::StrCat("plus the prompt's ", prompt_tokens,
                            " tokens must be at most the model's ",
                            limits.max_positions, " positions, got ",
                            params.max_tokens));
  }
  if (!std::isfinite(params.temperature) || params.temperature < 0 ||
      params.temperature > 100) {
    return bad("temperature",
               absl::StrCat("must be in [0, 100], got ", params.temperature));
  }
  if (!std::isfinite(params.top_p) || params.top_p <= 0 || params.top_p > 1) {
    return bad("top_p", absl::StrCat("must be in (0, 1], got ", params.top_p));
  }
  if (params.top_k < 0) {
    return bad("top_k",
               absl::StrCat("must be 0 (off) or positive, got ", params.top_k));
  }
  if (params.top_logprobs < 0 ||
      params.top_logprobs > limits.max_top_logprobs) {
    return bad("top_logprobs",
               absl::StrCat("must be in [0, ", limits.max_top_logprobs,
                            "], got ", params.top_logprobs));
  }
  for (size_t i = 0; i < params.stop_token_ids.size(); ++i) {
    const int64_t id = params.stop_token_ids[i];
    if (id < 0 || id >= limits.vocab_size) {
      return bad(
          absl::StrCat("stop_token_ids[", i, "]"),
          absl::StrCat("must be in [0, ", limits.vocab_size, "), got ", id));
    }
  }
  if (static_cast<int64_t>(params.stop.size()) > limits.max_stop_strings) {
    return bad("stop",
               absl::StrCat("may hold at most ", limits.max_stop_strings,
                            " strings, got ", params.stop.size()));
  }
  for (size_t i = 0; i < params.stop.size(); ++i) {
    const int64_t size = static_cast<int64_t>(params.stop[i].size());
    if (size == 0 || size > limits.max_stop_string_bytes) {
      return bad(absl::StrCat("stop[", i, "]"),
                 absl::StrCat("must hold 1 to ", limits.max_stop_string_bytes,
                              " bytes, got ", size));
    }
  }
  return absl::OkStatus();
}

size_t StopStringCut(const std::string& text,
                     const std::vector<std::string>& stops) {
  size_t cut = std::string::npos;
  size_t best_end = std::string::npos;
  for (const std::string& stop : stops) {
    const size_t at = text.find(stop);
    if (at == std::string::npos) continue;
    if (best_end == std::string::npos || at + stop.size() < best_end) {
      best_end = at + stop.size();
      cut = at;
    }
  }
  return cut;
}

}  // namespace loraplex
