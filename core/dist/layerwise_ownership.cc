#include "core/dist/layerwise_ownership.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loraplex {
namespace {

constexpr int64_t kMaxCost = std::numeric_limits<int64_t>::max();

// a * b, or INT64_MAX when that overflows (both non-negative).
int64_t SaturatingMul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  if (a > kMaxCost / b) return kMaxCost;
  return a * b;
}

int64_t SaturatingAdd(int64_t a, int64_t b) {
  return a > kMaxCost - b ? kMaxCost : a + b;
}

}  // namespace

int64_t ParamCost(c10::IntArrayRef shape, bool muon,
                  const ParamLayout& layout) {
  if (muon && shape.size() == 2) {
    int64_t m = std::max<int64_t>(shape[0], 0);
    int64_t n = std::max<int64_t>(shape[1], 0);
    // One expert's matrix, as MatrixShapeOf would give it (core/dist does
    // not link the optimizers).
    const int64_t experts = layout.matrices();
    int64_t& stacked = layout.stacking == ExpertStacking::kRows ? m : n;
    if (experts >= 1 && stacked % experts == 0) {
      stacked /= experts;
      const int64_t small = std::min(m, n);
      return SaturatingMul(
          experts, SaturatingMul(SaturatingMul(std::max(m, n), small), small));
    }
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel = SaturatingMul(numel, std::max<int64_t>(d, 0));
  return numel;
}

int64_t SoapParamCost(c10::IntArrayRef shape, const SoapCostModel& soap,
                      const ParamLayout& layout) {
  const int64_t elements = ParamCost(shape, /*muon=*/false);
  if (shape.size() != 2) return elements;
  int64_t m = std::max<int64_t>(shape[0], 0);
  int64_t n = std::max<int64_t>(shape[1], 0);
  const int64_t experts = std::max<int64_t>(layout.matrices(), 1);
  int64_t& stacked = layout.stacking == ExpertStacking::kRows ? m : n;
  if (stacked % experts != 0) return elements;
  stacked /= experts;
  const auto side = [&](int64_t size) {
    return soap.max_precond_dim > 0 && size > soap.max_precond_dim ? 0 : size;
  };
  const int64_t a = side(m);
  const int64_t b = side(n);
  const int64_t mn = SaturatingMul(m, n);
  const int64_t contraction = SaturatingMul(a + b, mn);
  const int64_t cubes = SaturatingAdd(SaturatingMul(a, SaturatingMul(a, a)),
                                      SaturatingMul(b, SaturatingMul(b, b)));
  const int64_t refresh = SaturatingAdd(
      SaturatingMul(2, contraction),
      SaturatingMul(2 * std::max<int64_t>(soap.power_iter_steps, 0), cubes));
  const int64_t per_matrix = SaturatingAdd(
      SaturatingAdd(SaturatingMul(3, contraction), mn),
      refresh / std::max<int64_t>(soap.precondition_frequency, 1));
  return SaturatingMul(experts, per_matrix);
}

absl::StatusOr<std::vector<int>> AssignOwners(
    const std::vector<OwnedParam>& params, int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be >= 1, got ", world_size));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].cost < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "params[", i, "].cost must be >= 0, got ", params[i].cost, " (slot ",
          params[i].slot, ", index ", params[i].index, ")"));
    }
  }
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const OwnedParam& x = params[a];
    const OwnedParam& y = params[b];
    if (x.cost != y.cost) return x.cost > y.cost;
    if (x.slot != y.slot) return x.slot < y.slot;
    return x.index < y.index;
  });
  {  // Every (slot, index) once: the tie-break must be a total order.
    std::vector<std::pair<int, int>> keys;
    keys.reserve(params.size());
    for (const OwnedParam& p : params) keys.emplace_back(p.slot, p.index);
    std::sort(keys.begin(), keys.end());
    auto dup = std::adjacent_find(keys.begin(), keys.end());
    if (dup != keys.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "params repeat (slot ", dup->first, ", index ", dup->second, ")"));
    }
  }

  // Min-heap of (load, rank): the least-loaded rank, lowest rank on ties.
  using Entry = std::pair<int64_t, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ranks;
  for (int r = 0; r < world_size; ++r) ranks.emplace(0, r);
  std::vector<int> owner(params.size(), 0);
  for (size_t i : order) {
    Entry least = ranks.top();
    ranks.pop();
    owner[i] = least.second;
    ranks.emplace(SaturatingAdd(least.first, params[i].cost), least.second);
  }
  return owner;
}

std::vector<int64_t> OwnerLoads(const std::vector<OwnedParam>& params,
                                const std::vector<int>& owner, int world_size) {
  std::vector<int64_t> loads(std::max(world_size, 0), 0);
  for (size_t i = 0; i < params.size() && i < owner.size(); ++i) {
    if (owner[i] < 0 || owner[i] >= world_size) continue;
    loads[owner[i]] = SaturatingAdd(loads[owner[i]], params[i].cost);
  }
  return loads;
}

}  // namespace loraplex
