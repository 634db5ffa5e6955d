// Attaching jobs (job_slots.h): rank 0 finds what each resumes (its
// checkpoint, verified on the checkpoint writer's thread), loads its
// weights and orders a batch's attaches before the plan; every rank then
// attaches it, restores the checkpoint, and agrees that the attach stood
// everywhere.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "core/common/status_macros.h"
#include "core/common/test_faults.h"
#include "core/runtime/exception_message.h"
#include "server/trainer/job_slots.h"

namespace loraplex {

void JobSlots::OrderAttaches(std::deque<TrainerCommand>& batch) const {
  if (!checkpoints_.enabled()) return;
  // Within each run of attaches, those going back to a slot go first, so a
  // job new to the pool does not take that slot before them.
  const auto is_attach = [](const TrainerCommand& command) {
    return std::holds_alternative<AttachJob>(command);
  };
  auto begin = batch.begin();
  while (begin != batch.end()) {
    if (!is_attach(*begin)) {
      ++begin;
      continue;
    }
    auto end = begin;
    while (end != batch.end() && is_attach(*end)) ++end;
    std::stable_partition(begin, end, [](const TrainerCommand& command) {
      return std::get<AttachJob>(command).request.preferred_slot >= 0;
    });
    begin = end;
  }
}

void JobSlots::ReadFiles(AttachJob& command) {
  command.prepared =
      CatchTorch("attach", [&] { return ReadAttachFiles(command); });
}

absl::Status JobSlots::ReadAttachFiles(AttachJob& command) {
  AttachCommand& attach = command.attach;
  command.weights_dir = attach.initial_adapter_dir;
  if (!attach.resume || !checkpoints_.enabled()) return absl::OkStatus();
  // The slot of its newest checkpoint, read or not.
  if (command.request.preferred_slot < 0) {
    command.request.preferred_slot =
        checkpoints_.SlotHint(attach.job_id, attach.recovering);
  }
  // After a crash, the pool's last complete checkpoint, not a newer one
  // of a group the crash cut short.
  LORAPLEX_ASSIGN_OR_RETURN(
      std::optional<PoolCheckpointer::ResumePoint> resume,
      checkpoints_.FindResumePoint(attach.job_id, attach.recovering,
                                   &command.rejected));
  if (!resume) return absl::OkStatus();
  command.weights_dir = resume->dir;
  if (command.request.preferred_slot < 0) {
    command.request.preferred_slot = resume->info.slot;
  }
  command.restore_dir = std::move(resume->dir);
  command.restore = std::move(resume->info);
  command.training_state = std::move(resume->training_state);
  return absl::OkStatus();
}

void JobSlots::Prepare(AttachJob& command) {
  if (!command.prepared.ok() || command.weights_dir.empty()) return;
  command.prepared = CatchTorch("attach", [&]() -> absl::Status {
    LORAPLEX_ASSIGN_OR_RETURN(
        PeftAdapter adapter,
        LoadPeftAdapter(command.weights_dir, model_.config()));
    command.request.lora = adapter.config;  // What the other ranks attach.
    command.request.initial_weights =
        std::make_shared<const PeftAdapter>(std::move(adapter));
    return absl::OkStatus();
  });
}

absl::StatusOr<int> JobSlots::AttachPrepared(AttachJob& command,
                                             std::optional<int64_t>& tokens) {
  const AttachCommand& attach = command.attach;
  LORAPLEX_ASSIGN_OR_RETURN(int slot, pool_.Attach(command.request));
  if (absl::Status fault =
          TestFault(TestFaultPoint::kAttach, command.request.training.seed);
      !fault.ok()) {
    FreeSlot(slot, attach.job_id);
    return fault;
  }
  if (ranks_.leader() && attach.resume) {
    // Later checkpoints belong to a run abandoned by a crash; the steps
    // they hold are trained again.
    checkpoints_.DropAfter(attach.job_id,
                           command.restore ? command.restore->step() : 0);
  }
  if (!command.restore) return slot;
  const absl::Status restored = RestoreCheckpoint(
      command.restore_dir, *command.restore, command.training_state,
      pool_.slot(slot), ranks_.data_parallel());
  if (!restored.ok()) {
    FreeSlot(slot, attach.job_id);
    return restored;
  }
  tokens = command.restore->tokens;
  return slot;
}

absl::StatusOr<int> JobSlots::AgreeOnAttach(absl::StatusOr<int> slot) {
  const absl::Status agreed = ranks_.AgreeOnOutcome(slot.status(), "the attach",
                                                    /*diverged_if_not=*/false);
  if (!agreed.ok()) {
    if (slot.ok()) FreeSlot(*slot, pool_.job_id(*slot));
    return agreed;
  }
  // Rank 0's weights (an initial adapter's, a checkpoint's) are every
  // rank's.
  std::vector<torch::Tensor> params = pool_.slot(*slot).weights.parameters();
  LORAPLEX_RETURN_IF_ERROR(ranks_.BroadcastFromLeader(params));
  return slot;
}

void JobSlots::FreeSlot(int slot, const std::string& job_id) {
  SlotJob placeholder;
  placeholder.job_id = job_id;
  owners_.Hold(slot, std::move(placeholder));
  RetireSlot(slot).IgnoreError();  // kRetiring on error.
}

void JobSlots::Attach(AttachJob& command) {
  AttachCommand& attach = command.attach;
  TrainerReport report;
  report.kind = TrainerReport::Kind::kAttached;
  report.job_id = attach.job_id;
  report.rejected_checkpoints = std::move(command.rejected);
  if (!command.prepared.ok()) {  // Rank 0 only: not in the plan.
    report.status = command.prepared;
    Report(std::move(report));
    return;
  }
  std::optional<int64_t> tokens;
  absl::StatusOr<int> slot = CatchTorch("attach", [&]() -> absl::StatusOr<int> {
    return AttachPrepared(command, tokens);
  });
  // A rank that broke here (its pool may now differ) leaves without the
  // agreement; the others then fail in it, and nothing is reported.
  if (ranks_.Broken()) return;
  slot = AgreeOnAttach(std::move(slot));
  if (ranks_.Broken()) return;
  if (slot.ok()) {
    SlotJob job;
    job.job_id = attach.job_id;
    job.tenant = attach.tenant;
    job.validation = std::move(attach.validation);
    job.final_adapter_dir = attach.final_adapter_dir;
    job.eval_interval = command.request.training.eval_interval;
    job.checkpoint_interval =
        checkpoints_.IntervalFor(command.request.training.checkpoint_interval);
    job.job_spec = std::move(attach.job_spec);
    job.tokens = tokens.value_or(0);
    if (command.request.data != nullptr) {
      job.family =
          std::string(OptimizerFamilyName(command.request.optimizer.family));
    }
    report.tokens = job.tokens;
    owners_.Hold(*slot, std::move(job));
    report.slot = *slot;
    report.total_steps = pool_.slot(*slot).total_steps;
    report.step = pool_.slot(*slot).counters.steps;
    if (command.restore) report.resumed_step = command.restore->step();
  } else {
    report.status = slot.status();
  }
  Report(std::move(report));
}

}  // namespace loraplex
