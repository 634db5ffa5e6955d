// Who is calling: maps the bearer token of a call to its tenant.
//
//   LORAPLEX_ASSIGN_OR_RETURN(TenantAuthenticator auth,
//                             TenantAuthenticator::FromTokensFile(path));
//   LORAPLEX_ASSIGN_OR_RETURN(std::string tenant,
//                             auth.Authenticate(context->client_metadata()));
//
// The tokens file has one `<tenant> <token>` pair per line; blank lines
// and lines starting with '#' are ignored. Without a tokens file the
// server has one tenant, "default", and every caller is it (local use).
#ifndef LORAPLEX_SERVER_EDGES_TENANT_AUTH_H_
#define LORAPLEX_SERVER_EDGES_TENANT_AUTH_H_

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loraplex {

inline constexpr absl::string_view kDefaultTenant = "default";

class TenantAuthenticator {
 public:
  // Every caller is kDefaultTenant.
  static TenantAuthenticator SingleTenant();
  // INVALID_ARGUMENT naming the file and line for a malformed line, a
  // repeated token, a token shorter than 16 characters, or no token at all.
  static absl::StatusOr<TenantAuthenticator> FromTokensFile(
      const std::string& path);
  static absl::StatusOr<TenantAuthenticator> FromTokensText(
      absl::string_view text, absl::string_view label);

  bool requires_tokens() const { return !tenants_by_token_.empty(); }
  // UNAUTHENTICATED when tokens are required and the call has no
  // `authorization: Bearer <token>` metadata or an unknown token. A gRPC
  // call's client_metadata(): a template only so that no gRPC header is
  // needed here (the HTTP edges include this).
  template <typename Metadata>
  absl::StatusOr<std::string> Authenticate(const Metadata& metadata) const {
    std::optional<std::string> value;
    auto it = metadata.find("authorization");
    if (it != metadata.end()) {
      value = std::string(it->second.data(), it->second.size());
    }
    return AuthenticateMetadata(value);
  }
  // The same for the `authorization` metadata's value (std::nullopt: none
  // sent).
  absl::StatusOr<std::string> AuthenticateMetadata(
      const std::optional<std::string>& authorization) const;
  // The same for an HTTP call's `X-API-Key` header (std::nullopt: none
  // sent), as the Tinker SDK sends it.
  absl::StatusOr<std::string> AuthenticateApiKey(
      const std::optional<std::string>& api_key) const;
  // The same for an HTTP call's `Authorization: Bearer <token>` header (the
  // header's value; std::nullopt: none sent), as OpenAI clients send it.
  absl::StatusOr<std::string> AuthenticateBearer(
      const std::optional<std::string>& authorization) const;

 private:
  absl::StatusOr<std::string> TenantOf(absl::string_view token) const;
  // `value` as "Bearer <token>" (any case); `where` names it in errors.
  absl::StatusOr<std::string> TenantOfBearer(absl::string_view value,
                                             absl::string_view where) const;

  std::map<std::string, std::string, std::less<>> tenants_by_token_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_EDGES_TENANT_AUTH_H_
