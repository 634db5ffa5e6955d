#include "server/engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "core/common/atomic_file.h"
#include "core/common/status_macros.h"
#include "server/common/clock.h"
#include "server/engine/catch_torch.h"
#include "server/engine/checkpoint.h"

namespace loraplex {

struct Trainer::Command {
  enum class Kind { kAttach, kRetire, kPause, kExport };
  Kind kind = Kind::kAttach;
  AttachCommand attach;
  std::string job_id;
  std::string dir;
  std::function<void(absl::Status)> done;
};

// What the trainer remembers about the job in a slot, beyond the slot.
struct Trainer::SlotJob {
  std::string job_id;
  std::string tenant;
  std::string family;
  std::shared_ptr<const SequenceSet> validation;
  std::string final_adapter_dir;
  int64_t eval_interval = 0;
  int64_t checkpoint_interval = 0;
  nlohmann::json job_spec;
  std::optional<CheckpointMetrics> last_metrics;
  bool evaluate_only = false;
  int64_t tokens = 0;
  double tokens_per_second = 0.0;
  std::optional<double> validation_loss;
  // The job is over but zeroing the slot failed (e.g. a device error): the
  // slot is kept out of use and retired again each iteration.
  bool quarantined = false;
};

Trainer::Trainer(std::unique_ptr<LlamaModel> model,
                 const TrainerOptions& options, ReportSink sink)
    : model_(std::move(model)),
      options_(options),
      sink_(std::move(sink)),
      pool_(model_->config(), options.pool),
      jobs_(pool_.capacity()),
      slots_(pool_.capacity()) {}

Trainer::~Trainer() { Stop(); }

void Trainer::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stop_) return;
  if (!options_.checkpoint_root.empty()) {
    // Damaged: resume each job from its newest valid checkpoint instead.
    pool_checkpoint_ = ReadPoolCheckpoint(options_.checkpoint_root)
                           .value_or(std::map<std::string, int64_t>{});
  }
  thread_ = std::thread([this] { Run(); });
}

void Trainer::Stop() {
  std::deque<Command> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    dropped.swap(commands_);
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Command& command : dropped) {
    if (command.done) {
      command.done(absl::UnavailableError("the server is shutting down"));
    }
  }
}

void Trainer::Enqueue(std::vector<Command> commands) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Command& command : commands) commands_.push_back(std::move(command));
  }
  wake_.notify_all();
}

void Trainer::Attach(AttachCommand command) {
  std::vector<AttachCommand> one;
  one.push_back(std::move(command));
  AttachAll(std::move(one));
}

void Trainer::AttachAll(std::vector<AttachCommand> commands) {
  std::vector<Command> entries(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    entries[i].kind = Command::Kind::kAttach;
    entries[i].job_id = commands[i].job_id;
    entries[i].attach = std::move(commands[i]);
  }
  Enqueue(std::move(entries));
}

void Trainer::Retire(const std::string& job_id) {
  std::vector<Command> entry(1);
  entry[0].kind = Command::Kind::kRetire;
  entry[0].job_id = job_id;
  Enqueue(std::move(entry));
}

void Trainer::Pause(const std::string& job_id) {
  std::vector<Command> entry(1);
  entry[0].kind = Command::Kind::kPause;
  entry[0].job_id = job_id;
  Enqueue(std::move(entry));
}

void Trainer::Export(const std::string& job_id, const std::string& dir,
                     std::function<void(absl::Status)> done) {
  std::vector<Command> entry(1);
  entry[0].kind = Command::Kind::kExport;
  entry[0].job_id = job_id;
  entry[0].dir = dir;
  entry[0].done = std::move(done);
  Enqueue(std::move(entry));
}

std::vector<SlotInfo> Trainer::Slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_;
}

