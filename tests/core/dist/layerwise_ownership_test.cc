#include "core/dist/layerwise_ownership.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace loraplex {
namespace {

using ::testing::HasSubstr;

// The smallest possible heaviest load, by trying every assignment.
int64_t OptimalMaxLoad(const std::vector<OwnedParam>& params, int world) {
  const size_t n = params.size();
  int64_t best = std::numeric_limits<int64_t>::max();
  std::vector<int> owner(n, 0);
  while (true) {
    std::vector<int64_t> loads = OwnerLoads(params, owner, world);
    best = std::min(best, *std::max_element(loads.begin(), loads.end()));
    size_t k = 0;
    while (k < n && ++owner[k] == world) owner[k++] = 0;
    if (k == n) break;
  }
  return best;
}

std::vector<OwnedParam> RandomParams(std::mt19937* rng, int count) {
  std::uniform_int_distribution<int64_t> cost(0, 1000);
  std::vector<OwnedParam> params;
  for (int i = 0; i < count; ++i) params.push_back({i % 3, i / 3, cost(*rng)});
  return params;
}

void ExpectBalanced(const std::vector<OwnedParam>& params,
                    const std::vector<int>& owner, int world) {
  ASSERT_EQ(owner.size(), params.size());
  for (int o : owner) {
    EXPECT_GE(o, 0);
    EXPECT_LT(o, world);
  }
  std::vector<int64_t> loads = OwnerLoads(params, owner, world);
  int64_t total = 0, largest = 0;
  for (const OwnedParam& p : params) {
    total += p.cost;
    largest = std::max(largest, p.cost);
  }
  EXPECT_EQ(std::accumulate(loads.begin(), loads.end(), int64_t{0}), total);
  const int64_t max_load = *std::max_element(loads.begin(), loads.end());
  // L_max <= C / world + c_max, in integers: world·L_max <= C + world·c_max.
  EXPECT_LE(max_load * world, total + largest * world);
}

TEST(ParamCostTest, AdamIsElementCount) {
  EXPECT_EQ(ParamCost({16, 64}, /*muon=*/false), 1024);
  EXPECT_EQ(ParamCost({7}, false), 7);
  EXPECT_EQ(ParamCost({2, 3, 4}, false), 24);
  EXPECT_EQ(ParamCost({0, 5}, false), 0);
}

TEST(ParamCostTest, MuonIsNewtonSchulzCost) {
  EXPECT_EQ(ParamCost({16, 64}, /*muon=*/true), 64 * 16 * 16);
  EXPECT_EQ(ParamCost({64, 16}, true), 64 * 16 * 16);
  EXPECT_EQ(ParamCost({8, 8}, true), 512);
  EXPECT_EQ(ParamCost({10}, true), 10);  // Not a matrix.
}

// A mixture-of-experts LoRA's A [E*r, in] and B [out, r*E] are E r×in
// and out×r matrices to Muon: E times one expert's Newton–Schulz cost, not
// the cost of the concatenation (here 8 times less).
TEST(ParamCostTest, MuonExpertsCostEachExpertsMatrix) {
  constexpr int64_t kExperts = 8;
  const ParamLayout rows{ExpertStacking::kRows, kExperts};
  const ParamLayout columns{ExpertStacking::kColumns, kExperts};
  const int64_t one_expert = 2048 * 16 * 16;
  EXPECT_EQ(ParamCost({kExperts * 16, 2048}, true, rows),
            kExperts * one_expert);
  EXPECT_EQ(ParamCost({2048, 16 * kExperts}, true, columns),
            kExperts * one_expert);
  EXPECT_EQ(ParamCost({kExperts * 16, 2048}, true), 2048 * 128 * 128);
  // A wide expert stack: [3*4, 6] holds three 4×6 matrices.
  EXPECT_EQ(ParamCost({12, 6}, true, {ExpertStacking::kRows, 3}), 3 * 6 * 16);
  // Elementwise optimizers and layouts that do not fit: the element count.
  EXPECT_EQ(ParamCost({kExperts * 16, 2048}, false, rows),
            kExperts * 16 * 2048);
  EXPECT_EQ(ParamCost({10, 6}, true, {ExpertStacking::kRows, 3}), 60);
  EXPECT_EQ(ParamCost({10}, true, rows), 10);
  // One expert is a plain matrix.
  EXPECT_EQ(ParamCost({16, 64}, true, {ExpertStacking::kColumns, 1}),
            64 * 16 * 16);
}

// SOAP's cost in multiply-adds, from its formula's terms: a 16×64 matrix
// with both sides preconditioned, refreshed every step with one round of
// orthogonal iteration, costs 3·(16+64)·1024 (factors and two projections)
// + 1024 (Adam) + 2·(16+64)·1024 + 2·(16³ + 64³) (the refresh).
TEST(ParamCostTest, SoapCountsFactorsProjectionsAndRefresh) {
  const int64_t mn = 16 * 64;
  const int64_t refresh = 2 * 80 * mn + 2 * (16 * 16 * 16 + 64 * 64 * 64);
  EXPECT_EQ(SoapParamCost({16, 64}, {}), 3 * 80 * mn + mn + refresh);
  // A refresh every 4 steps costs a quarter per step (integer division).
  EXPECT_EQ(SoapParamCost({16, 64}, {.precondition_frequency = 4}),
            3 * 80 * mn + mn + refresh / 4);
  // Sides longer than max_precond_dim cost nothing: only the 16 side.
  const int64_t one_sided = 2 * 16 * mn + 2 * 16 * 16 * 16;
  EXPECT_EQ(SoapParamCost({16, 64}, {.max_precond_dim = 32}),
            3 * 16 * mn + mn + one_sided);
  EXPECT_EQ(SoapParamCost({64, 16}, {.max_precond_dim = 32}),
            3 * 16 * mn + mn + one_sided);
  // Neither side: Adam's element count.
  EXPECT_EQ(SoapParamCost({16, 64}, {.max_precond_dim = 8}), mn);
  // Expert stacks cost each expert's matrix, and not-matrices their size.
  EXPECT_EQ(SoapParamCost({3 * 16, 64}, {}, {ExpertStacking::kRows, 3}),
            3 * SoapParamCost({16, 64}, {}));
  EXPECT_EQ(SoapParamCost({64, 16 * 3}, {}, {ExpertStacking::kColumns, 3}),
            3 * SoapParamCost({64, 16}, {}));
  EXPECT_EQ(SoapParamCost({7}, {}), 7);
  EXPECT_EQ(SoapParamCost({10, 6}, {}, {ExpertStacking::kRows, 3}), 60);
  // Far more than Muon's Newton–Schulz on the same matrix.
  EXPECT_GT(SoapParamCost({16, 64}, {}), ParamCost({16, 64}, true));
}

// Ownership follows the expert cost: an expert stack weighs what its
// experts do, so it balances against plain matrices of that total.
TEST(AssignOwnersTest, ExpertStacksWeighTheirExperts) {
  const ParamLayout rows{ExpertStacking::kRows, 4};
  const std::vector<OwnedParam> params = {
      {0, 0, ParamCost({4 * 8, 64}, true, rows)},  // 4 × 64·8·8
      {0, 1, ParamCost({8, 64}, true)},            // 64·8·8
      {1, 0, ParamCost({8, 64}, true)},
      {1, 1, ParamCost({8, 64}, true)},
      {1, 2, ParamCost({8, 64}, true)}};
  EXPECT_EQ(params[0].cost, 4 * params[1].cost);
  absl::StatusOr<std::vector<int>> owner = AssignOwners(params, 2);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(*owner, (std::vector<int>{0, 1, 1, 1, 1}));
  EXPECT_EQ(OwnerLoads(params, *owner, 2),
            (std::vector<int64_t>{params[0].cost, params[0].cost}));
}

TEST(ParamCostTest, Saturates) {
  EXPECT_EQ(ParamCost({int64_t{1} << 40, int64_t{1} << 40}, true),
            std::numeric_limits<int64_t>::max());
}

TEST(AssignOwnersTest, LongestFirstToLeastLoaded) {
  // By cost: 9 → r0 {9, 0}; 7 → r1 {9, 7}; 5 (1,0) → r1 {9, 12};
  // 5 (1,1) → r0 {14, 12}; 1 → r1 {14, 13}.
  std::vector<OwnedParam> params = {
      {0, 0, 9}, {0, 1, 7}, {0, 2, 1}, {1, 0, 5}, {1, 1, 5}};
  absl::StatusOr<std::vector<int>> owner = AssignOwners(params, 2);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(*owner, (std::vector<int>{0, 1, 1, 1, 0}));
  EXPECT_EQ(OwnerLoads(params, *owner, 2), (std::vector<int64_t>{14, 13}));
}

TEST(AssignOwnersTest, TiesGoToTheLowestRankAndSlotIndexOrder) {
  std::vector<OwnedParam> params = {{1, 0, 4}, {0, 1, 4}, {0, 0, 4}};
  absl::StatusOr<std::vector<int>> owner = AssignOwners(params, 3);
  ASSERT_TRUE(owner.ok()) << owner.status();
  // (0,0) first → rank 0, (0,1) → rank 1, (1,0) → rank 2.
  EXPECT_EQ(*owner, (std::vector<int>{2, 1, 0}));
}

TEST(AssignOwnersTest, DoesNotDependOnInputOrder) {
  std::mt19937 rng(7);
  std::vector<OwnedParam> params = RandomParams(&rng, 40);
  // Equal costs make the tie-break matter.
  for (int i = 0; i < 10; ++i) params[i].cost = 500;
  absl::StatusOr<std::vector<int>> owner = AssignOwners(params, 3);
  ASSERT_TRUE(owner.ok()) << owner.status();
  std::vector<size_t> perm(params.size());
  std::iota(perm.begin(), perm.end(), size_t{0});
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<OwnedParam> shuffled;
  for (size_t i : perm) shuffled.push_back(params[i]);
  absl::StatusOr<std::vector<int>> again = AssignOwners(shuffled, 3);
  ASSERT_TRUE(again.ok()) << again.status();
  for (size_t k = 0; k < perm.size(); ++k) {
    EXPECT_EQ((*again)[k], (*owner)[perm[k]]) << "param " << perm[k];
  }
  EXPECT_EQ(*AssignOwners(params, 3), *owner);  // Repeatable.
}

TEST(AssignOwnersTest, BalanceBoundOnRandomCases) {
  std::mt19937 rng(11);
  for (int world : {1, 2, 3, 4, 7, 8}) {
    for (int count : {0, 1, 3, 9, 50, 301}) {
      std::vector<OwnedParam> params = RandomParams(&rng, count);
      absl::StatusOr<std::vector<int>> owner = AssignOwners(params, world);
      ASSERT_TRUE(owner.ok()) << owner.status();
      SCOPED_TRACE(testing::Message()
                   << "world " << world << " count " << count);
      ExpectBalanced(params, *owner, world);
    }
  }
}

TEST(AssignOwnersTest, WithinGrahamBoundOfOptimal) {
  std::mt19937 rng(3);
  for (int world : {2, 3}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<OwnedParam> params = RandomParams(&rng, 8);
      absl::StatusOr<std::vector<int>> owner = AssignOwners(params, world);
      ASSERT_TRUE(owner.ok()) << owner.status();
      std::vector<int64_t> loads = OwnerLoads(params, *owner, world);
      const int64_t lpt = *std::max_element(loads.begin(), loads.end());
      const int64_t opt = OptimalMaxLoad(params, world);
      // lpt <= (4/3 - 1/(3·world)) · opt, times 3·world.
      EXPECT_LE(lpt * 3 * world, opt * (4 * world - 1))
          << "world " << world << " trial " << trial;
    }
  }
}

