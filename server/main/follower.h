// A rank other than 0 of a multi-process run (README.md, "Multi-process
// runs"): it serves no API and keeps no store or files; it loads the same
// base, joins the process group and trains its share of every step as rank
// 0's plans say, until rank 0 stops.
//
//   if (env.rank > 0) return FollowRankZero(flags, env, logger);
#ifndef LORAPLEX_SERVER_MAIN_FOLLOWER_H_
#define LORAPLEX_SERVER_MAIN_FOLLOWER_H_

#include "core/dist/dist_env.h"
#include "server/common/logger.h"
#include "server/main/server_flags.h"

namespace loraplex {

// Follows rank 0 until it stops. Returns the exit code: 0 once rank 0 has
// stopped, 2 for an INVALID_ARGUMENT start-up failure, 1 otherwise.
// SIGINT and SIGTERM are not acted on: this rank stops when rank 0 does.
int FollowRankZero(const ServerFlags& flags, const DistEnv& env,
                   Logger& logger);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_MAIN_FOLLOWER_H_
