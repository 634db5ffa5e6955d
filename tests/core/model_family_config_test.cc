// The model families' config.json keys (core/model/families/): the features
// each family sets, transformers' defaults where a key is absent, both the
// 4.x and 5.x RoPE spellings, ModelConfigToJson round trips, and a clear
// error for every key a family does not implement.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/lora/lora_config.h"
#include "core/model/model_config.h"
#include "core/model/model_family.h"
#include "tests/common/config_json.h"

namespace loraplex {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json Base(const std::string& model_type, const std::string& architecture) {
  return {{"model_type", model_type}, {"architectures", {architecture}},
          {"vocab_size", 100},        {"hidden_size", 32},
          {"intermediate_size", 64},  {"num_hidden_layers", 6},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
}

std::vector<int64_t> SlidingLayers(const ModelConfig& config) {
  std::vector<int64_t> layers;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    if (LayerIsSliding(config, i)) layers.push_back(i);
  }
  return layers;
}

TEST(ModelFamilyConfigTest, EveryFamilyIsRegisteredOnceAndFoundByName) {
  std::set<std::string> seen;
  for (const ModelFamilySpec* family : ModelFamilies()) {
    EXPECT_TRUE(seen.insert(std::string(family->model_type)).second);
    EXPECT_EQ(FindModelFamily(family->model_type), family);
    EXPECT_FALSE(family->architectures.empty());
  }
  for (const char* type :
       {"llama", "qwen2", "mistral", "qwen3", "olmo2", "olmo3", "gemma3_text",
        "phi3", "gemma3", "qwen3_moe", "gpt_oss"}) {
    EXPECT_NE(FindModelFamily(type), nullptr) << type;
  }
  EXPECT_EQ(FindModelFamily("gpt2"), nullptr);
  EXPECT_THAT(ConfigJsonError(Base("gpt2", "GPT2LMHeadModel")),
              HasSubstr("model_type \"gpt2\" is not supported (supported: "
                        "llama, qwen2, mistral, qwen3, olmo2, olmo3, "
                        "gemma3_text, phi3, gemma3, qwen3_moe, gpt_oss)"));
}

json GptOss() {
  json raw = Base("gpt_oss", "GptOssForCausalLM");
  raw["num_local_experts"] = 8;
  raw["num_experts_per_tok"] = 2;
  return raw;
}

TEST(ModelFamilyConfigTest, GptOssTakesTransformersDefaults) {
  auto config = ParseConfigJson(GptOss());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->attention_sinks);
  EXPECT_TRUE(config->qkv_bias && config->o_bias);
  EXPECT_EQ(config->norm_style, NormStyle::kScaleThenCast);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->rms_norm_eps, 1e-5);
  EXPECT_EQ(config->max_position_embeddings, 131072);
  EXPECT_EQ(config->sliding_window, 128);
  EXPECT_EQ(SlidingLayers(*config), std::vector<int64_t>({0, 2, 4}));
  EXPECT_EQ(config->rope.type, RopeType::kYarn);
  EXPECT_EQ(config->rope.theta, 150000.0);
  EXPECT_EQ(config->rope.factor, 32.0);
  EXPECT_EQ(config->rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(config->rope.truncate);
  EXPECT_DOUBLE_EQ(config->rope.attention_factor, 0.1 * std::log(32.0) + 1);
  const MoeConfig& moe = config->moe;
  EXPECT_EQ(moe.num_experts, 8);
  EXPECT_EQ(moe.top_k, 2);
  EXPECT_EQ(moe.intermediate_size, 64);  // intermediate_size is the experts'.
  EXPECT_EQ(moe.router, RouterStyle::kTopKThenSoftmax);
  EXPECT_TRUE(moe.router_bias && moe.expert_bias && moe.experts_transposed);
  EXPECT_EQ(moe.activation, ExpertActivation::kClampedSwigluInterleaved);
  EXPECT_EQ(moe.swiglu_alpha, 1.702);
  EXPECT_EQ(moe.swiglu_limit, 7.0);
  EXPECT_EQ(moe.router_module, "mlp.router");
  EXPECT_FALSE(HasDenseLayers(*config));
}

