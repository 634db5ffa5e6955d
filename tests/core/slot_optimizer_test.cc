// The per-slot optimizer factory: Adam/AdamW against PyTorch's own results,
// routing, eager state, in-place reset, save/load, config validation and
// the layouts of mixture-of-experts parameters.
#include "core/optim/slot_optimizer.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/optim/lion.h"
#include "core/optim/muon.h"
#include "core/optim/soap.h"
#include "core/runtime/step_profile.h"
#include "core/runtime/torch_compat.h"
#include "tests/common/optim_fixture.h"

namespace loraplex {
namespace {

// A LoRA-like parameter set: two A/B pairs of different shapes and a 1-D
// vector (which the muon family must route to AdamW).
std::vector<torch::Tensor> SlotParameters(uint64_t seed) {
  torch::manual_seed(seed);
  return {Leaf(torch::randn({4, 24})), Leaf(torch::randn({24, 4})),
          Leaf(torch::randn({4, 24})), Leaf(torch::randn({16, 4})),
          Leaf(torch::randn({24}))};
}

std::vector<torch::Tensor> Clones(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : params) out.push_back(Leaf(p));
  return out;
}

// Deterministic gradients for step `step`.
void SetGrads(const std::vector<torch::Tensor>& params, int step) {
  torch::manual_seed(1000 + step);
  for (const torch::Tensor& p : params) {
    p.mutable_grad() = torch::randn_like(p);
  }
}

OptimizerConfig MuonConfig() {
  OptimizerConfig config;
  config.family = OptimizerFamily::kMuon;
  config.lr = 0.02;
  config.weight_decay = 0.01;
  config.nesterov = true;
  return config;
}

// Every family, and the muon family with each scalar optimizer: every kind
// of child.
std::vector<OptimizerConfig> EveryChildKindConfigs() {
  std::vector<OptimizerConfig> configs;
  for (OptimizerFamily family : kAllOptimizerFamilies) {
    configs.push_back(MuonConfig());
    configs.back().family = family;
  }
  configs.push_back(MuonConfig());
  configs.back().scalar_optimizer = ScalarOptimizer::kLion;
  return configs;
}

std::string DescribeConfig(const OptimizerConfig& config) {
  return absl::StrCat(OptimizerFamilyName(config.family), " with scalar ",
                      ScalarOptimizerName(config.scalar_optimizer));
}

SlotOptimizer Build(const OptimizerConfig& config,
                    const std::vector<torch::Tensor>& params) {
  auto optimizer = BuildSlotOptimizer(config, params);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  return std::move(optimizer).value();
}

// Steps `optimizer` with the gradients of steps [first, end).
void TrainSteps(SlotOptimizer& optimizer,
                const std::vector<torch::Tensor>& params, int first, int end) {
  for (int step = first; step < end; ++step) {
    SetGrads(params, step);
    optimizer.Step();
  }
}

void ExpectSameValues(const std::vector<torch::Tensor>& a,
                      const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  }
}

// The first moment (Adam) or momentum buffer (Muon) of a state entry.
torch::Tensor FirstMoment(const OptimizerChild& child,
                          const torch::optim::OptimizerParamState& state) {
  switch (child.kind) {
    case OptimizerChildKind::kMuon:
      return static_cast<const MuonParamState&>(state).momentum_buffer();
    case OptimizerChildKind::kAdamW:
      return static_cast<const torch::optim::AdamWParamState&>(state).exp_avg();
    case OptimizerChildKind::kAdam:
      return static_cast<const torch::optim::AdamParamState&>(state).exp_avg();
    case OptimizerChildKind::kLion:
      return static_cast<const LionParamState&>(state).exp_avg();
    case OptimizerChildKind::kSoap:
      return static_cast<const SoapParamState&>(state).exp_avg();
  }
  return {};
}

// Where every child's first-moment tensors live.
std::vector<const void*> MomentStorage(const SlotOptimizer& optimizer) {
  std::vector<const void*> storage;
  for (const OptimizerChild& child : optimizer.children()) {
    for (const auto& entry : child.optimizer->state()) {
      storage.push_back(FirstMoment(child, *entry.second).data_ptr());
    }
  }
  return storage;
}

class AdamGoldenTest : public ::testing::TestWithParam<std::string> {};

// The fixture case `name` stepped on `device`.
void ExpectAdamCaseMatchesPyTorch(const std::string& name,
                                  const torch::Device& device) {
  const auto& c = OptimCase("adam", name);
  OptimizerConfig config;
  config.family = *ParseOptimizerFamily(c.at("family").get<std::string>());
  config.lr = c.at("lr").get<double>();
  config.beta1 = c.at("betas")[0].get<double>();
  config.beta2 = c.at("betas")[1].get<double>();
  config.eps = c.at("eps").get<double>();
  config.weight_decay = c.at("weight_decay").get<double>();

  const OptimFixture& fixture = OptimFixture::Get();
  torch::Tensor param = Leaf(fixture.Tensor(name, "param").to(device));
  torch::Tensor grads = fixture.Tensor(name, "grads").to(device);
  torch::Tensor expected = fixture.Tensor(name, "expected");
  SlotOptimizer optimizer = Build(config, {param});
  for (int64_t step = 0; step < grads.size(0); ++step) {
    param.mutable_grad() = grads[step].clone();
    optimizer.Step();
    const torch::Tensor value = param.detach().cpu();
    EXPECT_TRUE(torch::allclose(value, expected[step], 1e-6, 1e-7))
        << "step " << step + 1 << " max diff "
        << (value - expected[step]).abs().max().item<double>();
  }
  const OptimizerChild& child = optimizer.children()[0];
  const auto& state = *child.optimizer->state().begin()->second;
  auto check_state = [&](const auto& adam_state) {
    EXPECT_EQ(adam_state.step(), grads.size(0));
    // PyTorch updates the moments with lerp_, LibTorch with mul_/add_: the
    // last bit may differ.
    EXPECT_EQ(adam_state.exp_avg().device(), device);
    EXPECT_LE(MaxRelativeDiff(adam_state.exp_avg().cpu(),
                              fixture.Tensor(name, "exp_avg")),
              1e-6);
    EXPECT_LE(MaxRelativeDiff(adam_state.exp_avg_sq().cpu(),
                              fixture.Tensor(name, "exp_avg_sq")),
              1e-6);
  };
  if (child.kind == OptimizerChildKind::kAdam) {
    check_state(static_cast<const torch::optim::AdamParamState&>(state));
  } else {
    check_state(static_cast<const torch::optim::AdamWParamState&>(state));
  }
}

