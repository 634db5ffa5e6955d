// Everything downstream of the decoder for each model family beyond
// Llama's layout (Qwen3, OLMo 2, OLMo 3, Gemma 3 text), against
// transformers + PEFT + torch.optim on the committed goldens: PEFT's
// adapters load and give PEFT's logits; they export again under PEFT's
// names and load back identically; a forward/backward gives PyTorch's loss,
// logprobs and gradients in float64 (tools/golden/
// make_family_step_golden.py) and one AdamW step torch.optim.AdamW's
// weights; co-batched with another adapter, each call's gradients are those
// it gets alone.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "adapters/peft_config.h"
#include "core/common/json_parse.h"
#include "core/lora/multi_lora.h"
#include "core/model/llama_model.h"
#include "core/optim/slot_optimizer.h"
#include "core/safetensors/safetensors.h"
#include "core/train/co_batch_step.h"
#include "tests/common/golden_files.h"
#include "tests/common/golden_logits.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

// float64 against float64 but for the rotary tables, which both compute in
// fp32 (as tests/fixtures/golden/losses/README.md measures), relative to
// max(1, |value|).
constexpr double kTolerance = 2e-6;

const nlohmann::json& Golden() {
  static const nlohmann::json* golden =
      new nlohmann::json(nlohmann::json::parse(
          ReadGoldenText(GoldenPath("family_steps/cases.json"))));
  return *golden;
}

