// The trainer's checkpoint policy and files (DESIGN.md §7): where each
// job's checkpoints go, when the pool is due one, which checkpoint a job
// resumes from, and the pool's last complete checkpoint group.
//
// Checkpoints are pool-consistent: when a step completes a multiple of any
// job's interval, every training slot is checkpointed at that same step
// boundary and the group is recorded in <root>/pool.json. A job requeued
// by a restart resumes from its step in that group, not from a newer
// checkpoint of a group the crash cut short, so jobs resumed together
// train in the same co-batches as before and replay bit-exactly.
//
//   PoolCheckpointer checkpoints(
//       {.root = dir, .interval = 50, .enabled = true});
//   checkpoints.LoadGroup();                       // rank 0, at start
//   auto resume = checkpoints.FindResumePoint(job_id, recovering, &why);
//   ... every slot checkpointed: checkpoints.RecordGroup(held, steps) ...
//
// Used on the trainer thread only.
#ifndef LORAPLEX_SERVER_ENGINE_POOL_CHECKPOINTER_H_
#define LORAPLEX_SERVER_ENGINE_POOL_CHECKPOINTER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/train/training_slot.h"
#include "server/engine/checkpoint.h"

namespace loraplex {

struct PoolCheckpointerOptions {
  // Checkpoints go to <root>/<job id>/; empty: none are taken.
  std::string root;
  // Steps between checkpoints of jobs whose config leaves it at 0; 0: only
  // on pause, retire and stop.
  int64_t interval = 0;
  // Checkpoints kept per job (the newest).
  int keep = 3;
  // base_model_name_or_path written into the checkpoints' adapter configs.
  std::string base_model_name;
  // Whether checkpoints are taken: on rank 0, when `root` is set; on the
  // other ranks (which write nothing, their root is unused), when rank 0
  // takes them: they take part in gathering the optimizer state.
  bool enabled = false;
};

class PoolCheckpointer {
 public:
  explicit PoolCheckpointer(PoolCheckpointerOptions options);

  bool enabled() const { return options_.enabled; }
  // Reads pool.json; a damaged one is ignored (each job then resumes from
  // its newest valid checkpoint).
  void LoadGroup();

  std::string JobDir(const std::string& job_id) const;
  // The checkpoint directory of the job at `step`.
  std::string StepDir(const std::string& job_id, int64_t step) const;
  // A job's checkpoint interval: its own, else the default.
  int64_t IntervalFor(int64_t job_interval) const {
    return job_interval > 0 ? job_interval : options_.interval;
  }

  // The slot the job's checkpoint to resume was taken in, or -1.
  int SlotHint(const std::string& job_id, bool recovering) const;
  struct ResumePoint {
    std::string dir;
    CheckpointInfo info;
    std::string training_state;  // training_state.pt's bytes.
  };
  // The checkpoint to resume the job from: the newest that verifies (after
  // a crash, up to its step in the pool's group); none when it has none.
  // The newer ones that do not verify are described in `rejected`.
  absl::StatusOr<std::optional<ResumePoint>> FindResumePoint(
      const std::string& job_id, bool recovering,
      std::vector<std::string>* rejected) const;
  // Deletes the job's checkpoints after `step`: a run a crash abandoned.
  void DropAfter(const std::string& job_id, int64_t step) const;

  // Writes the slot's checkpoint (WriteCheckpoint), pruning old ones but
  // never the one of the job's step in the pool's group.
  absl::Status Write(const TrainingSlot& slot, const CheckpointInfo& info,
                     const std::string& training_state) const;

  // The job left the pool: it is no longer part of the group.
  void Forget(const std::string& job_id);
  // A new complete group at this step boundary: the entries of the jobs in
  // `held` (every job in a slot now) are replaced by `checkpointed` (job ->
  // step of those whose checkpoint was written); others (recovered jobs
  // waiting for a slot) keep theirs.
  void RecordGroup(const std::vector<std::string>& held,
                   const std::map<std::string, int64_t>& checkpointed);

 private:
  // The newest step the job may resume from.
  int64_t ResumeCap(const std::string& job_id, bool recovering) const;
  void SaveGroup() const;

  PoolCheckpointerOptions options_;
  // The jobs of the pool's last complete checkpoint and their steps.
  std::map<std::string, int64_t> group_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_ENGINE_POOL_CHECKPOINTER_H_
