#include "core/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/common/config_json.h"

namespace loraplex {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json BaseLlama() {
  return {{"model_type", "llama"},    {"architectures", {"LlamaForCausalLM"}},
          {"vocab_size", 100},        {"hidden_size", 32},
          {"intermediate_size", 64},  {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"rms_norm_eps", 1e-5}};
}

TEST(ModelConfigTest, ParsesLlamaWithDefaults) {
  auto config = ParseConfigJson(BaseLlama());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "llama");
  EXPECT_EQ(config->head_dim, 8);
  EXPECT_EQ(config->rope.type, RopeType::kDefault);
  EXPECT_EQ(config->rope.theta, 10000.0);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_EQ(config->dtype, StoredDtype::kFloat32);
  EXPECT_FALSE(config->sliding_window.has_value());
}

TEST(ModelConfigTest, KeepsTheNameOrPathTransformersSaved) {
  EXPECT_EQ(ParseConfigJson(BaseLlama())->name_or_path, "");
  json config = BaseLlama();
  config["_name_or_path"] = "Qwen/Qwen2.5-0.5B-Instruct";
  auto parsed = ParseConfigJson(config);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->name_or_path, "Qwen/Qwen2.5-0.5B-Instruct");
}

TEST(ModelConfigTest, KeyValueHeadsDefaultToAttentionHeads) {
  json raw = BaseLlama();
  raw.erase("num_key_value_heads");
  EXPECT_EQ(ParseConfigJson(raw)->num_key_value_heads, 4);
}

TEST(ModelConfigTest, Qwen2AlwaysHasQkvBiasButNoOutputBias) {
  json raw = BaseLlama();
  raw["model_type"] = "qwen2";
  raw["architectures"] = {"Qwen2ForCausalLM"};
  auto config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->qkv_bias);
  EXPECT_FALSE(config->o_bias);
}

TEST(ModelConfigTest, LlamaAttentionBiasCoversOutputProjection) {
  json raw = BaseLlama();
  raw["attention_bias"] = true;
  raw["mlp_bias"] = true;
  auto config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(config->qkv_bias && config->o_bias && config->mlp_bias);
}

TEST(ModelConfigTest, ReadsRopeScalingInBothSpellings) {
  json legacy = BaseLlama();
  legacy["rope_theta"] = 500000.0;
  legacy["rope_scaling"] = {{"type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 8192}};
  json modern = BaseLlama();
  modern["rope_parameters"] = {
      {"rope_type", "llama3"},   {"rope_theta", 500000.0},
      {"factor", 8.0},           {"low_freq_factor", 1.0},
      {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  for (const json& raw : {legacy, modern}) {
    auto config = ParseConfigJson(raw);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->rope.type, RopeType::kLlama3);
    EXPECT_EQ(config->rope.theta, 500000.0);
    EXPECT_EQ(config->rope.factor, 8.0);
    EXPECT_EQ(config->rope.original_max_position_embeddings, 8192);
  }
}

TEST(ModelConfigTest, ReadsDtypeInBothSpellings) {
  json raw = BaseLlama();
  raw["torch_dtype"] = "bfloat16";
  EXPECT_EQ(ParseConfigJson(raw)->dtype, StoredDtype::kBFloat16);
  raw.erase("torch_dtype");
  raw["dtype"] = "float16";
  EXPECT_EQ(ParseConfigJson(raw)->dtype, StoredDtype::kFloat16);
}

TEST(ModelConfigTest, MistralSlidingWindow) {
  json raw = BaseLlama();
  raw["model_type"] = "mistral";
  raw["architectures"] = {"MistralForCausalLM"};
  raw["sliding_window"] = 4096;
  EXPECT_EQ(ParseConfigJson(raw)->sliding_window, 4096);
  raw["sliding_window"] = nullptr;
  EXPECT_FALSE(ParseConfigJson(raw)->sliding_window.has_value());
}

TEST(ModelConfigTest, RejectsUnsupportedModelType) {
  json raw = BaseLlama();
  raw["model_type"] = "gpt2";
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("config.json: model_type \"gpt2\" is not supported"));
}

TEST(ModelConfigTest, RejectsArchitectureThatDisagreesWithModelType) {
  json raw = BaseLlama();
  raw["architectures"] = {"Qwen2ForCausalLM"};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("architectures entry "
                        "\"Qwen2ForCausalLM\" is not supported"));
}

TEST(ModelConfigTest, RejectsMissingAndNonPositiveSizes) {
  json raw = BaseLlama();
  raw.erase("hidden_size");
  EXPECT_THAT(ConfigJsonError(raw), HasSubstr("hidden_size is required"));
  raw = BaseLlama();
  raw["num_hidden_layers"] = 0;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("num_hidden_layers must be a positive "
                        "integer of at most 16777216, got 0"));
  raw = BaseLlama();
  raw["vocab_size"] = "many";
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("vocab_size must be a positive integer of at most"));
}

