// Lion against NVIDIA Emerging-Optimizers' own Lion class: the steps of
// tools/golden/make_emerging_optim_golden.py, in float64. Also its state:
// created eagerly, saved and loaded, zeroed like a fresh optimizer's, and
// its options checked.
#include "core/optim/lion.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/optim/slot_optimizer.h"
#include "tests/common/emerging_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

LionOptions OptionsOf(const nlohmann::json& c) {
  return LionOptions(c["lr"].get<double>())
      .beta1(c["betas"][0].get<double>())
      .beta2(c["betas"][1].get<double>())
      .weight_decay(c["weight_decay"].get<double>());
}

TEST(LionTest, FixtureLoads) {
  const EmergingFixture& fixture = EmergingFixture::Get();
  ASSERT_TRUE(fixture.loaded());
  EXPECT_GE(fixture.cases()["lion"].size(), 7u);
}

// Each case's steps equal the reference's in float64. The operations are
// the reference's own (lerp, sign, add), so only a kernel family's
// rounding can differ: far below a step of lr, which any wrong beta,
// sign or weight decay moves an element by.
TEST(LionTest, StepsEqualEmergingOptimizersLion) {
  const EmergingFixture& fixture = EmergingFixture::Get();
  ASSERT_TRUE(fixture.loaded());
  for (const nlohmann::json& c : fixture.cases()["lion"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    torch::Tensor param = fixture.Tensor(name, "param").set_requires_grad(true);
    const torch::Tensor grads = fixture.Tensor(name, "grads");
    const torch::Tensor expected = fixture.Tensor(name, "expected");
    ASSERT_EQ(param.scalar_type(), torch::kFloat64);
    Lion lion({param}, OptionsOf(c));
    for (int64_t step = 0; step < grads.size(0); ++step) {
      param.mutable_grad() = grads[step].clone();
      lion.step();
      EXPECT_LE(EmergingDistance(param.detach(), expected[step]), 1e-14)
          << "step " << step + 1;
    }
    EXPECT_LE(EmergingDistance(lion.StateOf(param)->exp_avg(),
                               fixture.Tensor(name, "exp_avg")),
              1e-14);
    EXPECT_EQ(lion.StateOf(param)->step(), grads.size(0));
  }
}

// The slot factory's Lion: the lion family (one child for everything) and
// the muon family with Lion as its scalar optimizer (the parameters that
// are not matrices), each on every case its parameters fit, equal the
// reference's steps.
TEST(LionTest, SlotFactoryLionStepsEqualEmergingOptimizersLion) {
  const EmergingFixture& fixture = EmergingFixture::Get();
  ASSERT_TRUE(fixture.loaded());
  int scalar_cases = 0;
  for (const nlohmann::json& c : fixture.cases()["lion"]) {
    const std::string name = c["name"];
    OptimizerConfig config;
    config.lr = c["lr"].get<double>();
    config.lion_beta1 = c["betas"][0].get<double>();
    config.lion_beta2 = c["betas"][1].get<double>();
    config.weight_decay = c["weight_decay"].get<double>();
    const torch::Tensor grads = fixture.Tensor(name, "grads");
    const torch::Tensor expected = fixture.Tensor(name, "expected");
    std::vector<OptimizerFamily> families = {OptimizerFamily::kLion};
    if (fixture.Tensor(name, "param").dim() != 2) {
      families.push_back(OptimizerFamily::kMuon);
      ++scalar_cases;
    }
    for (OptimizerFamily family : families) {
      SCOPED_TRACE(name + " " + std::string(OptimizerFamilyName(family)));
      config.family = family;
      config.scalar_optimizer = ScalarOptimizer::kLion;
      torch::Tensor param =
          fixture.Tensor(name, "param").set_requires_grad(true);
      // A matrix beside it, for Muon; its steps are Muon's business.
      torch::Tensor matrix =
          torch::ones({3, 4}, torch::kFloat64).set_requires_grad(true);
      auto built = BuildSlotOptimizer(config, {matrix, param});
      ASSERT_TRUE(built.ok()) << built.status();
      const OptimizerChild& child = built->children().back();
      ASSERT_EQ(child.kind, OptimizerChildKind::kLion);
      for (int64_t step = 0; step < grads.size(0); ++step) {
        matrix.mutable_grad() = torch::ones_like(matrix);
        param.mutable_grad() = grads[step].clone();
        built->Step();
        EXPECT_LE(EmergingDistance(param.detach(), expected[step]), 1e-14)
            << "step " << step + 1;
      }
      const std::vector<ParamStateRef> states = child.states();
      ASSERT_FALSE(states.empty());
      EXPECT_EQ(*states.back().step, grads.size(0));
      EXPECT_LE(EmergingDistance(states.back().tensors.at(0).second,
                                 fixture.Tensor(name, "exp_avg")),
                1e-14);
    }
  }
  EXPECT_GE(scalar_cases, 2);
}

// Several parameters of different shapes in one optimizer step as each
// alone (the multi-tensor step is per element).
TEST(LionTest, OneStepOverManyParametersEqualsEachAlone) {
  const EmergingFixture& fixture = EmergingFixture::Get();
  ASSERT_TRUE(fixture.loaded());
  std::vector<torch::Tensor> together, grads, expected;
  std::vector<std::string> names;
  for (const nlohmann::json& c : fixture.cases()["lion"]) {
    if (c["lr"] != 1e-3 || c["weight_decay"] != 0.0 ||
        c["betas"] != nlohmann::json::array({0.9, 0.99})) {
      continue;  // One options set for the one group.
    }
    const std::string name = c["name"];
    names.push_back(name);
    together.push_back(fixture.Tensor(name, "param").set_requires_grad(true));
    grads.push_back(fixture.Tensor(name, "grads"));
    expected.push_back(fixture.Tensor(name, "expected"));
  }
  ASSERT_GE(together.size(), 2u);
  Lion lion(together, LionOptions(1e-3).beta1(0.9).beta2(0.99).weight_decay(0));
  for (int64_t step = 0; step < 3; ++step) {
    for (size_t i = 0; i < together.size(); ++i) {
      together[i].mutable_grad() = grads[i][step].clone();
    }
    lion.step();
    for (size_t i = 0; i < together.size(); ++i) {
      EXPECT_LE(EmergingDistance(together[i].detach(), expected[i][step]),
                1e-14)
          << names[i] << " step " << step + 1;
    }
  }
}

// Eager state; a save and load continues bit for bit; ZeroState makes it
// a fresh optimizer (what retiring a slot needs).
TEST(LionTest, StateIsEagerSavedLoadedAndZeroed) {
  torch::manual_seed(3);
  const torch::Tensor start = torch::randn({6, 5}, torch::kFloat64);
  const torch::Tensor g1 = torch::randn({6, 5}, torch::kFloat64);
  const torch::Tensor g2 = torch::randn({6, 5}, torch::kFloat64);
  const LionOptions options =
      LionOptions(1e-2).beta1(0.8).beta2(0.95).weight_decay(0.1);

  torch::Tensor a = start.clone().set_requires_grad(true);
  Lion first({a}, options);
  EXPECT_EQ(first.StateOf(a), nullptr);
  first.InitState();
  ASSERT_NE(first.StateOf(a), nullptr);
  EXPECT_EQ(first.StateOf(a)->exp_avg().abs().sum().item<double>(), 0.0);
  a.mutable_grad() = g1.clone();
  first.step();
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    first.save(archive);
    archive.save_to(saved);
  }
  a.mutable_grad() = g2.clone();
  first.step();

  torch::Tensor b = a.detach().clone();  // Placeholder for the shape.
  {
    torch::NoGradGuard no_grad;
    b.copy_(start);
  }
  b.set_requires_grad(true);
  Lion second({b}, options);
  b.mutable_grad() = g1.clone();
  second.step();
  Lion third({b}, LionOptions(0.5));
  torch::serialize::InputArchive archive;
  archive.load_from(saved);
  third.load(archive);
  EXPECT_EQ(third.param_groups()[0].options().get_lr(), 1e-2);
  b.mutable_grad() = g2.clone();
  third.step();
  EXPECT_TRUE(torch::equal(a.detach(), b.detach()));

  // Zeroed: the next step equals a fresh optimizer's first.
  third.ZeroState();
  EXPECT_EQ(third.StateOf(b)->step(), 0);
  EXPECT_EQ(third.StateOf(b)->exp_avg().abs().sum().item<double>(), 0.0);
  torch::Tensor fresh = b.detach().clone().set_requires_grad(true);
  Lion reference({fresh}, options);
  b.mutable_grad() = g1.clone();
  fresh.mutable_grad() = g1.clone();
  third.step();
  reference.step();
  EXPECT_TRUE(torch::equal(b.detach(), fresh.detach()));
}

TEST(LionTest, OptionsAreChecked) {
  EXPECT_EQ(LionOptionsError(LionOptions(1e-4)), "");
  EXPECT_THAT(LionOptionsError(LionOptions(-1)), HasSubstr("lr must be"));
  EXPECT_THAT(LionOptionsError(LionOptions(1e-4).beta1(1.0)),
              HasSubstr("beta1 must be in [0, 1), got 1"));
  EXPECT_THAT(LionOptionsError(LionOptions(1e-4).beta2(-0.1)),
              HasSubstr("beta2 must be in [0, 1)"));
  EXPECT_THAT(LionOptionsError(LionOptions(1e-4).weight_decay(-1)),
              HasSubstr("weight_decay must be >= 0"));
  EXPECT_THAT(LionOptionsError(LionOptions(std::nan(""))),
              HasSubstr("lr must be"));
  torch::Tensor p = torch::zeros({2}, torch::kFloat64);
  EXPECT_THROW(Lion({p}, LionOptions(1e-4).beta1(2)), c10::Error);
}

}  // namespace
}  // namespace loraplex
