// Client-driven forward/backward against PyTorch + PEFT (tools/golden/
// make_loss_golden.py): for every loss (cross_entropy, also on top-3 soft
// targets; importance_sampling; ppo and cispo with default and tighter clip
// bounds; dro) and three adapters (one with LoRA on the LM head), the summed
// loss, each target token's
// logprob and the gradient of every LoRA matrix in float64 equal the
// fixture's; alone, all calls in one pass, and split over successive calls
// whose gradients add up.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "core/model/llama_model.h"
#include "core/safetensors/safetensors.h"
#include "core/train/co_batch_step.h"
#include "tests/common/golden_files.h"

namespace loraplex {
namespace {

// fp64 against fp64 but for the rotary tables, which both compute in fp32
// and whose last bits differ between LibTorch builds: < 3e-7 measured
// (tests/fixtures/golden/losses/README.md), relative to max(1, |value|).
constexpr double kTolerance = 2e-6;

const nlohmann::json& Golden() {
  static const nlohmann::json* golden = new nlohmann::json(
      nlohmann::json::parse(ReadGoldenText(GoldenPath("losses/cases.json"))));
  return *golden;
}

const LlamaModel& Model() {
  static const LlamaModel* model = [] {
    auto loaded = LlamaModel::Load(GoldenPath(Golden()["base"]),
                                   {.dtype = torch::kFloat64});
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded->release();
  }();
  return *model;
}

std::unique_ptr<LoraWeights> Adapter(const std::string& name) {
  auto adapter = LoadPeftAdapter(
      GoldenPath(
          absl::StrCat("sampling/", std::string(Golden()["base"]), "/", name)),
      Model().config());
  EXPECT_TRUE(adapter.ok()) << adapter.status();
  auto weights = std::make_unique<LoraWeights>(Model().config(), torch::kCPU,
                                               torch::kFloat64);
  EXPECT_TRUE(weights->Bind(adapter->config).ok());
  EXPECT_TRUE(CopyPeftAdapter(*adapter, *weights).ok());
  return weights;
}

// The fixture's datums as `golden_case` reads them.
std::vector<Datum> Datums(const nlohmann::json& golden_case) {
  const bool top3 = golden_case["targets_per_position"] == 3;
  const std::string adapter = golden_case["adapter"];
  std::vector<Datum> data;
  for (const nlohmann::json& d : Golden()["datums"]) {
    Datum datum;
    datum.input_ids = d["input_ids"].get<std::vector<int64_t>>();
    datum.target_tokens = d[top3 ? "target_tokens_top3" : "target_tokens"]
                              .get<std::vector<int64_t>>();
    datum.targets_per_position = top3 ? 3 : 1;
    if (golden_case["loss_fn"] == "cross_entropy") {
      datum.weights =
          d[top3 ? "weights_top3" : "weights"].get<std::vector<double>>();
    } else {
      datum.sampler_logprobs =
          d["logprobs"][adapter].get<std::vector<double>>();
      datum.advantages = d["advantages"].get<std::vector<double>>();
    }
    data.push_back(std::move(datum));
  }
  return data;
}

LossFnSpec LossOf(const nlohmann::json& golden_case) {
  auto spec = LossFnSpecOf(
      golden_case["loss_fn"].get<std::string>(),
      golden_case["loss_fn_config"].get<std::map<std::string, double>>());
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::string CaseName(const nlohmann::json& golden_case) {
  return absl::StrCat(std::string(golden_case["adapter"]), "/",
                      std::string(golden_case["name"]));
}

void ExpectGradsMatch(const LoraWeights& weights,
                      const nlohmann::json& golden_case) {
  auto file = SafetensorsFile::Open(
      GoldenPath("losses/" + golden_case["grads"].get<std::string>()));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), 2 * weights.modules().size());
  for (const LoraModule& m : weights.modules()) {
    for (bool is_a : {true, false}) {
      const std::string name = PeftTensorName(m.layer, m.projection, is_a);
      auto expected = (*file)->Load(name);
      ASSERT_TRUE(expected.ok()) << name;
      const torch::Tensor grad = (is_a ? m.a : m.b).grad();
      ASSERT_TRUE(grad.defined()) << name;
      const double scale = std::max(1.0, expected->abs().max().item<double>());
      EXPECT_LE((grad - *expected).abs().max().item<double>(),
                kTolerance * scale)
          << CaseName(golden_case) << " " << name;
    }
  }
}

void ExpectOutputMatches(const ForwardBackwardOutput& out,
                         const nlohmann::json& golden_case) {
  const double loss = golden_case["loss"];
  EXPECT_NEAR(out.loss, loss, kTolerance * std::max(1.0, std::abs(loss)))
      << CaseName(golden_case);
  const nlohmann::json& logprobs = golden_case["logprobs"];
  ASSERT_EQ(out.logprobs.size(), logprobs.size());
  for (size_t d = 0; d < logprobs.size(); ++d) {
    const auto expected = logprobs[d].get<std::vector<double>>();
    ASSERT_EQ(out.logprobs[d].size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(out.logprobs[d][i], expected[i], kTolerance)
          << CaseName(golden_case) << " datum " << d << " target " << i;
    }
  }
}

TEST(ForwardBackwardGoldenTest, EachLossAloneMatchesPyTorch) {
  ASSERT_EQ(Golden()["cases"].size(), 24u);
  for (const nlohmann::json& golden_case : Golden()["cases"]) {
    SCOPED_TRACE(CaseName(golden_case));
    auto adapter = Adapter(golden_case["adapter"]);
    const std::vector<Datum> data = Datums(golden_case);
    ForwardBackwardCall call{adapter.get(), &data, LossOf(golden_case)};
    auto result = RunCoBatchPass(Model(), {}, {call}, CoBatchOptions{});
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->calls.size(), 1u);
    ExpectOutputMatches(result->calls[0], golden_case);
    EXPECT_EQ(result->calls[0].tokens, 5 + 8 + 11);
    ExpectGradsMatch(*adapter, golden_case);
  }
}

