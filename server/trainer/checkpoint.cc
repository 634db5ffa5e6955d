#include "server/trainer/checkpoint.h"

#include <torch/serialize/archive.h>

#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adapters/data_parallel_slots.h"
#include "adapters/peft_adapter.h"
#include "core/common/status_macros.h"
#include "core/runtime/exception_message.h"

namespace loraplex {

absl::StatusOr<CheckpointContents> EncodeCheckpoint(
    const TrainingSlot& slot, CheckpointInfo info, std::string training_state,
    const std::string& base_model_name) {
  if (!slot.trainable()) {
    return absl::FailedPreconditionError(
        "only a slot that trains can be checkpointed");
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      PeftAdapterFiles adapter, CatchTorch("checkpoint", [&] {
        return EncodePeftAdapter(slot.weights, base_model_name);
      }));
  CheckpointContents contents;
  contents.info = std::move(info);
  contents.adapter_config = std::move(adapter.config);
  contents.adapter_weights = std::move(adapter.weights);
  contents.training_state = std::move(training_state);
  return contents;
}

absl::Status WriteCheckpoint(const std::string& job_dir,
                             const TrainingSlot& slot,
                             const CheckpointInfo& info,
                             const std::string& training_state,
                             const std::string& base_model_name, int keep_last,
                             int64_t keep_step) {
  LORAPLEX_ASSIGN_OR_RETURN(
      CheckpointContents contents,
      EncodeCheckpoint(slot, info, training_state, base_model_name));
  return WriteCheckpointFiles(job_dir, contents, keep_last, keep_step);
}

absl::StatusOr<std::string> SaveTrainingState(
    const TrainingSlot& slot, DataParallelSlots* data_parallel) {
  if (!slot.trainable()) {
    return absl::FailedPreconditionError(
        "only a slot that trains can be checkpointed");
  }
  std::string bytes;
  LORAPLEX_RETURN_IF_ERROR(
      CatchTorch("saving the optimizer state", [&]() -> absl::Status {
        torch::serialize::OutputArchive optimizer;
        if (data_parallel != nullptr) {
          LORAPLEX_RETURN_IF_ERROR(
              data_parallel->SaveOptimizerState(slot, optimizer));
        } else {
          slot.optimizer->Save(optimizer);
        }
        torch::serialize::OutputArchive scheduler;
        slot.scheduler->Save(scheduler);
        torch::serialize::OutputArchive archive;
        archive.write("optimizer", optimizer);
        archive.write("scheduler", scheduler);
        std::ostringstream out;
        archive.save_to(out);
        bytes = out.str();
        return absl::OkStatus();
      }));
  return bytes;
}

namespace {

absl::Status RestoreState(const CheckpointInfo& info,
                          const std::string& training_state, TrainingSlot& slot,
                          DataParallelSlots* data_parallel) {
  if (!slot.trainable()) {
    return absl::FailedPreconditionError(
        "the slot must be attached for training before a restore");
  }
  if (info.total_steps != slot.total_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint is of a run of ", info.total_steps,
                     " steps but the job now has ", slot.total_steps,
                     " (its data or configuration changed)"));
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      DataCursor cursor,
      DataCursor::Create(slot.cursor->num_sequences(), info.cursor));
  absl::Status loaded = CatchTorch("loading the optimizer state", [&] {
    std::istringstream bytes(training_state);
    torch::serialize::InputArchive archive;
    archive.load_from(bytes);
    torch::serialize::InputArchive optimizer;
    torch::serialize::InputArchive scheduler;
    if (!archive.try_read("optimizer", optimizer) ||
        !archive.try_read("scheduler", scheduler)) {
      return absl::InvalidArgumentError(absl::StrCat(
          kCheckpointStateFile, " lacks the optimizer or scheduler state"));
    }
    LORAPLEX_RETURN_IF_ERROR(
        data_parallel != nullptr
            ? data_parallel->LoadOptimizerState(slot, optimizer)
            : slot.optimizer->Load(optimizer));
    return slot.scheduler->Load(scheduler);
  });
  if (!loaded.ok()) {
    return absl::InvalidArgumentError(loaded.message());
  }
  slot.scheduler->ApplyTo(*slot.optimizer);
  slot.cursor.emplace(std::move(cursor));
  slot.counters = info.counters;
  return absl::OkStatus();
}

}  // namespace

absl::Status RestoreCheckpoint(const std::string& dir,
                               const CheckpointInfo& info,
                               const std::string& training_state,
                               TrainingSlot& slot,
                               DataParallelSlots* data_parallel) {
  const absl::Status status = CatchTorch("restore", [&] {
    return RestoreState(info, training_state, slot, data_parallel);
  });
  if (status.ok()) return status;
  return absl::Status(
      status.code(), absl::StrCat("checkpoint ", dir,
                                  " does not fit the job: ", status.message()));
}

}  // namespace loraplex
