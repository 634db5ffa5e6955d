// The launch description of one training process, read from the variables
// torchrun sets (docs/DESIGN.md §6).
//
//   LORAPLEX_ASSIGN_OR_RETURN(DistEnv env, DistEnvFromProcess());
//   if (env.distributed()) { ... DistContext::Create(env, device) ... }
//
// With none of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set
// the process runs alone (world size 1). Parsing takes the environment as a
// lookup function so tests need not touch the real one.
#ifndef LORAPLEX_CORE_DIST_DIST_ENV_H_
#define LORAPLEX_CORE_DIST_DIST_ENV_H_

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace loraplex {

struct DistEnv {
  int rank = 0;        // RANK, in [0, world_size).
  int world_size = 1;  // WORLD_SIZE, >= 1.
  int local_rank = 0;  // LOCAL_RANK (selects the accelerator); RANK if unset.
  std::string master_addr;  // MASTER_ADDR, host of rank 0's store.
  int master_port = 0;      // MASTER_PORT, in [1, 65535].
  // LORAPLEX_DIST_TIMEOUT_SECONDS: how long the rendezvous and each
  // collective may wait for a peer before failing.
  std::chrono::seconds timeout{300};
  // GLOO_SOCKET_IFNAME: the network interface Gloo binds to when
  // MASTER_ADDR is not a loopback address. Empty: the host's default.
  std::string gloo_socket_ifname;

  bool distributed() const { return world_size > 1; }
};

// Returns the value of an environment variable, or nullopt when unset.
using EnvLookup =
    std::function<std::optional<std::string>(const std::string& name)>;

// Parses and validates the launch variables. Errors are INVALID_ARGUMENT and
// name the variable, e.g. "RANK must be in [0, WORLD_SIZE), got 3".
absl::StatusOr<DistEnv> ParseDistEnv(const EnvLookup& lookup);

// ParseDistEnv over this process's environment.
absl::StatusOr<DistEnv> DistEnvFromProcess();

// A lookup over a fixed set of variables (for tests and embedding).
EnvLookup EnvLookupFromMap(std::map<std::string, std::string> variables);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_DIST_DIST_ENV_H_
