// ListCheckpoints' answer: a tenant's job's checkpoints as v1 protos.
//
//   LORAPLEX_RETURN_IF_ERROR(
//       ListJobCheckpoints(context, tenant, job_id, response));
#ifndef LORAPLEX_SERVER_GRPC_CHECKPOINT_LISTING_H_
#define LORAPLEX_SERVER_GRPC_CHECKPOINT_LISTING_H_

#include <string>

#include "absl/status/status.h"
#include "loraplex/v1/jobs.pb.h"
#include "server/edges/service_context.h"

namespace loraplex {

// The tenant's job's checkpoints, oldest first.
absl::Status ListJobCheckpoints(const ServiceContext& context,
                                const std::string& tenant,
                                const std::string& job_id,
                                v1::ListCheckpointsResponse* response);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_CHECKPOINT_LISTING_H_
