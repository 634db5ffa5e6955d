#include "server/grpc/request_ids.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/common/clock.h"

namespace loraplex {

absl::StatusOr<std::optional<RequestKey>> RequestKeyOf(
    const std::string& tenant, absl::string_view method,
    const std::string& request_id, absl::string_view field) {
  if (request_id.empty()) return std::nullopt;
  constexpr size_t kMaxBytes = 128;
  const bool printable =
      std::all_of(request_id.begin(), request_id.end(),
                  [](char c) { return c >= 0x21 && c <= 0x7e; });
  if (request_id.size() > kMaxBytes || !printable) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be at most ", kMaxBytes,
                     " printable ASCII characters without spaces"));
  }
  return RequestKey{tenant, std::string(method), request_id};
}

absl::StatusOr<std::optional<std::string>> EarlierResult(
    const ServiceContext& context, const std::optional<RequestKey>& key) {
  if (!key) return std::nullopt;
  absl::StatusOr<std::string> id =
      context.store->FindRequest(*key, NowMillis());
  if (absl::IsNotFound(id.status())) return std::nullopt;
  if (!id.ok()) return id.status();
  return *id;
}

}  // namespace loraplex
