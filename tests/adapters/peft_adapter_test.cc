// PEFT adapter export/import: the exact HF layout (checked against adapters
// saved by PEFT itself), round trips, and clear errors for bad adapters.
#include "adapters/peft_adapter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/lora/multi_lora.h"
#include "core/model/llama_model.h"
#include "core/safetensors/safetensors.h"
#include "tests/common/golden_files.h"
#include "tests/common/test_dir.h"
#include "tests/common/tiny_model.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

std::map<std::string, std::vector<int64_t>> TensorShapes(
    const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const SafetensorsTensorInfo& info : (*file)->tensors()) {
    shapes[info.name] = info.shape;
    EXPECT_EQ(info.dtype, SafetensorsDtype::kF32) << info.name;
  }
  return shapes;
}

nlohmann::json ReadJson(const std::string& path) {
  auto json = ReadUntrustedJsonFile(path);
  EXPECT_TRUE(json.ok()) << json.status();
  return *json;
}

ModelConfig GqaConfig() {
  auto model = LlamaModel::Load(FixturePath("golden/llama_gqa"), {});
  EXPECT_TRUE(model.ok()) << model.status();
  return (*model)->config();
}

// Our export of r=4, alpha=8, q/v has exactly the keys, shapes, dtype,
// metadata and config values of PEFT's own save_pretrained.
TEST(PeftAdapterTest, ExportMatchesPeftLayout) {
  const std::string peft_dir = FixturePath("golden/peft/q_v_r4_init");
  LoraWeights weights(GqaConfig(), torch::kCPU);
  LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.targets = {Projection::kQ, Projection::kV};
  ASSERT_TRUE(weights.Bind(lora).ok());
  weights.InitPeft(0);
  const std::string dir = FreshTestDir();
  ASSERT_TRUE(ExportPeftAdapter(weights, "llama_gqa", dir).ok());

  EXPECT_EQ(TensorShapes(dir + "/adapter_model.safetensors"),
            TensorShapes(peft_dir + "/adapter_model.safetensors"));
  auto ours = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  auto theirs = SafetensorsFile::Open(peft_dir + "/adapter_model.safetensors");
  EXPECT_EQ((*ours)->metadata(), (*theirs)->metadata());

  const nlohmann::json config = ReadJson(dir + "/adapter_config.json");
  const nlohmann::json peft = ReadJson(peft_dir + "/adapter_config.json");
  for (const char* key :
       {"peft_type", "task_type", "base_model_name_or_path", "r", "lora_alpha",
        "lora_dropout", "target_modules", "bias", "use_rslora",
        "fan_in_fan_out", "inference_mode", "rank_pattern", "alpha_pattern"}) {
    EXPECT_TRUE(config.contains(key)) << key;
  }
  for (const auto& [key, value] : config.items()) {
    ASSERT_TRUE(peft.contains(key)) << key << " is not a PEFT field";
    if (key == "target_modules") {
      EXPECT_EQ(value.get<std::set<std::string>>(),
                peft[key].get<std::set<std::string>>());
    } else {
      EXPECT_EQ(value, peft[key]) << key;
    }
  }
}

