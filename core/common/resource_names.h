// Resource names of the loraplex API ("datasets/{id}", "jobs/{id}",
// "adapters/{id}", "jobs/{id}/checkpoints/{step}"), for both ends: the
// server formats and strictly parses them (errors name the request field),
// the client builds them from what a user types (a bare ID or a full name).
//
//   FormatResourceName(kJobs, "abc");                       // "jobs/abc"
//   ParseResourceName("jobs/abc", kJobs, "name");           // "abc"
//   LORAPLEX_ASSIGN_OR_RETURN(std::string name,
//                             ResourceName(kJobs, "abc"));  // "jobs/abc"
//   ResourceId("jobs/abc");                                 // "abc"
//   CheckpointName("abc/checkpoints/40");  // "jobs/abc/checkpoints/40"
#ifndef LORAPLEX_CORE_COMMON_RESOURCE_NAMES_H_
#define LORAPLEX_CORE_COMMON_RESOURCE_NAMES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loraplex {

// Collection prefixes of resource names.
inline constexpr absl::string_view kDatasets = "datasets";
inline constexpr absl::string_view kJobs = "jobs";
inline constexpr absl::string_view kAdapters = "adapters";
inline constexpr absl::string_view kSessions = "sessions";
inline constexpr absl::string_view kSessionStates = "session_states";
// A job's checkpoints: "jobs/{id}/checkpoints/{step}".
inline constexpr absl::string_view kCheckpoints = "checkpoints";

// Whether `id` is a valid resource ID: 1 to 64 of [a-z0-9-].
bool IsResourceId(absl::string_view id);

// "jobs/abc" for ("jobs", "abc").
std::string FormatResourceName(absl::string_view collection,
                               absl::string_view id);
// The id of `name` ("{collection}/{id}", a valid ID). Errors are
// INVALID_ARGUMENT naming `field`: "training_dataset is required" for an
// empty name, else 'training_dataset must be a name like "datasets/{id}",
// got "foo"'.
absl::StatusOr<std::string> ParseResourceName(absl::string_view name,
                                              absl::string_view collection,
                                              absl::string_view field);

// "jobs/{job_id}/checkpoints/{step}", parsed.
struct CheckpointRef {
  std::string job_id;
  int64_t step = 0;
};
std::string CheckpointResourceName(const std::string& job_id, int64_t step);
// INVALID_ARGUMENT naming `field` for an empty or malformed name.
absl::StatusOr<CheckpointRef> ParseCheckpointName(absl::string_view name,
                                                  absl::string_view field);

// From a user: "collection/id" for `id_or_name` given as "id" or
// "collection/id".
// INVALID_ARGUMENT when it is empty, names another collection
// ("datasets/x" where a job is wanted) or has an empty or nested ID.
absl::StatusOr<std::string> ResourceName(absl::string_view collection,
                                         absl::string_view id_or_name);

// "jobs/{id}/checkpoints/{step}" for `name` given as that or as
// "{id}/checkpoints/{step}" (the job's bare ID). INVALID_ARGUMENT unless
// the job ID is a valid one and the step a non-negative decimal integer.
absl::StatusOr<std::string> CheckpointName(absl::string_view name);

// The ID part of a resource name ("jobs/abc" -> "abc"); a string without
// '/' is returned as is.
std::string ResourceId(absl::string_view name);

// The collection of a name ("jobs/abc" -> "jobs"); "" for a bare ID.
std::string ResourceCollection(absl::string_view name);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_COMMON_RESOURCE_NAMES_H_
