// Token choice in closed form (greedy, temperature, top-k, top-p at known
// draws), the uniform draws, request validation, and seeded sampling: the
// same request draws the same tokens alone, twice, or beside other requests.
#include "core/sample/token_sampler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/model/llama_model.h"
#include "core/sample/batch_generator.h"
#include "core/sample/sampling_params.h"
#include "tests/common/golden_files.h"

namespace loraplex {
namespace {

// Probabilities 0.5, 0.3, 0.2 on ids 2, 0, 1.
torch::Tensor ThreeTokens() {
  return torch::tensor({std::log(0.3), std::log(0.2), std::log(0.5)},
                       torch::kFloat32);
}

TEST(TokenSamplerTest, GreedyTakesTheMostLikelyToken) {
  SamplingParams params{.temperature = 0};
  EXPECT_EQ(ChooseToken(ThreeTokens(), params, 0.99), 2);
  // Equal logits: the lowest id.
  EXPECT_EQ(ChooseToken(torch::tensor({1.0f, 3.0f, 3.0f}), params, 0.5), 1);
}

TEST(TokenSamplerTest, InvertsTheDistributionAtTheDraw) {
  SamplingParams params;  // temperature 1, no filters.
  // Sorted: id 2 (0.5), id 0 (0.3), id 1 (0.2).
  EXPECT_EQ(ChooseToken(ThreeTokens(), params, 0.0), 2);
  EXPECT_EQ(ChooseToken(ThreeTokens(), params, 0.49), 2);
  EXPECT_EQ(ChooseToken(ThreeTokens(), params, 0.51), 0);
  EXPECT_EQ(ChooseToken(ThreeTokens(), params, 0.79), 0);
  EXPECT_EQ(ChooseToken(ThreeTokens(), params, 0.81), 1);
  EXPECT_EQ(ChooseToken(ThreeTokens(), params, 0.999999), 1);
}

TEST(TokenSamplerTest, TemperatureSharpensTheDistribution) {
  // At temperature 0.5, p ∝ p², so: 0.25, 0.09, 0.04 over 0.38.
  SamplingParams params{.temperature = 0.5};
  EXPECT_EQ(ChooseToken(ThreeTokens(), params, 0.25 / 0.38 - 1e-6), 2);
  EXPECT_EQ(ChooseToken(ThreeTokens(), params, 0.25 / 0.38 + 1e-6), 0);
  EXPECT_EQ(ChooseToken(ThreeTokens(), params, 0.34 / 0.38 + 1e-6), 1);
}

TEST(TokenSamplerTest, TopKAndTopPRenormaliseWhatTheyKeep) {
  // top_k 2 keeps 0.5 and 0.3: id 2 below 0.625, then id 0.
  SamplingParams top_k{.top_k = 2};
  EXPECT_EQ(ChooseToken(ThreeTokens(), top_k, 0.62), 2);
  EXPECT_EQ(ChooseToken(ThreeTokens(), top_k, 0.63), 0);
  EXPECT_EQ(ChooseToken(ThreeTokens(), top_k, 0.999), 0);
  // top_p 0.6: 0.5 < 0.6, 0.8 >= 0.6, so ids 2 and 0 are kept.
  SamplingParams top_p{.top_p = 0.6};
  EXPECT_EQ(ChooseToken(ThreeTokens(), top_p, 0.999), 0);
  // top_p 0.5: the first token alone reaches it.
  SamplingParams first{.top_p = 0.5};
  EXPECT_EQ(ChooseToken(ThreeTokens(), first, 0.999), 2);
  // top_k 1 is greedy.
  SamplingParams one{.top_k = 1};
  EXPECT_EQ(ChooseToken(ThreeTokens(), one, 0.999), 2);
}

TEST(TokenSamplerTest, DrawsAreUniformAndPerStream) {
  double sum = 0;
  std::set<double> seen;
  for (int64_t step = 0; step < 20000; ++step) {
    const double u = UniformDraw(SampleStream(7, 0), step);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    seen.insert(u);
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
  EXPECT_EQ(seen.size(), 20000u);
  EXPECT_NE(SampleStream(7, 0), SampleStream(7, 1));
  EXPECT_NE(SampleStream(7, 0), SampleStream(8, 0));
  EXPECT_EQ(UniformDraw(SampleStream(7, 3), 5),
            UniformDraw(SampleStream(7, 3), 5));
}

TEST(SamplingParamsTest, ErrorsNameTheFieldAndTheReason) {
  SamplingLimits limits{.vocab_size = 100, .max_positions = 64};
  auto message = [&](SamplingParams params, int64_t prompt = 4) {
    return std::string(
        ValidateSamplingParams(params, prompt, limits, "sampling.").message());
  };
  EXPECT_EQ(message({}), "");
  EXPECT_EQ(message({.max_tokens = 0}),
            "sampling.max_tokens must be in [1, 4096], got 0");
  EXPECT_EQ(message({.max_tokens = 61}),
            "sampling.max_tokens plus the prompt's 4 tokens must be at most "
            "the model's 64 positions, got 61");
  EXPECT_EQ(message({.temperature = -1}),
            "sampling.temperature must be in [0, 100], got -1");
  EXPECT_EQ(message({.top_p = 0}), "sampling.top_p must be in (0, 1], got 0");
  EXPECT_EQ(message({.top_k = -2}),
            "sampling.top_k must be 0 (off) or positive, got -2");
  EXPECT_EQ(message({.top_logprobs = 21}),
            "sampling.top_logprobs must be in [0, 20], got 21");
  EXPECT_EQ(message({.stop_token_ids = {3, 100}}),
            "sampling.stop_token_ids[1] must be in [0, 100), got 100");
  EXPECT_EQ(message({.stop = {"ok", ""}}),
            "sampling.stop[1] must hold 1 to 256 bytes, got 0");
  EXPECT_EQ(message({}, 0), "sampling.prompt must hold at least one token");
}

std::unique_ptr<LlamaModel> LoadModel() {
  auto model =
      LlamaModel::Load(GoldenPath("llama_gqa"), {.dtype = torch::kFloat32});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

SampleRequest Seeded(uint64_t seed, int64_t n) {
  SampleRequest request;
  request.prompt = {5, 9, 11, 40};
  request.params.max_tokens = 12;
  request.params.temperature = 1.0;
  request.params.seed = seed;
  request.n = n;
  return request;
}

TEST(SeededSamplingTest, SameSeedSameTokensWhateverSharesTheBatch) {
  std::unique_ptr<LlamaModel> model = LoadModel();
  ASSERT_NE(model, nullptr);
  auto alone = BatchGenerator::Generate(*model, {Seeded(42, 3)}, nullptr);
  ASSERT_TRUE(alone.ok()) << alone.status();
  auto again = BatchGenerator::Generate(*model, {Seeded(42, 3)}, nullptr);
  ASSERT_TRUE(again.ok());
  SampleRequest other = Seeded(7, 2);
  other.prompt = {100, 3, 3, 3, 3, 3, 3, 3, 9};
  other.params.max_tokens = 5;
  SampleRequest greedy = Seeded(1, 1);
  greedy.params.temperature = 0;
  auto shared =
      BatchGenerator::Generate(*model, {other, Seeded(42, 3), greedy}, nullptr);
  ASSERT_TRUE(shared.ok()) << shared.status();
  std::set<std::vector<int64_t>> distinct;
  for (int64_t i = 0; i < 3; ++i) {
    const auto& tokens = (*alone)[0].samples[i].tokens;
    EXPECT_EQ(tokens.size(), 12u);
    EXPECT_EQ((*again)[0].samples[i].tokens, tokens) << i;
    EXPECT_EQ((*shared)[1].samples[i].tokens, tokens) << i;
    distinct.insert(tokens);
  }
  // The n samples come from different streams.
  EXPECT_EQ(distinct.size(), 3u);
  auto reseeded = BatchGenerator::Generate(*model, {Seeded(43, 1)}, nullptr);
  ASSERT_TRUE(reseeded.ok());
  EXPECT_NE((*reseeded)[0].samples[0].tokens, (*alone)[0].samples[0].tokens);
  EXPECT_EQ((*shared)[0].samples[0].tokens.size(), 5u);
}

TEST(SeededSamplingTest, ReportedLogprobsAreThoseOfThePlainModel) {
  // Sampled (not greedy) tokens: their logprobs equal log_softmax of one
  // forward pass over prompt + tokens.
  std::unique_ptr<LlamaModel> model = LoadModel();
  ASSERT_NE(model, nullptr);
  SampleRequest request = Seeded(5, 1);
  request.params.top_p = 0.9;
  request.params.top_k = 40;
  auto results = BatchGenerator::Generate(*model, {request}, nullptr);
  ASSERT_TRUE(results.ok()) << results.status();
  const GeneratedSample& sample = (*results)[0].samples[0];
  std::vector<int64_t> all = request.prompt;
  all.insert(all.end(), sample.tokens.begin(), sample.tokens.end());
  auto logits = model->Forward(
      torch::tensor(all, torch::kInt64).unsqueeze(0),
      torch::tensor({static_cast<int64_t>(all.size())}, torch::kInt64));
  ASSERT_TRUE(logits.ok());
  torch::Tensor logprobs = torch::log_softmax(logits->to(torch::kFloat64), -1);
  for (size_t t = 0; t < sample.tokens.size(); ++t) {
    const int64_t at = static_cast<int64_t>(request.prompt.size() + t) - 1;
    EXPECT_NEAR(sample.logprobs[t],
                logprobs[0][at][sample.tokens[t]].item<double>(), 1e-5)
        << t;
  }
}

TEST(SeededSamplingTest, ACancelledRequestLeavesTheOthersAsTheyWere) {
  std::unique_ptr<LlamaModel> model = LoadModel();
  ASSERT_NE(model, nullptr);
  SampleRequest other = Seeded(42, 2);
  other.prompt = {7, 8, 9};
  auto alone = BatchGenerator::Generate(*model, {other}, nullptr);
  ASSERT_TRUE(alone.ok()) << alone.status();
  auto generator =
      BatchGenerator::Start(*model, {Seeded(3, 2), other}, nullptr);
  ASSERT_TRUE(generator.ok()) << generator.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*generator)->Step().ok());
  (*generator)->Cancel(0);
  while (!(*generator)->done()) ASSERT_TRUE((*generator)->Step().ok());
  std::vector<SampleResult> results = (*generator)->TakeResults();
  for (const GeneratedSample& sample : results[0].samples) {
    EXPECT_EQ(sample.tokens.size(), 4u);  // The prefill's token + 3 steps.
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(results[1].samples[i].tokens, (*alone)[0].samples[i].tokens);
  }
}

}  // namespace
}  // namespace loraplex
