#include "core/train/token_budget.h"

#include <gtest/gtest.h>

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

TEST(TokenBudgetTest, CpuKeepsItsBudget) {
  EXPECT_EQ(
      DefaultTokenBudget(Llama3_8B(), /*on_gpu=*/false, int64_t{1} << 40, 2),
      kCpuTokenBudget);
}

TEST(TokenBudgetTest, GpuBudgetIsWhatHalfTheFreeMemoryHolds) {
  const ModelConfig config = Llama3_8B();
  const int64_t memory = int64_t{141} << 30;  // An H200.
  // 4·4096 + 2·4096 + 2·1024 + 4096 + 3·14336 elements per token and layer.
  EXPECT_EQ(SavedActivationsPerTokenPerLayer(config), 73728);
  const int64_t per_token = 32 * 73728 * 2;
  const int64_t fits = (memory - 8030261248 * 2) / 2 / per_token;  // 14,340
  ASSERT_GE(fits, 8192);
  ASSERT_LT(fits, 16384);
  EXPECT_EQ(DefaultTokenBudget(config, true, memory, 2), 8192);
  // fp32 needs twice the bytes: 4096.
  EXPECT_EQ(DefaultTokenBudget(config, true, memory, 4), 4096);
  // A small model on the same GPU stops at the cap.
  EXPECT_EQ(DefaultTokenBudget(Qwen2_5_0_5B(), true, memory, 2),
            kMaxDefaultTokenBudget);
  // A GPU the weights barely fit on gets the CPU's budget, never less.
  EXPECT_EQ(DefaultTokenBudget(config, true, int64_t{17} << 30, 2),
            kCpuTokenBudget);
  EXPECT_EQ(DefaultTokenBudget(config, true, int64_t{8} << 30, 2),
            kCpuTokenBudget);
}

}  // namespace
}  // namespace loraplex
