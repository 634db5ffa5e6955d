// The trainer's parts as its commands see them (trainer_commands.h): a
// command's hooks get this and hand the command to the part it concerns.
// The references are the Trainer's own members, used on its thread (and a
// command's ReadFiles, which uses only the jobs' checkpoint writer, on the
// writer's).
#ifndef LORAPLEX_SERVER_TRAINER_TRAINER_PARTS_H_
#define LORAPLEX_SERVER_TRAINER_TRAINER_PARTS_H_

#include "adapters/slot_pool.h"
#include "server/trainer/job_slots.h"
#include "server/trainer/rank_coordinator.h"
#include "server/trainer/sampling_runner.h"
#include "server/trainer/session_slots.h"

namespace loraplex {

struct TrainerParts {
  SlotPool& pool;
  RankCoordinator& ranks;
  JobSlots& jobs;
  SessionSlots& sessions;
  SamplingRunner& sampling;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_TRAINER_PARTS_H_
