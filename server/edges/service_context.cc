#include "server/edges/service_context.h"

#include "absl/strings/str_cat.h"

namespace loraplex {

absl::StatusOr<int> PageSize(int requested) {
  if (requested < 0 || requested > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be in [0, 1000], got ", requested));
  }
  return requested == 0 ? 100 : requested;
}

absl::Status CheckDisplayName(const std::string& value,
                              absl::string_view field) {
  if (value.size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be at most 256 bytes, got ", value.size()));
  }
  return absl::OkStatus();
}

}  // namespace loraplex