TEST(ModelFamilyConfigTest, GptOssReadsItsKeysAndRoundTrips) {
  // gpt-oss-20b's config.json spelling: 4.x rope keys, MXFP4 experts.
  json raw = GptOss();
  raw["head_dim"] = 8;
  raw["rms_norm_eps"] = 1e-6;
  raw["sliding_window"] = 4;
  raw["layer_types"] = {"full_attention",    "sliding_attention",
                        "full_attention",    "full_attention",
                        "sliding_attention", "full_attention"};
  raw["attention_bias"] = false;
  raw["swiglu_alpha"] = 1.5;
  raw["swiglu_limit"] = 3.0;
  raw["rope_theta"] = 50000.0;
  raw["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 8.0},
      {"beta_fast", 16.0},   {"beta_slow", 2.0},
      {"truncate", false},   {"original_max_position_embeddings", 256}};
  raw["quantization_config"] = {
      {"quant_method", "mxfp4"},
      {"modules_to_not_convert", {"model.layers.*.self_attn", "lm_head"}}};
  auto config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->head_dim, 8);
  EXPECT_FALSE(config->qkv_bias || config->o_bias);
  EXPECT_EQ(SlidingLayers(*config), std::vector<int64_t>({1, 4}));
  EXPECT_EQ(config->rope.theta, 50000.0);
  EXPECT_EQ(config->rope.factor, 8.0);
  EXPECT_EQ(config->rope.beta_fast, 16.0);
  EXPECT_EQ(config->rope.original_max_position_embeddings, 256);
  EXPECT_EQ(config->moe.swiglu_limit, 3.0);

  auto again = ParseModelConfig(ModelConfigToJson(*config), "written");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(json::parse(ModelConfigToJson(*again)),
            json::parse(ModelConfigToJson(*config)));
  EXPECT_EQ(again->head_dim, 8);
  EXPECT_EQ(again->rms_norm_eps, 1e-6);
  EXPECT_EQ(again->sliding_window, 4);
  EXPECT_EQ(SlidingLayers(*again), std::vector<int64_t>({1, 4}));
  EXPECT_FALSE(again->qkv_bias || again->o_bias);
  EXPECT_TRUE(again->attention_sinks);
  EXPECT_EQ(again->rope.type, RopeType::kYarn);
  EXPECT_EQ(again->rope.theta, 50000.0);
  EXPECT_EQ(again->rope.beta_slow, 2.0);
  EXPECT_FALSE(again->rope.truncate);
  EXPECT_EQ(again->moe.num_experts, 8);
  EXPECT_EQ(again->moe.top_k, 2);
  EXPECT_EQ(again->moe.intermediate_size, 64);
  EXPECT_EQ(again->moe.swiglu_alpha, 1.5);
  EXPECT_EQ(again->moe.swiglu_limit, 3.0);

  // 5.x rope_parameters without a rope_theta take GptOssConfig's 150000.
  raw = GptOss();
  raw["max_position_embeddings"] = 64;
  raw["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope.theta, 150000.0);
  EXPECT_EQ(config->rope.factor, 4.0);
}

TEST(ModelFamilyConfigTest, GptOss20bReleasedConfigParses) {
  // openai/gpt-oss-20b's config.json (transformers 4.55), layer_types cut.
  json raw = json::parse(R"({
    "architectures": ["GptOssForCausalLM"], "attention_bias": true,
    "attention_dropout": 0.0, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 2880,
    "max_position_embeddings": 131072, "model_type": "gpt_oss",
    "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": false,
    "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router",
        "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
        "original_max_position_embeddings": 4096, "rope_type": "yarn",
        "truncate": false},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9,
    "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 201088})");
  auto config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->moe.num_experts, 32);
  EXPECT_EQ(config->moe.top_k, 4);
  EXPECT_EQ(config->moe.intermediate_size, 2880);
  EXPECT_EQ(config->rope.type, RopeType::kYarn);
  EXPECT_EQ(config->rope.theta, 150000.0);
  EXPECT_EQ(config->rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(SlidingLayers(*config).size(), 12u);  // Even layers.
  EXPECT_EQ(config->dtype, StoredDtype::kBFloat16);
}

