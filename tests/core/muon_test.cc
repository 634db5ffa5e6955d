// The Muon optimizer against the independent golden script
// (tools/golden/make_optim_golden.py), plus its closed-form parts, option
// validation, batching, serialization and mixture-of-experts parameters
// that stack one matrix per expert.
#include "core/optim/muon.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

#include "tests/common/optim_fixture.h"

namespace loraplex {
namespace {

class MuonGoldenTest : public ::testing::TestWithParam<std::string> {};

// The fixture case `name` stepped on `device`.
void ExpectMuonCaseMatchesReference(const std::string& name,
                                    const torch::Device& device) {
  const auto& c = OptimCase("muon", name);
  const OptimFixture& fixture = OptimFixture::Get();
  torch::Tensor initial = fixture.Tensor(name, "param");
  torch::Tensor grads = fixture.Tensor(name, "grads").to(device);
  torch::Tensor expected = fixture.Tensor(name, "expected");

  torch::Tensor param = Leaf(initial.to(device));
  Muon muon({param}, MuonOptionsOfCase(c));
  for (int64_t step = 0; step < grads.size(0); ++step) {
    param.mutable_grad() = grads[step].clone();
    muon.step();
    // Relative to the parameter (the criterion) and, stricter, to
    // the update itself.
    const torch::Tensor value = param.detach().cpu();
    EXPECT_LE(MaxRelativeDiff(value, expected[step]), 1e-5)
        << "step " << step + 1;
    EXPECT_LE(MaxRelativeDiff(value - initial, expected[step] - initial), 2e-4)
        << "step " << step + 1;
  }
  MuonParamState* state = muon.StateOf(param);
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->step(), grads.size(0));
  torch::Tensor momentum = fixture.Tensor(name, "momentum");
  EXPECT_EQ(state->momentum_buffer().device(), device);
  EXPECT_TRUE(
      torch::allclose(state->momentum_buffer().cpu(), momentum, 1e-5, 1e-7));
}

TEST_P(MuonGoldenTest, ThreeStepsMatchIndependentReference) {
  ExpectMuonCaseMatchesReference(GetParam(), torch::kCPU);
}

TEST_P(MuonGoldenTest, ThreeStepsMatchIndependentReferenceOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectMuonCaseMatchesReference(GetParam(), torch::Device(torch::kCUDA, 0));
}

INSTANTIATE_TEST_SUITE_P(Fixture, MuonGoldenTest,
                         ::testing::ValuesIn(OptimCaseNames("muon")));

// Every fixture case twice, as if each were one slot's optimizer, stepped
// together: their pending updates share batched Newton–Schulz calls wherever
// shape and settings agree, and each must still match the reference.
void ExpectCasesSteppedTogetherMatchTheReference(const torch::Device& device) {
  const OptimFixture& fixture = OptimFixture::Get();
  const std::vector<std::string> names = OptimCaseNames("muon");
  ASSERT_FALSE(names.empty());
  struct Slot {
    std::string name;
    torch::Tensor initial;
    torch::Tensor grads;
    torch::Tensor expected;
    torch::Tensor param;
    std::unique_ptr<Muon> muon;
  };
  std::vector<Slot> slots;
  for (int copy = 0; copy < 2; ++copy) {
    for (const std::string& name : names) {
      Slot slot{name,
                fixture.Tensor(name, "param"),
                fixture.Tensor(name, "grads"),
                fixture.Tensor(name, "expected"),
                Leaf(fixture.Tensor(name, "param").to(device)),
                nullptr};
      slot.muon =
          std::make_unique<Muon>(std::vector<torch::Tensor>{slot.param},
                                 MuonOptionsOfCase(OptimCase("muon", name)));
      slots.push_back(std::move(slot));
    }
  }
  const int64_t steps = slots.front().grads.size(0);
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<MuonPendingUpdate> pending;
    for (Slot& slot : slots) {
      ASSERT_EQ(slot.grads.size(0), steps) << slot.name;
      slot.param.mutable_grad() = slot.grads[step].to(device);
      slot.muon->PrepareStep(pending);
    }
    ASSERT_EQ(pending.size(), slots.size());
    ApplyMuonUpdates(pending);
    for (const Slot& slot : slots) {
      EXPECT_LE(MaxRelativeDiff(slot.param.detach().cpu() - slot.initial,
                                slot.expected[step] - slot.initial),
                2e-4)
          << slot.name << " step " << step + 1;
    }
  }
}

