#include "server/trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/test_faults.h"
#include "core/runtime/exception_message.h"
#include "server/common/clock.h"
#include "server/trainer/checkpoint.h"
#include "server/trainer/step_plan.h"

namespace loraplex {

namespace {

SlotAttachRequest AttachRequestOf(const AttachCommand& command) {
  SlotAttachRequest request;
  request.job_id = command.job_id;
  request.lora = command.spec.lora;
  request.optimizer = command.spec.optimizer;
  request.schedule = command.spec.schedule;
  request.training = command.spec.training;
  request.data = command.data;
  request.preferred_slot = command.preferred_slot;
  return request;
}

PoolCheckpointerOptions CheckpointerOptions(const TrainerOptions& options,
                                            bool leader) {
  PoolCheckpointerOptions checkpoints;
  checkpoints.root = options.checkpoint_root;
  checkpoints.interval = options.checkpoint_interval;
  checkpoints.keep = options.keep_checkpoints;
  checkpoints.base_model_name = options.base_model_name;
  checkpoints.enabled =
      leader ? !options.checkpoint_root.empty() : options.leader_checkpoints;
  return checkpoints;
}

SessionSlotsOptions SessionOptions(const TrainerOptions& options) {
  SessionSlotsOptions sessions;
  sessions.base_model_name = options.base_model_name;
  sessions.checkpoint_root = options.session_checkpoint_root;
  sessions.checkpoint_interval = options.session_checkpoint_interval;
  sessions.on_checkpoint = options.on_session_checkpoint;
  return sessions;
}

SlotPoolOptions PoolOptions(SlotPoolOptions pool, const LlamaModel& model,
                            ParamClaims* claims) {
  pool.dtype = model.dtype();
  if (claims != nullptr) pool.claims = claims;
  return pool;
}

// A report about `job_id`, which `slot` holds (-1: none).
TrainerReport JobReport(TrainerReport::Kind kind, const std::string& job_id,
                        int slot) {
  TrainerReport report;
  report.kind = kind;
  report.job_id = job_id;
  report.slot = slot;
  return report;
}

}  // namespace

Trainer::Trainer(std::unique_ptr<LlamaModel> model,
                 const TrainerOptions& options, ReportSink sink)
    : model_(std::move(model)),
      options_(options),
      ranks_(options.dist),
      checkpoints_(CheckpointerOptions(options, ranks_.leader())),
      pool_(model_->config(),
            PoolOptions(options.pool, *model_, ranks_.data_parallel())),
      owners_(pool_.capacity()),
      sessions_(pool_, owners_, SessionOptions(options),
                [this] {
                  retiring_ = static_cast<int>(
                      pool_.SlotsIn(SlotState::kRetiring).size());
                  PublishSlots();
                }),
      sampling_(*model_, options.tokenizer, options.sample_share),
      reports_(std::move(sink),
               [this] {
                 absl::MutexLock lock(&mu_);
                 wake_.SignalAll();
               }),
      slots_(pool_.capacity()) {
  if (ranks_.distributed()) {
    sync_ = ranks_.data_parallel()->Sync(pool_);
    options_.co_batch.sync = &sync_;
  }
}

Trainer::~Trainer() {
  Stop();
  // Before the members its tasks use go; later commands run inline.
  checkpoints_.Stop();
  sessions_.Stop();
}

void Trainer::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable() || stop_ || !ranks_.leader()) return;
  checkpoints_.LoadGroup();
  thread_ = std::thread([this] { Run(); });
}

void Trainer::Stop() {
  std::deque<TrainerCommand> dropped;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    dropped.swap(commands_);
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
  for (TrainerCommand& command : dropped) {
    Abandon(command, absl::UnavailableError("the server is shutting down"));
  }
}

