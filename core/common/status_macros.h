// Status propagation helpers used across module boundaries.
//
// The abseil shipped by Debian has no public status macros, so loraplex
// defines its own:
//
//   LORAPLEX_RETURN_IF_ERROR(DoThing());
//   LORAPLEX_ASSIGN_OR_RETURN(auto value, ComputeValue());
#ifndef LORAPLEX_CORE_COMMON_STATUS_MACROS_H_
#define LORAPLEX_CORE_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LORAPLEX_STATUS_CONCAT_INNER_(a, b) a##b
#define LORAPLEX_STATUS_CONCAT_(a, b) LORAPLEX_STATUS_CONCAT_INNER_(a, b)

#define LORAPLEX_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::absl::Status loraplex_status_ = (expr);            \
    if (!loraplex_status_.ok()) return loraplex_status_; \
  } while (false)

#define LORAPLEX_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                    \
  if (!statusor.ok()) return statusor.status();               \
  lhs = std::move(statusor).value()

#define LORAPLEX_ASSIGN_OR_RETURN(lhs, rexpr) \
  LORAPLEX_ASSIGN_OR_RETURN_IMPL_(            \
      LORAPLEX_STATUS_CONCAT_(loraplex_statusor_, __LINE__), lhs, rexpr)

#endif  // LORAPLEX_CORE_COMMON_STATUS_MACROS_H_