TEST(MuonTest, FixtureCasesSteppedTogetherMatchTheReference) {
  ExpectCasesSteppedTogetherMatchTheReference(torch::kCPU);
}

TEST(MuonTest, FixtureCasesSteppedTogetherMatchTheReferenceOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectCasesSteppedTogetherMatchTheReference(torch::Device(torch::kCUDA, 0));
}

TEST(MuonTest, ScaleFactorsForShapes) {
  EXPECT_DOUBLE_EQ(MuonScaleFactor(16, 4096, MuonScaleMode::kSpectral), 64.0);
  EXPECT_DOUBLE_EQ(MuonScaleFactor(4096, 16, MuonScaleMode::kSpectral), 64.0);
  EXPECT_DOUBLE_EQ(MuonScaleFactor(16, 4096, MuonScaleMode::kUnitRmsNorm),
                   1.0 / 16.0);
  EXPECT_DOUBLE_EQ(MuonScaleFactor(4096, 16, MuonScaleMode::kUnitRmsNorm),
                   16.0);
  EXPECT_DOUBLE_EQ(MuonScaleFactor(16, 4096, MuonScaleMode::kShapeScaling),
                   1.0);
  EXPECT_DOUBLE_EQ(MuonScaleFactor(4096, 16, MuonScaleMode::kShapeScaling),
                   16.0);
}

TEST(MuonTest, RejectsInvalidOptionsWithTheFieldName) {
  auto error_of = [](const MuonOptions& options) {
    try {
      Muon muon({Leaf(torch::zeros({2, 3}))}, options);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string();
  };
  EXPECT_NE(error_of(MuonOptions(-1.0)).find("lr must be a finite number >= 0"),
            std::string::npos);
  EXPECT_NE(error_of(MuonOptions(0.1).momentum(1.0))
                .find("momentum must be in [0, 1), got 1"),
            std::string::npos);
  EXPECT_NE(error_of(MuonOptions(0.1).ns_steps(0))
                .find("ns_steps must be in [1, 100], got 0"),
            std::string::npos);
  EXPECT_NE(error_of(MuonOptions(0.1).weight_decay(-0.1)).find("weight_decay"),
            std::string::npos);
  EXPECT_NE(error_of(MuonOptions(0.1).extra_scale_factor(0.0))
                .find("extra_scale_factor must be a finite number > 0"),
            std::string::npos);
  EXPECT_NE(
      error_of(MuonOptions(0.1).coefficient_set(NsCoefficientSet::kCustom))
          .find("custom_coefficients is empty"),
      std::string::npos);
  EXPECT_EQ(error_of(MuonOptions(0.1)), "");
}

TEST(MuonTest, RejectsParametersThatAreNotMatrices) {
  try {
    Muon muon({Leaf(torch::zeros({2, 3})), Leaf(torch::zeros({5}))});
    FAIL() << "a 1-D parameter was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 1 has shape [5]"),
              std::string::npos)
        << e.what();
  }
}

