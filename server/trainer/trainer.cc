#include "server/trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <iterator>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/test_faults.h"
#include "core/runtime/exception_message.h"
#include "server/common/clock.h"
#include "server/trainer/checkpoint.h"
#include "server/trainer/leader_forwards.h"
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

JobSlotsOptions JobOptions(const TrainerOptions& options, bool leader) {
  JobSlotsOptions jobs;
  jobs.base_model_name = options.base_model_name;
  PoolCheckpointerOptions& checkpoints = jobs.checkpoints;
  checkpoints.root = options.checkpoint_root;
  checkpoints.interval = options.checkpoint_interval;
  checkpoints.keep = options.keep_checkpoints;
  checkpoints.base_model_name = options.base_model_name;
  checkpoints.enabled =
      leader ? !options.checkpoint_root.empty() : options.leader_checkpoints;
  return jobs;
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

}  // namespace

Trainer::Trainer(std::unique_ptr<LlamaModel> model,
                 const TrainerOptions& options, ReportSink sink)
    : model_(std::move(model)),
      options_(options),
      ranks_(options.dist),
      pool_(model_->config(),
            PoolOptions(options.pool, *model_, ranks_.data_parallel())),
      owners_(pool_.capacity()),
      reports_(std::move(sink),
               [this] {
                 absl::MutexLock lock(&mu_);
                 wake_.SignalAll();
               }),
      jobs_(*model_, pool_, owners_, ranks_, reports_, options_.co_batch,
            JobOptions(options, ranks_.leader()), [this] { SlotsChanged(); }),
      sessions_(pool_, owners_, ranks_, SessionOptions(options),
                [this] { SlotsChanged(); }),
      sampling_(*model_, options.tokenizer, options.sample_share),
      parts_{pool_, ranks_, jobs_, sessions_, sampling_},
      slots_(pool_.capacity()) {
  if (ranks_.distributed()) {
    sync_ = ranks_.data_parallel()->Sync(pool_);
    options_.co_batch.sync = &sync_;
    sessions_.set_sync(&sync_);
  }
}

Trainer::~Trainer() {
  Stop();
  // Before the members its tasks use go; later commands run inline.
  jobs_.checkpoints().Stop();
  sessions_.Stop();
}