void Trainer::Run() {
  for (;;) {
    bool busy = !TrainableSlots().empty();
    for (const auto& job : jobs_) {
      busy = busy || (job && job->evaluate_only && !job->quarantined);
    }
    std::deque<Command> batch;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || busy || !commands_.empty(); });
      stopping = stop_;
      if (!stopping) batch.swap(commands_);
    }
    if (stopping) {
      // Every job that trains keeps its progress across the restart.
      CheckpointPool();
      return;
    }
    OrderAttaches(batch);
    for (Command& command : batch) Apply(command);
    for (int slot = 0; slot < pool_.capacity(); ++slot) {
      if (jobs_[slot] && jobs_[slot]->quarantined) {
        RetireSlot(slot).IgnoreError();  // Still quarantined on error.
      }
    }
    for (int slot = 0; slot < pool_.capacity(); ++slot) {
      if (jobs_[slot] && jobs_[slot]->evaluate_only &&
          !jobs_[slot]->quarantined) {
        EvaluateOnly(slot);
      }
    }
    const std::vector<int> stepped = TrainStep();
    if (CheckpointDue(stepped)) CheckpointPool();
    PublishSlots();
  }
}

void Trainer::Apply(Command& command) {
  int slot = -1;
  for (int i = 0; i < pool_.capacity(); ++i) {
    if (jobs_[i] && !jobs_[i]->quarantined &&
        jobs_[i]->job_id == command.job_id) {
      slot = i;
    }
  }
  switch (command.kind) {
    case Command::Kind::kAttach:
      ApplyAttach(command.attach);
      return;
    case Command::Kind::kRetire:
      ApplyRetire(command, slot);
      return;
    case Command::Kind::kPause: {
      TrainerReport report;
      report.kind = TrainerReport::Kind::kPaused;
      report.job_id = command.job_id;
      report.slot = slot;
      if (slot < 0 || pool_.slot(slot).done() ||
          !pool_.slot(slot).trainable()) {
        report.status = absl::FailedPreconditionError(absl::StrCat(
            "job \"", command.job_id, "\" is not training in a slot"));
      } else {
        report.status = CheckpointSlot(slot);
        report.step = pool_.slot(slot).counters.steps;
        report.checkpoint_dir =
            CheckpointDir(JobCheckpointDir(command.job_id), report.step);
        // Paused once its checkpoint is committed; a failed retire only
        // quarantines the slot.
        if (report.status.ok()) RetireSlot(slot).IgnoreError();
      }
      sink_(std::move(report));
      return;
    }
    case Command::Kind::kExport: {
      absl::Status status =
          slot < 0 ? absl::NotFoundError(absl::StrCat("job \"", command.job_id,
                                                      "\" is not in a slot"))
                   : ExportSlot(slot, command.dir);
      command.done(status);
      return;
    }
  }
}

void Trainer::ApplyRetire(Command& command, int slot) {
  TrainerReport report;
  report.kind = TrainerReport::Kind::kRetired;
  report.job_id = command.job_id;
  report.slot = slot;
  if (slot < 0) {
    // Reported all the same, so the scheduler lets go of the job.
    report.status = absl::NotFoundError(
        absl::StrCat("job \"", command.job_id, "\" is not in a slot"));
    sink_(std::move(report));
    return;
  }
  // The job's state up to here stays available (export, a new job).
  if (pool_.slot(slot).trainable() && !pool_.slot(slot).done()) {
    CheckpointSlot(slot).IgnoreError();
  }
  report.status = RetireSlot(slot);
  sink_(std::move(report));
}

int64_t Trainer::ResumeCap(const AttachCommand& command) const {
  auto pooled = pool_checkpoint_.find(command.job_id);
  return command.recovering && pooled != pool_checkpoint_.end() ? pooled->second
                                                                : INT64_MAX;
}

void Trainer::OrderAttaches(std::deque<Command>& batch) const {
  if (options_.checkpoint_root.empty()) return;
  for (Command& command : batch) {
    AttachCommand& attach = command.attach;
    if (command.kind != Command::Kind::kAttach || !attach.resume ||
        attach.request.preferred_slot >= 0) {
      continue;
    }
    attach.request.preferred_slot =
        CheckpointSlotHint(JobCheckpointDir(attach.job_id), ResumeCap(attach));
  }
  // Within each run of attaches, those going back to a slot go first, so a
  // job new to the pool does not take that slot before them.
  auto begin = batch.begin();
  while (begin != batch.end()) {
    if (begin->kind != Command::Kind::kAttach) {
      ++begin;
      continue;
    }
    auto end = begin;
    while (end != batch.end() && end->kind == Command::Kind::kAttach) ++end;
    std::stable_partition(begin, end, [](const Command& command) {
      return command.attach.request.preferred_slot >= 0;
    });
    begin = end;
  }
}