TEST(ModelFamilyConfigTest, GptOssRefusesOtherQuantizations) {
  json raw = GptOss();
  raw["quantization_config"] = {{"quant_method", "fp8"}};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("quantization_config.quant_method \"fp8\" is not "
                        "supported (only gpt_oss's \"mxfp4\""));
  raw["quantization_config"] = {{"bits", 4}};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("quantization_config is not supported without a "
                        "quant_method"));
  raw = Base("qwen3", "Qwen3ForCausalLM");
  raw["quantization_config"] = {{"quant_method", "mxfp4"}};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("quantization_config.quant_method \"mxfp4\" is "
                        "supported for model_type gpt_oss only"));
  raw = GptOss();
  raw["output_router_logits"] = true;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("output_router_logits true is not supported"));
  raw = GptOss();
  raw.erase("num_local_experts");
  EXPECT_THAT(ConfigJsonError(raw), HasSubstr("num_experts is required"));
}

json Qwen3Moe() {
  json raw = Base("qwen3_moe", "Qwen3MoeForCausalLM");
  raw["num_experts"] = 8;
  raw["num_experts_per_tok"] = 2;
  raw["moe_intermediate_size"] = 16;
  return raw;
}

std::vector<int64_t> SparseLayers(const ModelConfig& config) {
  std::vector<int64_t> layers;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    if (LayerIsSparse(config, i)) layers.push_back(i);
  }
  return layers;
}

TEST(ModelFamilyConfigTest, Qwen3MoeReadsItsExpertsAndSparseLayers) {
  auto config = ParseConfigJson(Qwen3Moe());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->qk_norm, QkNorm::kPerHead);  // Qwen3's attention.
  EXPECT_EQ(config->moe.num_experts, 8);
  EXPECT_EQ(config->moe.top_k, 2);
  EXPECT_EQ(config->moe.intermediate_size, 16);
  EXPECT_FALSE(config->moe.norm_topk_prob);  // Qwen3MoeConfig's default.
  EXPECT_EQ(config->moe.router, RouterStyle::kSoftmaxThenTopK);
  EXPECT_EQ(SparseLayers(*config), std::vector<int64_t>({0, 1, 2, 3, 4, 5}));
  EXPECT_FALSE(HasDenseLayers(*config));

  // transformers 5 writes num_local_experts; decoder_sparse_step k makes
  // layers k-1, 2k-1, ... sparse; mlp_only_layers are dense.
  json raw = Qwen3Moe();
  raw.erase("num_experts");
  raw["num_local_experts"] = 4;
  raw["decoder_sparse_step"] = 2;
  raw["mlp_only_layers"] = {3};
  raw["norm_topk_prob"] = true;
  config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->moe.num_experts, 4);
  EXPECT_TRUE(config->moe.norm_topk_prob);
  EXPECT_EQ(SparseLayers(*config), std::vector<int64_t>({1, 5}));
  EXPECT_EQ(LayerProjections(*config, 1),
            std::vector<Projection>(
                {Projection::kQ, Projection::kK, Projection::kV, Projection::kO,
                 Projection::kExpertGateUp, Projection::kExpertDown}));
  EXPECT_EQ(LayerProjections(*config, 3), LayerProjections(*config));

  auto again = ParseModelConfig(ModelConfigToJson(*config), "written");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(SparseLayers(*again), SparseLayers(*config));
  EXPECT_EQ(again->moe.num_experts, 4);
  EXPECT_EQ(again->moe.top_k, 2);
  EXPECT_EQ(again->moe.intermediate_size, 16);
  EXPECT_TRUE(again->moe.norm_topk_prob);
}

TEST(ModelFamilyConfigTest, Qwen3MoeErrorsNameTheKey) {
  json raw = Qwen3Moe();
  raw["num_experts_per_tok"] = 9;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("num_experts_per_tok must be at most num_experts "
                        "(8), got 9"));
  raw = Qwen3Moe();
  raw["mlp_only_layers"] = {6};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("mlp_only_layers[0] must be a layer index in [0, 6), "
                        "got 6"));
  raw = Qwen3Moe();
  raw.erase("moe_intermediate_size");
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("moe_intermediate_size is required"));
  raw = Qwen3Moe();
  raw["output_router_logits"] = true;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("output_router_logits true is not supported: the "
                        "router's auxiliary loss is not supported"));
  raw = Qwen3Moe();
  raw["shared_expert_intermediate_size"] = 64;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("shared_expert_intermediate_size 64 is not "
                        "supported: shared experts are not supported"));
}