void Trainer::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable() || stop_ || !ranks_.leader()) return;
  jobs_.checkpoints().LoadGroup();
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
  const bool reads =
      std::any_of(commands.begin(), commands.end(), CommandReadsFiles);
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
  jobs_.checkpoints().Post([this, queued] {
    for (TrainerCommand& command : *queued) {
      ReadCommandFiles(command, parts_);
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

void Trainer::Post(TrainerCommand command) {
  std::vector<TrainerCommand> one;
  one.push_back(std::move(command));
  Enqueue(std::move(one));
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

void Trainer::Retire(const std::string& job_id) { Post(RetireJob{job_id}); }

void Trainer::Pause(const std::string& job_id) { Post(PauseJob{job_id}); }

void Trainer::Export(const std::string& job_id, const std::string& dir,
                     std::function<void(absl::Status)> done) {
  Post(ExportJob{job_id, dir, std::move(done)});
}

void Trainer::Sample(SampleCommand command) {
  SampleJob job;
  job.command = std::move(command);
  Post(std::move(job));
}

void Trainer::OpenSession(SessionOpenCommand command) {
  Post(OpenSessionJob{std::move(command)});
}

void Trainer::RunSessionOp(SessionOp op) { Post(SessionWork{std::move(op)}); }

std::vector<SlotInfo> Trainer::Slots() const {
  absl::MutexLock lock(&mu_);
  return slots_;
}

TrainerStats Trainer::Stats() const {
  TrainerStats stats;
  {
    absl::MutexLock lock(&mu_);
    stats = stats_;
  }
  jobs_.AddStats(stats);
  return stats;
}

void Trainer::ReportWritten() { reports_.Flush(ranks_.leader()); }

void Trainer::SlotsChanged() {
  retiring_ = static_cast<int>(pool_.SlotsIn(SlotState::kRetiring).size());
  PublishSlots();
}

void Trainer::Run() {
  for (;;) {
    std::deque<TrainerCommand> batch;
    const bool stopping = !NextBatch(batch);
    jobs_.OrderAttaches(batch);
    for (TrainerCommand& command : batch) PrepareCommand(command, parts_);
    std::vector<StepPlan::SessionStep> round;
    if (!stopping) round = sessions_.TakeRound();
    if (ranks_.distributed()) {
      ranks_.SendPlan(PlanOf(batch, stopping, round));
    }
    if (ranks_.Broken() ||
        !Iterate(batch, stopping, pending_checkpoint_, round)) {
      for (TrainerCommand& command : batch) {
        Abandon(command, absl::UnavailableError("the trainer stopped"));
      }
      SessionSlots::AbandonRound(round,
                                 absl::UnavailableError("the trainer stopped"));
      break;
    }
  }
  sampling_.Abandon(absl::UnavailableError("the server is shutting down"));
  sessions_.Abandon(absl::UnavailableError("the server is shutting down"));
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
  jobs_.checkpoints().Flush();  // Stopping: every checkpoint on disk.
  sessions_.Flush();
  ReportWritten();
  if (ranks_.Broken() && options_.on_fatal) options_.on_fatal(ranks_.failure());
}

bool Trainer::NextBatch(std::deque<TrainerCommand>& batch) {
  const bool busy = pending_checkpoint_ || !jobs_.Steppable().empty() ||
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

StepPlan Trainer::PlanOf(
    const std::deque<TrainerCommand>& batch, bool stopping,
    const std::vector<StepPlan::SessionStep>& round) const {
  StepPlan plan;
  plan.stop = stopping;
  plan.checkpoint = pending_checkpoint_;
  for (int slot : owners_.JobSlots()) plan.active[slot] = jobs_.Held(slot);
  for (const TrainerCommand& command : batch) {
    // Exports and attaches that failed on rank 0 are rank 0's alone.
    if (std::optional<StepPlan::Entry> entry = PlanEntryOf(command)) {
      plan.entries.push_back(*std::move(entry));
    }
  }
  plan.sessions = round;  // The encoding leaves rank 0's parts out.
  return plan;
}

absl::Status Trainer::Follow() {
  for (;;) {
    LORAPLEX_ASSIGN_OR_RETURN(StepPlan plan, ranks_.ReceivePlan());
    jobs_.FollowActive(plan.active);
    std::deque<TrainerCommand> batch;
    for (StepPlan::Entry& entry : plan.entries) {
      if (std::optional<TrainerCommand> command = CommandOf(std::move(entry))) {
        batch.push_back(*std::move(command));
      }
    }
    if (ranks_.Broken() ||
        !Iterate(batch, plan.stop, plan.checkpoint, plan.sessions)) {
      break;
    }
  }
  return ranks_.failure();
}

bool Trainer::Iterate(std::deque<TrainerCommand>& batch, bool stopping,
                      bool checkpoint,
                      std::vector<StepPlan::SessionStep>& round) {
  pending_checkpoint_ = false;
  ReportWritten();
  // When stopping, every job that trains keeps its progress across the
  // restart, and every open session continues from here, gradients
  // included.
  if (checkpoint || stopping) jobs_.CheckpointPool();
  if (stopping && !ranks_.Broken()) sessions_.CheckpointAll();
  if (stopping || ranks_.Broken()) return false;
  // A rank that broke stops at once: its pool may differ from the others'.
  for (TrainerCommand& command : batch) {
    ApplyCommand(command, parts_);
    if (ranks_.Broken()) return false;
  }
  jobs_.RetryRetires();
  if (ranks_.Broken()) return false;
  {
    LeaderForwards forwards(*model_, ranks_);  // Rank 0 evaluates.
    jobs_.EvaluateWaiting();
  }
  if (ranks_.Broken()) return false;
  const auto train_start = std::chrono::steady_clock::now();
  std::vector<SessionCall> calls = sessions_.ApplyRound(round);
  if (ranks_.Broken()) {
    sessions_.Answer(calls, absl::UnavailableError("the trainer stopped"));
    return false;
  }
  const bool trained = !jobs_.Steppable().empty() || !calls.empty();
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
  pending_checkpoint_ = jobs_.CheckpointDue(stepped);
  if (!ranks_.Broken()) {
    // Data parallel, rank 0 still plans within half a heartbeat, so the
    // other ranks never take it for dead.
    std::optional<double> limit;
    if (const auto heartbeat = ranks_.HeartbeatInterval()) {
      limit = 0.5 * std::chrono::duration<double>(*heartbeat).count();
    }
    LeaderForwards forwards(*model_, ranks_);  // Rank 0 samples.
    sampling_.Run(train_seconds, limit, [this] {
      absl::MutexLock lock(&mu_);
      return stop_ || !commands_.empty();
    });
  }
  PublishSlots();
  return !ranks_.Broken();
}

std::vector<int> Trainer::TrainStep(std::vector<SessionCall>& calls) {
  const std::vector<int> ids = jobs_.Steppable();
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
    sessions_.Answer(calls, together.status());
  } else {
    // Apart, so that no job's or session's data fails another's work (the
    // failed pass left every slot and call as it was): the jobs' step
    // alone, split further where it fails, then each call alone.
    outcomes.assign(slots.size(), together.status());
    if (!slots.empty()) {
      StepInParts(slots, 0, slots.size(), /*failed_together=*/pass.empty(),
                  outcomes);
    }
    size_t i = 0;
    for (; i < calls.size() && !ranks_.Broken(); ++i) {
      absl::StatusOr<CoBatchResult> alone = CatchTorch("forward/backward", [&] {
        return RunCoBatchPass(*model_, {}, {pass[i]}, options_.co_batch);
      });
      std::vector<SessionCall> one;
      one.push_back(std::exchange(calls[i], SessionCall{}));
      sessions_.Answer(
          one, alone.ok() ? absl::StatusOr<std::vector<ForwardBackwardOutput>>(
                                std::move(alone->calls))
                          : alone.status());
    }
    // The ranks broke: the calls not run are answered, not left waiting.
    std::vector<SessionCall> rest(std::make_move_iterator(calls.begin() + i),
                                  std::make_move_iterator(calls.end()));
    sessions_.Answer(rest, absl::UnavailableError("the trainer stopped"));
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
  LeaderForwards forwards(*model_, ranks_);  // Rank 0 validates.
  return jobs_.RecordSteps(ids, outcomes, seconds);
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
