#include "server/engine/pool_checkpointer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/runtime/exception_message.h"

namespace loraplex {

PoolCheckpointer::PoolCheckpointer(PoolCheckpointerOptions options)
    : options_(std::move(options)) {}

void PoolCheckpointer::LoadGroup() {
  if (options_.root.empty()) return;
  group_ = ReadPoolCheckpoint(options_.root)
               .value_or(std::map<std::string, int64_t>{});
}

std::string PoolCheckpointer::JobDir(const std::string& job_id) const {
  return absl::StrCat(options_.root, "/", job_id);
}

std::string PoolCheckpointer::StepDir(const std::string& job_id,
                                      int64_t step) const {
  return CheckpointDir(JobDir(job_id), step);
}

int64_t PoolCheckpointer::ResumeCap(const std::string& job_id,
                                    bool recovering) const {
  auto pooled = group_.find(job_id);
  return recovering && pooled != group_.end() ? pooled->second : INT64_MAX;
}

int PoolCheckpointer::SlotHint(const std::string& job_id,
                               bool recovering) const {
  if (!enabled()) return -1;
  return CheckpointSlotHint(JobDir(job_id), ResumeCap(job_id, recovering));
}

absl::StatusOr<std::optional<PoolCheckpointer::ResumePoint>>
PoolCheckpointer::FindResumePoint(const std::string& job_id, bool recovering,
                                  std::vector<std::string>* rejected) const {
  if (!enabled()) return std::nullopt;
  const std::optional<CheckpointEntry> latest = LatestValidCheckpoint(
      JobDir(job_id), rejected, ResumeCap(job_id, recovering));
  if (!latest) return std::nullopt;
  ResumePoint point;
  point.dir = latest->dir;
  LORAPLEX_ASSIGN_OR_RETURN(point.info, ReadCheckpointInfo(latest->dir));
  if (point.info.job_id != job_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", latest->dir, " belongs to job ", point.info.job_id));
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      point.training_state,
      ReadCheckpointFile(latest->dir, kCheckpointStateFile));
  return point;
}

void PoolCheckpointer::DropAfter(const std::string& job_id,
                                 int64_t step) const {
  if (enabled()) RemoveCheckpointsAfter(JobDir(job_id), step);
}

absl::Status PoolCheckpointer::Write(const TrainingSlot& slot,
                                     const CheckpointInfo& info,
                                     const std::string& training_state) const {
  auto pooled = group_.find(info.job_id);
  const int64_t keep_step = pooled == group_.end() ? -1 : pooled->second;
  return CatchTorch("checkpoint", [&] {
    return WriteCheckpoint(JobDir(info.job_id), slot, info, training_state,
                           options_.base_model_name, options_.keep, keep_step);
  });
}

void PoolCheckpointer::Forget(const std::string& job_id) {
  if (group_.erase(job_id) > 0) SaveGroup();
}

void PoolCheckpointer::RecordGroup(
    const std::vector<std::string>& held,
    const std::map<std::string, int64_t>& checkpointed) {
  for (const std::string& job_id : held) group_.erase(job_id);
  for (const auto& [job_id, step] : checkpointed) group_[job_id] = step;
  SaveGroup();
}

void PoolCheckpointer::SaveGroup() const {
  // On failure the previous group stays on disk: still consistent, older.
  CatchTorch("pool checkpoint", [&] {
    return WritePoolCheckpoint(options_.root, group_);
  }).IgnoreError();
}

}  // namespace loraplex