TEST(ModelFamilyConfigTest, LoraTargetsFitTheExperts) {
  json raw = Qwen3Moe();
  raw["mlp_only_layers"] = {0};
  const ModelConfig mixed = *ParseConfigJson(raw);
  const ModelConfig sparse = *ParseConfigJson(Qwen3Moe());
  const ModelConfig llama = *ParseConfigJson(Base("llama", "LlamaForCausalLM"));
  const std::vector<Projection> seven(kAllProjections.begin(),
                                      kAllProjections.end());
  // The default targets adapt every MLP: the dense layers' projections
  // where there are dense layers, and the experts.
  auto fitted = FitLoraTargets(mixed, seven);
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  std::vector<Projection> expected = seven;
  expected.push_back(Projection::kExpertGateUp);
  expected.push_back(Projection::kExpertDown);
  EXPECT_EQ(*fitted, expected);
  fitted = FitLoraTargets(sparse, seven);
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  EXPECT_EQ(*fitted,
            std::vector<Projection>(
                {Projection::kQ, Projection::kK, Projection::kV, Projection::kO,
                 Projection::kExpertGateUp, Projection::kExpertDown}));
  fitted = FitLoraTargets(sparse, {Projection::kQ, Projection::kExpertDown});
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  EXPECT_EQ(*fitted,
            std::vector<Projection>({Projection::kQ, Projection::kExpertDown}));
  EXPECT_THAT(
      FitLoraTargets(sparse, {Projection::kGate}).status().message(),
      HasSubstr("stores each expert's gate_proj and up_proj as one matrix, "
                "experts.gate_up_proj"));
  EXPECT_THAT(FitLoraTargets(sparse, seven, /*dropout=*/0.1).status().message(),
              HasSubstr("lora.dropout must be 0 when the experts are adapted"));
  EXPECT_TRUE(FitLoraTargets(sparse, {Projection::kQ}, 0.1).ok());
  EXPECT_THAT(
      FitLoraTargets(llama, {Projection::kExpertDown}).status().message(),
      HasSubstr("names experts.down_proj, but model_type llama has no "
                "mixture-of-experts layers"));
}

TEST(ModelFamilyConfigTest, LlamaLayoutKeepsItsDefaults) {
  auto config = ParseConfigJson(Base("llama", "LlamaForCausalLM"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->norm_style, NormStyle::kCastThenScale);
  EXPECT_EQ(config->norm_placement, NormPlacement::kPreNorm);
  EXPECT_EQ(config->qk_norm, QkNorm::kNone);
  EXPECT_EQ(config->activation, MlpActivation::kSilu);
  EXPECT_FALSE(config->scale_embeddings);
  EXPECT_FALSE(config->attention_scale.has_value());
  EXPECT_TRUE(SlidingLayers(*config).empty());
}

TEST(ModelFamilyConfigTest, Qwen3HasPerHeadQkNormsAndNoBiases) {
  json raw = Base("qwen3", "Qwen3ForCausalLM");
  raw["head_dim"] = 16;
  auto config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "qwen3");
  EXPECT_EQ(config->qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_TRUE(SlidingLayers(*config).empty());
  raw["attention_bias"] = true;
  EXPECT_TRUE(ParseConfigJson(raw)->qkv_bias && ParseConfigJson(raw)->o_bias);
}

TEST(ModelFamilyConfigTest, Qwen3WindowsLayersFromMaxWindowLayersWhenAsked) {
  json raw = Base("qwen3", "Qwen3ForCausalLM");
  raw["sliding_window"] = 8;
  raw["max_window_layers"] = 4;
  // Without use_sliding_window, transformers ignores the window.
  EXPECT_TRUE(SlidingLayers(ParseConfigJson(raw).value()).empty());
  raw["use_sliding_window"] = true;
  auto config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->sliding_window, 8);
  EXPECT_EQ(SlidingLayers(*config), (std::vector<int64_t>{4, 5}));
}

