// LR schedules at chosen steps (closed form), their effect on a slot's
// optimizer, save/load, and per-slot gradient clipping.
#include "core/optim/lr_scheduler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/optim/grad_clip.h"

namespace loraplex {
namespace {

constexpr double kPi = 3.14159265358979323846;

// The peak lr of these tests.
constexpr double kPeak = 1.0;

LrScheduler Make(const LrScheduleConfig& config) {
  auto scheduler = LrScheduler::Create(config, kPeak);
  EXPECT_TRUE(scheduler.ok()) << scheduler.status();
  return std::move(scheduler).value();
}

LrScheduleConfig Config(LrScheduleKind kind) {
  LrScheduleConfig config;
  config.kind = kind;
  config.init_lr = 0.1;
  config.min_lr = 0.2;
  config.warmup_steps = 10;
  config.total_steps = 110;
  config.decay_fraction = 0.2;
  return config;
}

TEST(LrSchedulerTest, WarmupIsLinearFromInitLr) {
  for (LrScheduleKind kind :
       {LrScheduleKind::kConstant, LrScheduleKind::kLinear,
        LrScheduleKind::kCosine, LrScheduleKind::kWsd}) {
    LrScheduler s = Make(Config(kind));
    EXPECT_DOUBLE_EQ(s.LrAt(0), 0.1);
    EXPECT_DOUBLE_EQ(s.LrAt(5), 0.55);
    EXPECT_DOUBLE_EQ(s.LrAt(10), 1.0) << LrScheduleKindName(kind);
  }
}

TEST(LrSchedulerTest, ConstantStaysAtLr) {
  LrScheduler s = Make(Config(LrScheduleKind::kConstant));
  EXPECT_DOUBLE_EQ(s.LrAt(60), 1.0);
  EXPECT_DOUBLE_EQ(s.LrAt(110), 1.0);
  EXPECT_DOUBLE_EQ(s.LrAt(500), 1.0);
}

TEST(LrSchedulerTest, LinearDecaysToMinLr) {
  LrScheduler s = Make(Config(LrScheduleKind::kLinear));
  EXPECT_DOUBLE_EQ(s.LrAt(60), 0.6);  // Half way from 1.0 to 0.2.
  EXPECT_DOUBLE_EQ(s.LrAt(85), 0.4);  // Three quarters.
  EXPECT_DOUBLE_EQ(s.LrAt(110), 0.2);
  EXPECT_DOUBLE_EQ(s.LrAt(1000), 0.2);
}

TEST(LrSchedulerTest, CosineFollowsHalfCosine) {
  LrScheduler s = Make(Config(LrScheduleKind::kCosine));
  EXPECT_NEAR(s.LrAt(60), 0.6, 1e-12);
  EXPECT_NEAR(s.LrAt(35), 0.2 + 0.8 * 0.5 * (1 + std::cos(kPi * 0.25)), 1e-12);
  EXPECT_NEAR(s.LrAt(109), 0.2 + 0.8 * 0.5 * (1 + std::cos(kPi * 0.99)), 1e-12);
  EXPECT_DOUBLE_EQ(s.LrAt(110), 0.2);
}

TEST(LrSchedulerTest, WsdHoldsThenDecaysOverTheLastFraction) {
  // 20% of 110 steps = 22 decay steps, starting at step 88.
  LrScheduler s = Make(Config(LrScheduleKind::kWsd));
  EXPECT_DOUBLE_EQ(s.LrAt(11), 1.0);
  EXPECT_DOUBLE_EQ(s.LrAt(87), 1.0);
  EXPECT_DOUBLE_EQ(s.LrAt(88), 1.0);
  EXPECT_DOUBLE_EQ(s.LrAt(99), 0.6);
  EXPECT_DOUBLE_EQ(s.LrAt(110), 0.2);
  // Decay longer than what is left after warmup starts right after warmup.
  LrScheduleConfig long_decay = Config(LrScheduleKind::kWsd);
  long_decay.decay_fraction = 1.0;
  EXPECT_DOUBLE_EQ(Make(long_decay).LrAt(60), 0.6);
}

TEST(LrSchedulerTest, NoWarmupStartsAtLr) {
  LrScheduleConfig config = Config(LrScheduleKind::kLinear);
  config.warmup_steps = 0;
  config.total_steps = 4;
  config.min_lr = 0.0;
  LrScheduler s = Make(config);
  EXPECT_DOUBLE_EQ(s.LrAt(0), 1.0);
  EXPECT_DOUBLE_EQ(s.LrAt(1), 0.75);
  EXPECT_DOUBLE_EQ(s.LrAt(4), 0.0);
}

OptimizerConfig AdamW() {
  OptimizerConfig config;
  config.family = OptimizerFamily::kAdamW;
  return config;
}

TEST(LrSchedulerTest, StepsSetTheSlotsLrAndSkippedStepsDoNotCount) {
  LrScheduler s = Make(Config(LrScheduleKind::kLinear));
  torch::Tensor param = torch::zeros({2, 2}).set_requires_grad(true);
  auto optimizer = BuildSlotOptimizer(AdamW(), {param});
  ASSERT_TRUE(optimizer.ok());
  s.ApplyTo(*optimizer);
  EXPECT_DOUBLE_EQ(optimizer->lr(), 0.1);

  // Three steps taken, one skipped for a non-finite gradient norm.
  for (bool finite : {true, true, false, true}) {
    param.mutable_grad() =
        finite ? torch::ones({2, 2}) : torch::full({2, 2}, std::nan(""));
    GradNorm norm = ClipGradNorm({param}, 1.0);
    ASSERT_EQ(norm.finite, finite);
    if (!norm.finite) continue;
    optimizer->Step();
    s.Step(*optimizer);
  }
  EXPECT_EQ(s.completed_steps(), 3);
  EXPECT_DOUBLE_EQ(optimizer->lr(), s.LrAt(3));
  EXPECT_DOUBLE_EQ(optimizer->lr(), 0.37);
}

TEST(LrSchedulerTest, SaveLoadRestoresTheStepCount) {
  LrScheduler a = Make(Config(LrScheduleKind::kCosine));
  torch::Tensor param = torch::zeros({3}).set_requires_grad(true);
  auto optimizer = BuildSlotOptimizer(AdamW(), {param});
  ASSERT_TRUE(optimizer.ok());
  for (int i = 0; i < 17; ++i) a.Step(*optimizer);
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive archive;
    a.Save(archive);
    archive.save_to(bytes);
  }
  LrScheduler b = Make(Config(LrScheduleKind::kCosine));
  torch::serialize::InputArchive archive;
  archive.load_from(bytes);
  ASSERT_TRUE(b.Load(archive).ok());
  EXPECT_EQ(b.completed_steps(), 17);
  EXPECT_DOUBLE_EQ(b.lr(), a.lr());

