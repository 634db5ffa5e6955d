#include "core/model/sharded_base.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/model/checkpoint_weights.h"

namespace loraplex {
namespace {

// `t`'s dimensions by decreasing stride: permuted so, a dense tensor is
// contiguous and its elements are in memory order.
std::vector<int64_t> MemoryOrder(const torch::Tensor& t) {
  std::vector<int64_t> order(t.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return t.stride(a) > t.stride(b);
  });
  return order;
}

void AddStorage(const torch::Tensor& t, std::set<const void*>& seen,
                int64_t& bytes) {
  if (!t.defined()) return;
  if (!seen.insert(t.storage().unsafeGetStorageImpl()).second) return;
  bytes += static_cast<int64_t>(t.storage().nbytes());
}

}  // namespace

std::vector<torch::Tensor*> LayerTensorSlots(LayerWeights& layer) {
  std::vector<torch::Tensor*> slots = {&layer.input_norm,
                                       &layer.post_attention_norm,
                                       &layer.pre_feedforward_norm,
                                       &layer.post_feedforward_norm,
                                       &layer.q_norm,
                                       &layer.k_norm,
                                       &layer.router.weight,
                                       &layer.router.bias,
                                       &layer.sinks};
  for (LinearWeights& linear : layer.projections) {
    slots.push_back(&linear.weight);
    slots.push_back(&linear.bias);
  }
  return slots;
}

int64_t StorageBytes(const ModelWeights& weights) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  AddStorage(weights.embed_tokens, seen, bytes);
  AddStorage(weights.final_norm, seen, bytes);
  AddStorage(weights.lm_head, seen, bytes);
  for (const LayerWeights& layer : weights.layers) {
    LayerWeights copy = layer;
    for (torch::Tensor* t : LayerTensorSlots(copy)) {
      AddStorage(*t, seen, bytes);
    }
  }
  return bytes;
}

absl::StatusOr<ShardedModelWeights> LoadShardedModelWeights(
    const std::string& dir, const ModelConfig& config, torch::ScalarType dtype,
    torch::Device device, const BaseSharding& sharding) {
  LORAPLEX_ASSIGN_OR_RETURN(CheckpointWeights checkpoint,
                            CheckpointWeights::Open(dir, config, dtype));
  ShardedModelWeights weights;
  ModelWeights& whole = weights.replicated;
  LORAPLEX_ASSIGN_OR_RETURN(
      whole.embed_tokens, checkpoint.Load("model.embed_tokens.weight", device));
  LORAPLEX_ASSIGN_OR_RETURN(whole.final_norm,
                            checkpoint.Load("model.norm.weight", device));
  if (config.tie_word_embeddings) {
    whole.lm_head = whole.embed_tokens;
  } else {
    LORAPLEX_ASSIGN_OR_RETURN(whole.lm_head,
                              checkpoint.Load("lm_head.weight", device));
  }
  whole.layers.resize(config.num_hidden_layers);
  LORAPLEX_ASSIGN_OR_RETURN(
      weights.sharded,
      ShardedBase::Load(checkpoint, config, sharding, dtype, device));
  return weights;
}

