#include "adapters/data_parallel_slots.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/dist/layerwise_ownership.h"

namespace loraplex {

DataParallelSlots::DataParallelSlots(DistContext* dist, int64_t bucket_bytes)
    : dist_(dist),
      bucket_bytes_(bucket_bytes),
      loads_(static_cast<size_t>(dist->world_size()), 0) {}

std::vector<bool> DataParallelSlots::Claim(
    int slot, const std::vector<torch::Tensor>& params,
    const std::vector<ParamLayout>& layouts, const OptimizerConfig& optimizer) {
  Release(slot);
  Claimed& claimed = slots_[slot];
  const bool muon = optimizer.family == OptimizerFamily::kMuon;
  const SoapCostModel soap{optimizer.precondition_frequency,
                           optimizer.max_precond_dim,
                           // eigh costs about five rounds of iteration.
                           optimizer.use_eigh ? 5 : optimizer.power_iter_steps};
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamLayout layout = i < layouts.size() ? layouts[i] : ParamLayout{};
    claimed.cost.push_back(optimizer.family == OptimizerFamily::kSoap
                               ? SoapParamCost(params[i].sizes(), soap, layout)
                               : ParamCost(params[i].sizes(), muon, layout));
  }
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return claimed.cost[a] > claimed.cost[b];
  });
  claimed.owner.assign(params.size(), 0);
  for (size_t i : order) {
    const int rank = static_cast<int>(
        std::min_element(loads_.begin(), loads_.end()) - loads_.begin());
    claimed.owner[i] = rank;
    loads_[rank] += claimed.cost[i];
  }
  std::vector<bool> mine(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    mine[i] = claimed.owner[i] == dist_->rank();
  }
  return mine;
}

void DataParallelSlots::Release(int slot) {
  auto it = slots_.find(slot);
  if (it == slots_.end()) return;
  for (size_t i = 0; i < it->second.owner.size(); ++i) {
    loads_[it->second.owner[i]] -= it->second.cost[i];
  }
  slots_.erase(it);
}

std::vector<int> DataParallelSlots::owners(int slot) const {
  auto it = slots_.find(slot);
  return it == slots_.end() ? std::vector<int>{} : it->second.owner;
}

namespace {

// Each parameter's optimizer state, by the parameter's storage.
std::map<const void*, ParamStateRef> StatesByParam(
    const SlotOptimizer& optimizer) {
  std::map<const void*, ParamStateRef> states;
  for (const OptimizerChild& child : optimizer.children()) {
    std::vector<ParamStateRef> refs = child.states();
    size_t next = 0;
    for (const auto& group : child.optimizer->param_groups()) {
      for (const torch::Tensor& param : group.params()) {
        if (next < refs.size()) {
          states[param.unsafeGetTensorImpl()] = refs[next];
        }
        ++next;
      }
    }
  }
  return states;
}

// Copies one parameter's state (same optimizer kind on both sides).
absl::Status CopyState(const ParamStateRef& from, const ParamStateRef& to) {
  if (from.step == nullptr || to.step == nullptr ||
      from.tensors.size() != to.tensors.size()) {
    return absl::InternalError("optimizer states of different kinds");
  }
  torch::NoGradGuard no_grad;
  *to.step = *from.step;
  for (size_t i = 0; i < from.tensors.size(); ++i) {
    to.tensors[i].second.copy_(from.tensors[i].second);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DataParallelSlots::SaveOptimizerState(
    const TrainingSlot& slot, torch::serialize::OutputArchive& archive) {
  if (!slot.optimizer) {
    return absl::FailedPreconditionError("the slot does not train");
  }
  const std::vector<torch::Tensor> params = slot.weights.parameters();
  // The whole state, zero where another rank owns the parameter, then
  // summed over the ranks.
  LORAPLEX_ASSIGN_OR_RETURN(
      SlotOptimizer full, BuildSlotOptimizer(slot.optimizer->config(), params,
                                             slot.weights.parameter_layouts()));
  const auto mine = StatesByParam(*slot.optimizer);
  const auto all = StatesByParam(full);
  std::vector<torch::Tensor> buffers;
  std::vector<double> steps;
  for (const torch::Tensor& param : params) {
    const ParamStateRef& ref = all.at(param.unsafeGetTensorImpl());
    auto owned = mine.find(param.unsafeGetTensorImpl());
    if (owned != mine.end()) {
      LORAPLEX_RETURN_IF_ERROR(CopyState(owned->second, ref));
    } else {
      // A fresh state is not all zeros (SOAP's bases are the identity).
      torch::NoGradGuard no_grad;
      for (const auto& [name, tensor] : ref.tensors) tensor.zero_();
    }
    for (const auto& [name, tensor] : ref.tensors) buffers.push_back(tensor);
    steps.push_back(static_cast<double>(*ref.step));
  }
  buffers.push_back(
      torch::tensor(steps, torch::kDouble).to(params.front().device()));
  LORAPLEX_RETURN_IF_ERROR(dist_->AllReduceSum(buffers, bucket_bytes_));
  const torch::Tensor summed = buffers.back().cpu();
  for (size_t i = 0; i < params.size(); ++i) {
    *all.at(params[i].unsafeGetTensorImpl()).step =
        std::llround(summed[static_cast<int64_t>(i)].item<double>());
  }
  full.Save(archive);
  return absl::OkStatus();
}

absl::Status DataParallelSlots::LoadOptimizerState(
    TrainingSlot& slot, torch::serialize::InputArchive& archive) {
  if (!slot.optimizer) {
    return absl::FailedPreconditionError("the slot does not train");
  }
  const std::vector<torch::Tensor> params = slot.weights.parameters();
  LORAPLEX_ASSIGN_OR_RETURN(
      SlotOptimizer full, BuildSlotOptimizer(slot.optimizer->config(), params,
                                             slot.weights.parameter_layouts()));
  LORAPLEX_RETURN_IF_ERROR(full.Load(archive));
  const auto mine = StatesByParam(*slot.optimizer);
  const auto all = StatesByParam(full);
  for (const auto& [param, ref] : mine) {
    LORAPLEX_RETURN_IF_ERROR(CopyState(all.at(param), ref));
  }
  return absl::OkStatus();
}

StepSync DataParallelSlots::Sync(SlotPool& pool) {
  StepSync sync;
  sync.rank = dist_->rank();
  sync.world_size = dist_->world_size();
  sync.sum = [this](std::vector<torch::Tensor>& tensors) {
    return dist_->AllReduceSum(tensors, bucket_bytes_);
  };
  sync.after_step = [this, &pool](const std::vector<TrainingSlot*>& stepped) {
    std::vector<torch::Tensor> params;
    std::vector<int> owner;
    for (TrainingSlot* slot : stepped) {
      int index = -1;
      for (int i = 0; i < pool.capacity(); ++i) {
        if (&pool.slot(i) == slot) index = i;
      }
      const std::vector<int> owners_of = owners(index);
      const std::vector<torch::Tensor> of = slot->weights.parameters();
      if (index < 0 || owners_of.size() != of.size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "a stepped slot's parameters have no owners (slot ", index, ")"));
      }
      params.insert(params.end(), of.begin(), of.end());
      owner.insert(owner.end(), owners_of.begin(), owners_of.end());
    }
    return dist_->BroadcastFromOwners(params, owner, bucket_bytes_);
  };
  return sync;
}

}  // namespace loraplex