TEST(ModelFamilyConfigTest, OlmoLayoutsArePostNormWithWholeProjectionQkNorms) {
  auto olmo2 = ParseConfigJson(Base("olmo2", "Olmo2ForCausalLM"));
  ASSERT_TRUE(olmo2.ok()) << olmo2.status();
  EXPECT_EQ(olmo2->norm_placement, NormPlacement::kPostNorm);
  EXPECT_EQ(olmo2->norm_style, NormStyle::kScaleThenCast);
  EXPECT_EQ(olmo2->qk_norm, QkNorm::kWholeProjection);
  EXPECT_EQ(olmo2->rms_norm_eps, 1e-5);  // transformers' OLMo default.
  EXPECT_TRUE(SlidingLayers(*olmo2).empty());

  // OLMo 3: three sliding layers then a full one, window 4096, unless the
  // config says otherwise.
  auto olmo3 = ParseConfigJson(Base("olmo3", "Olmo3ForCausalLM"));
  ASSERT_TRUE(olmo3.ok()) << olmo3.status();
  EXPECT_EQ(olmo3->norm_placement, NormPlacement::kPostNorm);
  EXPECT_EQ(olmo3->sliding_window, 4096);
  EXPECT_EQ(SlidingLayers(*olmo3), (std::vector<int64_t>{0, 1, 2, 4, 5}));
}

TEST(ModelFamilyConfigTest, Olmo3LegacyRopeScalingAppliesToFullLayersOnly) {
  json raw = Base("olmo3", "Olmo3ForCausalLM");
  raw["rope_theta"] = 500000.0;
  raw["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  auto config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope.type, RopeType::kLinear);
  ASSERT_TRUE(config->sliding_rope.has_value());
  EXPECT_EQ(config->sliding_rope->type, RopeType::kDefault);
  EXPECT_EQ(config->sliding_rope->theta, 500000.0);
}

TEST(ModelFamilyConfigTest, Gemma3TextFeaturesAndDefaults) {
  json raw = Base("gemma3_text", "Gemma3ForCausalLM");
  raw["head_dim"] = 16;
  raw["query_pre_attn_scalar"] = 64;
  raw["rope_theta"] = 1000000.0;
  raw["rope_local_base_freq"] = 10000.0;
  raw["sliding_window"] = 512;
  raw["sliding_window_pattern"] = 3;
  auto config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->norm_style, NormStyle::kOnePlusWeight);
  EXPECT_EQ(config->norm_placement, NormPlacement::kSandwich);
  EXPECT_EQ(config->qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(config->activation, MlpActivation::kGeluTanh);
  EXPECT_TRUE(config->scale_embeddings);
  EXPECT_DOUBLE_EQ(config->attention_scale.value(), 0.125);
  EXPECT_EQ(config->rope.theta, 1000000.0);
  ASSERT_TRUE(config->sliding_rope.has_value());
  EXPECT_EQ(config->sliding_rope->theta, 10000.0);
  EXPECT_EQ(SlidingLayers(*config), (std::vector<int64_t>{0, 1, 3, 4}));
}

TEST(ModelFamilyConfigTest, PerLayerTypeRopeParameters) {
  json raw = Base("gemma3_text", "Gemma3ForCausalLM");
  raw["layer_types"] = {"sliding_attention", "full_attention",
                        "sliding_attention", "full_attention",
                        "sliding_attention", "full_attention"};
  raw["rope_parameters"] = {
      {"full_attention",
       {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  auto config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope.type, RopeType::kLinear);
  EXPECT_EQ(config->rope.factor, 8.0);
  EXPECT_EQ(config->sliding_rope->theta, 1e4);
  EXPECT_EQ(SlidingLayers(*config), (std::vector<int64_t>{0, 2, 4}));

  raw["rope_parameters"]["chunked_attention"] = json::object();
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("rope_parameters.chunked_attention is "
                        "not a layer type"));
  raw["rope_parameters"].erase("chunked_attention");
  raw["rope_parameters"]["full_attention"]["rope_type"] = "dynamic";
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("rope_parameters.full_attention.rope_type "
                        "\"dynamic\" is not supported"));
}

TEST(ModelFamilyConfigTest, BadLayerTypesAreNamed) {
  json raw = Base("olmo3", "Olmo3ForCausalLM");
  raw["layer_types"] = {"full_attention"};
  EXPECT_THAT(ConfigJsonError(raw), HasSubstr("layer_types must be a list of "
                                              "num_hidden_layers (6) entries"));
  raw["layer_types"] = {"full_attention", "full_attention", "chunked_attention",
                        "full_attention", "full_attention", "full_attention"};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("layer_types[2] \"chunked_attention\" "
                        "is not supported"));
}

