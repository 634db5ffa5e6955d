// SOAP against NVIDIA Emerging-Optimizers' own SOAP class: the steps of
// tools/golden/make_emerging_optim_golden.py, in float64 (the package's code
// with its float32 casts made float64) and in float32 (the package as
// shipped). Also its state: created eagerly, saved and loaded, zeroed like a
// fresh optimizer's, its options checked and non-matrices refused.
//
// Why the comparisons are built as they are: SOAP's update is not a
// continuous function of its input everywhere. At step 1, entries of
// Q_Lᵀ·g·Q_R that are zero in exact arithmetic come out as rounding noise x
// and Adam turns them into x/(|x| + eps): about 1e-8 of a step in float64,
// about a whole step in float32. And when a Kronecker factor is
// rank-deficient (LoRA A and B: R = gᵀg of a 4×24 gradient has rank 4), its
// eigenbasis on the null space is whatever the eigensolver's rounding makes
// it, and the next step's orthogonal iteration starts from that basis, so
// the trajectory after step 1 depends on rounding at the size of a step
// (measured: a one-ulp change of the gradients moves the reference's own
// float64 LoRA trajectories by as much as their steps). So:
// - every step of every case starts from the reference's own state after the
//   previous step (stored in the fixture) and must land on its parameter and
//   state. That is well posed: the tolerance is the step's own sensitivity
//   to rounding, measured in the test by rerunning it with its gradient and
//   incoming state moved by 64 ulps;
// - cases whose factors are full rank from step 1 (square matrices) also
//   run free for all their steps from the start, to the same kind of bound;
// - float32 runs, whose first step is rounding noise amplified to a step,
//   are checked for what can be checked: the state is float32, and the run
//   is no farther from the float64 one than the package's float32 run is.
#include "core/optim/soap.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/common/emerging_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

SoapOptions OptionsOf(const nlohmann::json& c) {
  return SoapOptions(c["lr"].get<double>())
      .beta1(c["betas"][0].get<double>())
      .beta2(c["betas"][1].get<double>())
      .shampoo_beta(c["shampoo_beta"].get<double>())
      .eps(c["eps"].get<double>())
      .weight_decay(c["weight_decay"].get<double>())
      .nesterov(c["nesterov"].get<bool>())
      .correct_bias(c["correct_bias"].get<bool>())
      .correct_shampoo_beta_bias(c["correct_bias"].get<bool>())
      .use_eigh(c["use_eigh"].get<bool>())
      .power_iter_steps(c["power_iter_steps"].get<int64_t>())
      .max_update_rms(c["max_update_rms"].get<double>());
}

// `values` with every element moved by `ulps` units in the last place
// (signs from `seed`): the size of rounding a reordered computation of the
// same operations makes.
torch::Tensor Perturbed(const torch::Tensor& values, double ulps,
                        uint64_t seed) {
  torch::manual_seed(seed);
  const double unit = std::ldexp(1.0, -52);
  const torch::Tensor signs =
      torch::randint(0, 2, values.sizes(), values.options()) * 2 - 1;
  return values * (1.0 + ulps * unit * signs);
}

// Ulps of the perturbation the noise floor is measured with. The rounding
// of the dozen gemms, the eigensolver and the QR between the gradient and
// the update amounts to a few ulps of their inputs. Measured: a Python
// transliteration of Soap::step (the same ATen calls, not the reference's
// own) differed from the reference by up to 0.64 of a 16-ulp floor, and
// this Soap by up to 0.17 of the 64-ulp one (the test prints it); 64 ulps
// keeps the floor far below a step (checked below).
constexpr double kFloorUlps = 64.0;

struct StepResult {
  torch::Tensor param;
  torch::Tensor momentum;  // Q_L·exp_avg·Q_Rᵀ: free of eigenvector signs.
  torch::Tensor exp_avg_sq;
  torch::Tensor kronecker_left;
  torch::Tensor kronecker_right;
};

