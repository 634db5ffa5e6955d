// Which rank owns which parameter in the LayerWise distributed optimizer
// (docs/DESIGN.md §6). Pure bookkeeping: no collectives here.
//
//   std::vector<OwnedParam> params;  // the union of every slot's parameters
//   for (...) params.push_back({slot, index, ParamCost(p.sizes(), is_muon)});
//   LORAPLEX_ASSIGN_OR_RETURN(std::vector<int> owner,
//                             AssignOwners(params, world_size));
//
// Only owner[i] keeps parameter i's optimizer state and steps it; the
// updated values then travel from each owner to every other rank
// (DistContext::BroadcastFromOwners). Every rank computes the same
// assignment from the same inputs, so it never needs to be exchanged.
#ifndef LORAPLEX_CORE_DIST_LAYERWISE_OWNERSHIP_H_
#define LORAPLEX_CORE_DIST_LAYERWISE_OWNERSHIP_H_

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/optim/param_layout.h"

namespace loraplex {

// One parameter of one slot, with the work its optimizer step costs.
struct OwnedParam {
  int slot = 0;      // The slot the parameter belongs to.
  int index = 0;     // Its position among that slot's parameters.
  int64_t cost = 0;  // ParamCost of the parameter, >= 0.
};

// The relative cost of one optimizer step of a parameter shaped `shape`:
// its element count for the Adam family, and max(m, n)·min(m, n)² — the
// Newton–Schulz matmuls — for a Muon m×n matrix; a Muon parameter that
// stacks E experts' m×n matrices (`layout`) costs E times that, not the
// cost of the concatenation. A Muon parameter that is not 2-D, or whose
// layout does not fit it, costs its element count. Saturates at INT64_MAX.
int64_t ParamCost(c10::IntArrayRef shape, bool muon,
                  const ParamLayout& layout = {});

// SOAP's knobs that decide its cost (core/optim/soap.h).
struct SoapCostModel {
  int64_t precondition_frequency = 1;
  int64_t max_precond_dim = 0;  // 0: every side is preconditioned.
  int64_t power_iter_steps = 1;
};

// The relative cost of one SOAP step of a parameter shaped `shape` (each of
// `layout`'s E matrices m×n on its own), counted in multiply-adds: with
// a = m and b = n where that side is preconditioned (else 0), every step
// updates the factors and projects the gradient and the update, 3·(a+b)·m·n;
// each eigenbasis refresh, amortized over precondition_frequency steps,
// projects the momentum twice, 2·(a+b)·m·n, and runs power_iter_steps
// rounds of a matmul and a QR per side, 2·power_iter_steps·(a³+b³); plus
// the element count for the Adam arithmetic. A parameter that is not 2-D
// costs its element count. Saturates at INT64_MAX.
int64_t SoapParamCost(c10::IntArrayRef shape, const SoapCostModel& soap,
                      const ParamLayout& layout = {});

// Deals the parameters out to `world_size` ranks and returns owner[i] for
// params[i]. Longest-processing-time first: parameters sorted by cost
// (descending; ties by (slot, index) ascending), each given to the rank with
// the least load so far (ties: the lowest rank). Deterministic: the result
// depends only on the inputs, not on their order.
//
// Balance: with L_max the heaviest rank's load, C the total cost and c_max
// the largest single cost, L_max <= C / world_size + c_max (the last item
// placed on the heaviest rank went to a rank that then held at most the
// average), and L_max <= (4/3 - 1/(3·world_size)) · the optimal L_max
// (Graham's bound for LPT).
//
// INVALID_ARGUMENT when world_size < 1, a cost is negative, or two params
// share (slot, index).
absl::StatusOr<std::vector<int>> AssignOwners(
    const std::vector<OwnedParam>& params, int world_size);

// The summed cost each rank owns under `owner` (for reports and tests).
std::vector<int64_t> OwnerLoads(const std::vector<OwnedParam>& params,
                                const std::vector<int>& owner, int world_size);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_DIST_LAYERWISE_OWNERSHIP_H_