void Trainer::Enqueue(std::vector<TrainerCommand> commands) {
  // A command that reads checkpoint files (an attach that resumes) reads
  // them on the checkpoint writer's thread, behind the writes queued before
  // it, and reaches the inbox from there; commands queued while such a
  // batch is on its way follow it, so commands keep their order. Every
  // other command comes straight to the inbox: a forward/backward, a
  // sample or an export never waits for a checkpoint being written.
  const bool reads = std::any_of(commands.begin(), commands.end(), ReadsFiles);
  bool stopped = false;
  bool direct = false;
  {
    absl::MutexLock lock(&mu_);
    stopped = stop_;
    direct = !stopped && !reads && via_writer_ == 0;
    if (direct) {
      for (TrainerCommand& command : commands) {
        commands_.push_back(std::move(command));
      }
    } else if (!stopped) {
      ++via_writer_;
    }
  }
  if (stopped) {
    for (TrainerCommand& command : commands) {
      Abandon(command, absl::UnavailableError("the server is shutting down"));
    }
    return;
  }
  if (direct) {
    wake_.SignalAll();
    return;
  }
  auto queued =
      std::make_shared<std::vector<TrainerCommand>>(std::move(commands));
  checkpoints_.Post([this, queued] {
    for (TrainerCommand& command : *queued) {
      std::visit([this](auto& c) { ReadFiles(c); }, command);
    }
    bool stopped = false;
    {
      absl::MutexLock lock(&mu_);
      --via_writer_;
      stopped = stop_;
      if (!stopped) {
        for (TrainerCommand& command : *queued) {
          commands_.push_back(std::move(command));
        }
      }
    }
    wake_.SignalAll();
    if (!stopped) return;
    for (TrainerCommand& command : *queued) {
      Abandon(command, absl::UnavailableError("the server is shutting down"));
    }
  });
}

void Trainer::Attach(AttachCommand command) {
  std::vector<AttachCommand> one;
  one.push_back(std::move(command));
  AttachAll(std::move(one));
}

void Trainer::AttachAll(std::vector<AttachCommand> commands) {
  std::vector<TrainerCommand> entries;
  for (AttachCommand& command : commands) {
    AttachJob attach;
    attach.request = AttachRequestOf(command);
    attach.attach = std::move(command);
    entries.push_back(std::move(attach));
  }
  Enqueue(std::move(entries));
}

void Trainer::Retire(const std::string& job_id) {
  std::vector<TrainerCommand> entry;
  entry.push_back(RetireJob{job_id});
  Enqueue(std::move(entry));
}

void Trainer::Pause(const std::string& job_id) {
  std::vector<TrainerCommand> entry;
  entry.push_back(PauseJob{job_id});
  Enqueue(std::move(entry));
}

void Trainer::Export(const std::string& job_id, const std::string& dir,
                     std::function<void(absl::Status)> done) {
  std::vector<TrainerCommand> entry;
  entry.push_back(ExportJob{job_id, dir, std::move(done)});
  Enqueue(std::move(entry));
}

std::vector<SlotInfo> Trainer::Slots() const {
  absl::MutexLock lock(&mu_);
  return slots_;
}

TrainerStats Trainer::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Trainer::Run() {
  for (;;) {
    std::deque<TrainerCommand> batch;
    const bool stopping = !NextBatch(batch);
    OrderAttaches(batch);
    for (TrainerCommand& command : batch) {
      std::visit([this](auto& c) { Prepare(c); }, command);
    }
    if (ranks_.distributed()) ranks_.SendPlan(PlanOf(batch, stopping));
    if (ranks_.Broken() || !Iterate(batch, stopping, pending_checkpoint_)) {
      for (TrainerCommand& command : batch) {
        Abandon(command, absl::UnavailableError("the trainer stopped"));
      }
      break;
    }
  }
  sampling_.Abandon(absl::UnavailableError("the server is shutting down"));
  sessions_.Abandon(absl::UnavailableError("the server is shutting down"));
  // Open sessions continue after a restart from here, gradients included.
  if (!ranks_.Broken()) sessions_.CheckpointAll();
  // Stopped for good (also after a failure of the ranks): what is queued
  // and what comes later is answered at once, never left waiting.
  std::deque<TrainerCommand> dropped;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    dropped.swap(commands_);
  }
  for (TrainerCommand& command : dropped) {
    Abandon(command, absl::UnavailableError("the trainer stopped"));
  }
  checkpoints_.Flush();  // Stopping: every checkpoint on disk.
  sessions_.Flush();
  ReportWritten();
  if (ranks_.Broken() && options_.on_fatal) options_.on_fatal(ranks_.failure());
}