TEST_P(AdamGoldenTest, FactoryChildMatchesPyTorch) {
  ExpectAdamCaseMatchesPyTorch(GetParam(), torch::kCPU);
}

TEST_P(AdamGoldenTest, FactoryChildMatchesPyTorchOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectAdamCaseMatchesPyTorch(GetParam(), torch::Device(torch::kCUDA, 0));
}

INSTANTIATE_TEST_SUITE_P(Fixture, AdamGoldenTest,
                         ::testing::ValuesIn(OptimCaseNames("adam")));

TEST(SlotOptimizerTest, MuonFamilyRoutesMatricesToMuonAndTheRestToAdamW) {
  std::vector<torch::Tensor> params = SlotParameters(1);
  SlotOptimizer optimizer = Build(MuonConfig(), params);
  ASSERT_EQ(optimizer.children().size(), 2u);
  EXPECT_EQ(optimizer.children()[0].kind, OptimizerChildKind::kMuon);
  EXPECT_EQ(optimizer.children()[1].kind, OptimizerChildKind::kAdamW);
  const auto& muon_params =
      optimizer.children()[0].optimizer->param_groups()[0].params();
  ASSERT_EQ(muon_params.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(muon_params[i].is_same(params[i]));
  const auto& adamw_params =
      optimizer.children()[1].optimizer->param_groups()[0].params();
  ASSERT_EQ(adamw_params.size(), 1u);
  EXPECT_TRUE(adamw_params[0].is_same(params[4]));

  // The AdamW child takes the config's betas, eps and weight decay.
  auto& adamw = static_cast<const torch::optim::AdamWOptions&>(
      optimizer.children()[1].optimizer->param_groups()[0].options());
  EXPECT_EQ(adamw.eps(), MuonConfig().eps);
  EXPECT_EQ(adamw.weight_decay(), MuonConfig().weight_decay);
  auto& muon = static_cast<const MuonOptions&>(
      optimizer.children()[0].optimizer->param_groups()[0].options());
  EXPECT_EQ(muon.extra_scale_factor(), 0.2);  // The service default.
  EXPECT_TRUE(muon.nesterov());
}

TEST(SlotOptimizerTest, AdamFamiliesUseOneChildForEverything) {
  for (OptimizerFamily family :
       {OptimizerFamily::kAdamW, OptimizerFamily::kAdam}) {
    OptimizerConfig config;
    config.family = family;
    std::vector<torch::Tensor> params = SlotParameters(2);
    SlotOptimizer optimizer = Build(config, params);
    ASSERT_EQ(optimizer.children().size(), 1u);
    EXPECT_EQ(optimizer.children()[0].kind, family == OptimizerFamily::kAdam
                                                ? OptimizerChildKind::kAdam
                                                : OptimizerChildKind::kAdamW);
    EXPECT_EQ(
        optimizer.children()[0].optimizer->param_groups()[0].params().size(),
        params.size());
  }
  // All matrices: the muon family makes no empty AdamW child.
  std::vector<torch::Tensor> matrices = SlotParameters(3);
  matrices.pop_back();
  EXPECT_EQ(Build(MuonConfig(), matrices).children().size(), 1u);
}

TEST(SlotOptimizerTest, LionFamilyAndLionAsMuonsScalarOptimizer) {
  OptimizerConfig config = MuonConfig();
  config.family = OptimizerFamily::kLion;
  config.lion_beta1 = 0.8;
  config.lion_beta2 = 0.95;
  std::vector<torch::Tensor> params = SlotParameters(5);
  SlotOptimizer lion = Build(config, params);
  ASSERT_EQ(lion.children().size(), 1u);
  EXPECT_EQ(lion.children()[0].kind, OptimizerChildKind::kLion);
  EXPECT_EQ(lion.children()[0].optimizer->param_groups()[0].params().size(),
            params.size());
  auto options = [](const OptimizerChild& child) -> const LionOptions& {
    return static_cast<const LionOptions&>(
        child.optimizer->param_groups()[0].options());
  };
  EXPECT_EQ(options(lion.children()[0]).beta1(), 0.8);
  EXPECT_EQ(options(lion.children()[0]).beta2(), 0.95);
  EXPECT_EQ(options(lion.children()[0]).weight_decay(), config.weight_decay);
  EXPECT_EQ(options(lion.children()[0]).lr(), config.lr);

  config.family = OptimizerFamily::kMuon;
  config.scalar_optimizer = ScalarOptimizer::kLion;
  SlotOptimizer muon = Build(config, params);
  ASSERT_EQ(muon.children().size(), 2u);
  EXPECT_EQ(muon.children()[0].kind, OptimizerChildKind::kMuon);
  EXPECT_EQ(muon.children()[1].kind, OptimizerChildKind::kLion);
  const auto& scalar = muon.children()[1].optimizer->param_groups()[0].params();
  ASSERT_EQ(scalar.size(), 1u);
  EXPECT_TRUE(scalar[0].is_same(params[4]));

  // Per-step hyperparameters reach the Lion child; the scalar optimizer
  // itself cannot change under a slot's state.
  config.lion_beta1 = 0.5;
  config.weight_decay = 0.3;
  ASSERT_TRUE(muon.SetHyperparameters(config).ok());
  EXPECT_EQ(options(muon.children()[1]).beta1(), 0.5);
  EXPECT_EQ(options(muon.children()[1]).weight_decay(), 0.3);
  config.scalar_optimizer = ScalarOptimizer::kAdamW;
  const absl::Status changed = muon.SetHyperparameters(config);
  EXPECT_EQ(changed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(changed.message(),
            "optimizer.scalar_optimizer: the slot's scalar optimizer is lion, "
            "not adamw");
  EXPECT_EQ(options(muon.children()[1]).beta1(), 0.5);

  EXPECT_EQ(ParseOptimizerFamily("lion"), OptimizerFamily::kLion);
  EXPECT_EQ(ParseScalarOptimizer("lion"), ScalarOptimizer::kLion);
  EXPECT_FALSE(ParseScalarOptimizer("adam").has_value());
}

// Family soap: SOAP for the matrices (with the config's knobs), the scalar
// optimizer for the rest; per-step hyperparameters reach both children, but
// max_precond_dim, which shapes SOAP's state, cannot change.
TEST(SlotOptimizerTest, SoapFamilyRoutesMatricesToSoap) {
  OptimizerConfig config;
  config.family = OptimizerFamily::kSoap;
  config.lr = 0.01;
  config.weight_decay = 0.05;
  config.soap_beta1 = 0.8;
  config.soap_beta2 = 0.9;
  config.shampoo_beta = 0.7;
  config.precondition_frequency = 3;
  config.max_precond_dim = 8;
  config.power_iter_steps = 2;
  config.max_update_rms = 1.5;
  config.scalar_optimizer = ScalarOptimizer::kLion;
  std::vector<torch::Tensor> params = SlotParameters(5);
  SlotOptimizer soap = Build(config, params);
  ASSERT_EQ(soap.children().size(), 2u);
  EXPECT_EQ(soap.children()[0].kind, OptimizerChildKind::kSoap);
  EXPECT_EQ(soap.children()[1].kind, OptimizerChildKind::kLion);
  EXPECT_EQ(soap.children()[0].optimizer->param_groups()[0].params().size(),
            4u);
  auto options = [&soap]() -> const SoapOptions& {
    return static_cast<const SoapOptions&>(
        soap.children()[0].optimizer->param_groups()[0].options());
  };
  EXPECT_EQ(options().lr(), 0.01);
  EXPECT_EQ(options().weight_decay(), 0.05);
  EXPECT_EQ(options().beta1(), 0.8);
  EXPECT_EQ(options().beta2(), 0.9);
  EXPECT_EQ(options().shampoo_beta(), 0.7);
  EXPECT_EQ(options().precondition_frequency(), 3);
  EXPECT_EQ(options().max_precond_dim(), 8);
  EXPECT_EQ(options().power_iter_steps(), 2);
  EXPECT_EQ(options().max_update_rms(), 1.5);
  // SlotParameters' 4×24, 24×4 and 16×4 matrices: only the sides of 4.
  for (const OptimizerChild& child : soap.children()) {
    EXPECT_EQ(OptimizerChildStateError(child), "");
  }
  auto& soap_child = static_cast<Soap&>(*soap.children()[0].optimizer);
  EXPECT_EQ(soap_child.StateOf(params[0])->kronecker_left().sizes(),
            torch::IntArrayRef({4, 4}));
  EXPECT_EQ(soap_child.StateOf(params[0])->kronecker_right().sizes(),
            torch::IntArrayRef({0, 0}));
  EXPECT_EQ(soap_child.StateOf(params[3])->kronecker_left().sizes(),
            torch::IntArrayRef({0, 0}));

  config.soap_beta1 = 0.5;
  config.shampoo_beta = 0.6;
  config.lion_beta1 = 0.3;
  ASSERT_TRUE(soap.SetHyperparameters(config).ok());
  EXPECT_EQ(options().beta1(), 0.5);
  EXPECT_EQ(options().shampoo_beta(), 0.6);
  EXPECT_EQ(static_cast<const LionOptions&>(
                soap.children()[1].optimizer->param_groups()[0].options())
                .beta1(),
            0.3);
  config.max_precond_dim = 16;
  const absl::Status changed = soap.SetHyperparameters(config);
  EXPECT_EQ(changed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(changed.message(),
            "optimizer.max_precond_dim: the slot's is 8 (it shapes the "
            "optimizer state), not 16");
  EXPECT_EQ(options().max_precond_dim(), 8);
  EXPECT_EQ(ParseOptimizerFamily("soap"), OptimizerFamily::kSoap);
}

// A data-parallel rank that owns none of a slot's parameters.
TEST(SlotOptimizerTest, EmptyOptimizerKeepsOnlyTheLearningRate) {
  OptimizerConfig config;
  config.family = OptimizerFamily::kMuon;
  config.lr = 0.25;
  SlotOptimizer optimizer = EmptySlotOptimizer(config);
  EXPECT_TRUE(optimizer.children().empty());
  EXPECT_TRUE(optimizer.parameters().empty());
  EXPECT_EQ(optimizer.lr(), 0.25);
  optimizer.SetLr(0.5);
  EXPECT_EQ(optimizer.lr(), 0.5);
  optimizer.Step();
  optimizer.ZeroGrad();
  optimizer.ZeroState();
  EXPECT_EQ(optimizer.lr(), 0.25);  // Back to the config's, as ZeroState.
}

TEST(SlotOptimizerTest, StateExistsBeforeAnyStep) {
  for (const OptimizerConfig& config : EveryChildKindConfigs()) {
    SCOPED_TRACE(DescribeConfig(config));
    std::vector<torch::Tensor> params = SlotParameters(4);
    SlotOptimizer optimizer = Build(config, params);
    size_t states = 0;
    for (const OptimizerChild& child : optimizer.children()) {
      EXPECT_EQ(OptimizerChildStateError(child), "");
      states += child.optimizer->state().size();
    }
    EXPECT_EQ(states, params.size());

    // The optimizers find and use exactly that state (same keys, same
    // storage) at their first step instead of creating their own.
    const std::vector<const void*> storage = MomentStorage(optimizer);
    SetGrads(params, 0);
    optimizer.Step();
    EXPECT_EQ(MomentStorage(optimizer), storage);
    for (const OptimizerChild& child : optimizer.children()) {
      for (const auto& entry : child.optimizer->state()) {
        EXPECT_GT(FirstMoment(child, *entry.second).abs().max().item<float>(),
                  0.0f);
      }
    }
  }
}

TEST(SlotOptimizerTest, ZeroStateMakesAUsedOptimizerBehaveLikeAFreshOne) {
  for (const OptimizerConfig& config : EveryChildKindConfigs()) {
    SCOPED_TRACE(DescribeConfig(config));
    std::vector<torch::Tensor> initial = SlotParameters(5);

    // Train a while, then retire: reset state and load the initial weights.
    std::vector<torch::Tensor> used_params = Clones(initial);
    SlotOptimizer used = Build(config, used_params);
    TrainSteps(used, used_params, 50, 54);
    const std::vector<const void*> storage = MomentStorage(used);
    used.ZeroState();
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < initial.size(); ++i) {
        used_params[i].copy_(initial[i]);
      }
    }

    std::vector<torch::Tensor> fresh_params = Clones(initial);
    SlotOptimizer fresh = Build(config, fresh_params);
    TrainSteps(used, used_params, 0, 3);
    TrainSteps(fresh, fresh_params, 0, 3);
    ExpectSameValues(used_params, fresh_params);

    EXPECT_EQ(MomentStorage(used), storage) << "ZeroState reallocated state";
  }
}

std::string SaveToBytes(const SlotOptimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.Save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

absl::Status LoadFromBytes(SlotOptimizer& optimizer, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  return optimizer.Load(archive);
}

TEST(SlotOptimizerTest, SaveLoadThenStepEqualsUninterruptedRun) {
  for (const OptimizerConfig& config : EveryChildKindConfigs()) {
    SCOPED_TRACE(DescribeConfig(config));
    std::vector<torch::Tensor> initial = SlotParameters(6);

    std::vector<torch::Tensor> straight = Clones(initial);
    SlotOptimizer uninterrupted = Build(config, straight);
    TrainSteps(uninterrupted, straight, 0, 5);

    std::vector<torch::Tensor> first = Clones(initial);
    SlotOptimizer before = Build(config, first);
    TrainSteps(before, first, 0, 3);
    const std::string bytes = SaveToBytes(before);

    std::vector<torch::Tensor> resumed = Clones(first);
    SlotOptimizer after = Build(config, resumed);
    ASSERT_TRUE(LoadFromBytes(after, bytes).ok());
    TrainSteps(after, resumed, 3, 5);
    ExpectSameValues(resumed, straight);
  }
}

// A checkpoint taken right after attach (no gradient yet) loads and resumes.
TEST(SlotOptimizerTest, CheckpointOfANeverSteppedSlotLoads) {
  OptimizerConfig config = MuonConfig();
  std::vector<torch::Tensor> initial = SlotParameters(7);
  std::vector<torch::Tensor> a = Clones(initial);
  SlotOptimizer fresh = Build(config, a);
  const std::string bytes = SaveToBytes(fresh);

  std::vector<torch::Tensor> b = Clones(initial);
  SlotOptimizer loaded = Build(config, b);
  ASSERT_TRUE(LoadFromBytes(loaded, bytes).ok());
  for (const OptimizerChild& child : loaded.children()) {
    EXPECT_EQ(OptimizerChildStateError(child), "");
  }
  SetGrads(a, 0);
  SetGrads(b, 0);
  fresh.Step();
  loaded.Step();
  ExpectSameValues(a, b);
}

TEST(SlotOptimizerTest, LoadRejectsAMismatchedArchiveAndKeepsItsState) {
  OptimizerConfig config = MuonConfig();
  std::vector<torch::Tensor> params = SlotParameters(8);
  SlotOptimizer optimizer = Build(config, params);
  SetGrads(params, 0);
  optimizer.Step();
  const std::string before = SaveToBytes(optimizer);

  // Same family, other shapes (a different LoRA rank).
  std::vector<torch::Tensor> other_rank = {
      Leaf(torch::randn({8, 24})), Leaf(torch::randn({24, 8})),
      Leaf(torch::randn({8, 24})), Leaf(torch::randn({16, 8})),
      Leaf(torch::randn({24}))};
  SlotOptimizer other = Build(config, other_rank);
  SetGrads(other_rank, 1);
  other.Step();
  absl::Status status = LoadFromBytes(optimizer, SaveToBytes(other));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("momentum_buffer has shape [8, 24], "
                                  "expected [4, 24]"),
            std::string::npos)
      << status;
  EXPECT_EQ(SaveToBytes(optimizer), before);

  // SOAP slots whose max_precond_dim kept different factors: the
  // factor's own shape is checked, not the parameter's.
  OptimizerConfig soap_config;
  soap_config.family = OptimizerFamily::kSoap;
  std::vector<torch::Tensor> soap_params = SlotParameters(8);
  SlotOptimizer soap = Build(soap_config, soap_params);
  SetGrads(soap_params, 0);
  soap.Step();
  const std::string soap_before = SaveToBytes(soap);
  OptimizerConfig one_sided = soap_config;
  one_sided.max_precond_dim = 8;
  std::vector<torch::Tensor> one_sided_params = SlotParameters(8);
  SlotOptimizer other_soap = Build(one_sided, one_sided_params);
  status = LoadFromBytes(soap, SaveToBytes(other_soap));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("parameter 0: kronecker_right has shape "
                                  "[0, 0], expected [24, 24]"),
            std::string::npos)
      << status;
  EXPECT_EQ(SaveToBytes(soap), soap_before);

  // Another family.
  OptimizerConfig adam;
  adam.family = OptimizerFamily::kAdam;
  std::vector<torch::Tensor> adam_params = SlotParameters(8);
  SlotOptimizer adam_optimizer = Build(adam, adam_params);
  status = LoadFromBytes(optimizer, SaveToBytes(adam_optimizer));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(
                "archive holds optimizer family adam, this slot uses muon"),
            std::string::npos)
      << status;
  EXPECT_EQ(SaveToBytes(optimizer), before);

  // The same family with another scalar optimizer.
  OptimizerConfig lion_scalar = config;
  lion_scalar.scalar_optimizer = ScalarOptimizer::kLion;
  std::vector<torch::Tensor> lion_params = SlotParameters(8);
  SlotOptimizer lion_optimizer = Build(lion_scalar, lion_params);
  status = LoadFromBytes(optimizer, SaveToBytes(lion_optimizer));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("optimizer child 1 is lion, expected adamw"),
            std::string::npos)
      << status;
  EXPECT_EQ(SaveToBytes(optimizer), before);
}

