// The sharding of a frozen base (core/model/sharded_base.h) over the ranks
// of a process group: its rank, world size, all-gather (also started
// without waiting, so the next layer's gather overlaps compute) and
// broadcast.
//
//   LORAPLEX_ASSIGN_OR_RETURN(auto model,
//       LlamaModel::Load(dir, {.shard_base = BaseShardingOver(dist)}));
#ifndef LORAPLEX_CORE_DIST_BASE_SHARDING_H_
#define LORAPLEX_CORE_DIST_BASE_SHARDING_H_

#include "core/dist/process_group.h"
#include "core/model/sharded_base.h"

namespace loraplex {

// `dist` must outlive the sharding and the model loaded with it. Its
// functions throw (c10::Error) with the collective's error when it fails.
BaseSharding BaseShardingOver(DistContext& dist);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_DIST_BASE_SHARDING_H_
