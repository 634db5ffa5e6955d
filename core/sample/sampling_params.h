// How one sampling request draws its tokens (docs/DESIGN.md §11), as plain
// values validated once at the edge. No LibTorch here.
//
//   SamplingParams params{.max_tokens = 64, .temperature = 0.7, .seed = 1};
//   LORAPLEX_RETURN_IF_ERROR(ValidateSamplingParams(params, limits));
#ifndef LORAPLEX_CORE_SAMPLE_SAMPLING_PARAMS_H_
#define LORAPLEX_CORE_SAMPLE_SAMPLING_PARAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace loraplex {

struct SamplingParams {
  // Tokens to generate at most (the stop token included).
  int64_t max_tokens = 16;
  // 0: greedy (the most likely token, as transformers' do_sample=False).
  double temperature = 1.0;
  // Nucleus sampling: the smallest set of most likely tokens whose
  // probabilities add up to at least top_p. 1: off.
  double top_p = 1.0;
  // Only the top_k most likely tokens. 0: off.
  int64_t top_k = 0;
  // Seed of sample i's random stream (SplitMix64 of seed and i), so a
  // request draws the same tokens whatever else decodes beside it.
  uint64_t seed = 0;
  // A generated token in this list ends the sample (and is kept in it).
  std::vector<int64_t> stop_token_ids = {};
  // The sample ends at the first token that completes one of these strings
  // in the generated text; the returned text ends before the string.
  std::vector<std::string> stop = {};
  // Alternatives reported per generated position, most likely first.
  int64_t top_logprobs = 0;
  // Also report log p(prompt[t] | prompt[:t]) for t >= 1.
  bool prompt_logprobs = false;
};

// Bounds a server puts on requests.
struct SamplingLimits {
  int64_t vocab_size = 0;
  // Prompt plus generated tokens must fit the model's positions.
  int64_t max_positions = 0;
  int64_t max_tokens = 4096;
  int64_t max_top_logprobs = 20;
  int64_t max_stop_strings = 16;
  int64_t max_stop_string_bytes = 256;
};

// INVALID_ARGUMENT naming the field (with `prefix`, e.g. "sampling.") and
// the reason. `prompt_tokens` is the prompt's length.
absl::Status ValidateSamplingParams(const SamplingParams& params,
                                    int64_t prompt_tokens,
                                    const SamplingLimits& limits,
                                    const std::string& prefix = "");

// Where `text` is cut for `stops`: at the start of the stop string whose
// first occurrence ends first; npos when none occurs.
size_t StopStringCut(const std::string& text,
                     const std::vector<std::string>& stops);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_SAMPLE_SAMPLING_PARAMS_H_