// The archive carries state, not hyperparameters: the lr stays the one the
// schedule set, and the storage of every state tensor is kept.
TEST(SlotOptimizerTest, LoadCopiesStateInPlaceAndKeepsTheLr) {
  OptimizerConfig config = MuonConfig();
  std::vector<torch::Tensor> params = SlotParameters(12);
  SlotOptimizer source = Build(config, params);
  SetGrads(params, 0);
  source.Step();
  source.SetLr(0.1);
  const std::string bytes = SaveToBytes(source);

  std::vector<torch::Tensor> other = SlotParameters(12);
  SlotOptimizer target = Build(config, other);
  target.SetLr(0.2);
  const std::vector<const void*> storage = MomentStorage(target);
  ASSERT_TRUE(LoadFromBytes(target, bytes).ok());
  EXPECT_EQ(target.lr(), 0.2);
  EXPECT_EQ(MomentStorage(target), storage);
  EXPECT_EQ(SaveToBytes(target), bytes);
}

// Archives whose header promises more than they hold.
std::string IncompleteArchive(bool with_child) {
  torch::serialize::OutputArchive archive;
  archive.write("version", c10::IValue(int64_t{2}));
  archive.write("family", c10::IValue(int64_t{2}));  // muon
  archive.write("num_children", c10::IValue(int64_t{2}));
  if (with_child) {
    torch::serialize::OutputArchive child(archive.compilation_unit());
    child.write("kind", c10::IValue(int64_t{0}));  // muon
    child.write("num_params", c10::IValue(int64_t{4}));
    archive.write("child0", child);
  }
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

TEST(SlotOptimizerTest, LoadRejectsAnIncompleteArchiveAndKeepsItsState) {
  std::vector<torch::Tensor> params = SlotParameters(13);
  SlotOptimizer optimizer = Build(MuonConfig(), params);
  SetGrads(params, 0);
  optimizer.Step();
  const std::string before = SaveToBytes(optimizer);

  absl::Status status = LoadFromBytes(optimizer, IncompleteArchive(false));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("archive has no optimizer child 0"),
            std::string::npos)
      << status;
  status = LoadFromBytes(optimizer, IncompleteArchive(true));
  EXPECT_NE(status.message().find("optimizer child 0 has no parameter 0"),
            std::string::npos)
      << status;
  EXPECT_EQ(SaveToBytes(optimizer), before);
}

