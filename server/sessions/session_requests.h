// A forward_backward call as both API edges parse it (the v1 gRPC
// TrainingSessionService from its proto, the Tinker REST API from its
// protobuf body), and its one check against the server's limits into the
// SessionManager's request. No protobuf here.
//
//   ForwardBackwardInput input;  // filled at the edge
//   input.loss_fn = "cross_entropy";
//   input.data.push_back(std::move(datum));
//   LORAPLEX_ASSIGN_OR_RETURN(
//       SessionRequest request,
//       SessionForwardBackwardOf(context, std::move(input)));
#ifndef LORAPLEX_SERVER_SESSIONS_SESSION_REQUESTS_H_
#define LORAPLEX_SERVER_SESSIONS_SESSION_REQUESTS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/train/loss_fn.h"
#include "server/sessions/session_manager.h"

namespace loraplex {

struct ServiceContext;

// One forward_backward (or forward) call, unchecked.
struct ForwardBackwardInput {
  // "cross_entropy", "importance_sampling", "ppo", "cispo" or "dro", and
  // its settings (LossFnSpecOf).
  std::string loss_fn;
  std::map<std::string, double> loss_fn_config;
  // Outputs only: no gradients.
  bool forward_only = false;
  std::vector<Datum> data;
};

// The SessionManager's request for `input`, its datums checked against
// `limits` for its loss and counted against `max_datums`. Errors are
// INVALID_ARGUMENT naming the field ("data[2].loss_fn_inputs.weights:
// ...", "loss_fn_config.beta ...").
absl::StatusOr<SessionRequest> ForwardBackwardRequestOf(
    ForwardBackwardInput input, const DatumLimits& limits, int64_t max_datums);

// ForwardBackwardRequestOf with the server's limits: the model's
// vocabulary and positions, datums and tokens per call, and (for a
// backward) tokens per row.
absl::StatusOr<SessionRequest> SessionForwardBackwardOf(
    const ServiceContext& context, ForwardBackwardInput input);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_SESSIONS_SESSION_REQUESTS_H_
