#include "core/dist/base_sharding.h"

#include <c10/util/Exception.h>

namespace loraplex {

BaseSharding BaseShardingOver(DistContext& dist) {
  BaseSharding sharding;
  sharding.rank = dist.rank();
  sharding.world_size = dist.world_size();
  sharding.all_gather = [&dist](const torch::Tensor& shard,
                                torch::Tensor& full) {
    const absl::Status status = dist.AllGather(shard, full);
    TORCH_CHECK(status.ok(), status.ToString());
  };
  sharding.start_all_gather = [&dist](const torch::Tensor& shard,
                                      torch::Tensor& full) {
    absl::StatusOr<std::function<void()>> wait =
        dist.StartAllGather(shard, full);
    TORCH_CHECK(wait.ok(), wait.status().ToString());
    return *std::move(wait);
  };
  sharding.broadcast_from_rank0 = [&dist](int64_t& value) {
    const absl::Status status = dist.BroadcastValue(&value, 0);
    TORCH_CHECK(status.ok(), status.ToString());
  };
  return sharding;
}

}  // namespace loraplex
