#include "core/dist/dist_env.h"

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

constexpr int64_t kMaxTimeoutSeconds = 7 * 24 * 3600;

// Reads an optional integer variable; nullopt when unset.
absl::StatusOr<std::optional<int64_t>> ReadInt(const EnvLookup& lookup,
                                               const std::string& name) {
  std::optional<std::string> text = lookup(name);
  if (!text.has_value()) return std::optional<int64_t>();
  int64_t value = 0;
  if (!absl::SimpleAtoi(*text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be an integer, got '", *text, "'"));
  }
  return std::optional<int64_t>(value);
}

}  // namespace

absl::StatusOr<DistEnv> ParseDistEnv(const EnvLookup& lookup) {
  DistEnv env;
  LORAPLEX_ASSIGN_OR_RETURN(std::optional<int64_t> world,
                            ReadInt(lookup, "WORLD_SIZE"));
  LORAPLEX_ASSIGN_OR_RETURN(std::optional<int64_t> rank,
                            ReadInt(lookup, "RANK"));
  LORAPLEX_ASSIGN_OR_RETURN(std::optional<int64_t> local_rank,
                            ReadInt(lookup, "LOCAL_RANK"));
  LORAPLEX_ASSIGN_OR_RETURN(std::optional<int64_t> port,
                            ReadInt(lookup, "MASTER_PORT"));
  LORAPLEX_ASSIGN_OR_RETURN(std::optional<int64_t> timeout,
                            ReadInt(lookup, "LORAPLEX_DIST_TIMEOUT_SECONDS"));
  std::optional<std::string> addr = lookup("MASTER_ADDR");
  std::optional<std::string> ifname = lookup("GLOO_SOCKET_IFNAME");

  if (timeout.has_value()) {
    if (*timeout < 1 || *timeout > kMaxTimeoutSeconds) {
      return absl::InvalidArgumentError(
          absl::StrCat("LORAPLEX_DIST_TIMEOUT_SECONDS must be in [1, ",
                       kMaxTimeoutSeconds, "], got ", *timeout));
    }
    env.timeout = std::chrono::seconds(*timeout);
  }
  if (ifname.has_value()) env.gloo_socket_ifname = *ifname;

  if (!world.has_value()) {
    if (rank.has_value() || local_rank.has_value() || addr.has_value() ||
        port.has_value()) {
      return absl::InvalidArgumentError(
          "WORLD_SIZE is required when any of RANK, LOCAL_RANK, MASTER_ADDR, "
          "MASTER_PORT is set");
    }
    return env;  // A single process.
  }
  if (*world < 1 || *world > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("WORLD_SIZE must be in [1, 65536], got ", *world));
  }
  env.world_size = static_cast<int>(*world);

  if (!rank.has_value()) {
    if (env.world_size > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("RANK is required when WORLD_SIZE is ", env.world_size));
    }
    rank = 0;
  }
  if (*rank < 0 || *rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK must be in [0, WORLD_SIZE), got ", *rank,
                     " with WORLD_SIZE ", env.world_size));
  }
  env.rank = static_cast<int>(*rank);

  if (!local_rank.has_value()) local_rank = *rank;
  if (*local_rank < 0 || *local_rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("LOCAL_RANK must be in [0, WORLD_SIZE), got ", *local_rank,
                     " with WORLD_SIZE ", env.world_size));
  }
  env.local_rank = static_cast<int>(*local_rank);

  if (env.world_size == 1) {
    // Alone: no store to reach, so the address does not matter.
    if (addr.has_value()) env.master_addr = *addr;
    if (port.has_value()) env.master_port = static_cast<int>(*port);
    return env;
  }
  if (!addr.has_value() || addr->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MASTER_ADDR is required when WORLD_SIZE is ", env.world_size));
  }
  env.master_addr = *addr;
  if (!port.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MASTER_PORT is required when WORLD_SIZE is ", env.world_size));
  }
  if (*port < 1 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT must be in [1, 65535], got ", *port));
  }
  env.master_port = static_cast<int>(*port);
  return env;
}

absl::StatusOr<DistEnv> DistEnvFromProcess() {
  return ParseDistEnv(
      [](const std::string& name) -> std::optional<std::string> {
        const char* value = std::getenv(name.c_str());
        if (value == nullptr) return std::nullopt;
        return std::string(value);
      });
}

EnvLookup EnvLookupFromMap(std::map<std::string, std::string> variables) {
  return [variables = std::move(variables)](
             const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace loraplex