StepResult ResultOf(const torch::Tensor& param, SoapParamState& state) {
  return {param.detach().clone(),
          at::matmul(at::matmul(state.eigenbasis_left(), state.exp_avg()),
                     state.eigenbasis_right().t()),
          state.exp_avg_sq().clone(), state.kronecker_left().clone(),
          state.kronecker_right().clone()};
}

// Step `step` (0-based) of case `c` from the reference's parameter and
// state after the step before; with `ulps` > 0, the gradient and that state
// moved by that many ulps (what measures the step's noise floor).
StepResult StepFromReference(const EmergingFixture& fixture,
                             const nlohmann::json& c, int64_t step,
                             double ulps = 0.0) {
  const std::string name = c["name"];
  uint64_t seed = 48;
  const auto input = [&](const std::string& field, int64_t index) {
    torch::Tensor value = fixture.Tensor(name, field)[index].clone();
    return ulps > 0.0 ? Perturbed(value, ulps, seed++) : value;
  };
  torch::Tensor param =
      (step == 0 ? fixture.Tensor(name, "param")
                 : fixture.Tensor(name, "expected")[step - 1].clone())
          .set_requires_grad(true);
  Soap soap({param}, OptionsOf(c));
  soap.InitState();
  SoapParamState& state = *soap.StateOf(param);
  if (step > 0) {
    state.step(step);
    state.exp_avg().copy_(input("exp_avg", step - 1));
    state.exp_avg_sq().copy_(input("exp_avg_sq", step - 1));
    state.kronecker_left().copy_(input("kronecker_left", step - 1));
    state.kronecker_right().copy_(input("kronecker_right", step - 1));
    state.eigenbasis_left().copy_(input("eigenbasis_left", step - 1));
    state.eigenbasis_right().copy_(input("eigenbasis_right", step - 1));
  }
  param.mutable_grad() = input("grads", step);
  soap.step();
  return ResultOf(param, state);
}

StepResult ReferenceAfter(const EmergingFixture& fixture,
                          const std::string& name, int64_t step) {
  const auto at = [&](const std::string& field) {
    return fixture.Tensor(name, field)[step].clone();
  };
  return {at("expected"),
          at::matmul(at::matmul(at("eigenbasis_left"), at("exp_avg")),
                     at("eigenbasis_right").t()),
          at("exp_avg_sq"), at("kronecker_left"), at("kronecker_right")};
}

std::array<double, 5> Distances(const StepResult& a, const StepResult& b) {
  return {EmergingDistance(a.param, b.param),
          EmergingDistance(a.momentum, b.momentum),
          EmergingDistance(a.exp_avg_sq, b.exp_avg_sq),
          EmergingDistance(a.kronecker_left, b.kronecker_left),
          EmergingDistance(a.kronecker_right, b.kronecker_right)};
}

constexpr std::array<const char*, 5> kFields = {
    "param", "momentum", "exp_avg_sq", "kronecker_left", "kronecker_right"};

TEST(SoapTest, FixtureLoads) {
  const EmergingFixture& fixture = EmergingFixture::Get();
  ASSERT_TRUE(fixture.loaded());
  ASSERT_TRUE(fixture.cases().contains("soap"));
  EXPECT_GE(fixture.cases()["soap"].size(), 9u);
  for (const nlohmann::json& c : fixture.cases()["soap"]) {
    EXPECT_GE(c["steps"].get<int64_t>(), 6) << c["name"];
  }
}

