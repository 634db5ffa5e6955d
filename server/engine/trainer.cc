#include "server/engine/trainer.h"

#include <chrono>
#include <exception>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "core/common/atomic_file.h"
#include "core/common/status_macros.h"

namespace loraplex {

struct Trainer::Command {
  enum class Kind { kAttach, kRetire, kExport };
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
  bool evaluate_only = false;
  int64_t tokens = 0;
  double tokens_per_second = 0.0;
  std::optional<double> validation_loss;
  // The job is over but zeroing the slot failed (e.g. a device error): the
  // slot is kept out of use and retired again each iteration.
  bool quarantined = false;
};

namespace {

// LibTorch reports failures by throwing c10::Error (a std::exception); they
// stop at the trainer boundary as a Status.
template <typename Fn>
auto CatchTorch(absl::string_view what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& error) {
    return absl::InternalError(absl::StrCat(what, ": ", error.what()));
  }
}

}  // namespace

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

void Trainer::Attach(AttachCommand command) {
  Command entry;
  entry.kind = Command::Kind::kAttach;
  entry.job_id = command.job_id;
  entry.attach = std::move(command);
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(entry));
  }
  wake_.notify_all();
}

void Trainer::Retire(const std::string& job_id) {
  Command entry;
  entry.kind = Command::Kind::kRetire;
  entry.job_id = job_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(entry));
  }
  wake_.notify_all();
}

void Trainer::Export(const std::string& job_id, const std::string& dir,
                     std::function<void(absl::Status)> done) {
  Command entry;
  entry.kind = Command::Kind::kExport;
  entry.job_id = job_id;
  entry.dir = dir;
  entry.done = std::move(done);
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(entry));
  }
  wake_.notify_all();
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
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || busy || !commands_.empty(); });
      if (stop_) return;
      batch.swap(commands_);
    }
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
    TrainStep();
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
    case Command::Kind::kRetire: {
      if (slot < 0) return;
      absl::Status status = RetireSlot(slot);
      TrainerReport report;
      report.kind = TrainerReport::Kind::kRetired;
      report.job_id = command.job_id;
      report.slot = slot;
      report.status = status;
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

void Trainer::ApplyAttach(AttachCommand& command) {
  TrainerReport report;
  report.kind = TrainerReport::Kind::kAttached;
  report.job_id = command.job_id;
  command.request.job_id = command.job_id;
  absl::StatusOr<int> slot = CatchTorch("attach", [&]() -> absl::StatusOr<int> {
    if (!command.initial_adapter_dir.empty()) {
      LORAPLEX_ASSIGN_OR_RETURN(
          PeftAdapter adapter,
          LoadPeftAdapter(command.initial_adapter_dir, model_->config()));
      command.request.initial_weights =
          std::make_shared<const PeftAdapter>(std::move(adapter));
    }
    return pool_.Attach(command.request);
  });
  if (slot.ok()) {
    auto job = std::make_unique<SlotJob>();
    job->job_id = command.job_id;
    job->tenant = command.tenant;
    job->validation = std::move(command.validation);
    job->final_adapter_dir = command.final_adapter_dir;
    job->eval_interval = command.request.training.eval_interval;
    job->evaluate_only = command.request.data == nullptr;
    if (!job->evaluate_only) {
      job->family =
          std::string(OptimizerFamilyName(command.request.optimizer.family));
    }
    jobs_[*slot] = std::move(job);
    report.slot = *slot;
    report.total_steps = pool_.slot(*slot).total_steps;
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
    jobs_[slot].reset();
  } else if (!jobs_[slot]->quarantined) {
    jobs_[slot]->quarantined = true;
    ++quarantined_;
  }
  return status;
}

void Trainer::TrainStep() {
  const std::vector<int> ids = TrainableSlots();
  if (ids.empty()) return;
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
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const int slot = ids[i];
    SlotJob& job = *jobs_[slot];
    const TrainingSlot& training = pool_.slot(slot);
    const SlotStepMetrics& step = (*metrics)[i];
    job.tokens += step.tokens;
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
    }
    sink_(std::move(report));
    if (training.done()) FinishJob(slot, absl::OkStatus());
  }
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