TEST(SlotOptimizerTest, ZeroStateRestoresTheConfiguredLr) {
  std::vector<torch::Tensor> params = SlotParameters(14);
  SlotOptimizer optimizer = Build(MuonConfig(), params);
  optimizer.SetLr(0.0);
  optimizer.ZeroState();
  EXPECT_EQ(optimizer.lr(), MuonConfig().lr);
}

TEST(SlotOptimizerTest, SetLrReachesEveryChild) {
  std::vector<torch::Tensor> params = SlotParameters(9);
  SlotOptimizer optimizer = Build(MuonConfig(), params);
  optimizer.SetLr(0.125);
  EXPECT_EQ(optimizer.lr(), 0.125);
  for (const OptimizerChild& child : optimizer.children()) {
    EXPECT_EQ(child.optimizer->param_groups()[0].options().get_lr(), 0.125);
  }
}

TEST(SlotOptimizerTest, ZeroGradKeepsGradientStorage) {
  std::vector<torch::Tensor> params = SlotParameters(10);
  SlotOptimizer optimizer = Build(MuonConfig(), params);
  SetGrads(params, 0);
  const void* storage = params[0].grad().data_ptr();
  optimizer.ZeroGrad();
  EXPECT_EQ(params[0].grad().data_ptr(), storage);
  EXPECT_EQ(params[0].grad().abs().max().item<float>(), 0.0f);
}