// Every step of every case from the reference's state before it lands on
// the reference's parameter and state, within the step's own sensitivity
// to rounding (the same step with its gradient and incoming state moved by
// kFloorUlps ulps).
// That floor is also checked to be far below a step, so the test can tell
// a wrong formula (a bias correction, a beta, a projection) from rounding.
TEST(SoapTest, EachStepFromTheReferenceStateEqualsIt) {
  const EmergingFixture& fixture = EmergingFixture::Get();
  ASSERT_TRUE(fixture.loaded());
  double worst_error = 0.0, worst_floor = 0.0;  // Of tolerance, of a step.
  for (const nlohmann::json& c : fixture.cases()["soap"]) {
    const std::string name = c["name"];
    const torch::Tensor grads = fixture.Tensor(name, "grads");
    const torch::Tensor expected = fixture.Tensor(name, "expected");
    ASSERT_EQ(grads.scalar_type(), torch::kFloat64);
    for (int64_t step = 0; step < grads.size(0); ++step) {
      SCOPED_TRACE(name + " step " + std::to_string(step + 1));
      const StepResult ours = StepFromReference(fixture, c, step);
      const StepResult floor_run =
          StepFromReference(fixture, c, step, kFloorUlps);
      const StepResult reference = ReferenceAfter(fixture, name, step);
      const std::array<double, 5> error = Distances(ours, reference);
      const std::array<double, 5> floor = Distances(floor_run, ours);
      const torch::Tensor before =
          step == 0 ? fixture.Tensor(name, "param") : expected[step - 1];
      const double step_size = EmergingDistance(expected[step], before);
      // The floor is at least 4 ulps of the compared values: the state
      // fields are a few roundings from their inputs, which a perturbation
      // can leave unmoved.
      constexpr double kUlp = 0x1p-52;
      // Measured at most 7e-6 of a step (at step 1, the amplified noise);
      // a wrong formula moves a parameter by a good fraction of a step.
      EXPECT_LE(floor[0], 1e-4 * step_size) << "noise floor not below a step";
      worst_floor = std::max(worst_floor, floor[0] / step_size);
      for (size_t f = 0; f < kFields.size(); ++f) {
        const double tolerance = std::max(floor[f], 4 * kUlp);
        worst_error = std::max(worst_error, error[f] / tolerance);
        EXPECT_LE(error[f], tolerance)
            << kFields[f] << " (noise floor " << floor[f] << ")";
      }
    }
  }
  std::cout << "largest error / tolerance " << worst_error
            << ", largest parameter noise floor / step " << worst_floor << "\n";
}

// Cases with square gradients have full-rank factors from step 1: their
// whole trajectory is well posed and runs free from the start.
TEST(SoapTest, FullRankTrajectoriesEqualTheReference) {
  const EmergingFixture& fixture = EmergingFixture::Get();
  ASSERT_TRUE(fixture.loaded());
  int checked = 0;
  double worst_error = 0.0;  // Of the tolerance.
  for (const nlohmann::json& c : fixture.cases()["soap"]) {
    if (c["shape"][0] != c["shape"][1]) continue;
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    ++checked;
    const torch::Tensor grads = fixture.Tensor(name, "grads");
    const torch::Tensor expected = fixture.Tensor(name, "expected");
    torch::Tensor param = fixture.Tensor(name, "param").set_requires_grad(true);
    torch::Tensor shadow = param.detach().clone().set_requires_grad(true);
    Soap soap({param}, OptionsOf(c));
    Soap shadow_soap({shadow}, OptionsOf(c));
    for (int64_t step = 0; step < grads.size(0); ++step) {
      param.mutable_grad() = grads[step].clone();
      shadow.mutable_grad() = Perturbed(grads[step], kFloorUlps, 48 + step);
      soap.step();
      shadow_soap.step();
      const double floor = EmergingDistance(shadow.detach(), param.detach());
      const double error = EmergingDistance(param.detach(), expected[step]);
      worst_error = std::max(worst_error, error / std::max(floor, 4 * 0x1p-52));
      EXPECT_LE(error, std::max(floor, 4 * 0x1p-52))
          << "step " << step + 1 << " (noise floor " << floor << ")";
    }
    EXPECT_EQ(soap.StateOf(param)->step(), grads.size(0));
  }
  EXPECT_GE(checked, 2);
  std::cout << "largest error / tolerance " << worst_error << "\n";
}

