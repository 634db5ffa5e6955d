// The sampler against transformers + PEFT (tools/golden/
// make_sampling_golden.py): greedy tokens identical to `generate`, logprobs,
// top alternatives and prompt logprobs within 1e-4, for three base layouts
// (GQA, Qwen2 biases, Mistral's sliding window) and the later families
// (Qwen3-MoE's routed experts among them), adapters on attention, on every
// projection (the experts' stacked parameters on Qwen3-MoE) and on the LM
// head, rows of different adapters in one
// batch, and stop strings that end generation where transformers'
// stop_strings does.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "adapters/peft_adapter.h"
#include "core/model/llama_model.h"
#include "core/sample/batch_generator.h"
#include "core/tokenizer/load_tokenizer.h"
#include "tests/common/golden_files.h"

namespace loraplex {
namespace {

constexpr double kTolerance = 1e-4;

struct GoldenBase {
  std::unique_ptr<LlamaModel> model;
  std::map<std::string, std::unique_ptr<LoraWeights>> adapters;
  nlohmann::json golden;
};

GoldenBase LoadBase(const std::string& base) {
  GoldenBase loaded;
  auto model = LlamaModel::Load(GoldenPath(base), {.dtype = torch::kFloat32});
  EXPECT_TRUE(model.ok()) << model.status();
  loaded.model = std::move(*model);
  for (const char* name : {"adapter_a", "adapter_b", "adapter_c"}) {
    auto adapter = LoadPeftAdapter(GoldenPath("sampling/" + base + "/" + name),
                                   loaded.model->config());
    EXPECT_TRUE(adapter.ok()) << adapter.status();
    auto weights =
        std::make_unique<LoraWeights>(loaded.model->config(), torch::kCPU);
    EXPECT_TRUE(weights->Bind(adapter->config).ok());
    EXPECT_TRUE(CopyPeftAdapter(*adapter, *weights).ok());
    loaded.adapters[name] = std::move(weights);
  }
  loaded.golden = nlohmann::json::parse(
      ReadGoldenText(GoldenPath("sampling/" + base + "/greedy.json")));
  return loaded;
}

SampleRequest GreedyRequest(const GoldenBase& base,
                            const nlohmann::json& golden_case) {
  SampleRequest request;
  request.prompt = golden_case["prompt"].get<std::vector<int64_t>>();
  const std::string weights = golden_case["weights"];
  if (weights != "base") request.adapter = base.adapters.at(weights).get();
  request.params.temperature = 0;
  request.params.max_tokens = base.golden["max_new_tokens"];
  if (!base.golden["eos_token_id"].is_null()) {
    request.params.stop_token_ids = {base.golden["eos_token_id"]};
  }
  request.params.top_logprobs = 5;
  request.params.prompt_logprobs = true;
  return request;
}

void ExpectMatches(const SampleResult& result,
                   const nlohmann::json& golden_case, const std::string& what) {
  ASSERT_EQ(result.samples.size(), 1u) << what;
  const GeneratedSample& sample = result.samples[0];
  EXPECT_EQ(sample.tokens, golden_case["tokens"].get<std::vector<int64_t>>())
      << what;
  EXPECT_EQ(sample.stop_reason, golden_case["stop"] == "eos"
                                    ? StopReason::kStopToken
                                    : StopReason::kLength)
      << what;
  const auto logprobs = golden_case["logprobs"].get<std::vector<double>>();
  ASSERT_EQ(sample.logprobs.size(), logprobs.size()) << what;
  for (size_t t = 0; t < logprobs.size(); ++t) {
    EXPECT_NEAR(sample.logprobs[t], logprobs[t], kTolerance)
        << what << " t=" << t;
    const auto& top_ids = golden_case["top_ids"][t];
    const auto& top_logprobs = golden_case["top_logprobs"][t];
    ASSERT_EQ(sample.top[t].size(), top_ids.size()) << what;
    for (size_t k = 0; k < top_ids.size(); ++k) {
      EXPECT_NEAR(sample.top[t][k].logprob, top_logprobs[k].get<double>(),
                  kTolerance)
          << what << " t=" << t << " k=" << k;
      // Ids may swap only between alternatives that are equally likely
      // within the tolerance.
      if (sample.top[t][k].id != top_ids[k].get<int64_t>()) {
        EXPECT_LT(std::abs(top_logprobs[k].get<double>() -
                           top_logprobs[k == 0 ? 1 : k - 1].get<double>()),
                  2 * kTolerance)
            << what << " t=" << t << " k=" << k;
      }
    }
  }
  const auto prompt_logprobs =
      golden_case["prompt_logprobs"].get<std::vector<double>>();
  ASSERT_EQ(result.prompt_logprobs.size(), prompt_logprobs.size()) << what;
  for (size_t t = 0; t < prompt_logprobs.size(); ++t) {
    EXPECT_NEAR(result.prompt_logprobs[t], prompt_logprobs[t], kTolerance)
        << what << " prompt t=" << t + 1;
  }
}

class SamplingGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SamplingGoldenTest, EachRequestAloneEqualsTransformersGenerate) {
  GoldenBase base = LoadBase(GetParam());
  ASSERT_NE(base.model, nullptr);
  for (const auto& golden_case : base.golden["cases"]) {
    auto results = BatchGenerator::Generate(
        *base.model, {GreedyRequest(base, golden_case)}, nullptr);
    ASSERT_TRUE(results.ok()) << results.status();
    ExpectMatches((*results)[0], golden_case,
                  std::string(golden_case["weights"]) + " " +
                      golden_case["prompt"].dump());
  }
}

TEST_P(SamplingGoldenTest, AllAdaptersAndPromptsInOneBatchEqualTransformers) {
  GoldenBase base = LoadBase(GetParam());
  ASSERT_NE(base.model, nullptr);
  // Interleaved, so the generator must regroup rows by adapter, and prompts
  // of different lengths share the batch (left padding).
  std::vector<size_t> order;
  const size_t count = base.golden["cases"].size();
  for (size_t i = 0; i < count; ++i) order.push_back((i * 4) % count);
  std::vector<SampleRequest> requests;
  for (size_t i : order) {
    requests.push_back(GreedyRequest(base, base.golden["cases"][i]));
  }
  auto results = BatchGenerator::Generate(*base.model, requests, nullptr);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& golden_case = base.golden["cases"][order[k]];
    ExpectMatches((*results)[k], golden_case,
                  "batched " + std::string(golden_case["weights"]) + " " +
                      golden_case["prompt"].dump());
  }
}

