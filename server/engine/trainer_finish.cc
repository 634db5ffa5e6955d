// Finishing jobs (trainer.h): a job whose last step is trained (or that
// only evaluates) is validated, its adapter exported into the job's final
// directory, its slot retired, and only then reported as kFinished; the
// ExportJob command writes a job's current adapter on request.
#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "core/common/atomic_file.h"
#include "core/common/status_macros.h"
#include "core/runtime/exception_message.h"
#include "server/engine/trainer.h"

namespace loraplex {

void Trainer::Apply(ExportJob& command) {
  const int slot = SlotOf(command.job_id);
  absl::Status status =
      slot < 0 ? absl::NotFoundError(absl::StrCat("job \"", command.job_id,
                                                  "\" is not in a slot"))
               : ExportSlot(slot, command.dir);
  std::exchange(command.done, nullptr)(status);
}

void Trainer::EvaluateOnly(int slot) {
  if (!ranks_.leader()) {  // Rank 0 evaluates.
    FinishJob(slot, absl::OkStatus());
    return;
  }
  absl::StatusOr<double> loss = Validate(slot);
  FinishJob(slot, loss.status());
}

absl::StatusOr<double> Trainer::Validate(int slot) {
  SlotJob& job = *jobs_[slot];
  if (!job.validation) {
    return absl::FailedPreconditionError("the job has no validation data");
  }
  absl::StatusOr<double> loss = CatchTorch("validation", [&] {
    return EvalLoss(*model_, &pool_.slot(slot).weights,
                    job.validation->sequences, options_.co_batch);
  });
  if (loss.ok()) job.validation_loss = *loss;
  return loss;
}

void Trainer::FinishJob(int slot, absl::Status status) {
  if (!ranks_.leader()) {  // Rank 0 validates, exports and reports.
    RetireSlot(slot).IgnoreError();
    return;
  }
  SlotJob& job = *jobs_[slot];
  if (status.ok() && pool_.state(slot) != SlotState::kEvaluating &&
      job.validation) {
    status = Validate(slot).status();
  }
  if (status.ok() && !job.final_adapter_dir.empty()) {
    status = ExportSlot(slot, job.final_adapter_dir);
  }
  TrainerReport report = ProgressReport(TrainerReport::Kind::kFinished, slot);
  report.status = status;
  report.validation_loss = job.validation_loss;
  // Its checkpoints are on disk (and reported) before its end is.
  checkpoints_.WaitForJob(job.job_id);
  ReportWritten();
  // The job's outcome stands even if zeroing its slot fails; the slot is
  // then kRetiring until a retire succeeds.
  RetireSlot(slot).IgnoreError();
  Report(std::move(report));
}

absl::Status Trainer::ExportSlot(int slot, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string staged = dir + ".staged";
  return CatchTorch("export", [&]() -> absl::Status {
    std::error_code error;
    fs::remove_all(staged, error);
    fs::create_directories(staged, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot create ", staged, ": ", error.message()));
    }
    LORAPLEX_RETURN_IF_ERROR(ExportPeftAdapter(
        pool_.slot(slot).weights, options_.base_model_name, staged));
    return PublishDirectory(staged, dir);
  });
}

}  // namespace loraplex
