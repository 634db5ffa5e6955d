// The ranks of a distributed run and the collectives the trainer needs
// (docs/DESIGN.md §6): a TCPStore rendezvous hosted by rank 0, then a Gloo
// (CPU) or NCCL (CUDA, CMake option LORAPLEX_WITH_NCCL) process group.
//
//   LORAPLEX_ASSIGN_OR_RETURN(DistEnv env, DistEnvFromProcess());
//   LORAPLEX_ASSIGN_OR_RETURN(DistContext dist,
//                             DistContext::Create(env, torch::kCPU));
//   LORAPLEX_RETURN_IF_ERROR(dist.Broadcast(&plan_bytes, /*root=*/0));
//   ... forward/backward on this rank's rows ...
//   LORAPLEX_RETURN_IF_ERROR(dist.AllReduceMean(grads, kDefaultBucketBytes));
//   ... each owner steps the parameters it owns (layerwise_ownership.h) ...
//   LORAPLEX_RETURN_IF_ERROR(dist.BroadcastFromOwners(params, owner));
//
// With world size 1 there is no store and no group, and every collective
// returns at once. Every rank must call the same collectives in the same
// order with tensors of the same shapes and dtypes. A peer that never comes
// or stops answering makes the others fail after DistEnv::timeout rather
// than hang. LibTorch and Gloo exceptions never leave this class.
#ifndef LORAPLEX_CORE_DIST_PROCESS_GROUP_H_
#define LORAPLEX_CORE_DIST_PROCESS_GROUP_H_

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dist/c10d_compat.h"
#include "core/dist/dist_env.h"

namespace loraplex {

// Default size of a flattened bucket: big enough that per-collective latency
// is amortised, small enough to bound the staging copy.
inline constexpr int64_t kDefaultBucketBytes = int64_t{25} << 20;

// What this rank's collectives moved, in buffer bytes (what the collective
// carries logically, not the wire traffic of its algorithm).
struct CollectiveCounters {
  int64_t collectives = 0;       // Every collective issued, barriers included.
  int64_t all_reduce_bytes = 0;  // Bytes of the buffers summed.
  // Broadcast buffers with this rank as the root, and from other roots.
  int64_t broadcast_sent_bytes = 0;
  int64_t broadcast_received_bytes = 0;
  int64_t all_gather_bytes = 0;  // Bytes of the gathered (full) buffers.
};

// Groups tensors[i] into buckets for flattened collectives: the tensors of
// one dtype, in order, are packed while a bucket stays <= bucket_bytes (a
// tensor larger than that gets a bucket of its own); dtypes come in order of
// first appearance. Tensors with no elements are left out. Returns indices
// into `tensors`. INVALID_ARGUMENT when bucket_bytes < 1 or a tensor is
// undefined.
absl::StatusOr<std::vector<std::vector<size_t>>> PlanBuckets(
    const std::vector<torch::Tensor>& tensors, int64_t bucket_bytes);

class DistContext {
 public:
  // Joins the run `env` describes. Rank 0 hosts the store at
  // MASTER_ADDR:MASTER_PORT; every rank then waits up to env.timeout for
  // all WORLD_SIZE ranks. DEADLINE_EXCEEDED (naming the address and how
  // many ranks joined) when some never come; UNAVAILABLE when the store
  // cannot be hosted or reached; FAILED_PRECONDITION for a CUDA `device`
  // in a build without NCCL. `device` is where collective tensors live.
  static absl::StatusOr<DistContext> Create(const DistEnv& env,
                                            torch::Device device);

  DistContext(DistContext&&) noexcept;
  DistContext& operator=(DistContext&&) noexcept;
  ~DistContext();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  bool is_root() const { return rank_ == 0; }
  const torch::Device& device() const { return device_; }
  // How long a collective waits for a peer (DistEnv::timeout).
  std::chrono::seconds timeout() const { return timeout_; }

  // Returns once every rank has called Barrier.
  absl::Status Barrier();

  // How many ranks passed `flag` true; every rank gets the count.
  absl::StatusOr<int> CountRanks(bool flag);

  // Replaces *bytes on every rank by root's *bytes: its length first, then
  // the bytes (two collectives).
  absl::Status Broadcast(std::string* bytes, int root);
  // Replaces *value on every rank by root's (one collective).
  absl::Status BroadcastValue(int64_t* value, int root);

  // Replaces every tensor by its mean over the ranks. Floating-point
  // tensors on device() only; flattened into PlanBuckets(tensors,
  // bucket_bytes), one all-reduce per bucket.
  absl::Status AllReduceMean(std::vector<torch::Tensor>& tensors,
                             int64_t bucket_bytes);
  // The same, summing instead of averaging.
  absl::Status AllReduceSum(std::vector<torch::Tensor>& tensors,
                            int64_t bucket_bytes);

  // Fills `full` with every rank's `shard` in rank order: `full` is
  // contiguous with world_size() times shard's elements and its dtype, both
  // on device(). One all-gather (with world size 1, a copy).
  absl::Status AllGather(const torch::Tensor& shard, torch::Tensor& full);
  // The same all-gather, started: returns at once with the function that
  // waits for it (call it exactly once; it throws c10::Error, and records
  // the failure, when the gather fails). Later collectives may be started
  // before it is waited on, in the same order on every rank.
  absl::StatusOr<std::function<void()>> StartAllGather(
      const torch::Tensor& shard, torch::Tensor& full);

  // After rank owner[i] has updated params[i], gives every rank its value.
  // Each owner's parameters are flattened into buckets and broadcast from
  // that owner, so each parameter's bytes leave its owner once. Tensors on
  // device(); owner[i] in [0, world_size).
  absl::Status BroadcastFromOwners(std::vector<torch::Tensor>& params,
                                   const std::vector<int>& owner,
                                   int64_t bucket_bytes = kDefaultBucketBytes);

  // OK until a collective fails; then that first failure. The ranks may
  // then disagree on where they are, so the group is unusable: a run
  // should stop (and restart from its checkpoints).
  const absl::Status& failure() const { return failure_; }

  const CollectiveCounters& counters() const { return counters_; }
  void ResetCounters() { counters_ = CollectiveCounters(); }

 private:
  DistContext(const DistEnv& env, torch::Device device);

  absl::Status CheckTensors(const std::vector<torch::Tensor>& tensors,
                            const char* what) const;
  absl::Status AllReduce(std::vector<torch::Tensor>& tensors,
                         int64_t bucket_bytes, bool mean);
  // INVALID_ARGUMENT naming `op` unless `root` is a rank.
  absl::Status CheckRoot(const char* op, int root) const;
  // INVALID_ARGUMENT unless AllGather may gather `shard` into `full`.
  absl::Status CheckGatherTensors(const torch::Tensor& shard,
                                  const torch::Tensor& full) const;
  // Runs `op`, turning a LibTorch or Gloo exception into UNAVAILABLE.
  template <typename Op>
  absl::Status Guarded(const char* name, Op&& op);

  int rank_ = 0;
  int world_size_ = 1;
  torch::Device device_;
  std::string address_;  // MASTER_ADDR:MASTER_PORT, for messages.
  std::chrono::seconds timeout_{0};
  // Declared before comm_ so the group is torn down first.
  std::unique_ptr<C10dStore> store_;
  std::unique_ptr<C10dCollectives> comm_;
  CollectiveCounters counters_;
  absl::Status failure_;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_DIST_PROCESS_GROUP_H_