// Exports an adapter trained on `device`, loads it back there: the same
// tensors and logits.
void ExpectRoundTripGivesIdenticalWeightsAndLogits(const LlamaModel& model) {
  const torch::Device device = model.device();
  LoraWeights weights(model.config(), device);
  LoraConfig lora;
  lora.rank = 6;
  lora.alpha = 3.5;
  lora.use_rslora = true;
  lora.targets = {Projection::kK, Projection::kO, Projection::kGate,
                  Projection::kDown, Projection::kLmHead};
  ASSERT_TRUE(weights.Bind(lora).ok());
  weights.InitPeft(11);
  RandomizeB(weights, 2, 0.1);
  const std::string dir = FreshTestDir();
  ASSERT_TRUE(ExportPeftAdapter(weights, "tiny", dir).ok());
  auto adapter = LoadPeftAdapter(dir, model.config());
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->base_model_name_or_path, "tiny");
  EXPECT_EQ(adapter->config.rank, 6);
  EXPECT_EQ(adapter->config.alpha, 3.5);
  EXPECT_TRUE(adapter->config.use_rslora);
  EXPECT_EQ(adapter->config.targets, lora.targets);
  LoraWeights loaded(model.config(), device);
  ASSERT_TRUE(loaded.Bind(adapter->config).ok());
  ASSERT_TRUE(CopyPeftAdapter(*adapter, loaded).ok());
  ASSERT_EQ(loaded.modules().size(), weights.modules().size());
  for (size_t i = 0; i < weights.modules().size(); ++i) {
    EXPECT_TRUE(torch::equal(loaded.modules()[i].a, weights.modules()[i].a));
    EXPECT_TRUE(torch::equal(loaded.modules()[i].b, weights.modules()[i].b));
  }
  EXPECT_EQ(loaded.modules()[0].a.device(), device);
  torch::Tensor ids = torch::randint(0, 259, {2, 7}, torch::kInt64).to(device);
  torch::Tensor lengths = torch::tensor({7, 3}, torch::kInt64).to(device);
  MultiLoraDelta original({{&weights, 2}});
  MultiLoraDelta reloaded({{&loaded, 2}});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(model.Forward(ids, lengths, &original).value(),
                           model.Forward(ids, lengths, &reloaded).value()));
}

TEST(PeftAdapterTest, RoundTripGivesIdenticalWeightsAndLogits) {
  ExpectRoundTripGivesIdenticalWeightsAndLogits(TinyModel());
}

TEST(PeftAdapterTest, RoundTripGivesIdenticalWeightsAndLogitsOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectRoundTripGivesIdenticalWeightsAndLogits(
      TinyModelOn(CudaDevice(), torch::kFloat32));
}

// An adapter PEFT saved with LoRA on q_proj, v_proj and lm_head loads with
// the LM head's module last, and exports again under PEFT's names, shapes
// and values.
TEST(PeftAdapterTest, LmHeadAdapterSavedByPeftLoadsAndExportsAgain) {
  const std::string peft_dir =
      FixturePath("golden/sampling/llama_gqa/adapter_c");
  const ModelConfig config = GqaConfig();
  auto adapter = LoadPeftAdapter(peft_dir, config);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->config.targets,
            (std::vector<Projection>{Projection::kQ, Projection::kV,
                                     Projection::kLmHead}));
  ASSERT_EQ(adapter->modules.size(), 2u * config.num_hidden_layers + 1);
  const PeftModuleTensors& head = adapter->modules.back();
  EXPECT_EQ(head.projection, Projection::kLmHead);
  EXPECT_EQ(head.layer, kLmHeadLayer);
  EXPECT_EQ(head.a.sizes(), (std::vector<int64_t>{4, config.hidden_size}));
  EXPECT_EQ(head.b.sizes(), (std::vector<int64_t>{config.vocab_size, 4}));

  LoraWeights weights(config, torch::kCPU);
  ASSERT_TRUE(weights.Bind(adapter->config).ok());
  ASSERT_TRUE(CopyPeftAdapter(*adapter, weights).ok());
  ASSERT_NE(weights.lm_head(), nullptr);
  EXPECT_EQ(weights.Find(0, Projection::kLmHead), nullptr);
  const std::string dir = FreshTestDir();
  ASSERT_TRUE(ExportPeftAdapter(weights, "llama_gqa", dir).ok());
  const std::string ours_path = dir + "/adapter_model.safetensors";
  const std::string theirs_path = peft_dir + "/adapter_model.safetensors";
  // PEFT also saves a copy of the frozen base LM head (its
  // save_embedding_layers); the export leaves it out, PEFT loads it without.
  const std::string base_copy = "base_model.model.lm_head.base_layer.weight";
  std::map<std::string, std::vector<int64_t>> expected_shapes =
      TensorShapes(theirs_path);
  ASSERT_EQ(expected_shapes.erase(base_copy), 1u);
  EXPECT_EQ(TensorShapes(ours_path), expected_shapes);
  auto ours = SafetensorsFile::Open(ours_path);
  auto theirs = SafetensorsFile::Open(theirs_path);
  ASSERT_TRUE(ours.ok() && theirs.ok());
  for (const SafetensorsTensorInfo& info : (*theirs)->tensors()) {
    if (info.name == base_copy) continue;
    EXPECT_TRUE(torch::equal((*ours)->Load(info.name).value(),
                             (*theirs)->Load(info.name).value()))
        << info.name;
  }
  EXPECT_EQ(ReadJson(dir + "/adapter_config.json")["target_modules"]
                .get<std::set<std::string>>(),
            ReadJson(peft_dir + "/adapter_config.json")["target_modules"]
                .get<std::set<std::string>>());
}

