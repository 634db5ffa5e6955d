#include "server/trainer/trainer_commands.h"

#include <utility>

namespace loraplex {
namespace {

using Entry = StepPlan::Entry;

std::optional<Entry> PlanEntry(const AttachJob& command) {
  if (!command.prepared.ok()) return std::nullopt;  // Failed on rank 0.
  Entry entry;
  entry.kind = Entry::Kind::kAttach;
  entry.job_id = command.request.job_id;
  entry.request = command.request;
  entry.request.initial_weights.reset();  // Broadcast after the attach.
  entry.restore = command.restore;
  entry.training_state = command.training_state;
  return entry;
}

std::optional<Entry> PlanEntry(const RetireJob& command) {
  Entry entry;
  entry.kind = Entry::Kind::kRetire;
  entry.job_id = command.job_id;
  return entry;
}

std::optional<Entry> PlanEntry(const PauseJob& command) {
  Entry entry;
  entry.kind = Entry::Kind::kPause;
  entry.job_id = command.job_id;
  return entry;
}

std::optional<Entry> PlanEntry(const ExportJob&) { return std::nullopt; }

std::optional<Entry> PlanEntry(const SampleJob&) { return std::nullopt; }

std::optional<Entry> PlanEntry(const OpenSessionJob&) { return std::nullopt; }

std::optional<Entry> PlanEntry(const SessionWork&) { return std::nullopt; }

void AbandonOne(ExportJob& command, const absl::Status& status) {
  if (command.done) std::exchange(command.done, nullptr)(status);
}
void AbandonOne(SampleJob& job, const absl::Status& status) {
  if (job.command.done) std::exchange(job.command.done, nullptr)(status, 0);
}
void AbandonOne(OpenSessionJob& open, const absl::Status& status) {
  if (open.command.done) std::exchange(open.command.done, nullptr)(status);
}
void AbandonOne(SessionWork& work, const absl::Status& status) {
  if (work.op.done) std::exchange(work.op.done, nullptr)(status);
}
template <typename Command>
void AbandonOne(Command&, const absl::Status&) {}

}  // namespace

std::optional<Entry> PlanEntryOf(const TrainerCommand& command) {
  return std::visit([](const auto& c) { return PlanEntry(c); }, command);
}

TrainerCommand CommandOf(Entry entry) {
  switch (entry.kind) {
    case Entry::Kind::kAttach: {
      AttachJob attach;
      attach.attach.job_id = entry.job_id;
      attach.request = std::move(entry.request);
      attach.request.job_id = entry.job_id;
      attach.restore = std::move(entry.restore);
      attach.training_state = std::move(entry.training_state);
      return attach;
    }
    case Entry::Kind::kRetire:
      return RetireJob{entry.job_id};
    case Entry::Kind::kPause:
      break;
  }
  return PauseJob{entry.job_id};
}

void Abandon(TrainerCommand& command, const absl::Status& status) {
  std::visit([&](auto& c) { AbandonOne(c, status); }, command);
}

}  // namespace loraplex
