// Picks the next token from one row of logits: greedy, or temperature with
// top-k and top-p, from a caller-supplied uniform draw so that a row's
// choices depend only on its own random stream (docs/DESIGN.md §11).
//
//   double u = UniformDraw(stream, step);
//   int64_t token = ChooseToken(logits_row, params, u);
#ifndef LORAPLEX_CORE_SAMPLE_TOKEN_SAMPLER_H_
#define LORAPLEX_CORE_SAMPLE_TOKEN_SAMPLER_H_

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "core/sample/sample_output.h"
#include "core/sample/sampling_params.h"

namespace loraplex {

// Draw `step` of the random stream `stream`, uniform in [0, 1), from
// SplitMix64 (no LibTorch generator, so draws are the same in every build).
double UniformDraw(uint64_t stream, int64_t step);

// The stream of sample `index` of a request seeded with `seed`.
uint64_t SampleStream(uint64_t seed, int64_t index);

// logits: [vocab] on the CPU. With temperature 0 the most likely token (the
// lowest id among equals); otherwise softmax(logits / temperature) cut to
// top_k then top_p, inverted at u (in fp64, most likely token first).
int64_t ChooseToken(const torch::Tensor& logits, const SamplingParams& params,
                    double u);

// The `count` most likely tokens of log-probabilities `logprobs` [vocab].
std::vector<TokenLogprob> TopLogprobs(const torch::Tensor& logprobs,
                                      int64_t count);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_SAMPLE_TOKEN_SAMPLER_H_