absl::StatusOr<std::unique_ptr<ShardedBase>> ShardedBase::Load(
    const CheckpointWeights& checkpoint, const ModelConfig& config,
    const BaseSharding& sharding, torch::ScalarType dtype,
    torch::Device device) {
  const int world = sharding.world_size;
  if (world < 1 || sharding.rank < 0 || sharding.rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_base: rank ", sharding.rank,
                     " must lie in [0, world_size ", world, ")"));
  }
  if (!sharding.all_gather) {
    return absl::InvalidArgumentError("shard_base: all_gather is not set");
  }
  std::unique_ptr<ShardedBase> base(new ShardedBase(sharding));
  // Each tensor's name, sizes and strides, from the headers (meta
  // tensors), or from the tensor read whole where it cannot be read in part.
  std::map<const c10::TensorImpl*, std::string> names;
  absl::Status status;
  const auto meta = torch::TensorOptions().dtype(dtype).device(torch::kMeta);
  const ModelWeights layout = AssembleModelWeights(
      config, [&](const std::string& name) -> torch::Tensor {
        torch::Tensor t;
        if (name.rfind("model.layers.", 0) != 0) {
          t = torch::empty({0}, meta);  // Not sharded.
        } else if (checkpoint.RangeReadable(name)) {
          t = checkpoint.Meta(name);
        } else {
          absl::StatusOr<torch::Tensor> read =
              checkpoint.Load(name, torch::kCPU);
          if (!read.ok()) {
            if (status.ok()) status = read.status();
            return torch::empty({0}, meta);
          }
          t = torch::empty_strided(read->sizes(), read->strides(), meta);
        }
        names[t.unsafeGetTensorImpl()] = name;
        return t;
      });
  LORAPLEX_RETURN_IF_ERROR(status);
  const int64_t element_bytes = c10::elementSize(dtype);
  int64_t largest_shard = 0;
  for (const LayerWeights& meta_layer : layout.layers) {
    LayerWeights layer_copy = meta_layer;
    const std::vector<torch::Tensor*> slots = LayerTensorSlots(layer_copy);
    Layer layer;
    int64_t numel = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      const torch::Tensor& t = *slots[i];
      if (!t.defined()) continue;
      if (!t.permute(MemoryOrder(t)).is_contiguous()) {
        return absl::InternalError(absl::StrCat(
            names[t.unsafeGetTensorImpl()], " is not dense: cannot shard it"));
      }
      layer.entries.push_back({names[t.unsafeGetTensorImpl()], i, numel,
                               t.numel(), t.sizes().vec(), t.strides().vec()});
      numel += t.numel();
    }
    base->whole_layer_bytes_ += numel * element_bytes;
    layer.shard_numel = (numel + world - 1) / world;
    largest_shard = std::max(largest_shard, layer.shard_numel);
    // Padding past the layer's elements stays zero.
    layer.shard =
        torch::zeros({layer.shard_numel},
                     torch::TensorOptions().dtype(dtype).device(device));
    const int64_t begin = sharding.rank * layer.shard_numel;
    const int64_t end = begin + layer.shard_numel;
    for (const Entry& entry : layer.entries) {
      const int64_t lo = std::max(begin, entry.offset);
      const int64_t hi = std::min(end, entry.offset + entry.numel);
      if (lo >= hi) continue;
      const std::string& name = entry.name;
      torch::Tensor part;
      if (checkpoint.RangeReadable(name)) {
        LORAPLEX_ASSIGN_OR_RETURN(
            part,
            checkpoint.LoadRange(name, lo - entry.offset, hi - lo, device));
      } else {
        LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor read,
                                  checkpoint.Load(name, device));
        part = read.permute(MemoryOrder(read))
                   .reshape({-1})
                   .narrow(0, lo - entry.offset, hi - lo);
      }
      layer.shard.narrow(0, lo - begin, hi - lo).copy_(part);
    }
    base->layers_.push_back(std::move(layer));
  }
  // A second buffer receives the next layer while the current one runs.
  const int buffers = sharding.start_all_gather ? 2 : 1;
  for (int i = 0; i < buffers; ++i) {
    base->buffers_.push_back(
        torch::empty({world * largest_shard},
                     torch::TensorOptions().dtype(dtype).device(device)));
  }
  return base;
}

int64_t ShardedBase::ShardBytes() const {
  int64_t bytes = 0;
  for (const Layer& layer : layers_) bytes += layer.shard.nbytes();
  return bytes;
}

int64_t ShardedBase::BufferBytes() const {
  int64_t bytes = 0;
  for (const torch::Tensor& buffer : buffers_) bytes += buffer.nbytes();
  return bytes;
}

int64_t ShardedBase::WholeLayerBytes() const { return whole_layer_bytes_; }

torch::Tensor ShardedBase::LayerIn(int buffer, int64_t layer) const {
  return buffers_[buffer].narrow(0, 0,
                                 world_size() * layers_.at(layer).shard_numel);
}

int64_t ShardedBase::LayerAtPosition(int64_t position) const {
  const int64_t layers = num_layers();
  const int64_t at = position % (2 * layers);
  return at < layers ? at : 2 * layers - 1 - at;
}

void ShardedBase::WaitPrefetch() {
  if (!prefetch_.wait) return;
  std::function<void()> wait = std::exchange(prefetch_.wait, nullptr);
  wait();
}

torch::Tensor ShardedBase::GatherInto(int64_t layer) {
  const Layer& l = layers_.at(layer);
  const bool prefetched = prefetch_.wait != nullptr && prefetch_.layer == layer;
  WaitPrefetch();  // A prefetch of another layer is waited for and unused.
  if (buffers_.size() > 1) active_ = 1 - active_;
  torch::Tensor full = LayerIn(active_, layer);
  if (prefetched) {
    ++prefetched_gathers_;
  } else {
    sharding_.all_gather(l.shard, full);
  }
  ++gathers_;
  // In an AllRanks scope every rank gathers the same sequence of layers
  // (forward 0..L-1, then backward L-1..0, per pass), so every rank starts
  // the same next gather here, into the other buffer.
  if (buffers_.size() > 1 && scopes_ > 0) {
    prefetch_.layer = LayerAtPosition(gathers_ - scope_first_gather_);
    const Layer& next = layers_[prefetch_.layer];
    torch::Tensor into = LayerIn(1 - active_, prefetch_.layer);
    prefetch_.wait = sharding_.start_all_gather(next.shard, into);
  }
  return full;
}

