// What sampling answers (plain values, no LibTorch): per sample the tokens,
// their logprobs and alternatives, why it stopped and its text.
#ifndef LORAPLEX_CORE_SAMPLE_SAMPLE_OUTPUT_H_
#define LORAPLEX_CORE_SAMPLE_SAMPLE_OUTPUT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace loraplex {

struct TokenLogprob {
  int64_t id = 0;
  double logprob = 0;
};

enum class StopReason {
  kLength,      // max_tokens generated.
  kStopToken,   // A token of stop_token_ids (kept as the last token).
  kStopString,  // The text reached one of the stop strings.
};

struct GeneratedSample {
  std::vector<int64_t> tokens;
  // log p(token) under the model, per generated token (log_softmax of the
  // fp32 logits, before temperature and filtering).
  std::vector<double> logprobs;
  // params.top_logprobs alternatives per generated token.
  std::vector<std::vector<TokenLogprob>> top;
  StopReason stop_reason = StopReason::kLength;
  // The generated text (with a tokenizer), cut before a matched stop string.
  std::string text;
};

struct SampleResult {
  // log p(prompt[t] | prompt[:t]) for t >= 1 (when params.prompt_logprobs).
  std::vector<double> prompt_logprobs;
  std::vector<GeneratedSample> samples;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_SAMPLE_SAMPLE_OUTPUT_H_
