// A slot pool trained data parallel over the ranks of a c10d process group,
// with the LayerWise distributed optimizer applied once over the union of
// every slot's parameters (docs/DESIGN.md §6).
//
//   LORAPLEX_ASSIGN_OR_RETURN(DistContext dist, DistContext::Create(env, cpu));
//   DataParallelSlots dp(&dist);
//   SlotPool pool(model.config(), {.capacity = 8, .claims = &dp});
//   StepSync sync = dp.Sync(pool);
//   CoBatchOptions options;
//   options.sync = &sync;
//   ... every rank attaches and retires the same jobs in the same order ...
//   LORAPLEX_ASSIGN_OR_RETURN(auto metrics,
//       TrainCoBatchStep(model, pool.ActiveSlots(), options));
//
// Each parameter has one owner rank, which alone keeps its optimizer state
// (Adam moments, Muon momentum) and steps it; every rank trains its share
// of each slot's rows, the gradients are summed over the ranks in
// flattened buckets, and after the step each owner broadcasts what it
// updated, so each parameter's bytes leave its owner once per step.
//
// Ownership is dealt at attach, the slot's parameters heaviest first (cost:
// ParamCost, Newton–Schulz work for Muon matrices), each to the rank with
// the least cost owned so far (ties: the lowest rank). Ownership of slots
// already training never moves, so no optimizer state crosses ranks; a
// retired slot's cost leaves its owners, and the next attaches fill the
// lighter ranks first. Every rank makes the same calls in the same order,
// so every rank computes the same owners without exchanging them.
#ifndef LORAPLEX_ADAPTERS_DATA_PARALLEL_SLOTS_H_
#define LORAPLEX_ADAPTERS_DATA_PARALLEL_SLOTS_H_

#include <cstdint>
#include <map>
#include <vector>

#include "adapters/slot_pool.h"
#include "core/dist/process_group.h"
#include "core/train/dist_hooks.h"
#include "core/train/training_slot.h"

namespace loraplex {

class DataParallelSlots : public ParamClaims {
 public:
  // `dist` must outlive this object.
  explicit DataParallelSlots(DistContext* dist,
                             int64_t bucket_bytes = kDefaultBucketBytes);

  std::vector<bool> Claim(int slot, const std::vector<torch::Tensor>& params,
                          const std::vector<ParamLayout>& layouts,
                          const OptimizerConfig& optimizer) override;
  void Release(int slot) override;

  // CoBatchOptions::sync for `pool`, whose claims must be this object.
  StepSync Sync(SlotPool& pool);

  // A slot's optimizer state in the one-process format (SlotOptimizer::
  // Save over all its parameters), each owner contributing the state of
  // the parameters it owns, so a checkpoint written with any number of
  // ranks loads with any other, 1 included. Collective: every rank calls
  // it for the same slot, and every rank gets the whole archive.
  absl::Status SaveOptimizerState(const TrainingSlot& slot,
                                  torch::serialize::OutputArchive& archive);
  // Loads such an archive (written by any number of ranks): this rank keeps
  // the state of the parameters it owns. Not collective. INVALID_ARGUMENT
  // (nothing changed) when the archive does not fit the slot.
  absl::Status LoadOptimizerState(TrainingSlot& slot,
                                  torch::serialize::InputArchive& archive);

  // The owner rank of each parameter of `slot` (empty when not claimed).
  std::vector<int> owners(int slot) const;
  // The cost each rank owns.
  const std::vector<int64_t>& loads() const { return loads_; }

 private:
  DistContext* dist_;
  int64_t bucket_bytes_;
  std::vector<int64_t> loads_;
  struct Claimed {
    std::vector<int> owner;
    std::vector<int64_t> cost;
  };
  std::map<int, Claimed> slots_;
};

}  // namespace loraplex

#endif  // LORAPLEX_ADAPTERS_DATA_PARALLEL_SLOTS_H_