TEST(ModelFamilyConfigTest, UnimplementedFeaturesAreRefusedByName) {
  json raw = Base("gemma3_text", "Gemma3ForCausalLM");
  raw["attn_logit_softcapping"] = 50.0;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("config.json: attn_logit_softcapping "
                        "50.0 is not supported"));
  raw = Base("gemma3_text", "Gemma3ForCausalLM");
  raw["final_logit_softcapping"] = 30.0;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("final_logit_softcapping 30.0 is not "
                        "supported"));
  raw = Base("gemma3_text", "Gemma3ForCausalLM");
  raw["use_bidirectional_attention"] = true;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("use_bidirectional_attention true is not supported"));
  raw = Base("qwen3", "Qwen3ForCausalLM");
  raw["quantization_config"] = {{"quant_method", "fp8"}};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("quantization_config.quant_method \"fp8\" is not "
                        "supported"));
  raw = Base("qwen3", "Qwen3ForCausalLM");
  raw["hidden_act"] = "relu";
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("hidden_act must be \"silu\" or "
                        "\"gelu_pytorch_tanh\", got \"relu\""));
  raw = Base("qwen3", "Qwen3ForCausalLM");
  raw["architectures"] = {"Qwen3MoeForCausalLM"};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("architectures entry "
                        "\"Qwen3MoeForCausalLM\" is not "
                        "supported with model_type \"qwen3\""));
  // Neutral values are accepted.
  raw = Base("gemma3_text", "Gemma3ForCausalLM");
  raw["attn_logit_softcapping"] = nullptr;
  raw["use_bidirectional_attention"] = false;
  EXPECT_TRUE(ParseConfigJson(raw).ok());
}

// google/gemma-3-4b-it's config.json as transformers 4.x wrote it: the text
// model's keys under text_config, Gemma3TextConfig's defaults left out,
// dtype and token ids at the top level.
json Gemma3Multimodal() {
  return json::parse(R"({
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
      "hidden_size": 2560, "intermediate_size": 10240,
      "model_type": "gemma3_text", "num_hidden_layers": 34,
      "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
      "sliding_window": 1024
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896,
      "intermediate_size": 4304, "model_type": "siglip_vision_model",
      "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14,
      "vision_use_head": false}
  })");
}

TEST(ModelFamilyConfigTest, Gemma3MultimodalReadsTextConfigWithDefaults) {
  auto config = ParseConfigJson(Gemma3Multimodal());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "gemma3");
  EXPECT_EQ(config->hidden_size, 2560);
  EXPECT_EQ(config->intermediate_size, 10240);
  EXPECT_EQ(config->num_hidden_layers, 34);
  // Gemma3TextConfig's defaults.
  EXPECT_EQ(config->vocab_size, 262208);
  EXPECT_EQ(config->num_attention_heads, 8);
  EXPECT_EQ(config->num_key_value_heads, 4);
  EXPECT_EQ(config->head_dim, 256);
  EXPECT_EQ(config->max_position_embeddings, 131072);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(*config->attention_scale, 1.0 / 16.0);
  EXPECT_EQ(config->rope.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(config->rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(config->rope.theta, 1e6);
  ASSERT_TRUE(config->sliding_rope.has_value());
  EXPECT_DOUBLE_EQ(config->sliding_rope->theta, 1e4);
  EXPECT_EQ(config->sliding_window, 1024);
  EXPECT_EQ(SlidingLayers(*config).size(), 34u - 5u);  // Every 6th global.
  EXPECT_EQ(config->activation, MlpActivation::kGeluTanh);
  EXPECT_EQ(config->norm_placement, NormPlacement::kSandwich);
  // The top level's.
  EXPECT_EQ(config->dtype, StoredDtype::kBFloat16);
  EXPECT_EQ(config->eos_token_id, 1);
  EXPECT_EQ(config->bos_token_id, 2);
  EXPECT_EQ(config->pad_token_id, 0);
}

TEST(ModelFamilyConfigTest, Gemma3MultimodalTopLevelKeysWin) {
  json raw = Gemma3Multimodal();
  raw["text_config"]["tie_word_embeddings"] = true;
  raw["tie_word_embeddings"] = false;
  raw["text_config"]["dtype"] = "float32";
  raw["text_config"]["vocab_size"] = 300;
  raw["eos_token_id"] = 7;
  auto config = ParseConfigJson(raw);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_EQ(config->dtype, StoredDtype::kBFloat16);
  EXPECT_EQ(config->eos_token_id, 7);
  EXPECT_EQ(config->vocab_size, 300);
}

TEST(ModelFamilyConfigTest, Gemma3MultimodalErrorsNameTextConfig) {
  json raw = Gemma3Multimodal();
  raw["text_config"]["num_attention_heads"] = 0;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("config.json: text_config: num_attention_heads must "
                        "be a positive integer"));
  raw = Gemma3Multimodal();
  raw["text_config"]["model_type"] = "llama";
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("text_config.model_type must be \"gemma3_text\" for "
                        "model_type \"gemma3\", got \"llama\""));
  raw = Gemma3Multimodal();
  raw["text_config"] = 5;
  EXPECT_THAT(ConfigJsonError(raw), HasSubstr("text_config must be an object"));
  raw = Gemma3Multimodal();
  raw["text_config"]["final_logit_softcapping"] = 30.0;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("text_config: final_logit_softcapping 30.0 is not "
                        "supported"));
  raw = Gemma3Multimodal();
  raw["quantization_config"] = {{"quant_method", "bitsandbytes"}};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("quantization_config.quant_method \"bitsandbytes\" "
                        "is not supported"));
  raw = Gemma3Multimodal();
  raw["architectures"] = {"Gemma3ForCausalLM"};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("expected \"Gemma3ForConditionalGeneration\""));
}