  torch::serialize::InputArchive empty;
  EXPECT_EQ(b.Load(empty).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.completed_steps(), 17);
}

TEST(LrSchedulerTest, InvalidConfigsNameTheField) {
  auto message = [](LrScheduleConfig config) {
    return std::string(ValidateLrScheduleConfig(config).message());
  };
  LrScheduleConfig c = Config(LrScheduleKind::kLinear);
  c.init_lr = -1;
  EXPECT_EQ(message(c),
            "schedule.init_lr must be a finite number >= 0, got -1");
  c = Config(LrScheduleKind::kLinear);
  c.min_lr = std::nan("");
  EXPECT_EQ(message(c),
            "schedule.min_lr must be a finite number >= 0, got nan");
  c = Config(LrScheduleKind::kLinear);
  c.total_steps = 0;
  EXPECT_EQ(message(c), "schedule.total_steps must be >= 1, got 0");
  c = Config(LrScheduleKind::kLinear);
  c.warmup_steps = 200;
  EXPECT_EQ(message(c),
            "schedule.warmup_steps must be in [0, total_steps = 110], got 200");
  c = Config(LrScheduleKind::kWsd);
  c.decay_fraction = 0;
  EXPECT_EQ(message(c), "schedule.decay_fraction must be in (0, 1], got 0");
  EXPECT_FALSE(LrScheduler::Create(c, kPeak).ok());
  EXPECT_FALSE(ParseLrScheduleKind("step").has_value());
  EXPECT_EQ(ParseLrScheduleKind("wsd"), LrScheduleKind::kWsd);

  // The peak comes from the optimizer config; min_lr may not exceed it.
  c = Config(LrScheduleKind::kLinear);
  EXPECT_EQ(LrScheduler::Create(c, 0.15).status().message(),
            "schedule.min_lr must be <= optimizer.lr (0.15), got 0.2");
  EXPECT_EQ(LrScheduler::Create(c, -1).status().message(),
            "optimizer.lr must be a finite number >= 0, got -1");
}

TEST(GradClipTest, ClipsByTheGlobalNormLikePyTorch) {
  // Gradients (3, 4) and (12): global norm 13.
  torch::Tensor a = torch::zeros({2}).set_requires_grad(true);
  torch::Tensor b = torch::zeros({1, 1}).set_requires_grad(true);
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});
  b.mutable_grad() = torch::tensor({{12.0f}});
  GradNorm norm = ClipGradNorm({a, b}, 6.5);
  EXPECT_DOUBLE_EQ(norm.norm, 13.0);
  EXPECT_TRUE(norm.finite);
  EXPECT_TRUE(norm.clipped);
  const double scale = 6.5 / (13.0 + 1e-6);
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), 3.0 * scale);
  EXPECT_FLOAT_EQ(a.grad()[1].item<float>(), 4.0 * scale);
  EXPECT_FLOAT_EQ(b.grad()[0][0].item<float>(), 12.0 * scale);
}

