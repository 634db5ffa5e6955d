// A frozen base sharded over the ranks of a data-parallel group
// (docs/DESIGN.md §18): each rank keeps 1/N of every decoder layer's frozen
// tensors, and a layer's full weights are all-gathered into a reused
// buffer just before it runs, in the forward pass and again in the backward
// pass (LlamaModel runs every layer of a sharded base as a checkpointed
// layer, layer_checkpoint.h, whose recomputation gathers again).
//
// A layer's tensors (LayerTensorSlots order) lie one after another in
// memory order in a flat vector, padded to a multiple of N; rank r keeps
// elements [r S, (r + 1) S), S = padded size / N, so the all-gather of the
// equal shards in rank order rebuilds the vector, and each tensor is a view
// of it with its own sizes and strides. The embedding, final norm and LM
// head stay whole on every rank.
//
// Every rank must gather the same layers in the same order: a forward
// outside an AllRanks or Leading scope is refused (FAILED_PRECONDITION)
// instead of waiting for ranks that never come, and a rank that ran fewer
// gathers in an AllRanks scope (fewer micro-batches, a failed one) pads them
// with PadTo. Rank 0 alone may run forwards (evaluation, sampling) in a
// Leading scope while the other ranks gather with it in ServeGathers.
#ifndef LORAPLEX_CORE_MODEL_SHARDED_BASE_H_
#define LORAPLEX_CORE_MODEL_SHARDED_BASE_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/model_config.h"
#include "core/model/model_weights.h"

namespace loraplex {

class CheckpointWeights;

// How the frozen base is split over the ranks (ModelLoadOptions).
struct BaseSharding {
  int rank = 0;
  int world_size = 1;
  // Fills `full` (contiguous, world_size × shard's elements, shard's dtype
  // and device) with every rank's `shard` in rank order; every rank calls it
  // with shards of one size. Throws (c10::Error) when it fails.
  std::function<void(const torch::Tensor& shard, torch::Tensor& full)>
      all_gather;
  // Replaces `value` on every rank by rank 0's. Throws (c10::Error) when it
  // fails. Needed only for Leading and ServeGathers.
  std::function<void(int64_t& value)> broadcast_from_rank0;
  // Optional: starts the same all-gather as all_gather and returns the
  // function that waits for it (which throws when it fails). Set, the next
  // layer's gather runs while the current layer computes, in a second
  // buffer.
  std::function<std::function<void()>(const torch::Tensor& shard,
                                      torch::Tensor& full)>
      start_all_gather;
};

// Pointers to every tensor field of `layer` in a fixed order (undefined
// ones included).
std::vector<torch::Tensor*> LayerTensorSlots(LayerWeights& layer);

class ShardedBase;

// The frozen weights of a sharded base as one rank holds them: the
// embedding, final norm and LM head whole, `layers` empty (one
// LayerWeights per layer), and this rank's shards.
struct ShardedModelWeights {
  ModelWeights replicated;
  std::unique_ptr<ShardedBase> sharded;
};
absl::StatusOr<ShardedModelWeights> LoadShardedModelWeights(
    const std::string& dir, const ModelConfig& config, torch::ScalarType dtype,
    torch::Device device, const BaseSharding& sharding);

// Bytes of the distinct storages of `weights`' tensors (a tied LM head or a
// transposed view counted once).
int64_t StorageBytes(const ModelWeights& weights);

class ShardedBase {
 public:
  // Reads this rank's shard of every decoder layer of the checkpoint: of
  // each tensor only the range the shard holds (CheckpointWeights::
  // LoadRange), or the whole tensor, one at a time, where it cannot be read
  // in part (MXFP4 experts).
  static absl::StatusOr<std::unique_ptr<ShardedBase>> Load(
      const CheckpointWeights& checkpoint, const ModelConfig& config,
      const BaseSharding& sharding, torch::ScalarType dtype,
      torch::Device device);