absl::StatusOr<int> Trainer::AttachOrResume(AttachCommand& command,
                                            TrainerReport& report,
                                            std::optional<int64_t>& tokens) {
  std::optional<CheckpointEntry> latest;
  std::optional<CheckpointInfo> info;
  std::string weights_dir = command.initial_adapter_dir;
  if (command.resume && !options_.checkpoint_root.empty()) {
    // After a crash, the pool's last complete checkpoint, not a newer one
    // of a group the crash cut short.
    latest =
        LatestValidCheckpoint(JobCheckpointDir(command.job_id),
                              &report.rejected_checkpoints, ResumeCap(command));
  }
  if (latest) {
    LORAPLEX_ASSIGN_OR_RETURN(info, ReadCheckpointInfo(latest->dir));
    if (info->job_id != command.job_id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", latest->dir, " belongs to job ", info->job_id));
    }
    weights_dir = latest->dir;
    if (command.request.preferred_slot < 0) {
      command.request.preferred_slot = info->slot;
    }
  }
  if (!weights_dir.empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(PeftAdapter adapter,
                              LoadPeftAdapter(weights_dir, model_->config()));
    command.request.initial_weights =
        std::make_shared<const PeftAdapter>(std::move(adapter));
  }
  LORAPLEX_ASSIGN_OR_RETURN(int slot, pool_.Attach(command.request));
  if (command.resume && !options_.checkpoint_root.empty()) {
    // Later checkpoints belong to a run abandoned by a crash; the steps
    // they hold are trained again.
    RemoveCheckpointsAfter(JobCheckpointDir(command.job_id),
                           latest ? latest->step : 0);
  }
  if (!latest) return slot;
  absl::Status restored = CatchTorch("restore", [&] {
    return RestoreCheckpoint(latest->dir, *info, pool_.slot(slot));
  });
  if (!restored.ok()) {
    absl::Status retired =
        CatchTorch("retire", [&] { return pool_.Retire(slot); });
    if (!retired.ok()) {
      // Kept out of use and retired again each iteration.
      auto stuck = std::make_unique<SlotJob>();
      stuck->job_id = command.job_id;
      stuck->quarantined = true;
      jobs_[slot] = std::move(stuck);
      ++quarantined_;
    }
    return restored;
  }
  report.resumed_step = info->step();
  tokens = info->tokens;
  return slot;
}

void Trainer::ApplyAttach(AttachCommand& command) {
  TrainerReport report;
  report.kind = TrainerReport::Kind::kAttached;
  report.job_id = command.job_id;
  command.request.job_id = command.job_id;
  std::optional<int64_t> tokens;
  absl::StatusOr<int> slot = CatchTorch("attach", [&]() -> absl::StatusOr<int> {
    return AttachOrResume(command, report, tokens);
  });
  if (slot.ok()) {
    auto job = std::make_unique<SlotJob>();
    job->job_id = command.job_id;
    job->tenant = command.tenant;
    job->validation = std::move(command.validation);
    job->final_adapter_dir = command.final_adapter_dir;
    job->eval_interval = command.request.training.eval_interval;
    job->checkpoint_interval =
        command.request.training.checkpoint_interval > 0
            ? command.request.training.checkpoint_interval
            : options_.checkpoint_interval;
    job->job_spec = std::move(command.job_spec);
    job->tokens = tokens.value_or(0);
    job->evaluate_only = command.request.data == nullptr;
    if (!job->evaluate_only) {
      job->family =
          std::string(OptimizerFamilyName(command.request.optimizer.family));
    }
    jobs_[*slot] = std::move(job);
    report.slot = *slot;
    report.total_steps = pool_.slot(*slot).total_steps;
    report.step = pool_.slot(*slot).counters.steps;
    report.tokens = jobs_[*slot]->tokens;
  } else {
    report.status = slot.status();
  }
  sink_(std::move(report));
}