bool Trainer::NextBatch(std::deque<TrainerCommand>& batch) {
  const bool busy = pending_checkpoint_ || !SteppableSlots().empty() ||
                    !pool_.SlotsIn(SlotState::kEvaluating).empty() ||
                    sampling_.busy() || sessions_.pending();
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || busy || !commands_.empty() || reports_.pending();
  };
  if (const auto heartbeat = ranks_.HeartbeatInterval()) {
    // An idle rank 0 sends the others an empty plan now and then.
    const absl::Time deadline = absl::Now() + absl::FromChrono(*heartbeat);
    while (!ready() && !wake_.WaitWithDeadline(&mu_, deadline)) {
    }
  } else {
    while (!ready()) wake_.Wait(&mu_);
  }
  if (stop_) return false;
  batch.swap(commands_);
  return true;
}

StepPlan Trainer::PlanOf(const std::deque<TrainerCommand>& batch,
                         bool stopping) const {
  StepPlan plan;
  plan.stop = stopping;
  plan.checkpoint = pending_checkpoint_;
  for (int slot : owners_.JobSlots()) plan.active[slot] = HeldSlot(slot);
  for (const TrainerCommand& command : batch) {
    // Exports and attaches that failed on rank 0 are rank 0's alone.
    if (std::optional<StepPlan::Entry> entry = PlanEntryOf(command)) {
      plan.entries.push_back(*std::move(entry));
    }
  }
  return plan;
}

absl::Status Trainer::Follow() {
  for (;;) {
    LORAPLEX_ASSIGN_OR_RETURN(StepPlan plan, ranks_.ReceivePlan());
    FollowActive(plan.active);
    std::deque<TrainerCommand> batch;
    for (StepPlan::Entry& entry : plan.entries) {
      batch.push_back(CommandOf(std::move(entry)));
    }
    if (ranks_.Broken() || !Iterate(batch, plan.stop, plan.checkpoint)) break;
  }
  return ranks_.failure();
}

bool Trainer::Iterate(std::deque<TrainerCommand>& batch, bool stopping,
                      bool checkpoint) {
  pending_checkpoint_ = false;
  ReportWritten();
  // When stopping, every job that trains keeps its progress across the
  // restart.
  if (checkpoint || stopping) CheckpointPool();
  if (stopping || ranks_.Broken()) return false;
  // A rank that broke stops at once: its pool may differ from the others'.
  for (TrainerCommand& command : batch) {
    std::visit([this](auto& c) { Apply(c); }, command);
    if (ranks_.Broken()) return false;
  }
  for (int slot : pool_.SlotsIn(SlotState::kRetiring)) {
    RetireSlot(slot).IgnoreError();  // Still kRetiring on error.
  }
  if (ranks_.Broken()) return false;
  for (int slot : pool_.SlotsIn(SlotState::kEvaluating)) {
    if (owners_.job(slot)) EvaluateOnly(slot);
  }
  if (ranks_.Broken()) return false;
  const auto train_start = std::chrono::steady_clock::now();
  std::vector<SessionCall> calls = sessions_.TakeCalls();
  const bool trained = !SteppableSlots().empty() || !calls.empty();
  const std::vector<int> stepped = TrainStep(calls);
  const double train_seconds =
      !trained ? 0.0
               : std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - train_start)
                     .count();
  if (trained) {
    absl::MutexLock lock(&mu_);
    ++stats_.steps;
    stats_.step_seconds += train_seconds;
    stats_.last_step_seconds = train_seconds;
  }
  pending_checkpoint_ = CheckpointDue(stepped);
  if (!ranks_.Broken()) {
    // Data parallel, rank 0 still plans within half a heartbeat, so the
    // other ranks never take it for dead.
    std::optional<double> limit;
    if (const auto heartbeat = ranks_.HeartbeatInterval()) {
      limit = 0.5 * std::chrono::duration<double>(*heartbeat).count();
    }
    sampling_.Run(train_seconds, limit, [this] {
      absl::MutexLock lock(&mu_);
      return stop_ || !commands_.empty();
    });
  }
  PublishSlots();
  return !ranks_.Broken();
}

StepPlan::Active Trainer::HeldSlot(int slot) const {
  StepPlan::Active held;
  held.job_id = owners_.job(slot)->job_id;
  if (pool_.state(slot) != SlotState::kFree) {
    const TrainingSlot& training = pool_.slot(slot);
    held.step = training.counters.steps;
    if (training.cursor) held.cursor = training.cursor->state();
  }
  return held;
}