// Phi-3.5-mini's keys, as 4.x writes them: LongRoPE in rope_scaling, the
// original context on its own, Phi3Config's eps default.
json Phi3LongRope() {
  json raw = Base("phi3", "Phi3ForCausalLM");
  raw["hidden_size"] = 64;  // head_dim 16.
  raw["max_position_embeddings"] = 131072;
  raw["original_max_position_embeddings"] = 4096;
  raw["partial_rotary_factor"] = 0.75;
  raw["rope_scaling"] = {{"type", "longrope"},
                         {"short_factor", {1.0, 1.1, 1.2, 1.3, 1.4, 1.5}},
                         {"long_factor", {2.0, 3.0, 4.0, 5.0, 6.0, 7.0}}};
  return raw;
}

TEST(ModelFamilyConfigTest, Phi3IsFusedWithLongRopeAndPartialRotation) {
  auto config = ParseConfigJson(Phi3LongRope());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->fused_projections);
  EXPECT_EQ(LayerProjections(*config),
            std::vector<Projection>(kFusedProjections.begin(),
                                    kFusedProjections.end()));
  EXPECT_EQ(config->rms_norm_eps, 1e-5);
  EXPECT_EQ(config->rope.type, RopeType::kLongRope);
  EXPECT_EQ(config->rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(RotaryDim(config->rope, config->head_dim), 12);
  EXPECT_EQ(config->rope.long_factor[5], 7.0);
  // transformers' default: sqrt(1 + ln(131072 / 4096) / ln(4096)).
  EXPECT_DOUBLE_EQ(config->rope.attention_factor,
                   std::sqrt(1.0 + std::log(32.0) / std::log(4096.0)));
  EXPECT_FALSE(
      ParseConfigJson(Base("llama", "LlamaForCausalLM"))->fused_projections);

  json raw = Phi3LongRope();
  raw["rope_scaling"]["long_factor"] = {2.0, 3.0};
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("rope_scaling.long_factor must have 6 "
                        "entries (half "
                        "the rotated head dimensions), got 2"));
  raw = Phi3LongRope();
  raw["rope_scaling"].erase("short_factor");
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("rope_scaling.short_factor must be a "
                        "non-empty list of numbers"));
  raw = Phi3LongRope();
  raw["partial_rotary_factor"] = 0.2;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("rope_scaling.partial_rotary_factor (0.2) must rotate "
                        "an even number of a head's 16 dimensions, got 3"));
  raw = Phi3LongRope();
  raw["resid_pdrop"] = 0.1;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("resid_pdrop 0.1 is not supported"));
  // Only a family whose attention rotates part of a head accepts it.
  raw = Base("llama", "LlamaForCausalLM");
  raw["partial_rotary_factor"] = 0.5;
  EXPECT_THAT(ConfigJsonError(raw),
              HasSubstr("partial_rotary_factor other than 1.0 "
                        "is not supported for model_type "
                        "llama"));
}

