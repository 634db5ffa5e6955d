// Newton–Schulz orthogonalization against the independent golden script,
// closed-form singular-value maps, and batched vs one-by-one.
#include "core/optim/newton_schulz.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "tests/common/optim_fixture.h"

namespace loraplex {
namespace {

NewtonSchulzOptions Options(NsCoefficientSet set, int steps) {
  NewtonSchulzOptions options;
  options.coefficient_set = set;
  options.steps = steps;
  return options;
}

// A random m×n matrix with the given singular values (min(m, n) of them).
torch::Tensor MatrixWithSingularValues(int64_t m, int64_t n,
                                       const std::vector<double>& sigma,
                                       uint64_t seed) {
  torch::manual_seed(seed);
  const int64_t k = std::min(m, n);
  torch::Tensor u = std::get<0>(
      at::linalg_qr(torch::randn({m, k}, torch::kFloat64), "reduced"));
  torch::Tensor v = std::get<0>(
      at::linalg_qr(torch::randn({n, k}, torch::kFloat64), "reduced"));
  torch::Tensor s = torch::tensor(sigma, torch::kFloat64);
  return (u * s).matmul(v.t()).to(torch::kFloat32);
}

TEST(OptimFixtureTest, FixtureFilesLoaded) {
  EXPECT_TRUE(OptimFixture::Get().Complete())
      << "tests/fixtures/golden/optim is missing or broken";
}

class NewtonSchulzGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NewtonSchulzGoldenTest, MatchesIndependentReference) {
  const auto& c = OptimCase("newton_schulz", GetParam());
  const auto set =
      ParseNsCoefficientSet(c.at("coefficient_set").get<std::string>());
  ASSERT_TRUE(set.has_value());
  const OptimFixture& fixture = OptimFixture::Get();
  torch::Tensor output =
      NewtonSchulz(fixture.Tensor(GetParam(), "input"),
                   Options(*set, c.at("ns_steps").get<int>()));
  torch::Tensor expected = fixture.Tensor(GetParam(), "output");
  ASSERT_EQ(output.sizes(), expected.sizes());
  EXPECT_LE(MaxRelativeDiff(output, expected), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Fixture, NewtonSchulzGoldenTest,
                         ::testing::ValuesIn(OptimCaseNames("newton_schulz")));

// Each singular value follows σ ← aσ + bσ³ + cσ⁵ after normalisation by the
// Frobenius norm, so the expected spectrum is a scalar computation.
TEST(NewtonSchulzTest, SingularValuesFollowTheScalarPolynomial) {
  const std::vector<double> sigma = {3.0, 2.0, 1.0, 0.5, 0.1, 0.02};
  torch::Tensor x = MatrixWithSingularValues(6, 20, sigma, 7);
  double frobenius = 0;
  for (double s : sigma) frobenius += s * s;
  frobenius = std::sqrt(frobenius);

  for (NsCoefficientSet set :
       {NsCoefficientSet::kSimple, NsCoefficientSet::kQuintic,
        NsCoefficientSet::kPolarExpress, NsCoefficientSet::kAol}) {
    const NewtonSchulzOptions options = Options(set, 7);
    torch::Tensor got =
        at::linalg_svdvals(NewtonSchulz(x, options).to(torch::kFloat64));
    std::vector<double> expected;
    for (double s : sigma) {
      double y = s / frobenius;
      for (int step = 0; step < options.steps; ++step) {
        const NsCoefficients k = NsCoefficientsForStep(options, step);
        y = k.a * y + k.b * y * y * y + k.c * y * y * y * y * y;
      }
      // A negative value is a singular value |y| with a flipped vector.
      expected.push_back(std::abs(y));
    }
    std::sort(expected.rbegin(), expected.rend());
    for (size_t i = 0; i < sigma.size(); ++i) {
      EXPECT_NEAR(got[i].item<double>(), expected[i], 2e-4)
          << NsCoefficientSetName(set) << " singular value " << i;
    }
  }
}

TEST(NewtonSchulzTest, QuinticMovesSpreadSpectrumIntoBandAroundOne) {
  // Condition number 100: every direction ends near 1 after five steps.
  std::vector<double> sigma;
  for (int i = 0; i < 16; ++i) sigma.push_back(std::pow(10.0, -2.0 * i / 15));
  torch::Tensor x = MatrixWithSingularValues(16, 48, sigma, 11);
  torch::Tensor s = at::linalg_svdvals(
      NewtonSchulz(x, Options(NsCoefficientSet::kQuintic, 5)));
  EXPECT_GT(s.min().item<double>(), 0.6);
  EXPECT_LT(s.max().item<double>(), 1.2);
}

TEST(NewtonSchulzTest, ZeroMatrixGivesZeros) {
  for (NsCoefficientSet set :
       {NsCoefficientSet::kSimple, NsCoefficientSet::kPolarExpress}) {
    torch::Tensor out = NewtonSchulz(torch::zeros({5, 9}), Options(set, 5));
    EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
    EXPECT_EQ(out.abs().max().item<float>(), 0.0f);
  }
}

TEST(NewtonSchulzTest, TallInputIsTheTransposeOfItsWideForm) {
  torch::manual_seed(3);
  torch::Tensor x = torch::randn({30, 7});
  const NewtonSchulzOptions options = Options(NsCoefficientSet::kQuintic, 5);
  EXPECT_TRUE(torch::allclose(NewtonSchulz(x, options),
                              NewtonSchulz(x.t().contiguous(), options).t(),
                              1e-6, 1e-6));
}

TEST(NewtonSchulzTest, BatchedEqualsOneByOne) {
  torch::manual_seed(5);
  // Very different norms per matrix: each must be normalised on its own.
  torch::Tensor batch =
      torch::randn({16, 8, 64}) * torch::logspace(-3, 3, 16).view({16, 1, 1});
  for (NsCoefficientSet set :
       {NsCoefficientSet::kQuintic, NsCoefficientSet::kPolarExpress}) {
    const NewtonSchulzOptions options = Options(set, 5);
    torch::Tensor batched = NewtonSchulz(batch, options);
    for (int64_t i = 0; i < batch.size(0); ++i) {
      torch::Tensor single = NewtonSchulz(batch[i], options);
      EXPECT_LE(MaxRelativeDiff(batched[i], single), 1e-5)
          << NsCoefficientSetName(set) << " matrix " << i;
    }
  }
  // Large matrices are processed a few at a time on the CPU (to stay in
  // cache): 50 KiB each gives chunks of 2, 2 and 1.
  torch::Tensor large = torch::randn({5, 16, 800});
  torch::Tensor chunked =
      NewtonSchulz(large, Options(NsCoefficientSet::kQuintic, 5));
  for (int64_t i = 0; i < large.size(0); ++i) {
    EXPECT_LE(
        MaxRelativeDiff(
            chunked[i],
            NewtonSchulz(large[i], Options(NsCoefficientSet::kQuintic, 5))),
        1e-5)
        << "large matrix " << i;
  }
  // Tall matrices are transposed as a batch too.
  torch::Tensor tall = torch::randn({4, 40, 6});
  torch::Tensor batched =
      NewtonSchulz(tall, Options(NsCoefficientSet::kAol, 4));
  for (int64_t i = 0; i < tall.size(0); ++i) {
    EXPECT_LE(MaxRelativeDiff(
                  batched[i],
                  NewtonSchulz(tall[i], Options(NsCoefficientSet::kAol, 4))),
              1e-5);
  }
}

TEST(NewtonSchulzTest, Bf16LoopStaysCloseToFp32) {
  torch::manual_seed(9);
  torch::Tensor x = torch::randn({16, 128});
  NewtonSchulzOptions fp32 = Options(NsCoefficientSet::kQuintic, 5);
  NewtonSchulzOptions bf16 = fp32;
  bf16.precision = NsPrecision::kBf16;
  torch::Tensor a = NewtonSchulz(x, fp32);
  torch::Tensor b = NewtonSchulz(x, bf16);
  EXPECT_EQ(b.scalar_type(), torch::kFloat32);
  const double diff = MaxRelativeDiff(b, a);
  EXPECT_GT(diff, 0.0) << "the bf16 loop should not be bit-identical to fp32";
  EXPECT_LT(diff, 0.05);
}

TEST(NewtonSchulzTest, CoefficientScheduleCyclesOrRepeats) {
  NewtonSchulzOptions quintic = Options(NsCoefficientSet::kQuintic, 12);
  EXPECT_DOUBLE_EQ(NsCoefficientsForStep(quintic, 0).a, 4.0848);
  EXPECT_DOUBLE_EQ(NsCoefficientsForStep(quintic, 5).a, 4.0848);
  EXPECT_DOUBLE_EQ(NsCoefficientsForStep(quintic, 9).a, 2.8366);

  NewtonSchulzOptions polar = Options(NsCoefficientSet::kPolarExpress, 12);
  EXPECT_DOUBLE_EQ(NsCoefficientsForStep(polar, 0).a, 8.2051);
  EXPECT_DOUBLE_EQ(NsCoefficientsForStep(polar, 7).a, 1.8750);
  EXPECT_DOUBLE_EQ(NsCoefficientsForStep(polar, 11).a, 1.8750);

  NewtonSchulzOptions aol = Options(NsCoefficientSet::kAol, 12);
  EXPECT_DOUBLE_EQ(NsCoefficientsForStep(aol, 4).b, -7.0585);

  NewtonSchulzOptions custom = Options(NsCoefficientSet::kCustom, 3);
  custom.custom_coefficients = {{1, 2, 3}, {4, 5, 6}};
  EXPECT_DOUBLE_EQ(NsCoefficientsForStep(custom, 2).c, 3);
  EXPECT_DOUBLE_EQ(NsCoefficientsForStep(custom, 3).c, 6);
}

TEST(NewtonSchulzTest, RejectsBadOptionsAndInputs) {
  NewtonSchulzOptions zero_steps = Options(NsCoefficientSet::kQuintic, 0);
  EXPECT_EQ(NewtonSchulzOptionsError(zero_steps),
            "ns_steps must be >= 1, got 0");
  EXPECT_THROW(NewtonSchulz(torch::ones({2, 2}), zero_steps), c10::Error);

  NewtonSchulzOptions empty_custom = Options(NsCoefficientSet::kCustom, 5);
  EXPECT_EQ(NewtonSchulzOptionsError(empty_custom),
            "coefficient_set is custom but custom_coefficients is empty");

  EXPECT_THROW(
      NewtonSchulz(torch::ones({4}), Options(NsCoefficientSet::kQuintic, 5)),
      c10::Error);
  EXPECT_FALSE(ParseNsCoefficientSet("cubic").has_value());
  EXPECT_EQ(ParseNsCoefficientSet("polar_express"),
            NsCoefficientSet::kPolarExpress);
}

}  // namespace
}  // namespace loraplex
