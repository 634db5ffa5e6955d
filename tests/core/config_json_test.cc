// The JSON form of optimizer and LR-schedule configs: round trip, defaults,
// and field-named errors for bad values.
#include "core/optim/config_json.h"

#include <gtest/gtest.h>

#include <string>

namespace loraplex {
namespace {

std::string OptimizerError(const nlohmann::json& json) {
  auto config = OptimizerConfigFromJson(json);
  EXPECT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

TEST(ConfigJsonTest, OptimizerRoundTripsEveryField) {
  OptimizerConfig config;
  config.family = OptimizerFamily::kMuon;
  config.lr = 3e-4;
  config.weight_decay = 0.01;
  config.beta1 = 0.8;
  config.beta2 = 0.95;
  config.eps = 1e-6;
  config.momentum = 0.9;
  config.nesterov = true;
  config.weight_decay_mode = MuonWeightDecayMode::kIndependent;
  config.ns_steps = 7;
  config.coefficient_set = NsCoefficientSet::kCustom;
  config.custom_coefficients = {{3, -3.2, 1.2}, {2, -1.5, 0.5}};
  config.ns_precision = NsPrecision::kBf16;
  config.scale_mode = MuonScaleMode::kUnitRmsNorm;
  config.extra_scale_factor = 0.5;
  config.scalar_optimizer = ScalarOptimizer::kLion;
  config.lion_beta1 = 0.7;
  config.lion_beta2 = 0.98;

  const nlohmann::json json = OptimizerConfigToJson(config);
  auto parsed = OptimizerConfigFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(OptimizerConfigToJson(*parsed), json);
  EXPECT_EQ(parsed->family, OptimizerFamily::kMuon);
  EXPECT_EQ(parsed->beta2, 0.95);
  EXPECT_EQ(parsed->custom_coefficients[1].c, 0.5);
  EXPECT_EQ(parsed->scale_mode, MuonScaleMode::kUnitRmsNorm);
  EXPECT_EQ(json.at("coefficient_set"), "custom");
  EXPECT_EQ(json.at("betas"), nlohmann::json({0.8, 0.95}));
  EXPECT_EQ(json.at("scalar_optimizer"), "lion");
  EXPECT_EQ(json.at("lion_betas"), nlohmann::json({0.7, 0.98}));
  EXPECT_EQ(parsed->scalar_optimizer, ScalarOptimizer::kLion);
  EXPECT_EQ(parsed->lion_beta2, 0.98);
}

TEST(ConfigJsonTest, AbsentFieldsKeepTheDefaults) {
  auto parsed = OptimizerConfigFromJson({{"family", "muon"}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  OptimizerConfig defaults;
  defaults.family = OptimizerFamily::kMuon;
  EXPECT_EQ(OptimizerConfigToJson(*parsed), OptimizerConfigToJson(defaults));
  EXPECT_EQ(parsed->extra_scale_factor, 0.2);
  EXPECT_EQ(parsed->scalar_optimizer, ScalarOptimizer::kAdamW);
  // Emerging-Optimizers' Lion betas.
  EXPECT_EQ(parsed->lion_beta1, 0.9);
  EXPECT_EQ(parsed->lion_beta2, 0.99);
  // Emerging-Optimizers' SOAP defaults (its basis refreshed every step).
  EXPECT_EQ(parsed->soap_beta1, 0.9);
  EXPECT_EQ(parsed->soap_beta2, 0.95);
  EXPECT_EQ(parsed->shampoo_beta, 0.95);
  EXPECT_EQ(parsed->precondition_frequency, 1);
  EXPECT_EQ(parsed->max_precond_dim, 1024);  // Not the reference's (none).
  EXPECT_TRUE(
      OptimizerConfigFromJson({{"family", "soap"}, {"max_precond_dim", 0}})
          .ok());
  EXPECT_EQ(parsed->power_iter_steps, 1);
  EXPECT_FALSE(parsed->use_eigh);
  EXPECT_EQ(parsed->max_update_rms, 0.0);
}

TEST(ConfigJsonTest, SoapFieldsRoundTrip) {
  const nlohmann::json json = {
      {"family", "soap"},          {"soap_betas", {0.8, 0.9}},
      {"shampoo_beta", 0.9},       {"precondition_frequency", 10},
      {"max_precond_dim", 512},    {"power_iter_steps", 2},
      {"use_eigh", true},          {"max_update_rms", 1.5},
      {"scalar_optimizer", "lion"}};
  auto parsed = OptimizerConfigFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->family, OptimizerFamily::kSoap);
  EXPECT_EQ(parsed->soap_beta1, 0.8);
  EXPECT_EQ(parsed->soap_beta2, 0.9);
  EXPECT_EQ(parsed->shampoo_beta, 0.9);
  EXPECT_EQ(parsed->precondition_frequency, 10);
  EXPECT_EQ(parsed->max_precond_dim, 512);
  EXPECT_EQ(parsed->power_iter_steps, 2);
  EXPECT_TRUE(parsed->use_eigh);
  EXPECT_EQ(parsed->max_update_rms, 1.5);
  EXPECT_EQ(parsed->scalar_optimizer, ScalarOptimizer::kLion);
  auto again = OptimizerConfigFromJson(OptimizerConfigToJson(*parsed));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(OptimizerConfigToJson(*again), OptimizerConfigToJson(*parsed));
}

TEST(ConfigJsonTest, BadOptimizerValuesNameTheField) {
  EXPECT_EQ(
      OptimizerError({{"family", "sgd"}}),
      "optimizer.family must be one of adamw, adam, muon, lion, soap; got "
      "\"sgd\"");
  EXPECT_EQ(OptimizerError({{"family", "muon"}, {"scalar_optimizer", "adam"}}),
            "optimizer.scalar_optimizer must be one of adamw, lion; got "
            "\"adam\"");
  EXPECT_EQ(OptimizerError({{"family", "lion"}, {"lion_betas", {0.9, 1.0}}}),
            "optimizer.lion_betas[1] must be in [0, 1), got 1");
  EXPECT_EQ(OptimizerError({{"lion_betas", 0.9}}),
            "optimizer.lion_betas must be a list of 2 numbers, got 0.9");
  EXPECT_EQ(OptimizerError({{"family", "soap"}, {"soap_betas", {1.5, 0.9}}}),
            "optimizer.soap_betas[0] must be in [0, 1), got 1.5");
  EXPECT_EQ(OptimizerError({{"family", "soap"}, {"shampoo_beta", -0.1}}),
            "optimizer.shampoo_beta must be in [0, 1), got -0.1");
  EXPECT_EQ(OptimizerError({{"family", "soap"}, {"precondition_frequency", 0}}),
            "optimizer.precondition_frequency must be >= 1, got 0");
  EXPECT_EQ(OptimizerError({{"family", "soap"}, {"max_precond_dim", -1}}),
            "optimizer.max_precond_dim must be >= 0 (0: no limit), got -1");
  EXPECT_EQ(OptimizerError({{"family", "soap"}, {"power_iter_steps", 0}}),
            "optimizer.power_iter_steps must be in [1, 100], got 0");
  EXPECT_EQ(OptimizerError({{"family", "soap"}, {"max_update_rms", -1}}),
            "optimizer.max_update_rms must be a finite number >= 0 (0: no "
            "clipping), got -1");
  EXPECT_EQ(OptimizerError({{"family", "soap"}, {"use_eigh", 1}}).substr(0, 26),
            "optimizer.use_eigh must be");
  EXPECT_EQ(OptimizerError({{"family", "muon"}, {"coefficient_set", "cubic"}}),
            "optimizer.coefficient_set must be one of simple, quintic, "
            "polar_express, aol, custom; got \"cubic\"");
  EXPECT_EQ(OptimizerError({{"scale_mode", 3}}),
            "optimizer.scale_mode must be one of spectral, unit_rms_norm, "
            "shape_scaling; got 3");
  EXPECT_EQ(OptimizerError({{"lr", -1}}),
            "optimizer.lr must be a finite number >= 0, got -1");
  EXPECT_EQ(OptimizerError({{"family", "muon"}, {"momentum", 1}}),
            "optimizer.momentum must be in [0, 1), got 1");
  // Muon fields are checked whatever the family.
  EXPECT_EQ(OptimizerError({{"family", "adamw"}, {"extra_scale_factor", -2}}),
            "optimizer.extra_scale_factor must be a finite number > 0, got -2");
  EXPECT_EQ(OptimizerError({{"family", "muon"}, {"ns_steps", 0}}),
            "optimizer.ns_steps must be in [1, 100], got 0");
  EXPECT_EQ(OptimizerError({{"betas", {0.9}}}),
            "optimizer.betas must be a list of 2 numbers, got a JSON array");
  EXPECT_EQ(OptimizerError({{"custom_coefficients", {{1, 2}}}}),
            "optimizer.custom_coefficients must be a list of at most 100 "
            "[a, b, c] number triples, got a JSON array");
  EXPECT_EQ(OptimizerError({{"learning_rate", 0.1}}).substr(0, 49),
            "optimizer.learning_rate is not a known field (kno");
  EXPECT_EQ(OptimizerError("adamw"),
            "optimizer must be a JSON object, got \"adamw\"");
}

TEST(ConfigJsonTest, ScheduleRoundTripsAndRejectsBadValues) {
  LrScheduleConfig config;
  config.kind = LrScheduleKind::kWsd;
  config.init_lr = 1e-5;
  config.min_lr = 1e-4;
  config.warmup_steps = 20;
  config.total_steps = 500;
  config.decay_fraction = 0.25;
  const nlohmann::json json = LrScheduleConfigToJson(config);
  auto parsed = LrScheduleConfigFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(LrScheduleConfigToJson(*parsed), json);
  EXPECT_EQ(parsed->kind, LrScheduleKind::kWsd);
  EXPECT_EQ(parsed->total_steps, 500);

  auto bad = LrScheduleConfigFromJson({{"kind", "step"}});
  EXPECT_EQ(bad.status().message(),
            "schedule.kind must be one of constant, linear, cosine, wsd; got "
            "\"step\"");
  bad = LrScheduleConfigFromJson({{"total_steps", 10}, {"warmup_steps", 11}});
  EXPECT_EQ(bad.status().message(),
            "schedule.warmup_steps must be in [0, total_steps = 10], got 11");
  bad = LrScheduleConfigFromJson({{"lr", 1e-3}});
  EXPECT_EQ(bad.status().message().substr(0, 34),
            "schedule.lr is not a known field (");
  bad = LrScheduleConfigFromJson({{"warmup_steps", "10"}});
  EXPECT_EQ(bad.status().message(),
            "schedule.warmup_steps must be an integer, got \"10\"");
}

}  // namespace
}  // namespace loraplex
