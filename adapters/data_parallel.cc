#include "adapters/data_parallel.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/dist/layerwise_ownership.h"

namespace loraplex {

DataParallelSlots::DataParallelSlots(DistContext* dist, int64_t bucket_bytes)
    : dist_(dist),
      bucket_bytes_(bucket_bytes),
      loads_(static_cast<size_t>(dist->world_size()), 0) {}

std::vector<bool> DataParallelSlots::Claim(
    int slot, const std::vector<torch::Tensor>& params,
    OptimizerFamily family) {
  Release(slot);
  Claimed& claimed = slots_[slot];
  const bool muon = family == OptimizerFamily::kMuon;
  for (const torch::Tensor& param : params) {
    claimed.cost.push_back(ParamCost(param.sizes(), muon));
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
