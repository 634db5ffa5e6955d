#include "core/train/token_budget.h"

#include <gtest/gtest.h>

#include <string>

namespace loraplex {
namespace {

// Llama-3-8B's config.json.
ModelConfig Llama3_8B() {
  ModelConfig config;
  config.vocab_size = 128256;
  config.hidden_size = 4096;
  config.intermediate_size = 14336;
  config.num_hidden_layers = 32;
  config.num_attention_heads = 32;
  config.num_key_value_heads = 8;
  config.head_dim = 128;
  return config;
}

// Qwen2.5-0.5B's config.json.
ModelConfig Qwen2_5_0_5B() {
  ModelConfig config;
  config.model_type = "qwen2";
  config.vocab_size = 151936;
  config.hidden_size = 896;
  config.intermediate_size = 4864;
  config.num_hidden_layers = 24;
  config.num_attention_heads = 14;
  config.num_key_value_heads = 2;
  config.tie_word_embeddings = true;
  config.qkv_bias = true;
  return config;
}

// The published parameter counts (the checkpoints' safetensors headers).
TEST(TokenBudgetTest, CountsTheBaseParameters) {
  EXPECT_EQ(BaseParameterCount(Llama3_8B()), 8030261248);
  EXPECT_EQ(BaseParameterCount(Qwen2_5_0_5B()), 494032768);
}

// Qwen3-30B-A3B's published config; its counts are what transformers'
// Qwen3MoeForCausalLM built from that config holds (30.5B in all, 3.3B
// active as its model card says).
ModelConfig Qwen3_30B_A3B() {
  ModelConfig config;
  config.model_type = "qwen3_moe";
  config.vocab_size = 151936;
  config.hidden_size = 2048;
  config.intermediate_size = 6144;
  config.num_hidden_layers = 48;
  config.num_attention_heads = 32;
  config.num_key_value_heads = 4;
  config.head_dim = 128;
  config.qk_norm = QkNorm::kPerHead;
  config.moe.num_experts = 128;
  config.moe.top_k = 8;
  config.moe.intermediate_size = 768;
  return config;
}

TEST(TokenBudgetTest, CountsEveryExpertAndTheActiveOnes) {
  EXPECT_EQ(BaseParameterCount(Qwen3_30B_A3B()), 30532122624);
  EXPECT_EQ(ActiveParameterCount(Qwen3_30B_A3B()), 3353032704);
  EXPECT_EQ(ActiveParameterCount(Llama3_8B()), BaseParameterCount(Llama3_8B()));
  // Per routed copy of a token: input, gate_up (2·768), the activation's
  // halves and output (2·768), down output and its weighted copy (2·2048),
  // less what the formula folds: 8·(3·2048 + 4·768) + 2·128 router values;
  // and the adapted experts' fp32 inputs, 2·8·(2048 + 768).
  const ModelConfig moe = Qwen3_30B_A3B();
  EXPECT_EQ(SavedActivationsPerTokenPerLayer(moe),
            4 * 2048 + 4096 + 2 * 4096 + 2 * 4096 + 8 * (3 * 2048 + 4 * 768) +
                2 * 128 + 2 * 8 * (2048 + 768));
}

TEST(TokenBudgetTest, CpuKeepsItsBudget) {
  EXPECT_EQ(
      DefaultTokenBudget(Llama3_8B(), /*on_gpu=*/false, int64_t{1} << 40, 2),
      kCpuTokenBudget);
}

TEST(TokenBudgetTest, GpuBudgetIsWhatHalfTheFreeMemoryHolds) {
  const ModelConfig config = Llama3_8B();
  const int64_t memory = int64_t{141} << 30;  // An H200.
  // Norms 4·4096; rotated q 4096; k and v repeated to the 32 query heads
  // 2·4096; attention output and o_proj's copy 2·4096; MLP 4·14336.
  EXPECT_EQ(SavedActivationsPerTokenPerLayer(config), 94208);
  // Beyond the layers: 4·4096 + 2·14336 + 4096.
  const int64_t per_token = (32 * 94208 + 49152) * 2;
  const int64_t fits = (memory - 8030261248 * 2) / 2 / per_token;  // 11,043
  ASSERT_GE(fits, 8192);
  ASSERT_LT(fits, 16384);
  EXPECT_EQ(DefaultTokenBudget(config, true, memory, 2), 8192);
  // fp32 needs twice the bytes: 4096.
  EXPECT_EQ(DefaultTokenBudget(config, true, memory, 4), 4096);
  // With every layer always checkpointed a token keeps 32·4096 + 94,208 +
  // 49,152 elements: 123,000-odd tokens fit, up to the cap; every other
  // layer: 1,716,224 per token, 19,700-odd fit.
  EXPECT_EQ(DefaultTokenBudget(config, true, memory, 2, 1),
            kMaxDefaultTokenBudget);
  EXPECT_EQ(DefaultTokenBudget(config, true, memory, 2, 2), 16384);
  // Qwen2.5-0.5B: 24 · 27,520 + 14,208 elements per token, 55,700-odd
  // tokens fit.
  EXPECT_EQ(DefaultTokenBudget(Qwen2_5_0_5B(), true, memory, 2), 32768);
  // A smaller model stops at the cap.
  ModelConfig shallow = Qwen2_5_0_5B();
  shallow.num_hidden_layers = 8;
  EXPECT_EQ(DefaultTokenBudget(shallow, true, memory, 2),
            kMaxDefaultTokenBudget);
  // A GPU the weights barely fit on gets the CPU's budget, never less.
  EXPECT_EQ(DefaultTokenBudget(config, true, int64_t{17} << 30, 2),
            kCpuTokenBudget);
  EXPECT_EQ(DefaultTokenBudget(config, true, int64_t{8} << 30, 2),
            kCpuTokenBudget);
}

// A rank of a sharded base holds only part of the weights (weight_bytes):
// what the rest leaves sets the budget and the activation memory, where the
// whole base would leave too little.
TEST(TokenBudgetTest, ShardedBaseCountsTheWeightsARankHolds) {
  const ModelConfig config = Llama3_8B();
  const int64_t memory = int64_t{17} << 30;
  const int64_t held = int64_t{4} << 30;
  ASSERT_EQ(DefaultTokenBudget(config, true, memory, 2, 1), kCpuTokenBudget);
  // Every layer checkpointed: (32·4096 + 94,208 + 49,152) · 2 bytes a token;
  // 12,700-odd tokens fit in half of the 13 GiB left.
  const int64_t per_token = (32 * 4096 + 94208 + 49152) * 2;
  const int64_t fits = (memory - held) / 2 / per_token;
  ASSERT_GE(fits, 8192);
  ASSERT_LT(fits, 16384);
  EXPECT_EQ(DefaultTokenBudget(config, true, memory, 2, 1, held), 8192);
  // Three quarters of what 4 GiB of weights leave of 8 GiB; the whole base
  // leaves nothing.
  EXPECT_EQ(ActivationMemoryBytes(config, int64_t{8} << 30, 2), 0);
  EXPECT_EQ(ActivationMemoryBytes(config, int64_t{8} << 30, 2, held),
            int64_t{3} << 30);
}

// Closed forms of the estimate: without checkpointing every layer keeps its
// 94,208 elements per token; checkpointing layers 0, k, 2k, ... keeps their
// inputs (4,096 each) plus one layer's activations while it is recomputed;
// 49,152 more are held beyond the layers either way.
TEST(TokenBudgetTest, CheckpointingKeepsLayerInputsAndOneLayer) {
  const ModelConfig config = Llama3_8B();
  EXPECT_EQ(SavedActivationElements(config, 10, 0), 10 * (32 * 94208 + 49152));
  EXPECT_EQ(SavedActivationElements(config, 10, 1),
            10 * (32 * 4096 + 94208 + 49152));
  // every:2 checkpoints 16 layers, keeps 16; every:5 checkpoints 0, 5, ...,
  // 30: 7 layers.
  EXPECT_EQ(SavedActivationElements(config, 1, 2),
            16 * 94208 + 16 * 4096 + 94208 + 49152);
  EXPECT_EQ(SavedActivationElements(config, 1, 5),
            25 * 94208 + 7 * 4096 + 94208 + 49152);
  // Without grouped-query attention k and v are kept at their own width:
  // the same count when their heads are as many as the queries'.
  ModelConfig mha = config;
  mha.num_key_value_heads = 32;
  EXPECT_EQ(SavedActivationsPerTokenPerLayer(mha), 94208);
}

TEST(TokenBudgetTest, AutoCheckpointsOnlyWhatWouldNotFitAndAsLittleAsFits) {
  const ModelConfig config = Llama3_8B();
  CheckpointPolicy policy;
  policy.element_bytes = 2;
  const int64_t per_token = (32 * 94208 + 49152) * 2;
  policy.activation_bytes = 1000 * per_token;
  EXPECT_EQ(CheckpointEveryFor(policy, config, 1000), 0);
  // 1,001 tokens no longer fit unchecked. Layer 0 alone would cost more
  // than it saves (its input plus its recomputation), so k = 31 (layers 0
  // and 31): one layer's activations fewer, two inputs more.
  EXPECT_EQ(CheckpointEveryFor(policy, config, 1001), 31);
  // 1,600 tokens: k = 2 holds 16·94,208 + 16·4,096 + 94,208 + 49,152 =
  // 1,716,224 per token (fits 1,785 tokens); k = 3 holds 22·94,208 +
  // 11·4,096 + 49,152 = 2,166,784 (fits 1,413).
  EXPECT_EQ(CheckpointEveryFor(policy, config, 1600), 2);
  // Far beyond: every layer.
  EXPECT_EQ(CheckpointEveryFor(policy, config, 100000), 1);
  // No memory limit known: never.
  policy.activation_bytes = 0;
  EXPECT_EQ(CheckpointEveryFor(policy, config, 100000), 0);
  // off and every:K do not look at the size.
  policy.mode = CheckpointMode::kOff;
  EXPECT_EQ(CheckpointEveryFor(policy, config, 100000), 0);
  policy.mode = CheckpointMode::kEvery;
  policy.every = 3;
  EXPECT_EQ(CheckpointEveryFor(policy, config, 1), 3);
}

// The longest row is what the policy's most checkpointing fits: for the 8B
// shape in bf16 on an 80 GB GPU (three quarters of what the weights leave:
// 48.0 GB), 7,825 tokens unchecked and 87,370 with every layer.
TEST(TokenBudgetTest, MaxRowTokensIsWhatTheMostCheckpointingFits) {
  const ModelConfig config = Llama3_8B();
  CheckpointPolicy policy;
  policy.element_bytes = 2;
  policy.activation_bytes =
      ActivationMemoryBytes(config, int64_t{80} * 1000 * 1000 * 1000, 2);
  EXPECT_EQ(policy.activation_bytes, (80000000000 - 8030261248 * 2) / 4 * 3);
  const int64_t all = MaxRowTokens(policy, config);
  EXPECT_EQ(all, policy.activation_bytes / ((32 * 4096 + 94208 + 49152) * 2));
  EXPECT_EQ(all, 87370);
  policy.mode = CheckpointMode::kOff;
  const int64_t none = MaxRowTokens(policy, config);
  EXPECT_EQ(none, policy.activation_bytes / ((32 * 94208 + 49152) * 2));
  EXPECT_EQ(none, 7825);
  policy.mode = CheckpointMode::kEvery;
  policy.every = 2;
  const int64_t half = MaxRowTokens(policy, config);
  EXPECT_GT(half, none);
  EXPECT_LT(half, all);
  policy.activation_bytes = 0;
  EXPECT_EQ(MaxRowTokens(policy, config), 0);
  // The weights leave nothing: no limit is known.
  EXPECT_EQ(ActivationMemoryBytes(config, int64_t{8} << 30, 2), 0);
}

TEST(TokenBudgetTest, ParsesCheckpointModes) {
  CheckpointPolicy policy;
  ASSERT_TRUE(ParseCheckpointMode("off", &policy).ok());
  EXPECT_EQ(policy.mode, CheckpointMode::kOff);
  EXPECT_EQ(CheckpointModeName(policy), "off");
  ASSERT_TRUE(ParseCheckpointMode("all", &policy).ok());
  EXPECT_EQ(policy.mode, CheckpointMode::kEvery);
  EXPECT_EQ(policy.every, 1);
  EXPECT_EQ(CheckpointModeName(policy), "all");
  ASSERT_TRUE(ParseCheckpointMode("every:4", &policy).ok());
  EXPECT_EQ(policy.every, 4);
  EXPECT_EQ(CheckpointModeName(policy), "every:4");
  ASSERT_TRUE(ParseCheckpointMode("auto", &policy).ok());
  EXPECT_EQ(CheckpointModeName(policy), "auto");
  for (const std::string bad : {"every:0", "every:", "every:x", "on", ""}) {
    const absl::Status status = ParseCheckpointMode(bad, &policy);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(status.message(),
              "activation checkpointing must be off, auto, all or every:K "
              "with K >= 1, got \"" +
                  bad + "\"");
  }
}

}  // namespace
}  // namespace loraplex