TEST(MuonTest, BatchedStepEqualsOneOptimizerPerMatrix) {
  torch::manual_seed(21);
  const MuonOptions options =
      MuonOptions(0.05).nesterov(true).weight_decay(0.1).extra_scale_factor(
          0.2);
  std::vector<torch::Tensor> batched_params;
  std::vector<torch::Tensor> single_params;
  std::vector<std::unique_ptr<Muon>> singles;
  // 12 matrices of one shape, 4 of another: two batched NS calls.
  for (int i = 0; i < 16; ++i) {
    torch::Tensor init = i < 12 ? torch::randn({4, 48}) : torch::randn({48, 4});
    batched_params.push_back(Leaf(init));
    single_params.push_back(Leaf(init));
    singles.push_back(std::make_unique<Muon>(
        std::vector<torch::Tensor>{single_params.back()}, options));
  }
  Muon batched(batched_params, options);
  for (int step = 0; step < 3; ++step) {
    for (int i = 0; i < 16; ++i) {
      torch::Tensor grad = torch::randn_like(batched_params[i]);
      batched_params[i].mutable_grad() = grad.clone();
      single_params[i].mutable_grad() = grad.clone();
      singles[i]->step();
    }
    batched.step();
  }
  for (int i = 0; i < 16; ++i) {
    EXPECT_TRUE(
        torch::allclose(batched_params[i], single_params[i], 1e-6, 1e-6))
        << "matrix " << i;
  }
}

TEST(MuonTest, ParametersWithoutGradientAreUntouched) {
  torch::Tensor with_grad = Leaf(torch::ones({3, 3}));
  torch::Tensor without = Leaf(torch::ones({3, 3}));
  Muon muon({with_grad, without}, MuonOptions(0.1).weight_decay(0.5));
  with_grad.mutable_grad() = torch::eye(3);
  muon.step();
  EXPECT_FALSE(torch::equal(with_grad, torch::ones({3, 3})));
  EXPECT_TRUE(torch::equal(without, torch::ones({3, 3})));
}

TEST(MuonTest, InitStateCreatesZeroStateForEveryParameter) {
  torch::Tensor a = Leaf(torch::ones({2, 5}));
  torch::Tensor b = Leaf(torch::ones({5, 2}));
  Muon muon({a, b});
  EXPECT_EQ(muon.StateOf(a), nullptr);
  muon.InitState();
  for (const torch::Tensor& p : {a, b}) {
    MuonParamState* state = muon.StateOf(p);
    ASSERT_NE(state, nullptr);
    EXPECT_EQ(state->step(), 0);
    EXPECT_EQ(state->momentum_buffer().sizes(), p.sizes());
    EXPECT_EQ(state->momentum_buffer().abs().max().item<float>(), 0.0f);
  }
}

// Save after two steps, load into a fresh optimizer, and the third step
// matches an uninterrupted run bit for bit.
TEST(MuonTest, SaveLoadResumesExactly) {
  torch::manual_seed(4);
  const MuonOptions options = MuonOptions(0.03).nesterov(true);
  torch::Tensor init = torch::randn({6, 10});
  std::vector<torch::Tensor> grads;
  for (int i = 0; i < 3; ++i) grads.push_back(torch::randn({6, 10}));

  torch::Tensor straight = Leaf(init);
  Muon uninterrupted({straight}, options);
  for (const torch::Tensor& g : grads) {
    straight.mutable_grad() = g.clone();
    uninterrupted.step();
  }

  torch::Tensor first = Leaf(init);
  Muon before({first}, options);
  for (int i = 0; i < 2; ++i) {
    first.mutable_grad() = grads[i].clone();
    before.step();
  }
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive archive;
    before.save(archive);
    archive.save_to(bytes);
  }
  torch::Tensor resumed = Leaf(first.detach());
  Muon after({resumed}, options);
  torch::serialize::InputArchive archive;
  archive.load_from(bytes);
  after.load(archive);
  ASSERT_NE(after.StateOf(resumed), nullptr);
  EXPECT_EQ(after.StateOf(resumed)->step(), 2);
  resumed.mutable_grad() = grads[2].clone();
  after.step();
  EXPECT_TRUE(torch::equal(resumed, straight));
}