std::unique_ptr<LlamaModel> LoadBase(const std::string& base,
                                     torch::ScalarType dtype,
                                     torch::Device device = torch::kCPU) {
  auto model = LlamaModel::Load(GoldenPath(base), {device, dtype});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

// The adapter each base trains (as tools/golden/make_family_step_golden.py
// names it): Qwen3-MoE's adapts attention and the experts at rank 4.
std::string AdapterDir(const std::string& base) {
  if (base == "qwen3_moe") return GoldenPath("peft/qwen3_moe_experts_r4");
  return GoldenPath(absl::StrCat("peft/", base, "_all_r4"));
}

std::unique_ptr<LoraWeights> LoadAdapter(const std::string& dir,
                                         const LlamaModel& model) {
  auto adapter = LoadPeftAdapter(dir, model.config());
  EXPECT_TRUE(adapter.ok()) << adapter.status();
  if (!adapter.ok()) return nullptr;
  auto weights = std::make_unique<LoraWeights>(model.config(), model.device(),
                                               model.logits_dtype());
  EXPECT_TRUE(weights->Bind(adapter->config).ok());
  EXPECT_TRUE(CopyPeftAdapter(*adapter, *weights).ok());
  return weights;
}

// The adapter in `dir` loads onto `model` as exactly `weights`.
void ExpectReloadsTo(const std::string& dir, const LlamaModel& model,
                     const LoraWeights& weights) {
  auto reloaded = LoadAdapter(dir, model);
  ASSERT_NE(reloaded, nullptr);
  ASSERT_EQ(reloaded->modules().size(), weights.modules().size());
  for (size_t i = 0; i < weights.modules().size(); ++i) {
    EXPECT_TRUE(torch::equal(reloaded->modules()[i].a, weights.modules()[i].a));
    EXPECT_TRUE(torch::equal(reloaded->modules()[i].b, weights.modules()[i].b));
  }
}

std::vector<Datum> Datums() {
  std::vector<Datum> data;
  for (const nlohmann::json& d : Golden()["datums"]) {
    Datum datum;
    datum.input_ids = d["input_ids"].get<std::vector<int64_t>>();
    datum.target_tokens = d["target_tokens"].get<std::vector<int64_t>>();
    datum.weights = d["weights"].get<std::vector<double>>();
    data.push_back(std::move(datum));
  }
  return data;
}

LossFnSpec CrossEntropy() {
  auto spec = LossFnSpecOf("cross_entropy", {});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// Max |actual - golden[prefix + PEFT name]| / max(1, |golden|) over every
// LoRA matrix of `weights`, `pick` choosing the matrix's tensor to compare.
template <typename Pick>
double WorstRelativeDiff(const std::string& base, const LoraWeights& weights,
                         const std::string& prefix, Pick pick) {
  auto file = SafetensorsFile::Open(
      GoldenPath("family_steps/" + base + ".safetensors"));
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return 1e9;
  double worst = 0;
  const bool both_experts =
      weights.config().Targets(Projection::kExpertGateUp) &&
      weights.config().Targets(Projection::kExpertDown);
  for (const LoraModule& m : weights.modules()) {
    for (bool is_a : {true, false}) {
      const std::string name =
          prefix + PeftTensorName(weights.model_config(), m.layer, m.projection,
                                  is_a, both_experts);
      auto expected = (*file)->Load(name);
      EXPECT_TRUE(expected.ok()) << name;
      if (!expected.ok()) return 1e9;
      const torch::Tensor actual = pick(is_a ? m.a : m.b);
      EXPECT_TRUE(actual.defined()) << name;
      if (!actual.defined()) return 1e9;
      const double scale = std::max(1.0, expected->abs().max().item<double>());
      worst = std::max(worst,
                       (actual - *expected).abs().max().item<double>() / scale);
    }
  }
  return worst;
}

class ModelFamilyGoldenTest : public ::testing::TestWithParam<std::string> {};

// Base + PEFT's adapter on `device` gives PEFT's logits, and the adapter
// matters: the base alone is far from them.
void ExpectPeftLogits(const std::string& base, torch::Device device) {
  auto model = LoadBase(base, torch::kFloat32, device);
  ASSERT_NE(model, nullptr);
  auto weights = LoadAdapter(AdapterDir(base), *model);
  ASSERT_NE(weights, nullptr);
  const GoldenLogits golden = ReadGoldenLogits(AdapterDir(base));
  const torch::Tensor ids = golden.input_ids.to(device);
  const torch::Tensor lengths = golden.lengths.to(device);
  MultiLoraDelta delta({{weights.get(), golden.input_ids.size(0)}});
  torch::NoGradGuard no_grad;
  auto logits = model->Forward(ids, lengths, &delta);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_LE(
      MaxValidDiff(logits->cpu(), golden.logits.at("logits"), golden.lengths),
      1e-4);
  auto plain = model->Forward(ids, lengths);
  ASSERT_TRUE(plain.ok());
  EXPECT_GT(
      MaxValidDiff(plain->cpu(), golden.logits.at("logits"), golden.lengths),
      0.05);
}

TEST_P(ModelFamilyGoldenTest, PeftAdapterGivesPeftLogits) {
  ExpectPeftLogits(GetParam(), torch::kCPU);
}

// PEFT's adapter, exported again: PEFT's tensor names and shapes, config
// fields PEFT has, and the same weights when loaded back.
TEST_P(ModelFamilyGoldenTest, ExportedAdapterHasPeftLayoutAndLoadsBack) {
  const std::string base = GetParam();
  auto model = LoadBase(base, torch::kFloat32);
  ASSERT_NE(model, nullptr);
  auto weights = LoadAdapter(AdapterDir(base), *model);
  ASSERT_NE(weights, nullptr);
  const std::string dir = FreshTestDir();
  ASSERT_TRUE(ExportPeftAdapter(*weights, base, dir).ok());

  auto names = [](const std::string& path) {
    auto file = SafetensorsFile::Open(path);
    EXPECT_TRUE(file.ok()) << file.status();
    std::set<std::pair<std::string, std::vector<int64_t>>> out;
    for (const SafetensorsTensorInfo& info : (*file)->tensors()) {
      out.insert({info.name, info.shape});
    }
    return out;
  };
  EXPECT_EQ(names(dir + "/adapter_model.safetensors"),
            names(AdapterDir(base) + "/adapter_model.safetensors"));
  auto ours = ReadUntrustedJsonFile(dir + "/adapter_config.json");
  auto theirs =
      ReadUntrustedJsonFile(AdapterDir(base) + "/adapter_config.json");
  ASSERT_TRUE(ours.ok() && theirs.ok());
  for (const auto& [key, value] : ours->items()) {
    EXPECT_TRUE(theirs->contains(key)) << key << " is not a PEFT field";
  }
  EXPECT_EQ((*ours)["base_model_name_or_path"], base);

  ExpectReloadsTo(dir, *model, *weights);
}

TEST_P(ModelFamilyGoldenTest, ForwardBackwardAndAdamWStepMatchPyTorch) {
  const std::string base = GetParam();
  const nlohmann::json& expected = Golden()["bases"][base];
  auto model = LoadBase(base, torch::kFloat64);
  ASSERT_NE(model, nullptr);
  auto weights = LoadAdapter(AdapterDir(base), *model);
  ASSERT_NE(weights, nullptr);
  const std::vector<Datum> data = Datums();
  auto result = RunCoBatchPass(
      *model, {}, {{weights.get(), &data, CrossEntropy()}}, CoBatchOptions{});
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->calls.size(), 1u);
  const ForwardBackwardOutput& out = result->calls[0];
  const double loss = expected["loss"];
  EXPECT_NEAR(out.loss, loss, kTolerance * std::max(1.0, std::abs(loss)));
  ASSERT_EQ(out.logprobs.size(), data.size());
  for (size_t d = 0; d < data.size(); ++d) {
    const auto want = expected["logprobs"][d].get<std::vector<double>>();
    ASSERT_EQ(out.logprobs[d].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(out.logprobs[d][i], want[i], kTolerance)
          << "datum " << d << " token " << i;
    }
  }
  EXPECT_LE(WorstRelativeDiff(base, *weights, "grad.",
                              [](const torch::Tensor& p) { return p.grad(); }),
            kTolerance);

  const nlohmann::json& adamw = Golden()["adamw"];
  OptimizerConfig config;
  config.family = OptimizerFamily::kAdamW;
  config.lr = adamw["lr"];
  config.weight_decay = adamw["weight_decay"];
  config.beta1 = adamw["betas"][0];
  config.beta2 = adamw["betas"][1];
  config.eps = adamw["eps"];
  std::vector<torch::Tensor> params;
  for (const LoraModule& m : weights->modules()) {
    params.push_back(m.a);
    params.push_back(m.b);
  }
  auto optimizer = BuildSlotOptimizer(config, params);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  optimizer->Step();
  EXPECT_LE(WorstRelativeDiff(base, *weights, "adamw.",
                              [](const torch::Tensor& p) { return p; }),
            kTolerance);
}

// The golden call co-batched with another adapter's call on other rows, cut
// into micro-batches that mix them: each call's loss and gradients are
// those it has alone (float64, to the last bits of summation order).
void ExpectCoBatchedCallsEqualEachAlone(const std::string& base,
                                        torch::Device device) {
  auto model = LoadBase(base, torch::kFloat64, device);
  ASSERT_NE(model, nullptr);
  const std::vector<Datum> data = Datums();
  std::vector<Datum> other_data(data.rbegin(), data.rend());
  for (Datum& datum : other_data) {
    for (double& w : datum.weights) w = -0.5 * w;
  }
  auto make_other = [&] {
    auto other = LoadAdapter(AdapterDir(base), *model);
    torch::NoGradGuard no_grad;
    for (const LoraModule& m : other->modules()) m.b.mul_(-0.7);
    return other;
  };
  auto alone = LoadAdapter(AdapterDir(base), *model);
  auto other_alone = make_other();
  ASSERT_NE(alone, nullptr);
  ASSERT_NE(other_alone, nullptr);
  auto first = RunCoBatchPass(
      *model, {}, {{alone.get(), &data, CrossEntropy()}}, CoBatchOptions{});
  auto second = RunCoBatchPass(
      *model, {}, {{other_alone.get(), &other_data, CrossEntropy()}},
      CoBatchOptions{});
  ASSERT_TRUE(first.ok() && second.ok());

  auto together = LoadAdapter(AdapterDir(base), *model);
  auto other_together = make_other();
  CoBatchOptions options;
  options.token_budget = 16;  // Micro-batches that mix the two calls.
  auto both =
      RunCoBatchPass(*model, {},
                     {{together.get(), &data, CrossEntropy()},
                      {other_together.get(), &other_data, CrossEntropy()}},
                     options);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_NEAR(both->calls[0].loss, first->calls[0].loss, 1e-10);
  EXPECT_NEAR(both->calls[1].loss, second->calls[0].loss, 1e-10);
  for (const auto& [a, b] :
       {std::pair{alone.get(), together.get()},
        std::pair{other_alone.get(), other_together.get()}}) {
    for (size_t i = 0; i < a->modules().size(); ++i) {
      EXPECT_LE((a->modules()[i].a.grad() - b->modules()[i].a.grad())
                    .abs()
                    .max()
                    .item<double>(),
                1e-10);
      EXPECT_LE((a->modules()[i].b.grad() - b->modules()[i].b.grad())
                    .abs()
                    .max()
                    .item<double>(),
                1e-10);
    }
  }
}

TEST_P(ModelFamilyGoldenTest, CoBatchedCallsEqualEachAlone) {
  ExpectCoBatchedCallsEqualEachAlone(GetParam(), torch::kCPU);
}

TEST_P(ModelFamilyGoldenTest, CoBatchedCallsEqualEachAloneOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectCoBatchedCallsEqualEachAlone(GetParam(),
                                     torch::Device(torch::kCUDA, 0));
}

// The next GPU run checks the same logits on CUDA.
TEST_P(ModelFamilyGoldenTest, PeftAdapterGivesPeftLogitsOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectPeftLogits(GetParam(), torch::Device(torch::kCUDA, 0));
}

// What PEFT 0.21 writes for Qwen3-MoE from LoRA on q/k/v/o and
// gate/up/down_proj: the experts' gate_up_proj at twice the rank through
// rank_pattern. One rank per adapter here: refused, naming the setting.
TEST(Qwen3MoeGoldenTest, RankPatternAdapterIsRefusedByName) {
  auto model = LoadBase("qwen3_moe", torch::kFloat32);
  ASSERT_NE(model, nullptr);
  auto adapter =
      LoadPeftAdapter(GoldenPath("peft/qwen3_moe_all_r4"), model->config());
  ASSERT_FALSE(adapter.ok());
  EXPECT_THAT(std::string(adapter.status().message()),
              ::testing::HasSubstr("rank_pattern"));
}

// target_parameters name the experts' stacked parameters, of every
// mixture-of-experts layer, with no dropout; anything else is refused.
TEST(Qwen3MoeGoldenTest, TargetParametersAreCheckedByName) {
  auto model = LoadBase("qwen3_moe", torch::kFloat32);
  ASSERT_NE(model, nullptr);
  auto config = ReadUntrustedJsonFile(
      GoldenPath("peft/qwen3_moe_experts_r4/adapter_config.json"));
  ASSERT_TRUE(config.ok());
  auto error = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json json = *config;
    change(json);
    std::string base;
    auto parsed = ParsePeftConfig(json, model->config(), "cfg", &base);
    return parsed.ok() ? std::string("ok")
                       : std::string(parsed.status().message());
  };
  EXPECT_EQ(error([](nlohmann::json&) {}), "ok");
  EXPECT_THAT(error([](nlohmann::json& j) {
                j["target_parameters"] = {"mlp.experts.up_proj"};
              }),
              ::testing::HasSubstr(
                  "target_parameters names an unsupported parameter "
                  "\"mlp.experts.up_proj\"; supported: "
                  "mlp.experts.gate_up_proj and mlp.experts.down_proj"));
  EXPECT_THAT(
      error([](nlohmann::json& j) {
        j["target_parameters"] = {"model.layers.0.mlp.experts.down_proj"};
      }),
      ::testing::HasSubstr(
          "target_parameters covers experts.down_proj on 1 of the 2 "
          "layers of the base model that have it (0)"));
  EXPECT_THAT(error([](nlohmann::json& j) { j["lora_dropout"] = 0.1; }),
              ::testing::HasSubstr("lora.dropout must be 0 when the experts "
                                   "are adapted"));
  EXPECT_THAT(error([](nlohmann::json& j) {
                j["target_parameters"] = "mlp.experts.down_proj";
              }),
              ::testing::HasSubstr("target_parameters must be a list"));
  // PEFT's all-linear adapts linear layers: attention and the dense layer's
  // MLP, with the experts only through target_parameters. Here the dense
  // MLP and the experts are adapted together.
  EXPECT_EQ(
      error([](nlohmann::json& j) { j["target_modules"] = "all-linear"; }),
      "ok");
  EXPECT_THAT(error([](nlohmann::json& j) {
                j["target_modules"] = "all-linear";
                j["target_parameters"] = nullptr;
              }),
              ::testing::HasSubstr(
                  "adapts the dense layers' gate_proj and up_proj but not "
                  "the experts' mlp.experts.gate_up_proj"));
  EXPECT_THAT(error([](nlohmann::json& j) {
                j["target_modules"] = {"q_proj", "down_proj"};
                j["target_parameters"] = nullptr;
              }),
              ::testing::HasSubstr("adapts the dense layers' down_proj but "
                                   "not the experts' mlp.experts.down_proj"));
}