TEST(PeftAdapterTest, LmHeadBaseCopyOfAnotherVocabularyIsRefused) {
  const std::string source = FixturePath("golden/sampling/llama_gqa/adapter_c");
  const std::string dir = FreshTestDir();
  std::filesystem::copy_file(source + "/adapter_config.json",
                             dir + "/adapter_config.json");
  auto file = SafetensorsFile::Open(source + "/adapter_model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const ModelConfig config = GqaConfig();
  std::vector<NamedTensor> tensors;
  for (const SafetensorsTensorInfo& info : (*file)->tensors()) {
    torch::Tensor t = (*file)->Load(info.name).value().clone();
    if (info.name == "base_model.model.lm_head.base_layer.weight") {
      t = torch::zeros({config.vocab_size + 1, config.hidden_size});
    }
    tensors.push_back({info.name, t});
  }
  ASSERT_TRUE(
      WriteSafetensors(dir + "/adapter_model.safetensors", tensors).ok());
  auto adapter = LoadPeftAdapter(dir, config);
  EXPECT_EQ(adapter.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(adapter.status().message()),
              HasSubstr("an LM head of another vocabulary"));
}

// A copy of the q_v_r4 PEFT adapter to break in one way.
class BadPeftAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir();
    const std::string source = FixturePath("golden/peft/q_v_r4");
    for (const char* name :
         {"adapter_config.json", "adapter_model.safetensors"}) {
      std::filesystem::copy_file(source + "/" + name, dir_ + "/" + name);
    }
    config_ = ReadJson(dir_ + "/adapter_config.json");
    auto file = SafetensorsFile::Open(dir_ + "/adapter_model.safetensors");
    ASSERT_TRUE(file.ok());
    for (const SafetensorsTensorInfo& info : (*file)->tensors()) {
      tensors_.push_back({info.name, (*file)->Load(info.name).value().clone()});
    }
  }
  void WriteConfig() {
    std::ofstream(dir_ + "/adapter_config.json") << config_.dump();
  }
  void WriteTensors() {
    ASSERT_TRUE(
        WriteSafetensors(dir_ + "/adapter_model.safetensors", tensors_).ok());
  }
  std::string Error() {
    auto adapter = LoadPeftAdapter(dir_, GqaConfig());
    EXPECT_FALSE(adapter.ok());
    EXPECT_EQ(adapter.status().code(), absl::StatusCode::kInvalidArgument)
        << adapter.status();
    return std::string(adapter.status().message());
  }

  std::string dir_;
  nlohmann::json config_;
  std::vector<NamedTensor> tensors_;
};

TEST_F(BadPeftAdapterTest, TheUnbrokenCopyLoads) {
  EXPECT_TRUE(LoadPeftAdapter(dir_, GqaConfig()).ok());
}

TEST_F(BadPeftAdapterTest, MissingTensor) {
  tensors_.erase(tensors_.begin());
  WriteTensors();
  EXPECT_THAT(Error(), HasSubstr("missing tensor base_model.model.model."
                                 "layers.0.self_attn.q_proj.lora_A.weight"));
}

