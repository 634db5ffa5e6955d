// Where rank 0 alone runs forwards of the base (validation, sampling) in a
// data-parallel run over a sharded base (docs/DESIGN.md §18): every rank
// opens one at the same point of its iteration; rank 0 then runs its
// forwards, each layer it gathers gathered by every rank, while the other
// ranks wait in the constructor serving those gathers until rank 0's scope
// ends. With a whole base, or alone, it does nothing.
//
//   {
//     LeaderForwards forwards(*model_, ranks_);
//     sampling_.Run(...);  // forwards on rank 0 only; no collectives
//   }
//
// Between the constructor and the end of rank 0's scope, no rank may run a
// collective of its own.
#ifndef LORAPLEX_SERVER_TRAINER_LEADER_FORWARDS_H_
#define LORAPLEX_SERVER_TRAINER_LEADER_FORWARDS_H_

#include <optional>

#include "core/model/llama_model.h"
#include "core/model/sharded_base.h"
#include "server/trainer/rank_coordinator.h"

namespace loraplex {

class LeaderForwards {
 public:
  // Other ranks: returns once rank 0's scope has ended; a failure is
  // recorded in `ranks`.
  LeaderForwards(const LlamaModel& model, RankCoordinator& ranks);
  // Rank 0: ends the scope; a failure is recorded in `ranks`.
  ~LeaderForwards();
  LeaderForwards(const LeaderForwards&) = delete;
  LeaderForwards& operator=(const LeaderForwards&) = delete;

 private:
  RankCoordinator& ranks_;
  std::optional<ShardedBase::Leading> leading_;  // Rank 0 only.
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_LEADER_FORWARDS_H_