// A float32 parameter keeps float32 state and runs the package's float32
// arithmetic. Its trajectory is rounding noise amplified to about a step
// (see the top of the file), so it cannot be compared element by element
// with the package's float32 run on another build; what is checked is that
// it is no farther from the exact (float64) trajectory than the package's
// own float32 run is, to a factor of 2 for the luck of the noise. A float32
// path that lost accuracy (half-precision state, a missing cast, a wrong
// eps) lands far outside.
TEST(SoapTest, Float32RunsAreAsCloseToFloat64AsTheReferencesFloat32Run) {
  const EmergingFixture& fixture = EmergingFixture::Get();
  ASSERT_TRUE(fixture.loaded());
  for (const nlohmann::json& c : fixture.cases()["soap"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const torch::Tensor grads =
        fixture.Tensor(name, "grads").to(torch::kFloat32);
    const torch::Tensor expected = fixture.Tensor(name, "expected");
    const torch::Tensor reference32 = fixture.Tensor(name, "expected_fp32");
    ASSERT_EQ(reference32.scalar_type(), torch::kFloat32);
    torch::Tensor param = fixture.Tensor(name, "param")
                              .to(torch::kFloat32)
                              .set_requires_grad(true);
    Soap soap({param}, OptionsOf(c));
    double ours = 0.0, theirs = 0.0;
    bool same = true;
    for (int64_t step = 0; step < grads.size(0); ++step) {
      param.mutable_grad() = grads[step].clone();
      soap.step();
      ours = std::max(ours, EmergingDistance(param.detach().to(torch::kFloat64),
                                             expected[step]));
      theirs = std::max(theirs,
                        EmergingDistance(reference32[step].to(torch::kFloat64),
                                         expected[step]));
      same = same && torch::equal(param.detach(), reference32[step]);
    }
    EXPECT_EQ(soap.StateOf(param)->exp_avg().scalar_type(), torch::kFloat32);
    EXPECT_EQ(soap.StateOf(param)->eigenbasis_left().scalar_type(),
              torch::kFloat32);
    EXPECT_LE(ours, 2 * theirs) << "reference float32 error " << theirs;
    std::cout << name << ": float32 error " << ours << ", reference's "
              << theirs << (same ? ", bit for bit the reference's" : "")
              << "\n";
  }
}

TEST(SoapTest, LowerPrecisionParametersKeepFloat32State) {
  torch::Tensor param =
      torch::randn({4, 6}).to(torch::kBFloat16).set_requires_grad(true);
  Soap soap({param}, SoapOptions(1e-3));
  param.mutable_grad() = torch::randn({4, 6}).to(torch::kBFloat16);
  soap.step();
  SoapParamState* state = soap.StateOf(param);
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->exp_avg().scalar_type(), torch::kFloat32);
  EXPECT_EQ(state->kronecker_right().scalar_type(), torch::kFloat32);
  EXPECT_EQ(param.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::isfinite(param).all().item<bool>());
}

