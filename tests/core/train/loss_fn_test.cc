// Loss names, their settings and defaults, and the checks on datums: every
// refusal names the field and the reason.
#include "core/train/loss_fn.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

namespace loraplex {
namespace {

using ::testing::HasSubstr;

TEST(LossFnTest, NamesRoundTripAndDefaultsAreTinkers) {
  for (LossFn fn : kAllLossFns) {
    auto spec = LossFnSpecOf(LossFnName(fn),
                             fn == LossFn::kDro
                                 ? std::map<std::string, double>{{"beta", 0.1}}
                                 : std::map<std::string, double>{});
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->fn, fn);
  }
  auto ppo = LossFnSpecOf("ppo", {});
  EXPECT_EQ(ppo->clip_low, 0.8);
  EXPECT_EQ(ppo->clip_high, 1.2);
  auto cispo = LossFnSpecOf("cispo", {});
  EXPECT_EQ(cispo->clip_low, 0.0);
  EXPECT_EQ(cispo->clip_high, 4.0);
  auto narrow = LossFnSpecOf(
      "ppo", {{"clip_low_threshold", 0.9}, {"clip_high_threshold", 1.1}});
  EXPECT_EQ(narrow->clip_low, 0.9);
  EXPECT_EQ(narrow->clip_high, 1.1);
  EXPECT_EQ(LossFnSpecOf("dro", {{"beta", 0.25}})->beta, 0.25);
}

TEST(LossFnTest, BadNamesAndSettingsAreRefused) {
  struct Case {
    const char* name;
    std::map<std::string, double> config;
    const char* message;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Case& c : std::vector<Case>{
           {"mse", {}, "loss_fn: unknown loss \"mse\" (known: cross_entropy"},
           {"cross_entropy",
            {{"beta", 1}},
            "loss_fn_config.beta is not a setting of loss_fn "
            "\"cross_entropy\" (it has none)"},
           {"ppo", {{"beta", 1}}, "loss_fn_config.beta is not a setting"},
           {"ppo",
            {{"clip_low_threshold", 1.5}},
            "loss_fn_config.clip_low_threshold (1.5) must not exceed "
            "clip_high_threshold (1.2)"},
           {"cispo",
            {{"clip_low_threshold", -0.1}},
            "loss_fn_config.clip_low_threshold must be >= 0"},
           {"ppo",
            {{"clip_high_threshold", nan}},
            "loss_fn_config.clip_high_threshold must be a finite number"},
           {"dro", {}, "loss_fn_config.beta is required for loss_fn \"dro\""},
           {"dro", {{"beta", -1}}, "loss_fn_config.beta must be >= 0"},
       }) {
    auto spec = LossFnSpecOf(c.name, c.config);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
        << c.message;
    EXPECT_THAT(spec.status().message(), HasSubstr(c.message));
  }
}

Datum RlDatum() {
  Datum datum;
  datum.input_ids = {1, 2, 3};
  datum.target_tokens = {2, 3, 4};
  datum.sampler_logprobs = {-1, -2, -3};
  datum.advantages = {0.5, 0.5, 0.5};
  return datum;
}

TEST(LossFnTest, DatumsAreCheckedFieldByField) {
  const LossFnSpec ppo = *LossFnSpecOf("ppo", {});
  const LossFnSpec ce = *LossFnSpecOf("cross_entropy", {});
  const DatumLimits limits{.vocab_size = 10, .max_positions = 4};
  EXPECT_TRUE(ValidateDatum(RlDatum(), ppo, limits, "data[0].").ok());

  auto message = [&](const Datum& datum, const LossFnSpec& loss) {
    return std::string(
        ValidateDatum(datum, loss, limits, "data[7].").message());
  };
  Datum d = RlDatum();
  d.input_ids.clear();
  EXPECT_EQ(message(d, ppo), "data[7].model_input has no tokens");
  d = RlDatum();
  d.input_ids = {1, 2, 3, 4, 5};
  EXPECT_EQ(message(d, ppo),
            "data[7].model_input has 5 tokens; the model takes at most 4");
  d = RlDatum();
  d.input_ids[1] = -1;
  EXPECT_EQ(message(d, ppo),
            "data[7].model_input[1] = -1 is outside the vocabulary [0, 10)");
  d = RlDatum();
  d.target_tokens.push_back(1);
  EXPECT_EQ(message(d, ppo),
            "data[7].loss_fn_inputs.target_tokens: 4 values for 3 input "
            "tokens");
  d = RlDatum();
  d.advantages.pop_back();
  EXPECT_EQ(message(d, ppo),
            "data[7].loss_fn_inputs.advantages: 2 values for 3 (too few)");
  d = RlDatum();
  d.sampler_logprobs[2] = std::numeric_limits<double>::infinity();
  EXPECT_EQ(message(d, ppo),
            "data[7].loss_fn_inputs.logprobs[2] is not a finite number");
  d = RlDatum();
  d.weights = {1, 1, 1};
  EXPECT_EQ(message(d, ppo),
            "data[7].loss_fn_inputs.weights is not an input of loss_fn "
            "\"ppo\"");
  // cross_entropy: weights, and no sampler inputs.
  EXPECT_EQ(message(RlDatum(), ce),
            "data[7].loss_fn_inputs.weights: 0 values for 3 (too few)");
  d = RlDatum();
  d.weights = {1, -2, 0.5};
  EXPECT_EQ(message(d, ce),
            "data[7].loss_fn_inputs.logprobs is not an input of loss_fn "
            "\"cross_entropy\"");
  d.sampler_logprobs.clear();
  d.advantages.clear();
  EXPECT_TRUE(ValidateDatum(d, ce, limits, "").ok());
  // Top-k targets: cross_entropy only, k values per position.
  d.targets_per_position = 2;
  EXPECT_EQ(message(d, ce),
            "data[7].loss_fn_inputs.target_tokens: 3 values for 3 input "
            "tokens × 2");
  d.target_tokens = {1, 2, 3, 4, 5, 6};
  d.weights = {1, 1, 1, 1, 1, 1};
  EXPECT_TRUE(ValidateDatum(d, ce, limits, "").ok());
  Datum rl = RlDatum();
  rl.targets_per_position = 2;
  EXPECT_EQ(message(rl, ppo),
            "data[7].loss_fn_inputs.target_tokens: 2 targets per position are "
            "for loss_fn \"cross_entropy\" only");
  d.targets_per_position = 21;
  EXPECT_EQ(message(d, ce),
            "data[7].loss_fn_inputs.target_tokens: 21 targets per position; "
            "1 to 20 are allowed");
}

}  // namespace
}  // namespace loraplex