TEST(ModelConfigTest, RejectsInconsistentHeads) {
  json raw = BaseLlama();
  raw["num_key_value_heads"] = 3;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("num_key_value_heads (3) must divide "
                        "num_attention_heads (4)"));
  raw = BaseLlama();
  raw["hidden_size"] = 30;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("hidden_size (30) must be divisible by "
                        "num_attention_heads (4)"));
  raw = BaseLlama();
  raw["head_dim"] = 7;
  EXPECT_THAT(ConfigJsonError(raw), HasSubstr("head_dim must be even"));
}

TEST(ModelConfigTest, RejectsUnsupportedRopeAndActivation) {
  json raw = BaseLlama();
  raw["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("rope_scaling.rope_type \"dynamic\" is not supported"));
  raw = BaseLlama();
  raw["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_THAT(ConfigJsonError(raw), HasSubstr("factor is required"));
  raw = BaseLlama();
  raw["hidden_act"] = "gelu";
  EXPECT_THAT(ConfigJsonError(raw), HasSubstr("hidden_act must be \"silu\""));
  raw = BaseLlama();
  raw["torch_dtype"] = "int8";
  EXPECT_THAT(ConfigJsonError(raw), HasSubstr("torch_dtype must be float32"));
}

TEST(ModelConfigTest, RejectsSpecialIdsOutsideVocabulary) {
  json raw = BaseLlama();
  raw["eos_token_id"] = 100;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("eos_token_id (100) must be below vocab_size (100)"));
}

TEST(ModelConfigTest, RejectsAbsurdSizesAndDeepNesting) {
  json raw = BaseLlama();
  raw["hidden_size"] = int64_t{1} << 40;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("hidden_size must be a positive integer "
                        "of at most 16777216"));
  const std::string nested = std::string(50000, '[') + std::string(50000, ']');
  std::string text = BaseLlama().dump();
  text.insert(1, R"("vocab_size": )" + nested + ",");
  auto parsed = ParseModelConfig(text, "config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("nested deeper than"));
}

TEST(ModelConfigTest, RejectsNonJson) {
  auto parsed = ParseModelConfig("{", "x/config.json");
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("x/config.json: not valid JSON"));
}

TEST(ModelConfigTest, WrittenJsonParsesBackToTheSameConfig) {
  json raw = BaseLlama();
  raw["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  raw["tie_word_embeddings"] = true;
  raw["attention_bias"] = true;
  raw["torch_dtype"] = "bfloat16";
  raw["bos_token_id"] = 1;
  ModelConfig config = ParseConfigJson(raw).value();
  auto again = ParseModelConfig(ModelConfigToJson(config), "written");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->head_dim, config.head_dim);
  EXPECT_EQ(again->rope.type, RopeType::kLinear);
  EXPECT_EQ(again->rope.factor, 2.0);
  EXPECT_TRUE(again->tie_word_embeddings);
  EXPECT_TRUE(again->o_bias);
  EXPECT_EQ(again->dtype, StoredDtype::kBFloat16);
  EXPECT_EQ(again->bos_token_id, 1);
}

}  // namespace
}  // namespace loraplex