// Eager state; a save and load continues bit for bit; ZeroState makes it
// a fresh optimizer (what retiring a slot needs).
TEST(SoapTest, StateIsEagerSavedLoadedAndZeroed) {
  torch::manual_seed(3);
  const torch::Tensor start = torch::randn({6, 5}, torch::kFloat64);
  const torch::Tensor g1 = torch::randn({6, 5}, torch::kFloat64);
  const torch::Tensor g2 = torch::randn({6, 5}, torch::kFloat64);
  const SoapOptions options =
      SoapOptions(1e-2).beta1(0.8).beta2(0.9).shampoo_beta(0.9).weight_decay(
          0.1);

  torch::Tensor a = start.clone().set_requires_grad(true);
  Soap first({a}, options);
  EXPECT_EQ(first.StateOf(a), nullptr);
  first.InitState();
  ASSERT_NE(first.StateOf(a), nullptr);
  EXPECT_EQ(first.StateOf(a)->exp_avg().abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(torch::equal(first.StateOf(a)->eigenbasis_right(),
                           torch::eye(5, torch::kFloat64)));
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

  torch::Tensor b = start.clone().set_requires_grad(true);
  Soap second({b}, options);
  b.mutable_grad() = g1.clone();
  second.step();  // b as a after its first step; the state comes from `saved`.
  Soap third({b}, SoapOptions(0.5));
  torch::serialize::InputArchive archive;
  archive.load_from(saved);
  third.load(archive);
  EXPECT_EQ(third.param_groups()[0].options().get_lr(), 1e-2);
  EXPECT_EQ(third.StateOf(b)->step(), 1);
  b.mutable_grad() = g2.clone();
  third.step();
  EXPECT_TRUE(torch::equal(a.detach(), b.detach()));

  // Zeroed: the next step equals a fresh optimizer's first.
  third.ZeroState();
  SoapParamState& state = *third.StateOf(b);
  EXPECT_EQ(state.step(), 0);
  EXPECT_EQ(state.kronecker_left().abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(
      torch::equal(state.eigenbasis_left(), torch::eye(6, torch::kFloat64)));
  torch::Tensor fresh = b.detach().clone().set_requires_grad(true);
  Soap reference({fresh}, options);
  b.mutable_grad() = g1.clone();
  fresh.mutable_grad() = g1.clone();
  third.step();
  reference.step();
  EXPECT_TRUE(torch::equal(b.detach(), fresh.detach()));
}

// An archive whose options are not valid is refused and leaves the
// optimizer's options as they were.
TEST(SoapTest, LoadKeepsOptionsOfABadArchive) {
  torch::Tensor p = torch::zeros({3, 2}, torch::kFloat64);
  Soap bad({p}, SoapOptions(1e-2));
  static_cast<SoapOptions&>(bad.param_groups()[0].options()).beta1(1.5);
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    bad.save(archive);
    archive.save_to(saved);
  }
  Soap target({p}, SoapOptions(3e-3));
  torch::serialize::InputArchive archive;
  archive.load_from(saved);
  try {
    target.load(archive);
    ADD_FAILURE() << "a bad archive loaded";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("beta1 must be in [0, 1), got 1.5"));
  }
  const auto& options =
      static_cast<const SoapOptions&>(target.param_groups()[0].options());
  EXPECT_EQ(options.lr(), 3e-3);
  EXPECT_EQ(options.beta1(), 0.9);
}

TEST(SoapTest, OptionsAreChecked) {
  EXPECT_EQ(SoapOptionsError(SoapOptions(1e-4)), "");
  EXPECT_THAT(SoapOptionsError(SoapOptions(-1)), HasSubstr("lr must be"));
  EXPECT_THAT(SoapOptionsError(SoapOptions(1e-4).beta1(1.0)),
              HasSubstr("beta1 must be in [0, 1), got 1"));
  EXPECT_THAT(SoapOptionsError(SoapOptions(1e-4).beta2(-0.1)),
              HasSubstr("beta2 must be in [0, 1)"));
  EXPECT_THAT(SoapOptionsError(SoapOptions(1e-4).shampoo_beta(1.0)),
              HasSubstr("shampoo_beta must be in [0, 1)"));
  EXPECT_THAT(SoapOptionsError(SoapOptions(1e-4).eps(-1e-8)),
              HasSubstr("eps must be >= 0"));
  EXPECT_THAT(SoapOptionsError(SoapOptions(1e-4).weight_decay(-1)),
              HasSubstr("weight_decay must be >= 0"));
  EXPECT_THAT(SoapOptionsError(SoapOptions(1e-4).power_iter_steps(-1)),
              HasSubstr("power_iter_steps must be >= 0, got -1"));
  EXPECT_THAT(SoapOptionsError(SoapOptions(1e-4).max_update_rms(-0.5)),
              HasSubstr("max_update_rms must be >= 0"));
  EXPECT_THAT(SoapOptionsError(SoapOptions(std::nan(""))),
              HasSubstr("lr must be"));
  torch::Tensor p = torch::zeros({2, 2}, torch::kFloat64);
  EXPECT_THROW(Soap({p}, SoapOptions(1e-4).beta1(2)), c10::Error);
}

TEST(SoapTest, OnlyMatricesAreTaken) {
  for (const auto& shape : std::vector<std::vector<int64_t>>{{4}, {2, 3, 4}}) {
    torch::Tensor p = torch::zeros(shape);
    try {
      Soap soap({torch::zeros({2, 2}), p});
      ADD_FAILURE() << "took a " << p.dim() << "-D parameter";
    } catch (const c10::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("parameter 1: SOAP takes 2-D "
                                      "parameters only"));
    }
  }
}