TEST_F(BadPeftAdapterTest, UnexpectedTensor) {
  tensors_.push_back(
      {"base_model.model.model.layers.0.mlp.up_proj.lora_A.weight",
       torch::zeros({4, 32})});
  WriteTensors();
  EXPECT_THAT(Error(), HasSubstr("unexpected tensor base_model.model.model."
                                 "layers.0.mlp.up_proj.lora_A.weight"));
}

TEST_F(BadPeftAdapterTest, NonFiniteValues) {
  tensors_[0].tensor.fill_(std::numeric_limits<float>::quiet_NaN());
  tensors_[1].tensor[0][0] = std::numeric_limits<float>::infinity();
  WriteTensors();
  const std::string error = Error();
  EXPECT_THAT(error, HasSubstr(tensors_[0].name + " holds NaN or infinite"));
  EXPECT_THAT(error, HasSubstr(tensors_[1].name + " holds NaN or infinite"));
}

TEST_F(BadPeftAdapterTest, ShapeMismatchWithTheBase) {
  // The same adapter against a base with another hidden size.
  auto adapter =
      LoadPeftAdapter(FixturePath("golden/peft/q_v_r4"), TinyModel().config());
  ASSERT_FALSE(adapter.ok());
  EXPECT_THAT(std::string(adapter.status().message()),
              HasSubstr("q_proj.lora_A.weight has shape [4, 32], expected "
                        "[4, 64]"));
}

TEST_F(BadPeftAdapterTest, RankDisagreesWithTensors) {
  config_["r"] = 8;
  WriteConfig();
  EXPECT_THAT(Error(), HasSubstr("expected [8, 32] for rank 8"));
}

TEST_F(BadPeftAdapterTest, LmHeadNamedWithoutItsTensors) {
  config_["target_modules"] = {"q_proj", "v_proj", "lm_head"};
  WriteConfig();
  EXPECT_THAT(
      Error(),
      HasSubstr("missing tensor base_model.model.lm_head.lora_A.weight"));
}

TEST_F(BadPeftAdapterTest, UnsupportedModule) {
  config_["target_modules"] = {"q_proj", "embed_tokens"};
  WriteConfig();
  EXPECT_THAT(Error(), HasSubstr("target_modules names an unsupported module "
                                 "\"embed_tokens\""));
}

// PEFT names modules by full path or by suffix (its `target_modules=
// "all-linear"` adapters list full paths); each matches when the module's
// name equals it or ends with "." + it.
TEST_F(BadPeftAdapterTest, FullPathsAndSuffixesCoveringEveryLayerLoad) {
  const int layers = GqaConfig().num_hidden_layers;
  ASSERT_GE(layers, 2);
  nlohmann::json targets = nlohmann::json::array();
  for (int layer = 0; layer < layers; ++layer) {
    targets.push_back(
        absl::StrCat("model.layers.", layer, ".self_attn.q_proj"));
  }
  targets.push_back("self_attn.v_proj");
  config_["target_modules"] = targets;
  WriteConfig();
  auto adapter = LoadPeftAdapter(dir_, GqaConfig());
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->config.targets,
            (std::vector<Projection>{Projection::kQ, Projection::kV}));
  EXPECT_EQ(adapter->modules.size(), static_cast<size_t>(2 * layers));

  // exclude_modules takes modules away by the same rule.
  config_["target_modules"] = {"q_proj", "k_proj", "v_proj"};
  config_["exclude_modules"] = {"self_attn.k_proj"};
  WriteConfig();
  adapter = LoadPeftAdapter(dir_, GqaConfig());
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->config.targets,
            (std::vector<Projection>{Projection::kQ, Projection::kV}));
}

