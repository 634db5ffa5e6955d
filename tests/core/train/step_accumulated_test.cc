// Stepping a client-driven slot with each step's own hyperparameters:
// AdamW steps equal the closed form (fp64) when lr, betas, eps, weight
// decay and clipping change from step to step; Muon takes its step's lr;
// a step without gradients, or with non-finite ones, changes nothing; a
// bad step is refused before anything moves.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/train/co_batch_step.h"
#include "tests/common/tiny_model.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<TrainingSlot> SessionSlot(OptimizerConfig config) {
  const LlamaModel& model = TinyModel64();
  auto slot = std::make_unique<TrainingSlot>(model.config(), torch::kCPU,
                                             torch::kFloat64);
  LoraConfig lora;
  lora.rank = 2;
  lora.alpha = 4;
  lora.targets = {Projection::kQ, Projection::kDown};
  EXPECT_TRUE(slot->weights.Bind(lora).ok());
  slot->weights.InitPeft(5);
  RandomizeB(slot->weights, 6, 0.1);
  auto optimizer = BuildSlotOptimizer(config, slot->weights.parameters());
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  slot->optimizer.emplace(std::move(optimizer).value());
  return slot;
}

// Sets seeded gradients; returns copies of them.
std::vector<torch::Tensor> SetGrads(TrainingSlot& slot, uint64_t seed,
                                    double scale) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> grads;
  for (torch::Tensor param : slot.weights.parameters()) {
    param.mutable_grad() = torch::randn(param.sizes(), torch::kFloat64) * scale;
    grads.push_back(param.grad().clone());
  }
  return grads;
}

double Norm(const std::vector<torch::Tensor>& tensors) {
  double sum = 0.0;
  for (const torch::Tensor& t : tensors) sum += t.pow(2).sum().item<double>();
  return std::sqrt(sum);
}

TEST(StepAccumulatedTest, AdamWStepsTakeEachStepsHyperparameters) {
  OptimizerConfig config;
  config.family = OptimizerFamily::kAdamW;
  auto slot = SessionSlot(config);
  std::vector<torch::Tensor> p = Snapshot(slot->weights);
  std::vector<torch::Tensor> m, v;
  for (const torch::Tensor& t : p) {
    m.push_back(torch::zeros_like(t));
    v.push_back(torch::zeros_like(t));
  }
  struct Step {
    double lr, beta1, beta2, eps, weight_decay, clip, grad_scale;
  };
  // Step 3's gradients are clipped (norm ~ 3 > 0.5), the others not.
  const std::vector<Step> steps = {{1e-2, 0.9, 0.95, 1e-12, 0.0, 0.0, 0.1},
                                   {3e-3, 0.8, 0.99, 1e-6, 0.1, 10.0, 0.1},
                                   {5e-3, 0.5, 0.9, 1e-8, 0.01, 0.5, 0.3}};
  for (size_t k = 0; k < steps.size(); ++k) {
    const Step& s = steps[k];
    std::vector<torch::Tensor> g = SetGrads(*slot, 100 + k, s.grad_scale);
    const double norm = Norm(g);
    if (s.clip > 0 && norm > s.clip) {
      for (torch::Tensor& t : g) t = t * (s.clip / (norm + 1e-6));
    }
    OptimizerConfig hyper = config;
    hyper.lr = s.lr;
    hyper.beta1 = s.beta1;
    hyper.beta2 = s.beta2;
    hyper.eps = s.eps;
    hyper.weight_decay = s.weight_decay;
    auto metrics = StepAccumulated(*slot, hyper, s.clip);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_FALSE(metrics->skipped);
    EXPECT_NEAR(metrics->grad_norm, norm, 1e-12 * norm);
    EXPECT_EQ(metrics->lr, s.lr);
    // torch.optim.AdamW's update, by hand: decoupled decay, then the
    // bias-corrected moments with this step's betas.
    const double t = static_cast<double>(k + 1);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] = p[i] * (1 - s.lr * s.weight_decay);
      m[i] = s.beta1 * m[i] + (1 - s.beta1) * g[i];
      v[i] = s.beta2 * v[i] + (1 - s.beta2) * g[i] * g[i];
      const torch::Tensor m_hat = m[i] / (1 - std::pow(s.beta1, t));
      const double bias2 = 1 - std::pow(s.beta2, t);
      p[i] = p[i] - s.lr * m_hat / ((v[i] / bias2).sqrt() + s.eps);
    }
    EXPECT_LE(MaxRelativeDiff(Snapshot(slot->weights), p), 1e-12)
        << "step " << k + 1;
    // The gradients are dropped: the next calls accumulate afresh.
    for (const torch::Tensor& param : slot->weights.parameters()) {
      EXPECT_FALSE(param.grad().defined());
    }
  }
  EXPECT_EQ(slot->counters.steps, 3);
  EXPECT_EQ(slot->counters.skipped_steps, 0);
}

