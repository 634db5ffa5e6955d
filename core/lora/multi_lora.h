// The adapters of a co-batch applied to the frozen projections: the rows of
// a batch are split into consecutive segments, each trained (or evaluated)
// through one adapter (docs/DESIGN.md §3).
//
//   MultiLoraDelta delta({{&weights_a, 2, ...}, {&weights_b, 1, ...}});
//   model.ForwardHidden(input_ids, lengths, &delta);   // 3 rows
//
// The base GEMM runs once over all rows (in LlamaModel); each segment then
// adds scale · dropout(x) Aᵀ Bᵀ for the projections its adapter targets.
// Rows are split with split_with_sizes and joined with cat, whose backward
// passes are a cat and a split: backward costs O(rows), never one full-size
// zero tensor per segment (the x[a:b] slicing trap). A segment's A matrices
// for projections that share an input (q/k/v, gate/up) are concatenated so
// the input is read once; with dropout each projection draws its own mask,
// as PEFT does.
//
// By default (LoraKernel::kGrouped) segments that agree in row count, dtype,
// dropout rate and per-projection ranks form one bucket whose LoRA products
// run as batched GEMMs (bmm) over all its adapters: a projection costs a few
// ops per bucket instead of a few per segment, which is what matters for
// many short rows. When one bucket holds every row (the usual co-batch of
// like-configured slots, and any single slot), x is its input as it is and
// each projection's terms add to the whole base output: no split or cat, nor
// their backward copies.
// LoraKernel::kPerSlot keeps one GEMM chain per segment; it
// is the reference the grouped path is tested against. Both give the same
// values up to the GEMMs' rounding. An adapter that targets the LM head adds
// scale · dropout(h) Aᵀ Bᵀ to its rows' logits the same way (AddToLogits).
#ifndef LORAPLEX_CORE_LORA_MULTI_LORA_H_
#define LORAPLEX_CORE_LORA_MULTI_LORA_H_

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "core/lora/lora_weights.h"
#include "core/model/experts.h"
#include "core/model/llama_model.h"

namespace loraplex {

struct LoraSegment {
  // nullptr: these rows see the base model only.
  const LoraWeights* weights = nullptr;
  // Number of rows (sequences) in the segment.
  int64_t rows = 0;
  // Dropout is applied only when true and the adapter's dropout is > 0.
  bool training = false;
  // Dropout masks are a pure function of (dropout_seed, row id, layer,
  // projection, position), so they do not depend on how rows are grouped
  // into batches or padded, nor on the device (ScaledDropoutMask).
  // row_ids[i] identifies row i (e.g. its index in the slot's batch); needed
  // only for dropout.
  uint64_t dropout_seed = 0;
  std::vector<int64_t> row_ids = {};
};

enum class LoraKernel {
  kGrouped,  // Batched GEMMs over the segments of a bucket.
  kPerSlot,  // One GEMM chain per segment (the reference).
};

class MultiLoraDelta : public ProjectionDelta {
 public:
  explicit MultiLoraDelta(std::vector<LoraSegment> segments,
                          LoraKernel kernel = LoraKernel::kGrouped);

  void AddTo(int layer, const torch::Tensor& x,
             const std::vector<Projection>& projections,
             std::vector<torch::Tensor>& outputs) const override;

  torch::Tensor AddToLogits(const torch::Tensor& hidden,
                            const torch::Tensor& logits,
                            int64_t first_row) const override;

  // Experts' LoRA (multi_lora_experts.cc): the pairs of the segments whose
  // adapters have one rank form one batch of (segment, expert) groups, each
  // padded to the longest, and their terms are two bmm's per projection;
  // a group touches only its own adapter's expert matrices.
  void AddToExperts(int layer, Projection projection, const torch::Tensor& x,
                    const std::vector<int64_t>& counts,
                    const torch::Tensor& rows,
                    torch::Tensor& output) const override;

  // Hands each mixture-of-experts layer's routing to `observer` (nullptr:
  // to none), which must outlive the backward pass (checkpointed layers
  // route again there).
  void set_routing_observer(RoutingObserver* observer) {
    routing_observer_ = observer;
  }
  void ObserveRouting(int layer, const ExpertRouting& routing) const override;

  const std::vector<LoraSegment>& segments() const { return segments_; }

  // Segment s's LM-head module, or nullptr when it has none.
  const LoraModule* LmHead(size_t s) const;
  // The input of segment s's LM-head LoRA: its final hidden states x [rows,
  // seq, hidden] in the adapter's dtype, dropped out in training.
  torch::Tensor LmHeadInput(size_t s, const torch::Tensor& x) const;

 private:
  bool UsesDropout(const LoraSegment& segment) const;
  // Inverted-dropout of x [rows, seq, in] for (layer, projection).
  torch::Tensor Dropout(const LoraSegment& segment, const torch::Tensor& x,
                        int layer, Projection projection) const;
  // AddTo's two kernels. modules[s][j]: segment s's module for
  // projections[j], or nullptr; adapted[j]: whether any segment has one.
  using ModuleTable = std::vector<std::vector<const LoraModule*>>;
  void AddPerSlot(int layer, const torch::Tensor& x,
                  const std::vector<Projection>& projections,
                  const ModuleTable& modules, const std::vector<bool>& adapted,
                  torch::ScalarType dtype,
                  std::vector<torch::Tensor>& outputs) const;
  void AddGrouped(int layer, const torch::Tensor& x,
                  const std::vector<Projection>& projections,
                  const ModuleTable& modules, const std::vector<bool>& adapted,
                  torch::ScalarType dtype,
                  std::vector<torch::Tensor>& outputs) const;

  std::vector<LoraSegment> segments_;
  std::vector<int64_t> sizes_;
  LoraKernel kernel_;
  RoutingObserver* routing_observer_ = nullptr;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_LORA_MULTI_LORA_H_