const LayerWeights& ShardedBase::Gather(int64_t layer) {
  TORCH_CHECK(CanForward(),
              "a layer of a sharded base was gathered outside an AllRanks "
              "or Leading scope");
  gathered_layer_ = -1;
  gathered_ = LayerWeights();
  if (leading_) {
    int64_t announced = layer;
    sharding_.broadcast_from_rank0(announced);
  }
  const torch::Tensor full = GatherInto(layer);
  const std::vector<torch::Tensor*> slots = LayerTensorSlots(gathered_);
  for (const Entry& entry : layers_[layer].entries) {
    *slots[entry.slot] = full.as_strided(entry.sizes, entry.strides,
                                         full.storage_offset() + entry.offset);
  }
  gathered_layer_ = layer;
  return gathered_;
}

const LayerWeights& ShardedBase::Gathered(int64_t layer) const {
  TORCH_CHECK(gathered_layer_ == layer, "layer ", layer,
              " of a sharded base used without being gathered (holding ",
              gathered_layer_, ")");
  return gathered_;
}

ShardedBase::Leading::Leading(ShardedBase& base) : base_(&base) {
  TORCH_CHECK(base.rank() == 0 && base.scopes_ == 0 && !base.leading_,
              "a Leading scope is rank 0's alone and does not nest");
  base.leading_ = true;
}

ShardedBase::Leading::~Leading() { End().IgnoreError(); }

absl::Status ShardedBase::Leading::End() {
  if (base_ == nullptr) return absl::OkStatus();
  ShardedBase& base = *std::exchange(base_, nullptr);
  base.leading_ = false;
  base.gathered_ = LayerWeights();
  base.gathered_layer_ = -1;
  if (base.world_size() == 1) return absl::OkStatus();
  try {
    int64_t end = -1;
    base.sharding_.broadcast_from_rank0(end);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "ending rank 0's gathers of the sharded base failed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status ShardedBase::ServeGathers() {
  if (rank() == 0) {
    return absl::InternalError("ServeGathers is for ranks other than 0");
  }
  try {
    for (;;) {
      int64_t layer = -1;
      sharding_.broadcast_from_rank0(layer);
      if (layer < 0) return absl::OkStatus();
      if (layer >= num_layers()) {
        return absl::InternalError(absl::StrCat("rank 0 asked for layer ",
                                                layer, " of ", num_layers()));
      }
      GatherInto(layer);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("gathering rank 0's layers of the sharded base failed on "
                     "rank ",
                     rank(), ": ", e.what()));
  }
}

absl::Status ShardedBase::CheckGathered(int64_t layer,
                                        const CheckpointWeights& checkpoint,
                                        int64_t samples) const {
  if (gathered_layer_ != layer) {
    return absl::InternalError(
        absl::StrCat("layer ", layer, " is not the gathered one"));
  }
  const torch::Tensor full = LayerIn(active_, layer);
  for (const Entry& entry : layers_[layer].entries) {
    if (!checkpoint.RangeReadable(entry.name)) continue;
    const int64_t n = std::min(samples, entry.numel);
    for (int64_t i = 0; i < n; ++i) {
      // Evenly spaced over the tensor, first and last included.
      const int64_t at = n == 1 ? 0 : i * (entry.numel - 1) / (n - 1);
      LORAPLEX_ASSIGN_OR_RETURN(
          torch::Tensor mine,
          checkpoint.LoadRange(entry.name, at, 1, full.device()));
      if (!torch::equal(mine.view({1}), full.narrow(0, entry.offset + at, 1))) {
        return absl::FailedPreconditionError(
            absl::StrCat(entry.name,
                         " differs between this rank's checkpoint and the "
                         "layer the ranks gathered (element ",
                         at, " in memory order)"));
      }
    }
  }
  return absl::OkStatus();
}

ShardedBase::AllRanks::AllRanks(ShardedBase& base)
    : base_(base), first_(base.gathers_) {
  TORCH_CHECK(!base.leading_, "an AllRanks scope inside a Leading scope");
  if (base_.scopes_++ == 0) base_.scope_first_gather_ = base_.gathers_;
}

ShardedBase::AllRanks::~AllRanks() {
  if (--base_.scopes_ == 0) {
    // Every rank started the same last prefetch. A failure stays recorded
    // by the process group, whose next collective fails.
    try {
      base_.WaitPrefetch();
    } catch (const std::exception&) {
    }
  }
  base_.gathered_ = LayerWeights();
  base_.gathered_layer_ = -1;
}

int64_t ShardedBase::AllRanks::gathers() const {
  return base_.gathers_ - first_;
}

absl::Status ShardedBase::AllRanks::PadTo(int64_t total) {
  const int64_t layers = base_.num_layers();
  if (layers == 0) return absl::OkStatus();
  try {
    while (gathers() < total) {
      base_.GatherInto(base_.LayerAtPosition(gathers()));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("gathering a layer of the sharded base failed on rank ",
                     base_.rank(), ": ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace loraplex