// Random float64 leaf of `shape` and `steps` gradients for it.
struct RandomCase {
  torch::Tensor param;
  std::vector<torch::Tensor> grads;
};

RandomCase MakeRandomCase(std::vector<int64_t> shape, int steps,
                          uint64_t seed) {
  torch::manual_seed(seed);
  RandomCase c;
  c.param = torch::randn(shape, torch::kFloat64).set_requires_grad(true);
  for (int i = 0; i < steps; ++i) {
    c.grads.push_back(torch::randn(shape, torch::kFloat64));
  }
  return c;
}

double MaxDifference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// A parameter stacking 3 experts' matrices (in rows, or in columns with the
// expert index fastest) is stepped as 3 separate SOAP matrices: equal to
// three optimizers on the experts' own matrices, and unlike SOAP on the
// concatenation. Square 4×4 experts with both sides preconditioned, and
// 4×8 experts whose 8-long side is not ([E, 0, 0] state): full-rank
// factors from step 1, so the runs are well posed (see the top of the
// file).
TEST(SoapTest, ExpertMatricesAreEachTheirOwnMatrix) {
  constexpr int64_t kExperts = 3;
  for (const auto& [stacking, cols, limit] :
       std::vector<std::tuple<ExpertStacking, int64_t, int64_t>>{
           {ExpertStacking::kRows, 4, 0},
           {ExpertStacking::kColumns, 4, 0},
           {ExpertStacking::kRows, 8, 4},
           {ExpertStacking::kColumns, 8, 4}}) {
    SCOPED_TRACE(absl::StrCat(
        stacking == ExpertStacking::kRows ? "rows" : "columns", " 4x", cols));
    const ParamLayout layout{stacking, kExperts};
    const std::vector<int64_t> shape =
        stacking == ExpertStacking::kRows
            ? std::vector<int64_t>{4 * kExperts, cols}
            : std::vector<int64_t>{4, cols * kExperts};
    RandomCase stacked = MakeRandomCase(shape, 4, 21);
    torch::Tensor whole =
        stacked.param.detach().clone().set_requires_grad(true);
    std::vector<torch::Tensor> experts;
    for (int64_t e = 0; e < kExperts; ++e) {
      experts.push_back(MatricesOf(stacked.param.detach(), layout)[e]
                            .clone()
                            .set_requires_grad(true));
    }
    const SoapOptions options =
        SoapOptions(1e-2).weight_decay(0.1).max_precond_dim(limit);
    Soap soap({stacked.param}, {layout}, options);
    Soap concatenation({whole}, options);
    Soap separate(experts, options);
    for (const torch::Tensor& grad : stacked.grads) {
      stacked.param.mutable_grad() = grad.clone();
      whole.mutable_grad() = grad.clone();
      for (int64_t e = 0; e < kExperts; ++e) {
        experts[e].mutable_grad() = MatricesOf(grad, layout)[e].clone();
      }
      soap.step();
      concatenation.step();
      separate.step();
    }
    const torch::Tensor result = MatricesOf(stacked.param.detach(), layout);
    for (int64_t e = 0; e < kExperts; ++e) {
      EXPECT_LE(MaxDifference(result[e], experts[e].detach()), 1e-12)
          << "expert " << e;
    }
    EXPECT_GT(MaxDifference(stacked.param.detach(), whole.detach()), 1e-4);
    EXPECT_EQ(soap.StateOf(stacked.param)->kronecker_left().sizes(),
              torch::IntArrayRef({kExperts, 4, 4}));
    const int64_t right = limit > 0 ? 0 : cols;
    EXPECT_EQ(soap.StateOf(stacked.param)->kronecker_right().sizes(),
              torch::IntArrayRef({kExperts, right, right}));
    // Retired: every expert's bases back to the identity.
    soap.ZeroState();
    SoapParamState& state = *soap.StateOf(stacked.param);
    for (int64_t e = 0; e < kExperts; ++e) {
      EXPECT_TRUE(torch::equal(state.eigenbasis_left()[e],
                               torch::eye(4, torch::kFloat64)));
      EXPECT_TRUE(torch::equal(state.eigenbasis_right()[e],
                               torch::eye(right, torch::kFloat64)));
    }
  }
}