// All 24 calls (each with its own copy of its adapter) in one pass, cut
// into small micro-batches and loss chunks that mix calls of different
// losses: each call's loss, logprobs and gradients are still its own.
TEST(ForwardBackwardGoldenTest, AllLossesInOnePassMatchPyTorch) {
  const nlohmann::json& cases = Golden()["cases"];
  std::vector<std::vector<Datum>> data;
  for (const nlohmann::json& golden_case : cases) {
    data.push_back(Datums(golden_case));
  }
  for (int64_t budget : {0, 24}) {
    SCOPED_TRACE(absl::StrCat("token budget ", budget));
    std::vector<std::unique_ptr<LoraWeights>> adapters;
    std::vector<ForwardBackwardCall> calls;
    for (size_t i = 0; i < cases.size(); ++i) {
      adapters.push_back(Adapter(cases[i]["adapter"]));
      calls.push_back({adapters[i].get(), &data[i], LossOf(cases[i])});
    }
    CoBatchOptions options;
    options.token_budget = budget;
    options.loss_chunk_tokens = 13;
    auto result = RunCoBatchPass(Model(), {}, calls, options);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->calls.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      ExpectOutputMatches(result->calls[i], cases[i]);
      ExpectGradsMatch(*adapters[i], cases[i]);
    }
  }
}

// Datum 0 in one call, datums 1 and 2 in the next: the gradients add up to
// those of all three, and the losses add up to the fixture's.
TEST(ForwardBackwardGoldenTest, GradientsOfSuccessiveCallsAddUp) {
  for (const nlohmann::json& golden_case : Golden()["cases"]) {
    if (golden_case["adapter"] == "adapter_a") continue;
    SCOPED_TRACE(CaseName(golden_case));
    auto adapter = Adapter(golden_case["adapter"]);
    const std::vector<Datum> all = Datums(golden_case);
    const std::vector<Datum> first(all.begin(), all.begin() + 1);
    const std::vector<Datum> rest(all.begin() + 1, all.end());
    double loss = 0.0;
    for (const std::vector<Datum>* part : {&first, &rest}) {
      auto result = RunCoBatchPass(Model(), {},
                                   {{adapter.get(), part, LossOf(golden_case)}},
                                   CoBatchOptions{});
      ASSERT_TRUE(result.ok()) << result.status();
      loss += result->calls[0].loss;
    }
    const double expected = golden_case["loss"];
    EXPECT_NEAR(loss, expected, kTolerance * std::max(1.0, std::abs(expected)));
    ExpectGradsMatch(*adapter, golden_case);
  }
}

// Forward only: the same logprobs and loss, and the gradients already
// accumulated are left as they were.
TEST(ForwardBackwardGoldenTest, ForwardOnlyMatchesAndLeavesGradientsAlone) {
  const nlohmann::json& golden_case = Golden()["cases"][3];  // adapter_a/ppo
  auto adapter = Adapter(golden_case["adapter"]);
  const std::vector<Datum> data = Datums(golden_case);
  const LossFnSpec loss = LossOf(golden_case);
  ASSERT_TRUE(RunCoBatchPass(Model(), {}, {{adapter.get(), &data, loss}},
                             CoBatchOptions{})
                  .ok());
  ForwardBackwardCall forward{adapter.get(), &data, loss};
  forward.backward = false;
  auto result = RunCoBatchPass(Model(), {}, {forward}, CoBatchOptions{});
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectOutputMatches(result->calls[0], golden_case);
  ExpectGradsMatch(*adapter, golden_case);  // One backward's worth.
}

// A bad datum is refused with the field named, before anything runs: the
// gradients accumulated so far stay.
TEST(ForwardBackwardGoldenTest, BadDataIsRefusedAndChangesNothing) {
  const nlohmann::json& golden_case = Golden()["cases"][0];  // cross_entropy
  auto adapter = Adapter(golden_case["adapter"]);
  const std::vector<Datum> data = Datums(golden_case);
  const LossFnSpec loss = LossOf(golden_case);
  ASSERT_TRUE(RunCoBatchPass(Model(), {}, {{adapter.get(), &data, loss}},
                             CoBatchOptions{})
                  .ok());
  std::vector<Datum> bad = data;
  bad[2].target_tokens[4] = 128;
  auto result = RunCoBatchPass(Model(), {}, {{adapter.get(), &bad, loss}},
                               CoBatchOptions{});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(),
            "data[2].loss_fn_inputs.target_tokens[4] = 128 is outside the "
            "vocabulary [0, 128)");
  bad = data;
  bad[1].weights.pop_back();
  result = RunCoBatchPass(Model(), {}, {{adapter.get(), &bad, loss}},
                          CoBatchOptions{});
  EXPECT_EQ(result.status().message(),
            "data[1].loss_fn_inputs.weights: 7 values for 8 (too few)");
  ExpectGradsMatch(*adapter, golden_case);
}

}  // namespace
}  // namespace loraplex