TEST(SlotOptimizerTest, InvalidConfigsNameTheField) {
  auto message = [](OptimizerConfig config) {
    auto built = BuildSlotOptimizer(config, SlotParameters(11));
    EXPECT_EQ(built.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(built.status().message());
  };
  OptimizerConfig c = MuonConfig();
  c.lr = -0.1;
  EXPECT_EQ(message(c), "optimizer.lr must be a finite number >= 0, got -0.1");
  c = MuonConfig();
  c.momentum = 1.0;
  EXPECT_EQ(message(c), "optimizer.momentum must be in [0, 1), got 1");
  c = MuonConfig();
  c.ns_steps = 0;
  EXPECT_EQ(message(c), "optimizer.ns_steps must be in [1, 100], got 0");
  c = MuonConfig();
  c.coefficient_set = NsCoefficientSet::kCustom;
  EXPECT_EQ(message(c),
            "optimizer.coefficient_set is custom but custom_coefficients is "
            "empty");
  c = MuonConfig();
  c.beta2 = 1.5;
  EXPECT_EQ(message(c), "optimizer.betas[1] must be in [0, 1), got 1.5");
  c = MuonConfig();
  c.lion_beta1 = -0.1;
  EXPECT_EQ(message(c), "optimizer.lion_betas[0] must be in [0, 1), got -0.1");
  c = MuonConfig();
  c.family = OptimizerFamily::kLion;
  c.lion_beta2 = 1;
  EXPECT_EQ(message(c), "optimizer.lion_betas[1] must be in [0, 1), got 1");
  c = MuonConfig();
  c.eps = 0;
  EXPECT_EQ(message(c), "optimizer.eps must be a finite number > 0, got 0");
  c = MuonConfig();
  c.weight_decay = std::nan("");
  EXPECT_EQ(message(c),
            "optimizer.weight_decay must be a finite number >= 0, got nan");

  EXPECT_FALSE(ParseOptimizerFamily("sgd").has_value());
  EXPECT_EQ(ParseOptimizerFamily("muon"), OptimizerFamily::kMuon);

  auto empty = BuildSlotOptimizer(MuonConfig(), {});
  EXPECT_EQ(empty.status().message(), "optimizer needs at least one parameter");
  auto frozen = BuildSlotOptimizer(MuonConfig(), {torch::zeros({2, 2})});
  EXPECT_EQ(frozen.status().message(),
            "parameter 0 must be a leaf tensor that requires grad");
  torch::Tensor twice = Leaf(torch::zeros({2, 2}));
  auto duplicate = BuildSlotOptimizer(MuonConfig(), {twice, twice});
  EXPECT_EQ(duplicate.status().message(), "parameter 1 appears twice");
}

// Slots of every family and assorted Muon settings, in fp64 so that stepping
// them together must equal stepping each alone to rounding.
std::vector<OptimizerConfig> MixedSlotConfigs() {
  std::vector<OptimizerConfig> configs(11, MuonConfig());
  configs[1].lr = 0.05;  // Shares every batch with slot 0, not its scale.
  configs[2].extra_scale_factor = 1.0;
  configs[2].scale_mode = MuonScaleMode::kUnitRmsNorm;
  configs[2].coefficient_set = NsCoefficientSet::kAol;  // Also 5 steps.
  configs[3].coefficient_set = NsCoefficientSet::kPolarExpress;
  configs[3].ns_steps = 8;
  configs[4].coefficient_set = NsCoefficientSet::kCustom;
  configs[4].custom_coefficients = {{3.0, -3.2, 1.2}, {2.0, -1.5, 0.5}};
  configs[5].family = OptimizerFamily::kAdamW;
  configs[6].family = OptimizerFamily::kAdam;
  configs[7].family = OptimizerFamily::kLion;
  configs[7].lion_beta1 = 0.8;
  configs[8].scalar_optimizer = ScalarOptimizer::kLion;
  configs[9].family = OptimizerFamily::kSoap;
  configs[10].family = OptimizerFamily::kSoap;
  configs[10].scalar_optimizer = ScalarOptimizer::kLion;
  configs[10].max_precond_dim = 8;
  configs[10].precondition_frequency = 2;
  return configs;
}

std::vector<torch::Tensor> Fp64(std::vector<torch::Tensor> params) {
  for (torch::Tensor& p : params) p = Leaf(p.to(torch::kFloat64));
  return params;
}

TEST(SlotOptimizerTest, SteppingSlotsTogetherEqualsSteppingEachAlone) {
  const std::vector<OptimizerConfig> configs = MixedSlotConfigs();
  std::vector<std::vector<torch::Tensor>> together_params;
  std::vector<std::vector<torch::Tensor>> alone_params;
  std::vector<SlotOptimizer> together;
  std::vector<SlotOptimizer> alone;
  for (size_t s = 0; s < configs.size(); ++s) {
    together_params.push_back(Fp64(SlotParameters(s)));
    alone_params.push_back(Clones(together_params.back()));
    together.push_back(Build(configs[s], together_params.back()));
    alone.push_back(Build(configs[s], alone_params.back()));
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<SlotOptimizer*> all;
    for (size_t s = 0; s < configs.size(); ++s) {
      SetGrads(together_params[s], step * 10 + s);
      SetGrads(alone_params[s], step * 10 + s);
      // Slot 2 has no gradient for one matrix: it stays as it is.
      if (s == 2) {
        together_params[s][1].mutable_grad() = torch::Tensor();
        alone_params[s][1].mutable_grad() = torch::Tensor();
      }
      all.push_back(&together[s]);
      alone[s].Step();
    }
    for (const absl::Status& status : StepSlotOptimizers(all)) {
      EXPECT_TRUE(status.ok()) << status;
    }
  }
  for (size_t s = 0; s < configs.size(); ++s) {
    for (size_t i = 0; i < together_params[s].size(); ++i) {
      const torch::Tensor& a = together_params[s][i];
      const torch::Tensor& b = alone_params[s][i];
      EXPECT_LE((a - b).abs().max().item<double>(),
                1e-12 * b.abs().max().item<double>())
          << "slot " << s << " parameter " << i;
    }
  }
  // The matrix that never had a gradient never moved.
  EXPECT_TRUE(torch::equal(together_params[2][1], Fp64(SlotParameters(2))[1]));
}

// Stepped together, Muon slots cost a few operators per slot and per batch
// of same-shape matrices, none per matrix: on a GPU each operator is a
// dispatch on the host (and often a kernel), and a step of 16 slots of a
// 24-layer model has 5,376 matrices. Counted with LibTorch's profiler.
TEST(SlotOptimizerTest, SteppingMuonSlotsTogetherCostsNoOperatorPerMatrix) {
  if (!kTorchIs2OrNewer) GTEST_SKIP() << "profiling needs LibTorch 2.x";
  constexpr int kPairs = 20;  // A/B pairs per slot.
  auto operators = [&](int slots) -> int64_t {
    std::vector<std::vector<torch::Tensor>> params(slots);
    std::vector<SlotOptimizer> optimizers;
    for (int s = 0; s < slots; ++s) {
      torch::manual_seed(s);
      for (int i = 0; i < kPairs; ++i) {
        params[s].push_back(Leaf(torch::randn({4, 24})));
        params[s].push_back(Leaf(torch::randn({24, 4})));
      }
      optimizers.push_back(Build(MuonConfig(), params[s]));
    }
    std::vector<SlotOptimizer*> all;
    for (SlotOptimizer& optimizer : optimizers) all.push_back(&optimizer);
    for (int s = 0; s < slots; ++s) SetGrads(params[s], s);
    const absl::StatusOr<std::vector<ProfiledEvent>> events = ProfileCall(
        [&] {
          for (const absl::Status& status : StepSlotOptimizers(all)) {
            EXPECT_TRUE(status.ok()) << status;
          }
        },
        /*cuda=*/false, "");
    EXPECT_TRUE(events.ok()) << events.status();
    return events.ok() ? SummarizeProfile(*events).top_level_ops : 0;
  };
  const int64_t two = operators(2);
  const int64_t ten = operators(10);
  EXPECT_GT(two, 0);
  // Eight more slots bring 8 · 2 · kPairs more matrices and no new shapes.
  EXPECT_LT(ten - two, 8 * 2 * kPairs)
      << two << " operators for 2 slots, " << ten << " for 10";
}

TEST(SlotOptimizerTest, ASlotWhoseStepFailsFailsAloneWhenSteppedTogether) {
  const std::vector<OptimizerConfig> configs = MixedSlotConfigs();
  std::vector<std::vector<torch::Tensor>> together_params;
  std::vector<std::vector<torch::Tensor>> alone_params;
  std::vector<SlotOptimizer> together;
  std::vector<SlotOptimizer> alone;
  for (size_t s = 0; s < configs.size(); ++s) {
    together_params.push_back(Fp64(SlotParameters(s)));
    alone_params.push_back(Clones(together_params.back()));
    together.push_back(Build(configs[s], together_params.back()));
    alone.push_back(Build(configs[s], alone_params.back()));
  }
  std::vector<SlotOptimizer*> all;
  for (size_t s = 0; s < configs.size(); ++s) {
    SetGrads(together_params[s], s);
    SetGrads(alone_params[s], s);
    all.push_back(&together[s]);
  }
  // Slot 1's gradient has the wrong shape: its momentum update throws.
  together_params[1][0].mutable_grad() = torch::randn({3}, torch::kFloat64);
  // Slot 4's Newton–Schulz settings are broken after it was built: the
  // shared orthogonalization throws, and each slot is then stepped alone.
  auto& muon_options = static_cast<MuonOptions&>(
      together[4].children()[0].optimizer->param_groups()[0].options());
  muon_options.ns_steps(0);
  const std::vector<absl::Status> statuses = StepSlotOptimizers(all);
  ASSERT_EQ(statuses.size(), configs.size());
  for (size_t s = 0; s < configs.size(); ++s) {
    if (s == 1 || s == 4) {
      EXPECT_EQ(statuses[s].code(), absl::StatusCode::kInternal) << s;
      continue;
    }
    EXPECT_TRUE(statuses[s].ok()) << statuses[s];
    alone[s].Step();
    for (size_t i = 0; i < together_params[s].size(); ++i) {
      const torch::Tensor& a = together_params[s][i];
      const torch::Tensor& b = alone_params[s][i];
      EXPECT_LE((a - b).abs().max().item<double>(),
                1e-12 * b.abs().max().item<double>())
          << "slot " << s << " parameter " << i;
    }
  }
  EXPECT_NE(statuses[4].message().find("ns_steps"), std::string::npos)
      << statuses[4];
}

// A mixture-of-experts slot: a plain A/B pair, 3 experts' A [3*4, 24]
// (stacked in rows) and B [16, 4*3] (in columns), and a vector.
std::vector<torch::Tensor> ExpertSlotParameters(uint64_t seed) {
  torch::manual_seed(seed);
  return {Leaf(torch::randn({4, 24})), Leaf(torch::randn({24, 4})),
          Leaf(torch::randn({12, 24})), Leaf(torch::randn({16, 12})),
          Leaf(torch::randn({24}))};
}

std::vector<ParamLayout> ExpertSlotLayouts() {
  return {
      {}, {}, {ExpertStacking::kRows, 3}, {ExpertStacking::kColumns, 3}, {}};
}

SlotOptimizer BuildExperts(const OptimizerConfig& config,
                           const std::vector<torch::Tensor>& params) {
  auto optimizer = BuildSlotOptimizer(config, params, ExpertSlotLayouts());
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  return std::move(optimizer).value();
}

TEST(SlotOptimizerTest, ExpertLayoutsReachMuonAndLeaveElementwiseChildren) {
  for (const OptimizerConfig& config : EveryChildKindConfigs()) {
    SCOPED_TRACE(DescribeConfig(config));
    const std::vector<torch::Tensor> initial = ExpertSlotParameters(11);
    std::vector<torch::Tensor> with = Clones(initial);
    std::vector<torch::Tensor> without = Clones(initial);
    SlotOptimizer experts = BuildExperts(config, with);
    SlotOptimizer plain = Build(config, without);
    ASSERT_EQ(experts.layouts().size(), with.size());
    EXPECT_EQ(experts.layouts()[3].matrices(), 3);
    EXPECT_EQ(plain.layouts()[3].matrices(), 1);
    for (const OptimizerChild& child : experts.children()) {
      EXPECT_EQ(OptimizerChildStateError(child), "");
    }
    TrainSteps(experts, with, 0, 3);
    TrainSteps(plain, without, 0, 3);
    if (config.family == OptimizerFamily::kSoap) {
      // Each expert's matrix has its own factors (soap_test.cc checks
      // their values).
      ASSERT_EQ(experts.children().front().kind, OptimizerChildKind::kSoap);
      auto& soap = static_cast<Soap&>(*experts.children().front().optimizer);
      EXPECT_EQ(soap.StateOf(with[2])->kronecker_left().sizes(),
                torch::IntArrayRef({3, 4, 4}));
      EXPECT_EQ(soap.StateOf(with[3])->kronecker_right().sizes(),
                torch::IntArrayRef({3, 4, 4}));
      EXPECT_FALSE(torch::equal(with[2], without[2]));
      EXPECT_FALSE(torch::equal(with[3], without[3]));
      continue;
    }
    if (config.family != OptimizerFamily::kMuon) {
      ExpectSameValues(with, without);  // Elementwise: layouts do not matter.
      continue;
    }
    ASSERT_EQ(experts.children().front().kind, OptimizerChildKind::kMuon);
    auto& muon = static_cast<Muon&>(*experts.children().front().optimizer);
    EXPECT_EQ(muon.param_groups()[0].params().size(), 4u);
    EXPECT_EQ(muon.LayoutOf(with[2]).stacking, ExpertStacking::kRows);
    EXPECT_EQ(muon.LayoutOf(with[3]).stacking, ExpertStacking::kColumns);
    EXPECT_FALSE(torch::equal(with[2], without[2]));
    EXPECT_FALSE(torch::equal(with[3], without[3]));
  }
}

// fp64: the experts' matrices share batches with the other slot's A
// [4, 24] and B [16, 4].
TEST(SlotOptimizerTest, ExpertSlotSteppedTogetherEqualsEachAlone) {
  const OptimizerConfig config = MuonConfig();
  std::vector<std::vector<torch::Tensor>> together = {
      Fp64(ExpertSlotParameters(12)), Fp64(SlotParameters(13))};
  std::vector<std::vector<torch::Tensor>> alone = {Clones(together[0]),
                                                   Clones(together[1])};
  std::vector<SlotOptimizer> together_optimizers;
  together_optimizers.push_back(BuildExperts(config, together[0]));
  together_optimizers.push_back(Build(config, together[1]));
  SlotOptimizer alone_experts = BuildExperts(config, alone[0]);
  SlotOptimizer alone_plain = Build(config, alone[1]);
  for (int step = 0; step < 3; ++step) {
    for (size_t s = 0; s < 2; ++s) {
      SetGrads(together[s], step * 10 + s);
      SetGrads(alone[s], step * 10 + s);
    }
    for (const absl::Status& status : StepSlotOptimizers(
             {&together_optimizers[0], &together_optimizers[1]})) {
      EXPECT_TRUE(status.ok()) << status;
    }
    alone_experts.Step();
    alone_plain.Step();
  }
  for (size_t s = 0; s < 2; ++s) {
    for (size_t i = 0; i < together[s].size(); ++i) {
      const torch::Tensor& a = together[s][i];
      const torch::Tensor& b = alone[s][i];
      EXPECT_LE((a - b).abs().max().item<double>(),
                1e-12 * b.abs().max().item<double>())
          << "slot " << s << " parameter " << i;
    }
  }
}

TEST(SlotOptimizerTest, ExpertSlotSaveLoadAndZeroStateKeepWorking) {
  const OptimizerConfig config = MuonConfig();
  const std::vector<torch::Tensor> initial = ExpertSlotParameters(14);
  std::vector<torch::Tensor> straight = Clones(initial);
  SlotOptimizer uninterrupted = BuildExperts(config, straight);
  TrainSteps(uninterrupted, straight, 0, 5);

  std::vector<torch::Tensor> first = Clones(initial);
  SlotOptimizer before = BuildExperts(config, first);
  TrainSteps(before, first, 0, 3);
  const std::string bytes = SaveToBytes(before);
  std::vector<torch::Tensor> resumed = Clones(first);
  SlotOptimizer after = BuildExperts(config, resumed);
  ASSERT_TRUE(LoadFromBytes(after, bytes).ok());
  TrainSteps(after, resumed, 3, 5);
  ExpectSameValues(resumed, straight);

  // Reset in place, it steps as a fresh optimizer from the same values.
  std::vector<torch::Tensor> fresh_params = Clones(resumed);
  SlotOptimizer fresh = BuildExperts(config, fresh_params);
  after.ZeroState();
  TrainSteps(after, resumed, 0, 2);
  TrainSteps(fresh, fresh_params, 0, 2);
  ExpectSameValues(resumed, fresh_params);
}

TEST(SlotOptimizerTest, RejectsLayoutsThatDoNotFitTheParameters) {
  const std::vector<torch::Tensor> params = ExpertSlotParameters(15);
  auto message_of = [&](const std::vector<ParamLayout>& layouts) {
    auto built = BuildSlotOptimizer(MuonConfig(), params, layouts);
    EXPECT_EQ(built.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(built.status().message());
  };
  EXPECT_EQ(message_of({ParamLayout{}}),
            "optimizer has 1 layouts for 5 parameters");
  std::vector<ParamLayout> layouts = ExpertSlotLayouts();
  layouts[3].experts = 5;
  EXPECT_EQ(message_of(layouts),
            "parameter 3 holds 5 experts stacked in columns, but its shape "
            "[16, 12] has 12 columns");
  layouts = ExpertSlotLayouts();
  layouts[4] = {ExpertStacking::kRows, 2};
  EXPECT_EQ(message_of(layouts),
            "parameter 4 holds 2 experts stacked in rows, but its shape [24] "
            "is not a matrix");
}

}  // namespace
}  // namespace loraplex