void Trainer::FollowActive(const std::map<int, StepPlan::Active>& active) {
  for (int slot : owners_.JobSlots()) {
    auto held = active.find(slot);
    if (held == active.end() ||
        held->second.job_id != owners_.job(slot)->job_id) {
      RetireSlot(slot).IgnoreError();
    }
  }
  for (const auto& [slot, expected] : active) {
    if (!ranks_.failure().ok()) return;
    if (slot < 0 || slot >= pool_.capacity()) {
      ranks_.Fail(absl::InternalError(
          absl::StrCat("rank 0 holds slot ", slot, " but rank ", ranks_.rank(),
                       " has ", pool_.capacity(), " slots")));
      continue;
    }
    if (!owners_.job(slot)) {
      ranks_.Fail(absl::InternalError(
          absl::StrCat("rank ", ranks_.rank(), " holds no job in slot ", slot,
                       " where rank 0 holds job ", expected.job_id)));
      continue;
    }
    const StepPlan::Active mine = HeldSlot(slot);
    const bool same =
        mine.step == expected.step &&
        mine.cursor.has_value() == expected.cursor.has_value() &&
        (!mine.cursor || (mine.cursor->seed == expected.cursor->seed &&
                          mine.cursor->epoch == expected.cursor->epoch &&
                          mine.cursor->position == expected.cursor->position));
    if (!same) {
      const auto describe = [](const StepPlan::Active& held) {
        return held.cursor ? absl::StrCat("step ", held.step, ", epoch ",
                                          held.cursor->epoch, ", position ",
                                          held.cursor->position)
                           : absl::StrCat("step ", held.step);
      };
      ranks_.Fail(absl::InternalError(absl::StrCat(
          "rank ", ranks_.rank(), "'s slot ", slot, " (job ", mine.job_id,
          ") is at ", describe(mine), ", rank 0's at ", describe(expected),
          ": the ranks diverged")));
    }
  }
}

int Trainer::SlotOf(const std::string& job_id) const {
  return owners_.SlotOfJob(job_id);
}

void Trainer::Apply(PauseJob& command) {
  const int slot = SlotOf(command.job_id);
  TrainerReport report =
      JobReport(TrainerReport::Kind::kPaused, command.job_id, slot);
  if (slot < 0 || pool_.state(slot) != SlotState::kTraining) {
    // A job that just ended is reported so (after its export) first.
    ReportWrittenFor(command.job_id);
    report.status = absl::FailedPreconditionError(
        absl::StrCat("job \"", command.job_id, "\" is not training in a slot"));
  } else {
    owners_.job(slot)->held = false;  // Trains on if the pause fails.
    // Every rank takes part in the checkpoint; a fault only fails the
    // pause (the ranks agree on it below).
    const absl::Status fault = TestFault(TestFaultPoint::kPauseCheckpoint,
                                         pool_.slot(slot).training.seed);
    report.status = CheckpointSlot(slot, /*wait=*/true);
    if (report.status.ok()) report.status = fault;
    // Rank 0 alone writes the checkpoint: all pause or none does.
    absl::StatusOr<int> failed = ranks_.CountFailed(!report.status.ok());
    if (!failed.ok()) return;  // Broken.
    if (*failed > 0 && report.status.ok()) {
      report.status = absl::InternalError(
          "its checkpoint failed on another rank (see its log)");
    }
    report.step = pool_.slot(slot).counters.steps;
    report.checkpoint_dir = checkpoints_.StepDir(command.job_id, report.step);
    // Paused once its checkpoint is committed; a failed retire only leaves
    // the slot kRetiring.
    if (report.status.ok()) RetireSlot(slot).IgnoreError();
  }
  Report(std::move(report));
}

void Trainer::Apply(RetireJob& command) {
  const int slot = SlotOf(command.job_id);
  TrainerReport report =
      JobReport(TrainerReport::Kind::kRetired, command.job_id, slot);
  if (slot < 0) {
    // A job that just ended is reported so (after its export) first.
    ReportWrittenFor(command.job_id);
    // Reported all the same, so the scheduler lets go of the job.
    report.status = absl::NotFoundError(
        absl::StrCat("job \"", command.job_id, "\" is not in a slot"));
    Report(std::move(report));
    return;
  }
  // The job's state up to here stays available (export, a new job).
  if (pool_.state(slot) == SlotState::kTraining) {
    CheckpointSlot(slot, /*wait=*/true).IgnoreError();
  }
  if (pool_.state(slot) != SlotState::kFree) {
    // The steps it trained since its last step report (the scheduler drops
    // those of a cancelled job), so its record matches its checkpoint.
    const TrainerReport progress = ProgressReport(report.kind, slot);
    report.step = progress.step;
    report.tokens = progress.tokens;
  }
  report.status = RetireSlot(slot);
  Report(std::move(report));
}

