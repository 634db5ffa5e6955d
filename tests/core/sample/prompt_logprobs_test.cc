// Prompt logprobs of prompts longer than one chunk of positions (the
// generator computes their logits kPromptLogprobChunk = 1024 positions at a
// time) equal, position by position, log_softmax of the logits of one full
// LlamaModel::Forward over the prompt: in fp64, up to rounding, for prompts
// that end in a partial chunk, in exactly one chunk, left-padded beside a
// longer one, and with an adapter on the LM head.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/lora/lora_weights.h"
#include "core/lora/multi_lora.h"
#include "core/model/llama_model.h"
#include "core/sample/batch_generator.h"
#include "tests/common/tiny_model.h"

namespace loraplex {
namespace {

// fp64 rounding of the same math grouped differently (a cached, padded
// prefill against one unpadded forward), relative to the logprob.
constexpr double kRelativeTolerance = 1e-10;

// BOS, then `length - 1` pseudo-random bytes.
std::vector<int64_t> Prompt(int64_t length, uint64_t seed) {
  std::vector<int64_t> prompt = {256};
  uint64_t state = seed;
  while (static_cast<int64_t>(prompt.size()) < length) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    prompt.push_back(static_cast<int64_t>((state >> 33) % 256));
  }
  return prompt;
}

// log p(prompt[t] | prompt[:t]) for t >= 1 from one Forward over the whole
// prompt (`adapter` applied when not null).
std::vector<double> ForwardLogprobs(const LlamaModel& model,
                                    const std::vector<int64_t>& prompt,
                                    const LoraWeights* adapter) {
  const int64_t length = static_cast<int64_t>(prompt.size());
  torch::NoGradGuard no_grad;
  const MultiLoraDelta delta({{.weights = adapter, .rows = 1}});
  absl::StatusOr<torch::Tensor> logits =
      model.Forward(torch::tensor(prompt, torch::kInt64).unsqueeze(0),
                    torch::tensor({length}, torch::kInt64),
                    adapter != nullptr ? &delta : nullptr);
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (!logits.ok()) return {};
  EXPECT_EQ(logits->scalar_type(), torch::kFloat64);
  torch::Tensor logprobs =
      torch::log_softmax((*logits)[0].narrow(0, 0, length - 1), -1);
  torch::Tensor next = torch::tensor(
      std::vector<int64_t>(prompt.begin() + 1, prompt.end()), torch::kInt64);
  torch::Tensor picked =
      logprobs.gather(1, next.unsqueeze(1)).squeeze(1).contiguous();
  return std::vector<double>(picked.data_ptr<double>(),
                             picked.data_ptr<double>() + length - 1);
}

TEST(PromptLogprobsTest, ChunkedPromptLogprobsEqualOneFullForward) {
  const LlamaModel& model = TinyModel64();
  ASSERT_EQ(model.dtype(), torch::kFloat64);
  ASSERT_GE(model.config().max_position_embeddings, 1500);

  // An adapter on attention and the LM head, with B drawn away from PEFT's
  // zeros so that it changes every logit.
  LoraWeights adapter(model.config(), torch::kCPU, torch::kFloat64);
  LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.targets = {Projection::kQ, Projection::kV, Projection::kLmHead};
  ASSERT_TRUE(adapter.Bind(lora).ok());
  adapter.InitPeft(11);
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(5);
    for (const LoraModule& module : adapter.modules()) {
      module.b.copy_(torch::randn(module.b.sizes(), torch::kFloat64) * 0.1);
    }
  }

  struct Case {
    std::string what;
    std::vector<int64_t> prompt;
    const LoraWeights* adapter;
  };
  // 1499 positions: a full chunk and a partial one; 1024 positions: exactly
  // one chunk; 1099 positions left-padded beside the longest, adapted.
  const std::vector<Case> cases = {
      {"1500 tokens, base", Prompt(1500, 1), nullptr},
      {"1025 tokens, base", Prompt(1025, 2), nullptr},
      {"1100 tokens, adapter", Prompt(1100, 3), &adapter},
  };
  std::vector<SampleRequest> requests;
  for (const Case& c : cases) {
    SampleRequest request;
    request.prompt = c.prompt;
    request.adapter = c.adapter;
    request.params.temperature = 0;
    request.params.max_tokens = 1;
    request.params.prompt_logprobs = true;
    requests.push_back(request);
  }
  auto results = BatchGenerator::Generate(model, requests, nullptr);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), cases.size());

  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::vector<double> expected =
        ForwardLogprobs(model, c.prompt, c.adapter);
    const std::vector<double>& actual = (*results)[i].prompt_logprobs;
    ASSERT_EQ(expected.size(), c.prompt.size() - 1) << c.what;
    ASSERT_EQ(actual.size(), expected.size()) << c.what;
    for (size_t t = 0; t < expected.size(); ++t) {
      ASSERT_TRUE(std::isfinite(actual[t])) << c.what << " t=" << t + 1;
      const double relative = std::abs(actual[t] - expected[t]) /
                              std::max(1.0, std::abs(expected[t]));
      EXPECT_LE(relative, kRelativeTolerance)
          << c.what << " t=" << t + 1 << ": " << actual[t] << " vs "
          << expected[t];
    }
  }

  // The adapter changes the logprobs: the third case did not pass for the
  // base by accident.
  const std::vector<double> base =
      ForwardLogprobs(model, cases[2].prompt, nullptr);
  double largest_change = 0;
  for (size_t t = 0; t < base.size(); ++t) {
    largest_change = std::max(
        largest_change, std::abs(base[t] - (*results)[2].prompt_logprobs[t]));
  }
  EXPECT_GT(largest_change, 1e-3);
}

}  // namespace
}  // namespace loraplex