TEST(MuonTest, OptionsSurviveSerialization) {
  MuonOptions options = MuonOptions(0.7)
                            .momentum(0.8)
                            .nesterov(true)
                            .weight_decay(0.25)
                            .weight_decay_mode(MuonWeightDecayMode::kL2)
                            .coefficient_set(NsCoefficientSet::kCustom)
                            .custom_coefficients({{1, 2, 3}, {4, 5, 6}})
                            .ns_steps(9)
                            .precision(NsPrecision::kBf16)
                            .scale_mode(MuonScaleMode::kShapeScaling)
                            .extra_scale_factor(0.3);
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive archive;
    options.serialize(archive);
    archive.save_to(bytes);
  }
  torch::serialize::InputArchive archive;
  archive.load_from(bytes);
  MuonOptions loaded;
  loaded.serialize(archive);
  EXPECT_EQ(loaded.lr(), 0.7);
  EXPECT_EQ(loaded.momentum(), 0.8);
  EXPECT_TRUE(loaded.nesterov());
  EXPECT_EQ(loaded.weight_decay(), 0.25);
  EXPECT_EQ(loaded.weight_decay_mode(), MuonWeightDecayMode::kL2);
  EXPECT_EQ(loaded.coefficient_set(), NsCoefficientSet::kCustom);
  ASSERT_EQ(loaded.custom_coefficients().size(), 2u);
  EXPECT_EQ(loaded.custom_coefficients()[1].b, 5);
  EXPECT_EQ(loaded.ns_steps(), 9);
  EXPECT_EQ(loaded.precision(), NsPrecision::kBf16);
  EXPECT_EQ(loaded.scale_mode(), MuonScaleMode::kShapeScaling);
  EXPECT_EQ(loaded.extra_scale_factor(), 0.3);
}

// [E, m, n] expert matrices as one parameter stacked as `stacking` says
// (PEFT's target_parameters: A [E*m, n], B [m, n*E] with expert e in
// columns e, e+E, ...).
torch::Tensor Stacked(const torch::Tensor& experts, ExpertStacking stacking) {
  const int64_t e = experts.size(0);
  const int64_t m = experts.size(1);
  const int64_t n = experts.size(2);
  return stacking == ExpertStacking::kRows
             ? experts.reshape({e * m, n})
             : experts.permute({1, 2, 0}).reshape({m, n * e});
}

class MuonExpertTest : public ::testing::TestWithParam<ExpertStacking> {};

// Steps 1–3 are elementwise and each expert's matrix is orthogonalized in
// the same batched call as the same matrices given as plain parameters, so
// the results are equal bit for bit (fp64); orthogonalizing the
// concatenation instead is a different update.
TEST_P(MuonExpertTest, StepEqualsOneMatrixPerExpertNotTheConcatenation) {
  const ExpertStacking stacking = GetParam();
  constexpr int64_t kExperts = 3;
  // LoRA A experts [4, 16] stacked in rows, B experts [12, 4] in columns.
  const int64_t m = stacking == ExpertStacking::kRows ? 4 : 12;
  const int64_t n = stacking == ExpertStacking::kRows ? 16 : 4;
  const ParamLayout layout{stacking, kExperts};
  const MuonOptions options =
      MuonOptions(0.05).nesterov(true).weight_decay(0.1).extra_scale_factor(
          0.2);
  torch::manual_seed(31);
  const torch::Tensor init = torch::randn({kExperts, m, n}, torch::kFloat64);
  torch::Tensor stacked = Leaf(Stacked(init, stacking));
  torch::Tensor concatenated = Leaf(stacked);
  std::vector<torch::Tensor> singles;
  for (int64_t e = 0; e < kExperts; ++e) singles.push_back(Leaf(init[e]));
  Muon experts({stacked}, {layout}, options);
  Muon concatenation({concatenated}, options);
  Muon single(singles, options);
  EXPECT_EQ(experts.LayoutOf(stacked).matrices(), kExperts);
  EXPECT_EQ(concatenation.LayoutOf(concatenated).matrices(), 1);
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor grads = torch::randn({kExperts, m, n}, torch::kFloat64);
    stacked.mutable_grad() = Stacked(grads, stacking).clone();
    concatenated.mutable_grad() = Stacked(grads, stacking).clone();
    for (int64_t e = 0; e < kExperts; ++e) {
      singles[e].mutable_grad() = grads[e].clone();
    }
    experts.step();
    concatenation.step();
    single.step();
  }
  const torch::Tensor values = MatricesOf(stacked.detach(), layout);
  MuonParamState* state = experts.StateOf(stacked);
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->step(), 3);
  EXPECT_EQ(state->momentum_buffer().sizes(), stacked.sizes());
  const torch::Tensor momenta = MatricesOf(state->momentum_buffer(), layout);
  for (int64_t e = 0; e < kExperts; ++e) {
    EXPECT_TRUE(torch::equal(values[e], singles[e])) << "expert " << e;
    EXPECT_TRUE(
        torch::equal(momenta[e], single.StateOf(singles[e])->momentum_buffer()))
        << "expert " << e;
  }
  const torch::Tensor start = Stacked(init, stacking);
  EXPECT_GT(
      MaxRelativeDiff(stacked.detach() - start, concatenated.detach() - start),
      0.1);
}

