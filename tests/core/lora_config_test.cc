// LoRA and training configs from JSON: defaults, round trips, and errors
// that name the field.
#include "core/lora/lora_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/train/training_config.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

std::string Error(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

TEST(LoraConfigTest, DefaultsAndScale) {
  auto config = LoraConfigFromJson(nlohmann::json::object());
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->rank, 8);
  EXPECT_EQ(config->targets.size(), 7u);
  EXPECT_DOUBLE_EQ(LoraScale(*config), 16.0 / 8.0);
  config->use_rslora = true;
  EXPECT_DOUBLE_EQ(LoraScale(*config), 16.0 / std::sqrt(8.0));
}

TEST(LoraConfigTest, TargetsAreSortedAndRoundTrip) {
  auto config = LoraConfigFromJson(
      {{"rank", 4}, {"target_modules", {"v_proj", "q_proj", "down_proj"}}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->targets,
            (std::vector<Projection>{Projection::kQ, Projection::kV,
                                     Projection::kDown}));
  auto again = LoraConfigFromJson(LoraConfigToJson(*config));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->targets, config->targets);
  EXPECT_EQ(again->rank, 4);
}

// The LM head is a target only when named, and sorts after the layers'
// projections; it may be the only one.
TEST(LoraConfigTest, LmHeadIsAnOptInTarget) {
  auto config =
      LoraConfigFromJson({{"target_modules", {"lm_head", "v_proj", "q_proj"}}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->targets,
            (std::vector<Projection>{Projection::kQ, Projection::kV,
                                     Projection::kLmHead}));
  EXPECT_TRUE(config->TargetsLmHead());
  EXPECT_EQ(LoraConfigToJson(*config)["target_modules"],
            nlohmann::json({"q_proj", "v_proj", "lm_head"}));
  auto alone = LoraConfigFromJson({{"target_modules", {"lm_head"}}});
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_TRUE(alone->TargetsLmHead());
  auto defaults = LoraConfigFromJson(nlohmann::json::object());
  ASSERT_TRUE(defaults.ok());
  EXPECT_FALSE(defaults->TargetsLmHead());
}

TEST(LoraConfigTest, ErrorsNameTheField) {
  EXPECT_THAT(Error(LoraConfigFromJson({{"rank", 0}}).status()),
              HasSubstr("lora.rank must be in [1, 256], got 0"));
  EXPECT_THAT(Error(LoraConfigFromJson({{"rank", 257}}).status()),
              HasSubstr("lora.rank must be in [1, 256], got 257"));
  EXPECT_THAT(Error(LoraConfigFromJson({{"alpha", -1}}).status()),
              HasSubstr("lora.alpha"));
  EXPECT_THAT(Error(LoraConfigFromJson({{"dropout", 1.0}}).status()),
              HasSubstr("lora.dropout must be in [0, 1)"));
  EXPECT_THAT(
      Error(
          LoraConfigFromJson({{"target_modules", {"embed_tokens"}}}).status()),
      HasSubstr("lora.target_modules names an unsupported module "
                "\"embed_tokens\"; supported: q_proj, k_proj, v_proj, "
                "qkv_proj, o_proj, gate_proj, up_proj, gate_up_proj, "
                "down_proj, experts.gate_up_proj, experts.down_proj, "
                "lm_head"));
  EXPECT_THAT(
      Error(LoraConfigFromJson({{"target_modules", {"q_proj", "q_proj"}}})
                .status()),
      HasSubstr("must not repeat"));
  EXPECT_THAT(
      Error(LoraConfigFromJson({{"target_modules", nlohmann::json::array()}})
                .status()),
      HasSubstr("at least one"));
  EXPECT_THAT(Error(LoraConfigFromJson({{"rnak", 4}}).status()),
              HasSubstr("rnak"));
}

TEST(TrainingConfigTest, StepsFromEpochsOrMaxSteps) {
  TrainingConfig config;
  config.batch_size = 4;
  config.epochs = 3;
  EXPECT_EQ(TotalSteps(config, 10), 8);  // ceil(30 / 4)
  config.max_steps = 5;
  EXPECT_EQ(TotalSteps(config, 10), 5);
}

TEST(TrainingConfigTest, JsonRoundTripAndErrors) {
  auto config = TrainingConfigFromJson({{"batch_size", 2},
                                        {"seq_len", 64},
                                        {"seed", 9},
                                        {"grad_clip", 0},
                                        {"eval_interval", 25}});
  ASSERT_TRUE(config.ok()) << config.status();
  auto again = TrainingConfigFromJson(TrainingConfigToJson(*config));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->batch_size, 2);
  EXPECT_EQ(again->seq_len, 64);
  EXPECT_EQ(again->seed, 9u);
  EXPECT_EQ(again->eval_interval, 25);
  EXPECT_THAT(Error(TrainingConfigFromJson({{"batch_size", 0}}).status()),
              HasSubstr("training.batch_size must be in [1, 4096], got 0"));
  EXPECT_THAT(Error(TrainingConfigFromJson({{"seq_len", 1}}).status()),
              HasSubstr("training.seq_len"));
  EXPECT_THAT(Error(TrainingConfigFromJson({{"seed", -1}}).status()),
              HasSubstr("training.seed must be >= 0"));
  EXPECT_THAT(Error(TrainingConfigFromJson({{"grad_clip", -1}}).status()),
              HasSubstr("training.grad_clip"));
  EXPECT_THAT(Error(TrainingConfigFromJson({{"eval_interval", -2}}).status()),
              HasSubstr("training.eval_interval must be in [0, "));
}

}  // namespace
}  // namespace loraplex