  int rank() const { return sharding_.rank; }
  int world_size() const { return sharding_.world_size; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // This rank's shard of `layer`.
  const torch::Tensor& shard(int64_t layer) const {
    return layers_.at(layer).shard;
  }
  // Bytes of this rank's shards and of the gather buffers (two with
  // start_all_gather).
  int64_t ShardBytes() const;
  int64_t BufferBytes() const;
  // Bytes of every layer's tensors unsharded (no padding).
  int64_t WholeLayerBytes() const;

  // While one is alive the caller vouches that every rank runs the same
  // forward and backward passes of the model, and forwards are allowed.
  class AllRanks {
   public:
    explicit AllRanks(ShardedBase& base);
    ~AllRanks();
    AllRanks(const AllRanks&) = delete;
    AllRanks& operator=(const AllRanks&) = delete;

    // Layers gathered since the scope opened.
    int64_t gathers() const;
    // Gathers until `total` layers have been gathered since the scope
    // opened, continuing the order of passes with backward (layers 0..L-1,
    // then L-1..0, per pass), so that a rank that ran fewer passes, or
    // stopped inside one, meets the others' gathers. UNAVAILABLE when a
    // gather fails.
    absl::Status PadTo(int64_t total);

   private:
    ShardedBase& base_;
    int64_t first_;
  };
  // Rank 0 only. While one is alive, forwards of rank 0 alone are allowed:
  // each Gather first tells the other ranks which layer (they gather with it
  // in ServeGathers), and End, or the destructor, tells them the scope
  // ended.
  class Leading {
   public:
    explicit Leading(ShardedBase& base);
    ~Leading();
    Leading(const Leading&) = delete;
    Leading& operator=(const Leading&) = delete;

    // Ends the scope. UNAVAILABLE when telling the other ranks fails.
    absl::Status End();

   private:
    ShardedBase* base_;  // Null once ended.
  };
  // Ranks other than 0: gathers the layers rank 0 names from its Leading
  // scope until that scope ends. UNAVAILABLE when a collective fails.
  absl::Status ServeGathers();

  // Compares `samples` evenly spaced elements of each tensor of the last
  // gathered layer, which must be `layer`, with `checkpoint`'s: so the
  // layer every rank gathered is the one this rank's checkpoint holds.
  // Tensors that cannot be read in part (MXFP4 experts) are not compared.
  // FAILED_PRECONDITION naming the first tensor that differs.
  absl::Status CheckGathered(int64_t layer, const CheckpointWeights& checkpoint,
                             int64_t samples) const;

  // Gathers per forward pass with backward: every layer twice.
  int64_t GathersPerTrainingPass() const { return 2 * num_layers(); }
  bool InAllRanksScope() const { return scopes_ > 0; }
  // Whether forwards may run: in an AllRanks or a Leading scope.
  bool CanForward() const { return scopes_ > 0 || leading_; }

  // Gathers `layer` into a buffer; its weights stay valid until the next
  // Gather. In an AllRanks scope, with start_all_gather, the layer that
  // comes next in the scope's order (forward 0..L-1, backward L-1..0) is
  // then started into the other buffer, and a Gather of it only waits.
  // Throws (c10::Error) when the gather fails.
  const LayerWeights& Gather(int64_t layer);
  // The weights of the last gathered layer, which must be `layer`.
  const LayerWeights& Gathered(int64_t layer) const;
  // Gathers since the object was made, and those of them a prefetch had
  // already started.
  int64_t gathers() const { return gathers_; }
  int64_t prefetched_gathers() const { return prefetched_gathers_; }

 private:
  // A tensor of a layer: where its elements lie in the layer's vector and
  // the sizes and strides of its view.
  struct Entry {
    std::string name;  // In the checkpoint (ModelTensorSpecs).
    size_t slot;       // Index into LayerTensorSlots.
    int64_t offset;
    int64_t numel;
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;
  };
  struct Layer {
    std::vector<Entry> entries;
    int64_t shard_numel = 0;  // Padded numel / world_size.
    torch::Tensor shard;      // This rank's [shard_numel].
  };

  ShardedBase(BaseSharding sharding) : sharding_(std::move(sharding)) {}
  // The layer's vector in a buffer, gathered.
  torch::Tensor GatherInto(int64_t layer);
  // `layer`'s vector in buffers_[buffer].
  torch::Tensor LayerIn(int buffer, int64_t layer) const;
  // The layer gathered at `position` of a scope's order.
  int64_t LayerAtPosition(int64_t position) const;
  // Waits for the started prefetch, if any. Throws when it failed.
  void WaitPrefetch();

  BaseSharding sharding_;
  std::vector<Layer> layers_;
  int64_t whole_layer_bytes_ = 0;
  // One or two, each world_size × the largest shard.
  std::vector<torch::Tensor> buffers_;
  int active_ = 0;  // The buffer of the last gathered layer.
  struct Prefetch {
    int64_t layer = -1;
    std::function<void()> wait;  // Unset: none started.
  };
  Prefetch prefetch_;
  int64_t scope_first_gather_ = 0;
  int64_t prefetched_gathers_ = 0;
  LayerWeights gathered_;
  int64_t gathered_layer_ = -1;
  int scopes_ = 0;
  bool leading_ = false;
  int64_t gathers_ = 0;  // Since the object was made.
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_SHARDED_BASE_H_