// Each expert of a stacked parameter against the independent reference:
// the fixture case and its negation (Muon is odd in (p, g), exactly, since
// every Newton–Schulz step is) as two experts.
void ExpectExpertsMatchTheReference(ExpertStacking stacking,
                                    const torch::Device& device) {
  const OptimFixture& fixture = OptimFixture::Get();
  const ParamLayout layout{stacking, 2};
  auto pair = [](const torch::Tensor& t) { return torch::stack({t, -t}); };
  for (const std::string& name : OptimCaseNames("muon")) {
    const torch::Tensor initial = fixture.Tensor(name, "param");
    const torch::Tensor grads = fixture.Tensor(name, "grads");
    const torch::Tensor expected = fixture.Tensor(name, "expected");
    torch::Tensor param = Leaf(Stacked(pair(initial), stacking).to(device));
    Muon muon({param}, {layout}, MuonOptionsOfCase(OptimCase("muon", name)));
    for (int64_t step = 0; step < grads.size(0); ++step) {
      param.mutable_grad() = Stacked(pair(grads[step]), stacking).to(device);
      muon.step();
      const torch::Tensor experts = MatricesOf(param.detach().cpu(), layout);
      for (int64_t e = 0; e < 2; ++e) {
        const double sign = e == 0 ? 1.0 : -1.0;
        EXPECT_LE(MaxRelativeDiff(experts[e] - sign * initial,
                                  sign * (expected[step] - initial)),
                  2e-4)
            << name << " expert " << e << " step " << step + 1;
      }
    }
  }
}

TEST_P(MuonExpertTest, EachExpertMatchesTheIndependentReference) {
  ExpectExpertsMatchTheReference(GetParam(), torch::kCPU);
}

TEST_P(MuonExpertTest, EachExpertMatchesTheIndependentReferenceOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectExpertsMatchTheReference(GetParam(), torch::Device(torch::kCUDA, 0));
}

INSTANTIATE_TEST_SUITE_P(
    Stacking, MuonExpertTest,
    ::testing::Values(ExpertStacking::kRows, ExpertStacking::kColumns),
    [](const ::testing::TestParamInfo<ExpertStacking>& info) {
      return info.param == ExpertStacking::kRows ? "Rows" : "Columns";
    });

TEST(MuonTest, RejectsALayoutThatDoesNotFitItsParameter) {
  try {
    Muon muon({Leaf(torch::zeros({4, 8})), Leaf(torch::zeros({10, 8}))},
              {ParamLayout{}, ParamLayout{ExpertStacking::kRows, 3}});
    FAIL() << "3 experts in 10 rows were accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "parameter 1 holds 3 experts stacked in rows, but its shape "
                  "[10, 8] has 10 rows"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loraplex
