// Client request ids (idempotent retries): a CreateJob, UploadDataset or
// AttachAdapter that carries a request_id is recorded with what it
// created (JobStore::RequestKey), and a repeat answers with that.
//
//   LORAPLEX_ASSIGN_OR_RETURN(std::optional<RequestKey> key,
//       RequestKeyOf(tenant, "CreateJob", request.request_id(), "request_id"));
//   LORAPLEX_ASSIGN_OR_RETURN(std::optional<std::string> earlier,
//                             EarlierResult(context, key));
#ifndef LORAPLEX_SERVER_GRPC_REQUEST_IDS_H_
#define LORAPLEX_SERVER_GRPC_REQUEST_IDS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/grpc/unary_calls.h"
#include "server/store/job_store.h"

namespace loraplex {

// The key of `request_id` (nullopt when empty); INVALID_ARGUMENT naming
// `field` unless it is at most 128 printable ASCII characters.
absl::StatusOr<std::optional<RequestKey>> RequestKeyOf(
    const std::string& tenant, absl::string_view method,
    const std::string& request_id, absl::string_view field);

// The id of what the request `key` created earlier, or nullopt (also for
// no key).
absl::StatusOr<std::optional<std::string>> EarlierResult(
    const ServiceContext& context, const std::optional<RequestKey>& key);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_REQUEST_IDS_H_
