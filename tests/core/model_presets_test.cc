#include "core/model/model_presets.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/model/llama_model.h"
#include "core/safetensors/safetensors.h"
#include "core/tokenizer/load_tokenizer.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

std::string TempModelDir(const std::string& name) { return FreshTestDir(name); }

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

TEST(ModelPresetsTest, TinyIsAHuggingFaceLayoutWithByteTokenizer) {
  const std::string dir = TempModelDir("tiny");
  ASSERT_TRUE(WritePresetModel("tiny", 0, dir).ok());
  EXPECT_TRUE(fs::exists(dir + "/config.json"));
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->vocab_size, ByteTokenizer::kVocabSize);
  auto file = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  auto tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->eos_id(), *config->eos_token_id);
  EXPECT_EQ((*tokenizer)->pad_id(), *config->pad_token_id);
}

TEST(ModelPresetsTest, SameSeedSameBytesOtherSeedOtherWeights) {
  const std::string a = TempModelDir("seed_a");
  const std::string b = TempModelDir("seed_b");
  const std::string c = TempModelDir("seed_c");
  ASSERT_TRUE(WritePresetModel("tiny", 42, a).ok());
  ASSERT_TRUE(WritePresetModel("tiny", 42, b).ok());
  ASSERT_TRUE(WritePresetModel("tiny", 43, c).ok());
  EXPECT_EQ(ReadBytes(a + "/model.safetensors"),
            ReadBytes(b + "/model.safetensors"));
  EXPECT_NE(ReadBytes(a + "/model.safetensors"),
            ReadBytes(c + "/model.safetensors"));
}

TEST(ModelPresetsTest, WeightsHaveTheIntendedDistribution) {
  const std::string dir = TempModelDir("stats");
  ASSERT_TRUE(WritePresetModel("small", 7, dir).ok());
  auto file = SafetensorsFile::Open(dir + "/model.safetensors").value();
  // Projections are N(0, 1/fan_in): std * sqrt(fan_in) ~ 1, mean ~ 0.
  torch::Tensor down =
      file->Load("model.layers.3.mlp.down_proj.weight").value();
  const double fan_in = static_cast<double>(down.size(1));
  EXPECT_NEAR(down.std().item<double>() * std::sqrt(fan_in), 1.0, 0.01);
  EXPECT_NEAR(down.mean().item<double>() * std::sqrt(fan_in), 0.0, 0.01);
  // Normal, not uniform: ~68.3% of samples within one standard deviation.
  const double within = (down.abs() * std::sqrt(fan_in) < 1.0)
                            .to(torch::kFloat64)
                            .mean()
                            .item<double>();
  EXPECT_NEAR(within, 0.6827, 0.01);
  EXPECT_TRUE(torch::equal(file->Load("model.norm.weight").value(),
                           torch::ones({512})));
  // Different tensors get independent streams.
  torch::Tensor up = file->Load("model.layers.3.mlp.up_proj.weight").value();
  EXPECT_FALSE(torch::equal(up.flatten().narrow(0, 0, 100),
                            down.flatten().narrow(0, 0, 100)));
}

TEST(ModelPresetsTest, SmallIsBenchmarkSized) {
  auto config = PresetConfig("small");
  ASSERT_TRUE(config.ok());
  EXPECT_GE(config->hidden_size, 512);
  EXPECT_GE(config->num_hidden_layers, 4);
}

TEST(ModelPresetsTest, TinyLoadsAndRunsQuickly) {
  const std::string dir = TempModelDir("quick");
  ASSERT_TRUE(WritePresetModel("tiny", 0, dir).ok());
  auto model = LlamaModel::Load(dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  torch::NoGradGuard no_grad;
  auto logits = (*model)->Forward(torch::randint(0, 256, {2, 16}),
                                  torch::tensor({16, 9}, torch::kInt64));
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits->sizes(), (std::vector<int64_t>{2, 16, 259}));
  EXPECT_TRUE(torch::isfinite(*logits).all().item<bool>());
  // Logits are informative (far from uniform), so tests built on the tiny
  // model can detect changes.
  EXPECT_GT(logits->std().item<double>(), 0.1);
}

TEST(ModelPresetsTest, UnknownPresetIsAnError) {
  auto config = PresetConfig("huge");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()),
              ::testing::HasSubstr("unknown preset \"huge\" (choose one of: "
                                   "tiny, small, tiny-moe)"));
}

// The written tiny-moe parses back as the preset (every layer an experts
// layer, 8 experts, 2 per token) and runs with weights of every expert.
TEST(ModelPresetsTest, TinyMoeIsAMixtureOfExperts) {
  const std::string dir = TempModelDir("moe");
  ASSERT_TRUE(WritePresetModel("tiny-moe", 0, dir).ok());
  auto model = LlamaModel::Load(dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& config = (*model)->config();
  EXPECT_EQ(config.model_type, "qwen3_moe");
  EXPECT_EQ(config.qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(config.moe.num_experts, 8);
  EXPECT_EQ(config.moe.top_k, 2);
  EXPECT_TRUE(config.moe.norm_topk_prob);
  EXPECT_TRUE(LayerIsSparse(config, 0) && LayerIsSparse(config, 1));
  const torch::Tensor experts = (*model)
                                    ->weights()
                                    .layers[0]
                                    .at(Projection::kExpertGateUp)
                                    .weight;
  EXPECT_EQ(experts.sizes(), (std::vector<int64_t>{8, 128, 64}));
  // Fan-in scaling over each expert's input (64), not its output.
  EXPECT_NEAR(experts.std().item<double>(), 1.0 / 8.0, 0.01);
  torch::NoGradGuard no_grad;
  auto logits = (*model)->Forward(torch::randint(0, 256, {2, 16}),
                                  torch::tensor({16, 9}, torch::kInt64));
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_TRUE(torch::isfinite(*logits).all().item<bool>());
  EXPECT_GT(logits->std().item<double>(), 0.1);
}

}  // namespace
}  // namespace loraplex