TEST_F(BadPeftAdapterTest, AllLinearStringTargetsEveryProjection) {
  const std::string source = FixturePath("golden/peft/all_r8_rslora");
  for (const char* name :
       {"adapter_config.json", "adapter_model.safetensors"}) {
    std::filesystem::copy_file(
        source + "/" + name, dir_ + "/" + name,
        std::filesystem::copy_options::overwrite_existing);
  }
  config_ = ReadJson(dir_ + "/adapter_config.json");
  config_["target_modules"] = "all-linear";
  WriteConfig();
  auto adapter = LoadPeftAdapter(dir_, GqaConfig());
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->config.targets.size(), kAllProjections.size());
}

TEST_F(BadPeftAdapterTest, PathsCoveringSomeLayersOnlyAreRefused) {
  config_["target_modules"] = {"model.layers.0.self_attn.q_proj", "v_proj"};
  WriteConfig();
  EXPECT_THAT(Error(),
              HasSubstr(absl::StrCat(
                  "target_modules covers q_proj on 1 of the base model's ",
                  GqaConfig().num_hidden_layers,
                  " layers (0); adapters on some layers only are not "
                  "supported")));
  // A layer the base does not have, and a path that is no projection.
  config_["target_modules"] = {"model.layers.99.self_attn.q_proj"};
  WriteConfig();
  EXPECT_THAT(Error(), HasSubstr("target_modules names an unsupported module "
                                 "\"model.layers.99.self_attn.q_proj\""));
  config_["target_modules"] = {"q_proj", "model.layers.0.mlp"};
  WriteConfig();
  EXPECT_THAT(Error(), HasSubstr("\"model.layers.0.mlp\""));
  config_["target_modules"] = {"q_proj", "v_proj"};
  config_["exclude_modules"] = ".*";
  WriteConfig();
  EXPECT_THAT(Error(), HasSubstr("exclude_modules must be a list"));
}

TEST_F(BadPeftAdapterTest, RegexTargets) {
  config_["target_modules"] = ".*proj";
  WriteConfig();
  EXPECT_THAT(Error(), HasSubstr("regular expression is not supported"));
}

TEST_F(BadPeftAdapterTest, UnsupportedSettings) {
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{
           {"use_dora", true},
           {"bias", "all"},
           {"rank_pattern", {{"q_proj", 8}}},
           {"modules_to_save", {"lm_head"}},
           {"fan_in_fan_out", true},
           {"alora_invocation_tokens", {1, 2}},
           {"init_lora_weights", "pissa"}}) {
    nlohmann::json saved = config_;
    config_[key] = value;
    WriteConfig();
    EXPECT_THAT(Error(), HasSubstr(key)) << key;
    EXPECT_THAT(Error(), HasSubstr("is not supported")) << key;
    config_ = saved;
  }
}

TEST_F(BadPeftAdapterTest, BadConfigValues) {
  config_["peft_type"] = "IA3";
  WriteConfig();
  EXPECT_THAT(Error(), HasSubstr("peft_type must be \"LORA\""));
  config_["peft_type"] = "LORA";
  config_["r"] = 512;
  WriteConfig();
  EXPECT_THAT(Error(), HasSubstr("r must be an integer in [1, 256], got 512"));
}

TEST_F(BadPeftAdapterTest, MissingWeightsFile) {
  std::filesystem::rename(dir_ + "/adapter_model.safetensors",
                          dir_ + "/adapter_model.bin");
  EXPECT_THAT(Error(), HasSubstr("adapter_model.bin is not supported"));
}

TEST_F(BadPeftAdapterTest, MissingConfigFile) {
  std::filesystem::remove(dir_ + "/adapter_config.json");
  auto adapter = LoadPeftAdapter(dir_, GqaConfig());
  ASSERT_FALSE(adapter.ok());
  EXPECT_THAT(std::string(adapter.status().message()),
              HasSubstr("adapter_config.json"));
}

}  // namespace
}  // namespace loraplex

