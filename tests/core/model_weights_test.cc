// Checkpoint/config mismatches are reported completely and clearly.
#include "core/model/model_weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "core/model/llama_model.h"
#include "core/model/model_presets.h"
#include "core/safetensors/safetensors.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ModelWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir();
    ASSERT_TRUE(WritePresetModel("tiny", 3, dir_).ok());
    config_ = LoadModelConfig(dir_).value();
  }

  // Rewrites model.safetensors after `edit` changes the tensor list.
  void Rewrite(const std::function<void(std::vector<NamedTensor>&)>& edit) {
    std::vector<NamedTensor> tensors;
    {
      auto file = SafetensorsFile::Open(dir_ + "/model.safetensors").value();
      for (const auto& info : file->tensors()) {
        tensors.push_back({info.name, file->Load(info.name).value().clone()});
      }
    }
    edit(tensors);
    ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", tensors).ok());
  }

  std::string LoadError() {
    auto model = LlamaModel::Load(dir_, {});
    EXPECT_FALSE(model.ok());
    return std::string(model.status().message());
  }

  std::string dir_;
  ModelConfig config_;
};

TEST_F(ModelWeightsTest, SpecsFollowHuggingFaceNames) {
  const auto specs = ModelTensorSpecs(config_);
  // embed + 2 layers * (2 norms + 7 projections) + final norm + lm_head.
  EXPECT_EQ(specs.size(), 1u + 2 * 9 + 1 + 1);
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs[3].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(specs[4].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(specs[4].shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(specs[9].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(specs[9].shape, (std::vector<int64_t>{64, 176}));
  EXPECT_EQ(specs.back().name, "lm_head.weight");
}

TEST_F(ModelWeightsTest, ReportsEveryMissingTensor) {
  Rewrite([](std::vector<NamedTensor>& tensors) {
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [](const NamedTensor& t) {
                                   return t.name.find("v_proj") !=
                                          std::string::npos;
                                 }),
                  tensors.end());
  });
  const std::string error = LoadError();
  EXPECT_THAT(error, HasSubstr("2 missing tensor(s)"));
  EXPECT_THAT(error, HasSubstr("model.layers.0.self_attn.v_proj.weight"));
  EXPECT_THAT(error, HasSubstr("model.layers.1.self_attn.v_proj.weight"));
}

TEST_F(ModelWeightsTest, ListsEveryMissingNameHoweverMany) {
  Rewrite([](std::vector<NamedTensor>& tensors) {
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [](const NamedTensor& t) {
                                   return t.name.find("proj") !=
                                          std::string::npos;
                                 }),
                  tensors.end());
  });
  const std::string error = LoadError();
  EXPECT_THAT(error, HasSubstr("14 missing tensor(s)"));
  for (const TensorSpec& spec : ModelTensorSpecs(config_)) {
    if (spec.name.find("proj") != std::string::npos) {
      EXPECT_THAT(error, HasSubstr(spec.name));
    }
  }
}

TEST_F(ModelWeightsTest, ReportsWrongShapesAndUnexpectedNames) {
  Rewrite([](std::vector<NamedTensor>& tensors) {
    for (NamedTensor& t : tensors) {
      if (t.name == "model.norm.weight") t.tensor = torch::ones({63});
    }
    tensors.push_back({"model.layers.2.mlp.up_proj.weight", torch::ones({1})});
    tensors.push_back(
        {"model.layers.0.self_attn.rotary_emb.inv_freq", torch::ones({8})});
  });
  const std::string error = LoadError();
  EXPECT_THAT(error, HasSubstr("model.norm.weight is [63], expected [64]"));
  EXPECT_THAT(error, HasSubstr("1 unexpected tensor(s): "
                               "model.layers.2.mlp.up_proj.weight"));
  EXPECT_THAT(error, ::testing::Not(HasSubstr("inv_freq")));
}

TEST_F(ModelWeightsTest, RejectsIntegerWeights) {
  Rewrite([](std::vector<NamedTensor>& tensors) {
    for (NamedTensor& t : tensors) {
      if (t.name == "model.norm.weight") t.tensor = t.tensor.to(torch::kInt32);
    }
  });
  EXPECT_THAT(LoadError(), HasSubstr("model.norm.weight is I32"));
}

TEST_F(ModelWeightsTest, BadConfigIsReportedBeforeWeights) {
  std::ofstream(dir_ + "/config.json") << R"({"model_type": "bert"})";
  EXPECT_THAT(LoadError(), HasSubstr("model_type \"bert\" is not supported"));
}

TEST_F(ModelWeightsTest, Bf16ComputeConvertsEveryWeight) {
  ModelLoadOptions options;
  options.dtype = torch::kBFloat16;
  auto model = LlamaModel::Load(dir_, options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->weights().embed_tokens.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(
      (*model)->weights().layers[1].at(Projection::kDown).weight.scalar_type(),
      torch::kBFloat16);
  torch::NoGradGuard no_grad;
  auto logits = (*model)->Forward(torch::tensor({{1, 2, 3}}, torch::kInt64),
                                  torch::tensor({3}, torch::kInt64));
  ASSERT_TRUE(logits.ok());
  EXPECT_EQ(logits->scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::isfinite(*logits).all().item<bool>());
}

TEST_F(ModelWeightsTest, RejectsUnsupportedComputeDtype) {
  ModelLoadOptions options;
  options.dtype = torch::kFloat16;
  auto model = LlamaModel::Load(dir_, options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("compute dtype must be float32, bfloat16 or float64"));
}

TEST_F(ModelWeightsTest, Float64ComputeGivesFloat64WeightsAndLogits) {
  auto model = LlamaModel::Load(dir_, {.dtype = torch::kFloat64});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->dtype(), torch::kFloat64);
  EXPECT_EQ((*model)->weights().embed_tokens.scalar_type(), torch::kFloat64);
  auto logits = (*model)->Forward(torch::tensor({{1, 2, 3}}, torch::kInt64),
                                  torch::tensor({3}, torch::kInt64));
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits->scalar_type(), torch::kFloat64);
  // The same checkpoint in fp32 gives the same logits up to fp32 rounding.
  auto fp32 = LlamaModel::Load(dir_, {});
  ASSERT_TRUE(fp32.ok());
  auto logits32 = (*fp32)->Forward(torch::tensor({{1, 2, 3}}, torch::kInt64),
                                   torch::tensor({3}, torch::kInt64));
  ASSERT_TRUE(logits32.ok());
  EXPECT_EQ(logits32->scalar_type(), torch::kFloat32);
  EXPECT_TRUE(
      torch::allclose(*logits, logits32->to(torch::kFloat64), 1e-4, 1e-5));
}

}  // namespace
}  // namespace loraplex
