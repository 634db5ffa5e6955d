#include "server/edges/tenant_auth.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/common/read_file.h"

namespace loraplex {

TenantAuthenticator TenantAuthenticator::SingleTenant() { return {}; }

absl::StatusOr<TenantAuthenticator> TenantAuthenticator::FromTokensFile(
    const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat("the tokens file ", text.status().message()));
  }
  return FromTokensText(*text, path);
}

absl::StatusOr<TenantAuthenticator> TenantAuthenticator::FromTokensText(
    absl::string_view text, absl::string_view label) {
  TenantAuthenticator auth;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto invalid = [&](absl::string_view reason) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, " line ", line_number, ": ", reason));
    };
    if (parts.size() != 2) return invalid("expected \"<tenant> <token>\"");
    for (char c : parts[0]) {
      if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.') {
        return invalid(
            "a tenant name may only hold letters, digits, '-', "
            "'_' and '.'");
      }
    }
    if (parts[1].size() < 16) {
      return invalid("tokens must be at least 16 characters long");
    }
    if (!auth.tenants_by_token_.emplace(parts[1], parts[0]).second) {
      return invalid("this token is already given to another line");
    }
  }
  if (auth.tenants_by_token_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, " holds no \"<tenant> <token>\" line"));
  }
  return auth;
}

absl::StatusOr<std::string> TenantAuthenticator::AuthenticateMetadata(
    const std::optional<std::string>& authorization) const {
  if (tenants_by_token_.empty()) return std::string(kDefaultTenant);
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "this server requires a token: send the metadata "
        "\"authorization: Bearer <token>\"");
  }
  return TenantOfBearer(*authorization, "authorization metadata");
}

absl::StatusOr<std::string> TenantAuthenticator::AuthenticateApiKey(
    const std::optional<std::string>& api_key) const {
  if (tenants_by_token_.empty()) return std::string(kDefaultTenant);
  if (!api_key.has_value()) {
    return absl::UnauthenticatedError(
        "this server requires a key: send the header \"X-API-Key: <token>\"");
  }
  return TenantOf(*api_key);
}

absl::StatusOr<std::string> TenantAuthenticator::AuthenticateBearer(
    const std::optional<std::string>& authorization) const {
  if (tenants_by_token_.empty()) return std::string(kDefaultTenant);
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "this server requires a key: send the header \"Authorization: "
        "Bearer <token>\"");
  }
  return TenantOfBearer(*authorization, "Authorization header");
}

absl::StatusOr<std::string> TenantAuthenticator::TenantOfBearer(
    absl::string_view value, absl::string_view where) const {
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWithIgnoreCase(value, kBearer)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the ", where, " must read \"Bearer <token>\""));
  }
  value.remove_prefix(kBearer.size());
  return TenantOf(value);
}

absl::StatusOr<std::string> TenantAuthenticator::TenantOf(
    absl::string_view token) const {
  auto tenant = tenants_by_token_.find(absl::StripAsciiWhitespace(token));
  if (tenant == tenants_by_token_.end()) {
    return absl::UnauthenticatedError("unknown token");
  }
  return tenant->second;
}

}  // namespace loraplex
