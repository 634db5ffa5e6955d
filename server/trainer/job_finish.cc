// Finishing jobs (job_slots.h): a job whose last step is trained (or that
// only evaluates) is validated, its adapter exported into the job's final
// directory, its slot retired, and only then reported as kFinished; the
// ExportJob command writes a job's current adapter on request.
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "core/common/status_macros.h"
#include "core/common/test_faults.h"
#include "core/runtime/exception_message.h"
#include "server/trainer/job_slots.h"

namespace loraplex {

void JobSlots::Export(ExportJob& command) {
  const int slot = SlotOf(command.job_id);
  if (slot < 0) {
    std::exchange(command.done, nullptr)(absl::NotFoundError(
        absl::StrCat("job \"", command.job_id, "\" is not in a slot")));
    return;
  }
  owners_.job(slot)->held = false;  // Test hold: an export releases it.
  ExportSlot(slot, command.dir, std::exchange(command.done, nullptr));
}

void JobSlots::EvaluateOnly(int slot) {
  if (!ranks_.leader()) {  // Rank 0 evaluates.
    FinishJob(slot, absl::OkStatus());
    return;
  }
  absl::StatusOr<double> loss = Validate(slot);
  FinishJob(slot, loss.status());
}

absl::StatusOr<double> JobSlots::Validate(int slot) {
  SlotJob& job = *owners_.job(slot);
  if (!job.validation) {
    return absl::FailedPreconditionError("the job has no validation data");
  }
  LORAPLEX_RETURN_IF_ERROR(
      TestFault(TestFaultPoint::kValidation, pool_.slot(slot).training.seed));
  absl::StatusOr<double> loss = CatchTorch("validation", [&] {
    return EvalLoss(model_, &pool_.slot(slot).weights,
                    job.validation->sequences, co_batch_);
  });
  if (loss.ok()) job.validation_loss = *loss;
  return loss;
}

void JobSlots::FinishJob(int slot, absl::Status status) {
  if (!ranks_.leader()) {  // Rank 0 validates, exports and reports.
    RetireSlot(slot).IgnoreError();
    return;
  }
  SlotJob& job = *owners_.job(slot);
  if (status.ok() && pool_.state(slot) != SlotState::kEvaluating &&
      job.validation) {
    status = Validate(slot).status();
  }
  TrainerReport report = ProgressReport(TrainerReport::Kind::kFinished, slot);
  report.status = status;
  report.validation_loss = job.validation_loss;
  const bool exports = status.ok() && !job.final_adapter_dir.empty();
  if (exports) {
    // Reported once the adapter is written, after the job's checkpoints
    // queued before it.
    ExportSlot(slot, job.final_adapter_dir,
               [this, report](absl::Status written) mutable {
                 report.status = written;
                 reports_.Written(std::move(report));
               });
  }
  // The job's outcome stands even if zeroing its slot fails; the slot is
  // then kRetiring until a retire succeeds.
  const std::string job_id = job.job_id;
  RetireSlot(slot).IgnoreError();
  if (exports) return;
  // Its checkpoints are on disk (and reported) before its end is.
  ReportWrittenFor(job_id);
  Report(std::move(report));
}

void JobSlots::ExportSlot(int slot, const std::string& dir,
                          std::function<void(absl::Status)> done) {
  absl::StatusOr<PeftAdapterFiles> files = CatchTorch("export", [&] {
    return EncodePeftAdapter(pool_.slot(slot).weights,
                             options_.base_model_name);
  });
  if (!files.ok()) {
    done(files.status());
    return;
  }
  std::map<std::string, std::string> named;
  named[kPeftWeightsFile] = std::move(files->weights);
  named[kPeftConfigFile] = std::move(files->config);
  checkpoints_.WriteDirectory(owners_.job(slot)->job_id, dir, std::move(named),
                              std::move(done));
}

}  // namespace loraplex