std::vector<int> Trainer::TrainableSlots() const {
  std::vector<int> ids;
  for (int slot : pool_.SlotsIn(SlotState::kTraining)) {
    if (owners_.job(slot)) ids.push_back(slot);
  }
  return ids;
}

std::vector<int> Trainer::SteppableSlots() const {
  std::vector<int> ids;
  for (int slot : TrainableSlots()) {
    if (!owners_.job(slot)->held) ids.push_back(slot);
  }
  return ids;
}

absl::Status Trainer::RetireSlot(int slot) {
  absl::Status status =
      CatchTorch("retire", [&] { return pool_.Retire(slot); });
  // Whether or not zeroing worked, the job has left its slot (a failed
  // retire leaves the slot kRetiring, holding no job). Resumed later, the
  // job continues from its newest checkpoint.
  if (const SlotJob* job = owners_.job(slot)) {
    checkpoints_.Forget(job->job_id);
    owners_.Release(slot);
  }
  if (!status.ok()) {
    ranks_.FailIfDistributed(absl::InternalError(absl::StrCat(
        "freeing slot ", slot, " failed on rank ", ranks_.rank(), " (",
        status.message(), "); the ranks' pools would differ")));
  }
  retiring_ = static_cast<int>(pool_.SlotsIn(SlotState::kRetiring).size());
  // Seen free (ListSlots) before the retire, pause or end is reported.
  PublishSlots();
  return status;
}

std::vector<int> Trainer::TrainStep(std::vector<SessionCall>& calls) {
  const std::vector<int> ids = SteppableSlots();
  std::vector<int> stepped;
  if (ids.empty() && calls.empty()) return stepped;
  std::vector<TrainingSlot*> slots;
  for (int slot : ids) slots.push_back(&pool_.slot(slot));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<ForwardBackwardCall> pass = sessions_.PassOf(calls);
  absl::StatusOr<CoBatchResult> together = CatchTorch("training step", [&] {
    return RunCoBatchPass(*model_, slots, pass, options_.co_batch);
  });
  std::vector<absl::StatusOr<SlotStepMetrics>> outcomes;
  if (together.ok()) {
    sessions_.Answer(calls, std::move(together->calls));
    for (SlotStepMetrics& metrics : together->slots) {
      outcomes.push_back(std::move(metrics));
    }
  } else if (!StepLeftSlotsUnchanged(together.status())) {
    outcomes.assign(slots.size(), together.status());
  } else {
    // Apart, so that no job's or session's data fails another's work (the
    // failed pass left every slot and call as it was): the jobs' step
    // alone, split further where it fails, then each call alone.
    outcomes.assign(slots.size(), together.status());
    if (!slots.empty()) {
      StepInParts(slots, 0, slots.size(), /*failed_together=*/pass.empty(),
                  outcomes);
    }
    for (size_t i = 0; i < calls.size() && !ranks_.Broken(); ++i) {
      absl::StatusOr<CoBatchResult> alone = CatchTorch("forward/backward", [&] {
        return RunCoBatchPass(*model_, {}, {pass[i]}, options_.co_batch);
      });
      std::vector<SessionCall> one;
      one.push_back(std::move(calls[i]));
      sessions_.Answer(
          one, alone.ok() ? absl::StatusOr<std::vector<ForwardBackwardOutput>>(
                                std::move(alone->calls))
                          : alone.status());
    }
  }
  if (ids.empty()) return stepped;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  for (const absl::StatusOr<SlotStepMetrics>& outcome : outcomes) {
    // The ranks failed, not the jobs: nothing is reported, and they resume
    // from their checkpoints after a restart.
    if (outcome.status().code() == absl::StatusCode::kAborted) {
      ranks_.FailIfDistributed(outcome.status());  // It skipped the sync.
    }
  }
  if (ranks_.Broken()) return stepped;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int slot = ids[i];
    if (!outcomes[i].ok()) {
      FinishJob(slot, outcomes[i].status());
      continue;
    }
    if (!outcomes[i]->failure.empty()) {
      FinishJob(slot, absl::InternalError(outcomes[i]->failure));
      continue;
    }
    SlotJob& job = *owners_.job(slot);
    const TrainingSlot& training = pool_.slot(slot);
    const SlotStepMetrics& step = *outcomes[i];
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
    const bool interval_eval = ranks_.leader() && job.validation &&
                               job.eval_interval > 0 &&
                               pool_.state(slot) == SlotState::kTraining &&
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
    Report(std::move(report));
    if (pool_.state(slot) == SlotState::kTrained) {
      FinishJob(slot, absl::OkStatus());
    } else {
      stepped.push_back(slot);
      // Test only; single-process servers (the release by an export is
      // rank 0's alone, which the other ranks' plans would not follow).
      if (!ranks_.distributed() &&
          TestHold(training.training.seed, training.counters.steps)) {
        job.held = true;
      }
    }
  }
  return stepped;
}