std::vector<int> Trainer::TrainableSlots() const {
  std::vector<int> ids;
  for (int slot : pool_.ActiveSlotIds()) {
    if (jobs_[slot] && !jobs_[slot]->quarantined) ids.push_back(slot);
  }
  return ids;
}

absl::Status Trainer::RetireSlot(int slot) {
  absl::Status status =
      CatchTorch("retire", [&] { return pool_.Retire(slot); });
  if (status.ok()) {
    if (jobs_[slot]->quarantined) --quarantined_;
    // It left the pool: resumed later, it continues from its newest
    // checkpoint.
    if (pool_checkpoint_.erase(jobs_[slot]->job_id) > 0) SavePoolCheckpoint();
    jobs_[slot].reset();
  } else if (!jobs_[slot]->quarantined) {
    jobs_[slot]->quarantined = true;
    ++quarantined_;
  }
  return status;
}

std::vector<int> Trainer::TrainStep() {
  const std::vector<int> ids = TrainableSlots();
  std::vector<int> stepped;
  if (ids.empty()) return stepped;
  std::vector<TrainingSlot*> slots;
  for (int slot : ids) slots.push_back(&pool_.slot(slot));
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<SlotStepMetrics>> metrics = CatchTorch(
      "training step",
      [&] { return TrainCoBatchStep(*model_, slots, options_.co_batch); });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (!metrics.ok()) {
    for (int slot : ids) FinishJob(slot, metrics.status());
    return stepped;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const int slot = ids[i];
    SlotJob& job = *jobs_[slot];
    const TrainingSlot& training = pool_.slot(slot);
    const SlotStepMetrics& step = (*metrics)[i];
    job.tokens += step.tokens;
    job.last_metrics.emplace();
    job.last_metrics->loss = step.loss;
    job.last_metrics->lr = step.lr;
    job.last_metrics->grad_norm = step.grad_norm;
    const double rate = seconds > 0 ? step.tokens / seconds : 0.0;
    // A short moving average: single steps are noisy on a shared machine.
    job.tokens_per_second = job.tokens_per_second == 0.0
                                ? rate
                                : 0.7 * job.tokens_per_second + 0.3 * rate;
    TrainerReport report = ProgressReport(TrainerReport::Kind::kStep, slot);
    report.metrics = step;
    report.tokens_per_second = job.tokens_per_second;
    const bool interval_eval = job.validation && job.eval_interval > 0 &&
                               !training.done() &&
                               training.counters.steps % job.eval_interval == 0;
    if (interval_eval) {
      absl::StatusOr<double> loss = Validate(slot);
      if (!loss.ok()) {
        FinishJob(slot, loss.status());
        continue;
      }
      report.validation_loss = *loss;
      job.last_metrics->validation_loss = *loss;
    }
    sink_(std::move(report));
    if (training.done()) {
      FinishJob(slot, absl::OkStatus());
    } else {
      stepped.push_back(slot);
    }
  }
  return stepped;
}

bool Trainer::CheckpointDue(const std::vector<int>& stepped) const {
  if (options_.checkpoint_root.empty()) return false;
  for (int slot : stepped) {
    const int64_t interval = jobs_[slot]->checkpoint_interval;
    if (interval > 0 && pool_.slot(slot).counters.steps % interval == 0) {
      return true;
    }
  }
  return false;
}

void Trainer::CheckpointPool() {
  if (options_.checkpoint_root.empty()) return;
  // Jobs of the previous group not in a slot now (recovered jobs waiting
  // for one) keep their entries.
  std::map<std::string, int64_t> group = pool_checkpoint_;
  for (const auto& job : jobs_) {
    if (job) group.erase(job->job_id);
  }
  for (int slot : TrainableSlots()) {
    if (CheckpointSlot(slot).ok()) {
      group[jobs_[slot]->job_id] = pool_.slot(slot).counters.steps;
    }
  }
  pool_checkpoint_ = std::move(group);
  SavePoolCheckpoint();
}