TEST(StepAccumulatedTest, MuonTakesItsStepsLearningRate) {
  OptimizerConfig config;
  config.family = OptimizerFamily::kMuon;
  config.lr = 0.02;
  // Two slots alike; one steps at lr 0.02, the other at 0.04 through
  // StepAccumulated. A Muon update is lr times a function of the
  // gradient (no decay here): the second slot moves exactly twice as far.
  auto a = SessionSlot(config);
  auto b = SessionSlot(config);
  const std::vector<torch::Tensor> start = Snapshot(a->weights);
  SetGrads(*a, 7, 0.1);
  SetGrads(*b, 7, 0.1);
  ASSERT_TRUE(StepAccumulated(*a, config, 0.0).ok());
  OptimizerConfig doubled = config;
  doubled.lr = 0.04;
  ASSERT_TRUE(StepAccumulated(*b, doubled, 0.0).ok());
  std::vector<torch::Tensor> twice;
  const std::vector<torch::Tensor> after_a = Snapshot(a->weights);
  for (size_t i = 0; i < start.size(); ++i) {
    twice.push_back(start[i] + 2 * (after_a[i] - start[i]));
  }
  EXPECT_GT(MaxRelativeDiff(after_a, start), 1e-4);
  EXPECT_LE(MaxRelativeDiff(Snapshot(b->weights), twice), 1e-12);
  EXPECT_EQ(b->optimizer->lr(), 0.04);
}

TEST(StepAccumulatedTest, NothingToApplyOrNonFiniteChangesNothing) {
  OptimizerConfig config;
  auto slot = SessionSlot(config);
  const std::vector<torch::Tensor> start = Snapshot(slot->weights);
  auto metrics = StepAccumulated(*slot, config, 1.0);
  ASSERT_TRUE(metrics.ok());
  EXPECT_TRUE(metrics->skipped);
  EXPECT_EQ(metrics->skip_reason, "no gradients since the last step");
  SetGrads(*slot, 3, 1.0);
  torch::Tensor first = slot->weights.parameters()[0];
  first.mutable_grad()[0][0] = std::numeric_limits<double>::quiet_NaN();
  metrics = StepAccumulated(*slot, config, 1.0);
  ASSERT_TRUE(metrics.ok());
  EXPECT_TRUE(metrics->skipped);
  EXPECT_EQ(metrics->skip_reason, "gradient norm is not finite");
  EXPECT_EQ(MaxRelativeDiff(Snapshot(slot->weights), start), 0.0);
  EXPECT_EQ(slot->counters.steps, 2);
  EXPECT_EQ(slot->counters.skipped_steps, 2);
  // The optimizer never stepped: its state is still zero.
  for (const torch::Tensor& t : OptimizerStateTensors(*slot->optimizer)) {
    EXPECT_EQ(t.abs().max().item<double>(), 0.0);
  }
}

TEST(StepAccumulatedTest, BadStepsAreRefusedBeforeAnythingMoves) {
  OptimizerConfig config;
  auto slot = SessionSlot(config);
  const std::vector<torch::Tensor> grads = SetGrads(*slot, 4, 1.0);
  OptimizerConfig bad = config;
  bad.beta2 = 1.0;
  auto metrics = StepAccumulated(*slot, bad, 0.0);
  EXPECT_EQ(metrics.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(metrics.status().message()),
              HasSubstr("optimizer.betas[1]"));
  OptimizerConfig muon = config;
  muon.family = OptimizerFamily::kMuon;
  metrics = StepAccumulated(*slot, muon, 0.0);
  EXPECT_THAT(std::string(metrics.status().message()),
              HasSubstr("the slot's optimizer is adamw, not muon"));
  metrics = StepAccumulated(*slot, config, -1.0);
  EXPECT_THAT(std::string(metrics.status().message()),
              HasSubstr("grad_clip_norm must be a finite number >= 0"));
  // The gradients are still there, unclipped, and nothing stepped.
  std::vector<torch::Tensor> now;
  for (const torch::Tensor& p : slot->weights.parameters()) {
    now.push_back(p.grad());
  }
  EXPECT_EQ(MaxRelativeDiff(now, grads), 0.0);
  EXPECT_EQ(slot->counters.steps, 0);
}

}  // namespace
}  // namespace loraplex