TEST(GradClipTest, BelowTheLimitOrDisabledLeavesGradients) {
  torch::Tensor a = torch::zeros({2}).set_requires_grad(true);
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});
  GradNorm below = ClipGradNorm({a}, 10.0);
  EXPECT_DOUBLE_EQ(below.norm, 5.0);
  EXPECT_FALSE(below.clipped);
  GradNorm disabled = ClipGradNorm({a}, 0.0);
  EXPECT_DOUBLE_EQ(disabled.norm, 5.0);
  EXPECT_FALSE(disabled.clipped);
  EXPECT_TRUE(torch::equal(a.grad(), torch::tensor({3.0f, 4.0f})));
  // Parameters without gradients count as zero.
  torch::Tensor no_grad = torch::zeros({4}).set_requires_grad(true);
  EXPECT_DOUBLE_EQ(ClipGradNorm({a, no_grad}, 0.0).norm, 5.0);
}

TEST(GradClipTest, NonFiniteNormIsReportedAndGradientsKept) {
  torch::Tensor a = torch::zeros({2}).set_requires_grad(true);
  a.mutable_grad() =
      torch::tensor({1.0f, std::numeric_limits<float>::infinity()});
  GradNorm norm = ClipGradNorm({a}, 1.0);
  EXPECT_FALSE(norm.finite);
  EXPECT_FALSE(norm.clipped);
  EXPECT_EQ(a.grad()[0].item<float>(), 1.0f);
}

// Several slots measured together: each clipped by its own norm and limit
// exactly as alone; a slot without gradients or with a NaN changes nothing
// of the others.
TEST(GradClipTest, SetsClippedTogetherAsEachAlone) {
  auto sets = [] {
    torch::manual_seed(3);
    std::vector<std::vector<torch::Tensor>> out(4);
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 3; ++j) {
        torch::Tensor p = torch::zeros({5, 3 + j}).set_requires_grad(true);
        if (i != 2) p.mutable_grad() = torch::randn({5, 3 + j}) * (i + 1);
        out[i].push_back(p);
      }
    }
    out[3][1].mutable_grad()[0][0] = std::nanf("");
    return out;
  };
  const std::vector<double> limits = {1.0, 0.0, 1.0, 0.5};
  const std::vector<std::vector<torch::Tensor>> together = sets();
  const std::vector<GradNorm> norms = ClipGradNorms(together, limits);
  const std::vector<std::vector<torch::Tensor>> alone = sets();
  ASSERT_EQ(norms.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const GradNorm one = ClipGradNorm(alone[i], limits[i]);
    if (one.finite) {
      EXPECT_EQ(norms[i].norm, one.norm) << i;
    }
    EXPECT_EQ(norms[i].finite, one.finite) << i;
    EXPECT_EQ(norms[i].clipped, one.clipped) << i;
    for (size_t j = 0; j < 3; ++j) {
      ASSERT_EQ(together[i][j].grad().defined(), alone[i][j].grad().defined());
      if (!alone[i][j].grad().defined()) continue;
      EXPECT_TRUE(torch::equal(together[i][j].grad().nan_to_num(),
                               alone[i][j].grad().nan_to_num()))
          << i << " " << j;
    }
  }
  EXPECT_TRUE(norms[0].clipped);
  EXPECT_GT(norms[1].norm, 1.0);
  EXPECT_FALSE(norms[1].clipped);  // max_norm 0 only measures.
  EXPECT_EQ(norms[2].norm, 0.0);   // No gradients.
  EXPECT_FALSE(norms[3].finite);
}

}  // namespace
}  // namespace loraplex