namespace loraplex {
namespace {

// A Qwen3-MoE adapter (PEFT's, attention and both expert parameters)
// exported in the per-expert layout vLLM loads: one LoRA per expert's
// gate_proj, up_proj and down_proj that is the same update exactly.
TEST(PeftExpertLayoutTest, PerExpertExportIsTheSameUpdate) {
  auto model = LlamaModel::Load(GoldenPath("qwen3_moe"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& config = (*model)->config();
  auto adapter =
      LoadPeftAdapter(GoldenPath("peft/qwen3_moe_experts_r4"), config);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  LoraWeights weights(config, torch::kCPU);
  ASSERT_TRUE(weights.Bind(adapter->config).ok());
  ASSERT_TRUE(CopyPeftAdapter(*adapter, weights).ok());
  const std::string dir = FreshTestDir();
  ASSERT_TRUE(
      ExportPeftAdapter(weights, "base", dir, PeftExpertLayout::kPerExpert)
          .ok());

  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const int64_t r = adapter->config.rank;
  const int64_t hidden = config.hidden_size;
  const int64_t width = config.moe.intermediate_size;
  size_t expected_tensors = 0;
  for (const LoraModule& m : weights.modules()) {
    if (!IsExpertProjection(m.projection)) {
      ++expected_tensors;
      ++expected_tensors;
      EXPECT_NE((*file)->Find(PeftTensorName(m.layer, m.projection, true)),
                nullptr);
      continue;
    }
    for (int64_t e = 0; e < config.moe.num_experts; ++e) {
      const std::string prefix = absl::StrCat("base_model.model.model.layers.",
                                              m.layer, ".mlp.experts.", e, ".");
      auto load = [&](const std::string& name,
                      std::vector<int64_t> shape) -> torch::Tensor {
        auto tensor = (*file)->Load(prefix + name);
        EXPECT_TRUE(tensor.ok()) << prefix + name;
        if (!tensor.ok()) return torch::zeros(shape);
        EXPECT_EQ(tensor->sizes().vec(), shape) << prefix + name;
        ++expected_tensors;
        return *tensor;
      };
      const torch::Tensor delta =
          torch::matmul(m.ExpertB()[e], m.ExpertA()[e]).detach();
      if (m.projection == Projection::kExpertDown) {
        const torch::Tensor a = load("down_proj.lora_A.weight", {r, width});
        const torch::Tensor b = load("down_proj.lora_B.weight", {hidden, r});
        EXPECT_TRUE(torch::equal(torch::matmul(b, a), delta));
        continue;
      }
      const torch::Tensor gate_a = load("gate_proj.lora_A.weight", {r, hidden});
      const torch::Tensor gate_b = load("gate_proj.lora_B.weight", {width, r});
      const torch::Tensor up_a = load("up_proj.lora_A.weight", {r, hidden});
      const torch::Tensor up_b = load("up_proj.lora_B.weight", {width, r});
      EXPECT_TRUE(torch::equal(gate_a, up_a));
      EXPECT_TRUE(torch::equal(torch::cat({torch::matmul(gate_b, gate_a),
                                           torch::matmul(up_b, up_a)}),
                               delta));
    }
  }
  EXPECT_EQ((*file)->tensors().size(), expected_tensors);
  auto json = ReadUntrustedJsonFile(dir + "/adapter_config.json");
  ASSERT_TRUE(json.ok());
  EXPECT_TRUE((*json)["target_parameters"].is_null());
  const auto targets = (*json)["target_modules"].get<std::set<std::string>>();
  EXPECT_EQ(targets,
            (std::set<std::string>{"q_proj", "k_proj", "v_proj", "o_proj",
                                   "gate_proj", "up_proj", "down_proj"}));

  // gpt-oss interleaves gate and up: its experts export stacked only.
  ModelConfig interleaved = config;
  interleaved.moe.activation = ExpertActivation::kClampedSwigluInterleaved;
  LoraWeights other(interleaved, torch::kCPU);
  ASSERT_TRUE(other.Bind(adapter->config).ok());
  auto refused = EncodePeftAdapter(other, "base", PeftExpertLayout::kPerExpert);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("exports its experts stacked only"));
}

}  // namespace
}  // namespace loraplex