TEST(AssignOwnersTest, UnevenCosts) {
  // One huge matrix and many small vectors: the huge one gets a rank to
  // itself, the small ones fill the rest.
  std::vector<OwnedParam> params = {{0, 0, ParamCost({4096, 4096}, true)}};
  for (int i = 1; i <= 20; ++i) {
    params.push_back({0, i, ParamCost({4096}, false)});
  }
  absl::StatusOr<std::vector<int>> owner = AssignOwners(params, 3);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ((*owner)[0], 0);
  for (size_t i = 1; i < params.size(); ++i) EXPECT_NE((*owner)[i], 0);
  ExpectBalanced(params, *owner, 3);
}

TEST(AssignOwnersTest, MoreRanksThanParams) {
  std::vector<OwnedParam> params = {{0, 0, 3}, {0, 1, 2}};
  absl::StatusOr<std::vector<int>> owner = AssignOwners(params, 5);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(*owner, (std::vector<int>{0, 1}));
}

TEST(AssignOwnersTest, WorldOfOneOwnsEverything) {
  std::mt19937 rng(5);
  std::vector<OwnedParam> params = RandomParams(&rng, 17);
  absl::StatusOr<std::vector<int>> owner = AssignOwners(params, 1);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(*owner, std::vector<int>(17, 0));
}

TEST(AssignOwnersTest, RejectsBadInput) {
  absl::StatusOr<std::vector<int>> owner = AssignOwners({{0, 0, 1}}, 0);
  ASSERT_FALSE(owner.ok());
  EXPECT_THAT(std::string(owner.status().message()),
              HasSubstr("world_size must be >= 1, got 0"));
  owner = AssignOwners({{0, 0, 1}, {0, 1, -2}}, 2);
  ASSERT_FALSE(owner.ok());
  EXPECT_THAT(std::string(owner.status().message()),
              HasSubstr("params[1].cost must be >= 0, got -2"));
  owner = AssignOwners({{0, 1, 1}, {2, 0, 5}, {0, 1, 3}}, 2);
  ASSERT_FALSE(owner.ok());
  EXPECT_THAT(std::string(owner.status().message()),
              HasSubstr("params repeat (slot 0, index 1)"));
}

}  // namespace
}  // namespace loraplex