// A multimodal gemma3 base trains its text model: PEFT's adapter on it
// (the text model's modules, named by PEFT in transformers 5) gives PEFT's
// logits, exports under PEFT's names, and imports under 4.x's names too.
TEST(Gemma3MultimodalGoldenTest, PeftAdapterGivesPeftLogits) {
  ExpectPeftLogits("gemma3_mm", torch::kCPU);
}

// Copies the adapter in `from` to a fresh directory, its tensors renamed by
// `rename` and `extra` added.
std::string RewrittenAdapter(
    const std::string& from,
    const std::function<std::string(const std::string&)>& rename,
    const std::vector<NamedTensor>& extra = {}) {
  auto file = SafetensorsFile::Open(from + "/adapter_model.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  std::vector<NamedTensor> tensors = extra;
  for (const SafetensorsTensorInfo& info : (*file)->tensors()) {
    tensors.push_back({rename(info.name), (*file)->Load(info.name).value()});
  }
  const std::string dir = FreshTestDir("rewritten");
  EXPECT_TRUE(
      WriteSafetensors(dir + "/adapter_model.safetensors", tensors).ok());
  std::filesystem::copy(from + "/adapter_config.json",
                        dir + "/adapter_config.json");
  return dir;
}

TEST(Gemma3MultimodalGoldenTest, ExportsPeftNamesAndImportsBothLayouts) {
  auto model = LoadBase("gemma3_mm", torch::kFloat32);
  ASSERT_NE(model, nullptr);
  auto weights = LoadAdapter(AdapterDir("gemma3_mm"), *model);
  ASSERT_NE(weights, nullptr);
  const std::string dir = FreshTestDir();
  ASSERT_TRUE(ExportPeftAdapter(*weights, "gemma3_mm", dir).ok());
  auto names = [](const std::string& path) {
    auto file = SafetensorsFile::Open(path);
    EXPECT_TRUE(file.ok()) << file.status();
    std::set<std::pair<std::string, std::vector<int64_t>>> out;
    for (const SafetensorsTensorInfo& info : (*file)->tensors()) {
      out.insert({info.name, info.shape});
    }
    return out;
  };
  const auto peft_names =
      names(AdapterDir("gemma3_mm") + "/adapter_model.safetensors");
  EXPECT_EQ(names(dir + "/adapter_model.safetensors"), peft_names);
  EXPECT_EQ(peft_names.begin()->first.rfind(
                "base_model.model.model.language_model.layers.", 0),
            0u);
  // The text model's modules by path: SigLIP's q_proj must not match.
  auto ours = ReadUntrustedJsonFile(dir + "/adapter_config.json");
  ASSERT_TRUE(ours.ok());
  EXPECT_EQ((*ours)["target_modules"].size(), 7u * 3u);
  EXPECT_EQ((*ours)["target_modules"][0],
            "model.language_model.layers.0.self_attn.q_proj");

  // Ours and transformers 4.x's names load back to the same weights.
  const std::string v4 = RewrittenAdapter(dir, [](const std::string& name) {
    const std::string from = "base_model.model.model.language_model.";
    EXPECT_EQ(name.rfind(from, 0), 0u) << name;
    return "base_model.model.language_model.model." + name.substr(from.size());
  });
  for (const std::string& source : {dir, v4}) {
    SCOPED_TRACE(source);
    ExpectReloadsTo(source, *model, *weights);
  }
}

TEST(Gemma3MultimodalGoldenTest, VisionTowerLoraIsRefusedByName) {
  auto model = LoadBase("gemma3_mm", torch::kFloat32);
  ASSERT_NE(model, nullptr);
  for (const std::string& vision :
       {std::string("base_model.model.model.vision_tower.encoder.layers.0."
                    "self_attn.q_proj.lora_A.weight"),
        std::string(
            "base_model.model.multi_modal_projector.x.lora_B.weight")}) {
    const std::string dir = RewrittenAdapter(
        AdapterDir("gemma3_mm"), [](const std::string& name) { return name; },
        {{vision, torch::zeros({4, 16})}});
    auto adapter = LoadPeftAdapter(dir, model->config());
    ASSERT_FALSE(adapter.ok());
    EXPECT_EQ(adapter.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(adapter.status().message().find(
                  "tensor " + vision +
                  " adapts a vision tower or projector module: only the text "
                  "model of model_type gemma3 is trained here"),
              std::string::npos)
        << adapter.status();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ModelFamilyGoldenTest,
                         ::testing::Values("qwen3_tied", "olmo2_post_norm",
                                           "olmo3_window", "gemma3_text_window",
                                           "phi3_tied", "qwen3_moe",
                                           "gpt_oss"));

}  // namespace
}  // namespace loraplex