INSTANTIATE_TEST_SUITE_P(Bases, SamplingGoldenTest,
                         ::testing::Values("llama_gqa", "qwen2_bias_sharded",
                                           "mistral_window", "qwen3_tied",
                                           "olmo2_post_norm", "olmo3_window",
                                           "gemma3_text_window", "phi3_tied",
                                           "qwen3_moe", "gpt_oss"));

TEST(StopStringGoldenTest, StopsAtTheTokenTransformersStopsAt) {
  const std::string dir = GoldenPath("sampling/stop_strings");
  auto model = LlamaModel::Load(dir, {.dtype = torch::kFloat32});
  ASSERT_TRUE(model.ok()) << model.status();
  auto tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const nlohmann::json golden = nlohmann::json::parse(
      ReadGoldenText(GoldenPath("sampling/stop_strings.json")));
  const auto prompt = golden["prompt"].get<std::vector<int64_t>>();
  ASSERT_EQ(
      (*tokenizer)->Encode(golden["prompt_text"].get<std::string>()).value(),
      prompt);
  const auto continuation = golden["continuation"].get<std::vector<int64_t>>();
  const std::string full_text = golden["text"];
  std::vector<SampleRequest> requests;
  for (const auto& stop_case : golden["cases"]) {
    SampleRequest request;
    request.prompt = prompt;
    request.params.temperature = 0;
    request.params.max_tokens = static_cast<int64_t>(continuation.size());
    request.params.stop = stop_case["stop"].get<std::vector<std::string>>();
    requests.push_back(request);
  }
  auto results = BatchGenerator::Generate(**model, requests, tokenizer->get());
  ASSERT_TRUE(results.ok()) << results.status();
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& stop_case = golden["cases"][i];
    const GeneratedSample& sample = (*results)[i].samples[0];
    const size_t expected = stop_case["tokens"];
    const std::string what = stop_case["stop"].dump();
    EXPECT_EQ(sample.tokens,
              std::vector<int64_t>(continuation.begin(),
                                   continuation.begin() + expected))
        << what;
    // The text ends before the stop string that ended the sample.
    size_t cut = std::string::npos;
    size_t best_end = std::string::npos;
    for (const std::string& stop : requests[i].params.stop) {
      const size_t at = full_text.find(stop);
      if (at != std::string::npos &&
          (best_end == std::string::npos || at + stop.size() < best_end)) {
        best_end = at + stop.size();
        cut = at;
      }
    }
    if (cut == std::string::npos) {
      EXPECT_EQ(sample.stop_reason, StopReason::kLength) << what;
      EXPECT_EQ(sample.text, full_text) << what;
    } else {
      EXPECT_EQ(sample.stop_reason, StopReason::kStopString) << what;
      EXPECT_EQ(sample.text, full_text.substr(0, cut)) << what;
    }
  }
}

}  // namespace
}  // namespace loraplex