TEST(ModelFamilyConfigTest, LoraTargetsFitTheLayout) {
  const ModelConfig phi3 = *ParseConfigJson(Phi3LongRope());
  const ModelConfig llama = *ParseConfigJson(Base("llama", "LlamaForCausalLM"));
  const std::vector<Projection> seven(kAllProjections.begin(),
                                      kAllProjections.end());
  auto fitted = FitLoraTargets(phi3, seven);
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  EXPECT_EQ(*fitted, std::vector<Projection>(kFusedProjections.begin(),
                                             kFusedProjections.end()));
  EXPECT_EQ(*FitLoraTargets(llama, seven), seven);
  fitted = FitLoraTargets(phi3, {Projection::kQ, Projection::kK, Projection::kV,
                                 Projection::kLmHead});
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  EXPECT_EQ(*fitted,
            std::vector<Projection>({Projection::kQkv, Projection::kLmHead}));
  EXPECT_THAT(
      FitLoraTargets(phi3, {Projection::kQ, Projection::kV}).status().message(),
      HasSubstr("model_type phi3 stores q_proj, k_proj, v_proj as one "
                "matrix, qkv_proj, adapted as a whole"));
  EXPECT_THAT(FitLoraTargets(llama, {Projection::kGateUp}).status().message(),
              HasSubstr("names gate_up_proj, which model_type llama does not "
                        "have: name its parts, gate_proj, up_proj"));
}

TEST(ModelFamilyConfigTest, WrittenJsonParsesBackForEveryFamily) {
  std::vector<json> configs = {Base("mistral", "MistralForCausalLM"),
                               Base("qwen3", "Qwen3ForCausalLM"),
                               Base("olmo2", "Olmo2ForCausalLM"),
                               Base("olmo3", "Olmo3ForCausalLM"),
                               Base("gemma3_text", "Gemma3ForCausalLM"),
                               Phi3LongRope(),
                               Gemma3Multimodal(),
                               Qwen3Moe()};
  configs[0]["sliding_window"] = 16;
  configs[1]["use_sliding_window"] = true;
  configs[1]["sliding_window"] = 8;
  configs[1]["max_window_layers"] = 2;
  configs[4]["query_pre_attn_scalar"] = 64;
  configs[4]["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  for (const json& raw : configs) {
    SCOPED_TRACE(raw["model_type"].get<std::string>());
    auto config = ParseConfigJson(raw);
    ASSERT_TRUE(config.ok()) << config.status();
    auto again = ParseModelConfig(ModelConfigToJson(*config), "written");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->model_type, config->model_type);
    EXPECT_EQ(SlidingLayers(*again), SlidingLayers(*config));
    EXPECT_EQ(again->sliding_window, config->sliding_window);
    EXPECT_EQ(again->norm_style, config->norm_style);
    EXPECT_EQ(again->norm_placement, config->norm_placement);
    EXPECT_EQ(again->qk_norm, config->qk_norm);
    EXPECT_EQ(again->activation, config->activation);
    EXPECT_EQ(again->scale_embeddings, config->scale_embeddings);
    EXPECT_EQ(again->attention_scale, config->attention_scale);
    EXPECT_EQ(again->rope.type, config->rope.type);
    EXPECT_EQ(again->rope.factor, config->rope.factor);
    EXPECT_EQ(again->rope.short_factor, config->rope.short_factor);
    EXPECT_EQ(again->rope.long_factor, config->rope.long_factor);
    EXPECT_EQ(again->rope.attention_factor, config->rope.attention_factor);
    EXPECT_EQ(again->rope.partial_rotary_factor,
              config->rope.partial_rotary_factor);
    EXPECT_EQ(again->rope.original_max_position_embeddings,
              config->rope.original_max_position_embeddings);
    EXPECT_EQ(again->fused_projections, config->fused_projections);
    EXPECT_EQ(again->sliding_rope.has_value(),
              config->sliding_rope.has_value());
    if (config->sliding_rope.has_value()) {
      EXPECT_EQ(again->sliding_rope->theta, config->sliding_rope->theta);
      EXPECT_EQ(again->sliding_rope->type, config->sliding_rope->type);
    }
  }
}

}  // namespace
}  // namespace loraplex
