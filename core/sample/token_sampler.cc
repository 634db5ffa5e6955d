#include "core/sample/token_sampler.h"

#include <torch/torch.h>

#include <algorithm>

#include "core/common/split_mix.h"

namespace loraplex {

double UniformDraw(uint64_t stream, int64_t step) {
  const uint64_t bits =
      SplitMix64(stream ^ SplitMix64(static_cast<uint64_t>(step)));
  // The top 53 bits as a double in [0, 1).
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

uint64_t SampleStream(uint64_t seed, int64_t index) {
  return SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(index));
}

int64_t ChooseToken(const torch::Tensor& logits, const SamplingParams& params,
                    double u) {
  if (params.temperature == 0) return logits.argmax().item<int64_t>();
  torch::Tensor scaled = logits.to(torch::kFloat64) / params.temperature;
  // Stable, so equal logits keep id order.
  auto [values, ids] = scaled.sort(/*stable=*/true, /*dim=*/0,
                                   /*descending=*/true);
  int64_t keep = values.size(0);
  if (params.top_k > 0) keep = std::min(keep, params.top_k);
  torch::Tensor probs = torch::softmax(values.narrow(0, 0, keep), 0);
  if (params.top_p < 1) {
    torch::Tensor cumulative = probs.cumsum(0);
    // The first index whose running sum reaches top_p closes the nucleus.
    const int64_t reached =
        (cumulative < params.top_p).sum().item<int64_t>() + 1;
    keep = std::min(keep, reached);
    probs = probs.narrow(0, 0, keep);
  }
  const double* p = probs.contiguous().data_ptr<double>();
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += p[i];
  const double target = u * total;
  double running = 0;
  int64_t chosen = keep - 1;
  for (int64_t i = 0; i < keep; ++i) {
    running += p[i];
    if (target < running) {
      chosen = i;
      break;
    }
  }
  return ids[chosen].item<int64_t>();
}

std::vector<TokenLogprob> TopLogprobs(const torch::Tensor& logprobs,
                                      int64_t count) {
  std::vector<TokenLogprob> top;
  if (count <= 0) return top;
  auto [values, ids] = logprobs.to(torch::kFloat64).topk(count);
  top.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    top.push_back({ids[i].item<int64_t>(), values[i].item<double>()});
  }
  return top;
}

}  // namespace loraplex