void Trainer::StepInParts(
    const std::vector<TrainingSlot*>& slots, size_t begin, size_t end,
    bool failed_together,
    std::vector<absl::StatusOr<SlotStepMetrics>>& outcomes) {
  if (ranks_.Broken()) return;
  if (failed_together && end - begin == 1) return;  // Its error stands.
  if (!failed_together) {
    const std::vector<TrainingSlot*> part(slots.begin() + begin,
                                          slots.begin() + end);
    absl::StatusOr<std::vector<SlotStepMetrics>> result = CatchTorch(
        "training step",
        [&] { return TrainCoBatchStep(*model_, part, options_.co_batch); });
    if (result.ok()) {
      for (size_t i = begin; i < end; ++i) {
        outcomes[i] = std::move((*result)[i - begin]);
      }
      return;
    }
    for (size_t i = begin; i < end; ++i) outcomes[i] = result.status();
    if (end - begin == 1 || !StepLeftSlotsUnchanged(result.status())) return;
  }
  const size_t middle = begin + (end - begin) / 2;
  StepInParts(slots, begin, middle, /*failed_together=*/false, outcomes);
  StepInParts(slots, middle, end, /*failed_together=*/false, outcomes);
}

TrainerReport Trainer::ProgressReport(TrainerReport::Kind kind,
                                      int slot) const {
  const SlotJob& job = *owners_.job(slot);
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

void Trainer::PublishSlots() {
  std::vector<SlotInfo> slots(pool_.capacity());
  for (int i = 0; i < pool_.capacity(); ++i) {
    if (pool_.state(i) == SlotState::kFree) continue;
    SlotInfo& info = slots[i];
    info.attached = true;
    if (const SlotSession* session = owners_.session(i)) {
      const TrainingSlot& training = pool_.slot(i);
      info.session_id = session->session_id;
      info.tenant = session->tenant;
      info.rank = training.weights.config().rank;
      info.family = session->family;
      info.step = training.counters.steps;
      if (training.optimizer) info.lr = training.optimizer->lr();
      continue;
    }
    const SlotJob* job = owners_.job(i);
    if (job == nullptr) continue;  // kRetiring: taken, by no one.
    const TrainingSlot& training = pool_.slot(i);
    info.job_id = job->job_id;
    info.tenant = job->tenant;
    info.rank = training.weights.config().rank;
    info.family = job->family;
    info.step = training.counters.steps;
    info.total_steps = training.total_steps;
    if (training.scheduler) info.lr = training.scheduler->lr();
  }
  absl::MutexLock lock(&mu_);
  // A slot whose step count moved stepped in this iteration.
  const int64_t now = NowMillis();
  for (size_t i = 0; i < slots.size(); ++i) {
    SlotInfo& info = slots[i];
    if (!info.attached) continue;
    const SlotInfo* before = i < slots_.size() ? &slots_[i] : nullptr;
    const bool same_owner = before != nullptr && before->attached &&
                            before->job_id == info.job_id &&
                            before->session_id == info.session_id;
    if (same_owner && before->step == info.step) {
      info.last_step_time_ms = before->last_step_time_ms;
    } else if (same_owner || info.step > 0) {
      info.last_step_time_ms = now;
    }
  }
  slots_ = std::move(slots);
}

}  // namespace loraplex