void Trainer::SavePoolCheckpoint() {
  // On failure the previous group stays on disk: still consistent, older.
  CatchTorch("pool checkpoint", [&] {
    return WritePoolCheckpoint(options_.checkpoint_root, pool_checkpoint_);
  }).IgnoreError();
}

std::string Trainer::JobCheckpointDir(const std::string& job_id) const {
  return absl::StrCat(options_.checkpoint_root, "/", job_id);
}

absl::Status Trainer::CheckpointSlot(int slot) {
  if (options_.checkpoint_root.empty()) {
    return absl::FailedPreconditionError("checkpoints are disabled");
  }
  const SlotJob& job = *jobs_[slot];
  const TrainingSlot& training = pool_.slot(slot);
  CheckpointInfo info;
  info.job_id = job.job_id;
  info.time_ms = NowMillis();
  info.slot = slot;
  info.total_steps = training.total_steps;
  info.counters = training.counters;
  info.tokens = job.tokens;
  info.cursor = training.cursor->state();
  info.metrics = job.last_metrics;
  info.job_spec = job.job_spec;
  TrainerReport report = ProgressReport(TrainerReport::Kind::kCheckpoint, slot);
  report.checkpoint_dir =
      CheckpointDir(JobCheckpointDir(job.job_id), info.step());
  // The step the pool would resume the job from is never pruned.
  auto pooled = pool_checkpoint_.find(job.job_id);
  const int64_t keep_step =
      pooled == pool_checkpoint_.end() ? -1 : pooled->second;
  report.status = CatchTorch("checkpoint", [&] {
    return WriteCheckpoint(JobCheckpointDir(job.job_id), training, info,
                           options_.base_model_name, options_.keep_checkpoints,
                           keep_step);
  });
  const absl::Status status = report.status;
  sink_(std::move(report));
  return status;
}

TrainerReport Trainer::ProgressReport(TrainerReport::Kind kind,
                                      int slot) const {
  const SlotJob& job = *jobs_[slot];
  const TrainingSlot& training = pool_.slot(slot);
  TrainerReport report;
  report.kind = kind;
  report.job_id = job.job_id;
  report.slot = slot;
  report.step = training.counters.steps;
  report.total_steps = training.total_steps;
  report.tokens = job.tokens;
  report.skipped_steps = training.counters.skipped_steps;
  return report;
}

void Trainer::EvaluateOnly(int slot) {
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
  SlotJob& job = *jobs_[slot];
  if (status.ok() && !job.evaluate_only && job.validation) {
    status = Validate(slot).status();
  }
  if (status.ok() && !job.final_adapter_dir.empty()) {
    status = ExportSlot(slot, job.final_adapter_dir);
  }
  TrainerReport report = ProgressReport(TrainerReport::Kind::kFinished, slot);
  report.status = status;
  report.validation_loss = job.validation_loss;
  // The job's outcome stands even if zeroing its slot fails; the slot is
  // then quarantined until a retire succeeds.
  RetireSlot(slot).IgnoreError();
  sink_(std::move(report));
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

void Trainer::PublishSlots() {
  std::vector<SlotInfo> slots(pool_.capacity());
  for (int i = 0; i < pool_.capacity(); ++i) {
    if (!jobs_[i]) continue;
    SlotInfo& info = slots[i];
    info.attached = true;
    if (jobs_[i]->quarantined) continue;  // Taken, by no job.
    const TrainingSlot& training = pool_.slot(i);
    info.job_id = jobs_[i]->job_id;
    info.tenant = jobs_[i]->tenant;
    info.rank = training.weights.config().rank;
    info.family = jobs_[i]->family;
    info.step = training.counters.steps;
    info.total_steps = training.total_steps;
    if (training.scheduler) info.lr = training.scheduler->lr();
  }
  std::lock_guard<std::mutex> lock(mu_);
  slots_ = std::move(slots);
}

}  // namespace loraplex
