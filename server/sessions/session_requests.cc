#include "server/sessions/session_requests.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "server/edges/service_context.h"

namespace loraplex {

absl::StatusOr<SessionRequest> ForwardBackwardRequestOf(
    ForwardBackwardInput input, const DatumLimits& limits, int64_t max_datums) {
  SessionRequest native;
  native.kind = input.forward_only ? SessionOp::Kind::kForward
                                   : SessionOp::Kind::kForwardBackward;
  LORAPLEX_ASSIGN_OR_RETURN(native.loss,
                            LossFnSpecOf(input.loss_fn, input.loss_fn_config));
  const int64_t datums = static_cast<int64_t>(input.data.size());
  if (datums == 0) {
    return absl::InvalidArgumentError("data must have at least one datum");
  }
  if (datums > max_datums) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data has ", datums, " datums; this server takes at most ", max_datums,
        " per call (send the rest in further calls: their "
        "gradients add up)"));
  }
  for (int64_t i = 0; i < datums; ++i) {
    LORAPLEX_RETURN_IF_ERROR(ValidateDatum(input.data[i], native.loss, limits,
                                           absl::StrCat("data[", i, "].")));
  }
  native.data = std::make_shared<std::vector<Datum>>(std::move(input.data));
  return native;
}

absl::StatusOr<SessionRequest> SessionForwardBackwardOf(
    const ServiceContext& context, ForwardBackwardInput input) {
  DatumLimits limits;
  limits.vocab_size = context.model.vocab_size;
  limits.max_positions = context.model.max_position_embeddings;
  // A forward alone keeps no activations: only a backward is bounded.
  if (!input.forward_only) {
    limits.max_row_tokens = context.limits.max_row_tokens;
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      SessionRequest native,
      ForwardBackwardRequestOf(std::move(input), limits,
                               context.limits.max_session_datums));
  int64_t tokens = 0;
  for (const Datum& datum : *native.data) tokens += datum.positions();
  if (tokens > context.limits.max_session_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data has ", tokens, " tokens; this server takes at most ",
        context.limits.max_session_tokens,
        " per call (send the rest in further calls: their gradients add up)"));
  }
  return native;
}

}  // namespace loraplex
