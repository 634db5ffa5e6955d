#include "core/common/resource_names.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/common/quoted.h"

namespace loraplex {
namespace {

// "job" for "jobs": how error messages call one member of a collection.
absl::string_view Singular(absl::string_view collection) {
  if (!collection.empty() && collection.back() == 's') {
    collection.remove_suffix(1);
  }
  return collection;
}

}  // namespace

bool IsResourceId(absl::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '-') {
      return false;
    }
  }
  return true;
}

std::string FormatResourceName(absl::string_view collection,
                               absl::string_view id) {
  return absl::StrCat(collection, "/", id);
}

absl::StatusOr<std::string> ParseResourceName(absl::string_view name,
                                              absl::string_view collection,
                                              absl::string_view field) {
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is required"));
  }
  absl::string_view id = name;
  if (absl::ConsumePrefix(&id, collection) && absl::ConsumePrefix(&id, "/") &&
      IsResourceId(id)) {
    return std::string(id);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be a name like \"", collection,
                   "/{id}\", got ", Quoted(name)));
}

std::string CheckpointResourceName(const std::string& job_id, int64_t step) {
  return absl::StrCat(kJobs, "/", job_id, "/", kCheckpoints, "/", step);
}

absl::StatusOr<CheckpointRef> ParseCheckpointName(absl::string_view name,
                                                  absl::string_view field) {
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is required"));
  }
  absl::string_view rest = name;
  CheckpointRef parsed;
  const size_t slash = rest.find('/', 5);
  if (absl::ConsumePrefix(&rest, "jobs/") && slash != absl::string_view::npos) {
    const absl::string_view id = rest.substr(0, slash - 5);
    rest.remove_prefix(id.size());
    if (IsResourceId(id) && absl::ConsumePrefix(&rest, "/checkpoints/") &&
        !rest.empty() && rest.size() <= 18 &&
        rest.find_first_not_of("0123456789") == absl::string_view::npos &&
        absl::SimpleAtoi(rest, &parsed.step)) {
      parsed.job_id = std::string(id);
      return parsed;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, " must be a name like \"jobs/{id}/checkpoints/{step}\", got ",
      Quoted(name)));
}

absl::StatusOr<std::string> ResourceName(absl::string_view collection,
                                         absl::string_view id_or_name) {
  const std::string expected =
      absl::StrCat("expected a ", Singular(collection), " ID or ", collection,
                   "/{id}, got \"", id_or_name, "\"");
  if (id_or_name.empty()) return absl::InvalidArgumentError(expected);
  absl::string_view id = id_or_name;
  const size_t slash = id_or_name.find('/');
  if (slash != absl::string_view::npos) {
    if (id_or_name.substr(0, slash) != collection) {
      return absl::InvalidArgumentError(expected);
    }
    id = id_or_name.substr(slash + 1);
  }
  if (id.empty() || id.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(expected);
  }
  return absl::StrCat(collection, "/", id);
}

absl::StatusOr<std::string> CheckpointName(absl::string_view name) {
  const std::string expected = absl::StrCat(
      "expected a checkpoint jobs/{id}/checkpoints/{step}, got \"", name, "\"");
  std::vector<absl::string_view> parts = absl::StrSplit(name, '/');
  // Without the "jobs/" prefix, the name starts at the job ID.
  if (parts.size() == 4 && parts[0] == kJobs) parts.erase(parts.begin());
  if (parts.size() != 3 || parts[0].empty() || parts[1] != kCheckpoints) {
    return absl::InvalidArgumentError(expected);
  }
  const absl::string_view step_text = parts[2];
  int64_t step = 0;
  bool digits = !step_text.empty();
  for (char c : step_text) digits = digits && absl::ascii_isdigit(c);
  if (!digits || !absl::SimpleAtoi(step_text, &step)) {
    return absl::InvalidArgumentError(expected);
  }
  return absl::StrCat(kJobs, "/", parts[0], "/", kCheckpoints, "/", step);
}

std::string ResourceId(absl::string_view name) {
  const size_t slash = name.rfind('/');
  if (slash == absl::string_view::npos) return std::string(name);
  return std::string(name.substr(slash + 1));
}

std::string ResourceCollection(absl::string_view name) {
  const size_t slash = name.find('/');
  if (slash == absl::string_view::npos) return "";
  return std::string(name.substr(0, slash));
}

}  // namespace loraplex
