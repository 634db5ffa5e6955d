#include "server/grpc/checkpoint_listing.h"

#include "core/common/status_macros.h"
#include "server/checkpoints/checkpoint_files.h"
#include "server/grpc/proto_convert.h"

namespace loraplex {
namespace {

void SetTimestamp(int64_t time_ms, google::protobuf::Timestamp* time) {
  time->set_seconds(time_ms / 1000);
  time->set_nanos(static_cast<int32_t>(time_ms % 1000) * 1000000);
}

}  // namespace

absl::Status ListJobCheckpoints(const ServiceContext& context,
                                const std::string& tenant,
                                const std::string& job_id,
                                v1::ListCheckpointsResponse* response) {
  LORAPLEX_RETURN_IF_ERROR(context.store->GetJob(tenant, job_id).status());
  for (const CheckpointEntry& entry :
       ListCheckpoints(context.scheduler->CheckpointDir(job_id))) {
    absl::StatusOr<CheckpointInfo> info = ReadCheckpointInfo(entry.dir);
    if (!info.ok()) continue;  // Removed meanwhile, or damaged.
    v1::Checkpoint* checkpoint = response->add_checkpoints();
    checkpoint->set_name(CheckpointResourceName(job_id, entry.step));
    checkpoint->set_step(entry.step);
    SetTimestamp(info->time_ms, checkpoint->mutable_create_time());
    v1::JobMetrics* metrics = checkpoint->mutable_metrics();
    metrics->set_step(entry.step);
    metrics->set_tokens(info->tokens);
    metrics->set_skipped_steps(info->counters.skipped_steps);
    if (info->metrics) {
      metrics->set_loss(info->metrics->loss);
      metrics->set_lr(info->metrics->lr);
      metrics->set_grad_norm(info->metrics->grad_norm);
      if (info->metrics->validation_loss) {
        metrics->set_validation_loss(*info->metrics->validation_loss);
      }
    }
    checkpoint->set_size_bytes(CheckpointSizeBytes(entry.dir));
  }
  return absl::OkStatus();
}

}  // namespace loraplex