// With precondition_frequency 3 the bases are refreshed at steps 1, 4, 7,
// ...: unchanged by steps 2 and 3 while the factors keep accumulating.
TEST(SoapTest, PreconditionFrequencyRefreshesEveryNthStep) {
  RandomCase c = MakeRandomCase({6, 6}, 5, 7);
  Soap soap({c.param}, SoapOptions(1e-2).precondition_frequency(3));
  std::vector<torch::Tensor> bases;
  std::vector<torch::Tensor> factors;
  for (const torch::Tensor& grad : c.grads) {
    c.param.mutable_grad() = grad.clone();
    soap.step();
    bases.push_back(soap.StateOf(c.param)->eigenbasis_left().clone());
    factors.push_back(soap.StateOf(c.param)->kronecker_left().clone());
  }
  EXPECT_FALSE(torch::equal(bases[0], torch::eye(6, torch::kFloat64)));
  EXPECT_TRUE(torch::equal(bases[1], bases[0]));
  EXPECT_TRUE(torch::equal(bases[2], bases[0]));
  EXPECT_FALSE(torch::equal(bases[3], bases[2]));  // Step 4 refreshes.
  EXPECT_TRUE(torch::equal(bases[4], bases[3]));
  for (size_t i = 1; i < factors.size(); ++i) {
    EXPECT_FALSE(torch::equal(factors[i], factors[i - 1])) << "step " << i + 1;
  }
}

// A side longer than max_precond_dim keeps no factor and no basis (0×0)
// and its projections are the identity. With both sides beyond it, SOAP is
// Adam with decoupled weight decay: equal to LibTorch's own AdamW.
TEST(SoapTest, SidesLongerThanMaxPrecondDimAreNotPreconditioned) {
  RandomCase one_sided = MakeRandomCase({4, 24}, 3, 3);
  Soap soap({one_sided.param}, SoapOptions(1e-2).max_precond_dim(8));
  soap.InitState();
  SoapParamState& state = *soap.StateOf(one_sided.param);
  EXPECT_EQ(state.kronecker_left().sizes(), torch::IntArrayRef({4, 4}));
  EXPECT_EQ(state.kronecker_right().sizes(), torch::IntArrayRef({0, 0}));
  EXPECT_EQ(state.eigenbasis_right().sizes(), torch::IntArrayRef({0, 0}));
  for (const torch::Tensor& grad : one_sided.grads) {
    one_sided.param.mutable_grad() = grad.clone();
    soap.step();
  }
  EXPECT_FALSE(
      torch::equal(state.eigenbasis_left(), torch::eye(4, torch::kFloat64)));
  EXPECT_TRUE(torch::isfinite(one_sided.param).all().item<bool>());

  const double lr = 1e-2;
  const double weight_decay = 0.1;
  RandomCase c = MakeRandomCase({5, 7}, 4, 5);
  torch::Tensor adam_param = c.param.detach().clone().set_requires_grad(true);
  Soap diagonal({c.param}, SoapOptions(lr)
                               .beta1(0.9)
                               .beta2(0.95)
                               .eps(1e-8)
                               .weight_decay(weight_decay)
                               .max_precond_dim(4));
  torch::optim::AdamW adamw({adam_param}, torch::optim::AdamWOptions(lr)
                                              .betas({0.9, 0.95})
                                              .eps(1e-8)
                                              .weight_decay(weight_decay));
  for (const torch::Tensor& grad : c.grads) {
    c.param.mutable_grad() = grad.clone();
    adam_param.mutable_grad() = grad.clone();
    diagonal.step();
    adamw.step();
    EXPECT_LE(MaxDifference(c.param.detach(), adam_param.detach()), 1e-14);
  }
  EXPECT_EQ(diagonal.StateOf(c.param)->kronecker_left().numel(), 0);
}

}  // namespace
}  // namespace loraplex
