#include "server/jobs/job_scheduler.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "server/common/clock.h"
#include "server/jobs/job_spec.h"
#include "server/jobs/resource_id.h"

namespace loraplex {

JobScheduler::JobScheduler(JobStore* store, DatasetLoader* datasets,
                           JobEventHub* hub, Logger* logger,
                           const SchedulerOptions& options)
    : store_(store),
      datasets_(datasets),
      hub_(hub),
      logger_(logger),
      options_(options) {}

JobScheduler::~JobScheduler() { Stop(); }

std::string JobScheduler::AdapterDir(const std::string& adapter_id) const {
  return absl::StrCat(options_.state_dir, "/adapters/", adapter_id);
}

std::string JobScheduler::CheckpointDir(const std::string& job_id) const {
  return absl::StrCat(options_.state_dir, "/checkpoints/", job_id);
}

absl::Status JobScheduler::Start(JobTrainer* trainer,
                                 const std::function<void()>& first) {
  LORAPLEX_ASSIGN_OR_RETURN(
      std::vector<JobRecord> unfinished,
      store_->JobsWithStatus({JobStatus::kValidating, JobStatus::kQueued,
                              JobStatus::kRunning, JobStatus::kPaused}));
  // Jobs that were running go first, in slot order, so they get their
  // slots back and train in the same co-batches as before.
  std::stable_sort(unfinished.begin(), unfinished.end(),
                   [](const JobRecord& a, const JobRecord& b) {
                     const bool a_ran = a.status == JobStatus::kRunning;
                     const bool b_ran = b.status == JobStatus::kRunning;
                     if (a_ran != b_ran) return a_ran;
                     return a_ran && a.slot < b.slot;
                   });
  {
    absl::MutexLock lock(&mu_);
    trainer_ = trainer;
  }
  if (first) first();
  absl::MutexLock lock(&mu_);
  for (JobRecord& record : unfinished) {
    if (live_.count(record.id) > 0) continue;
    auto job = std::make_unique<LiveJob>();
    job->record = std::move(record);
    job->stored_status = job->record.status;
    LiveJob& live = *job;
    const std::string id = live.record.id;
    live_[id] = std::move(job);
    if (live.record.status == JobStatus::kPaused) continue;
    queue_.push_back(id);
    live.restarted_in_slot = -1;
    if (live.record.status != JobStatus::kQueued) {
      live.restarted_in_slot = live.record.slot;
      live.record.status = JobStatus::kQueued;
      live.record.slot = -1;
      Commit(live, {StatusEvent(live.record, JobStatus::kQueued,
                                "queued again: the server restarted; it "
                                "continues from its latest checkpoint")})
          .IgnoreError();  // Logged and counted.
    }
  }
  if (!unfinished.empty()) {
    logger_->Info("recovered ", unfinished.size(), " unfinished job(s)");
  }
  thread_ = std::thread([this] { Run(); });
  FillSlots();
  return absl::OkStatus();
}

void JobScheduler::Stop() {
  {
    absl::MutexLock lock(&inbox_mu_);
    stop_ = true;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, job] : live_) {
    if (!job->pause_done) continue;
    job->pause_done(absl::UnavailableError("the server is shutting down"));
    job->pause_done = nullptr;
  }
}

bool JobScheduler::Holds(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  return live_.count(job_id) > 0;
}

void JobScheduler::RefuseCommands(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (!refused_.ok()) return;
  refused_ = why;
  for (auto& [id, job] : live_) {
    if (job->pause_done) std::exchange(job->pause_done, nullptr)(why);
  }
}

absl::StatusOr<JobRecord> JobScheduler::Submit(
    JobRecord record, JobSpec spec, JobData data,
    const std::optional<RequestKey>& request) {
  record.spec = JobSpecToJson(spec);
  record.status = JobStatus::kQueued;
  record.slot = -1;
  record.create_time_ms = NowMillis();
  record.total_steps = data.total_steps;
  std::string validating = "validating the request";
  for (const std::string& note : data.notes) {
    absl::StrAppend(&validating, "; ", note);
  }
  std::vector<JobEventRecord> events = {
      StatusEvent(record, JobStatus::kValidating, validating),
      StatusEvent(record, JobStatus::kQueued,
                  absl::StrCat("queued: ", record.total_steps,
                               " steps for tenant ", record.tenant))};
  absl::MutexLock lock(&mu_);
  LORAPLEX_RETURN_IF_ERROR(refused_);
  absl::Status stored =
      store_
          ->InsertJob(record, std::move(events),
                      request.has_value() ? &*request : nullptr)
          .status();
  // An id already taken is the request's fault, not the store's.
  if (!absl::IsAlreadyExists(stored)) CountStoreWrite(stored);
  LORAPLEX_RETURN_IF_ERROR(stored);
  auto job = std::make_unique<LiveJob>();
  job->record = record;
  job->spec = std::move(spec);
  job->stored_status = record.status;
  job->data = std::move(data);
  job->place = JobPlace::kPrepared;
  live_[record.id] = std::move(job);
  queue_.push_back(record.id);
  if (trainer_ != nullptr) FillSlots();
  return record;
}

absl::StatusOr<JobRecord> JobScheduler::Cancel(const std::string& tenant,
                                               const std::string& job_id,
                                               const std::string& reason) {
  absl::MutexLock lock(&mu_);
  LORAPLEX_RETURN_IF_ERROR(refused_);
  LORAPLEX_ASSIGN_OR_RETURN(LiveJob * active, ActiveJob(tenant, job_id));
  LiveJob& job = *active;
  JobRecord updated = job.record;
  updated.status = JobStatus::kCancelled;
  updated.slot = -1;
  updated.end_time_ms = NowMillis();
  LORAPLEX_RETURN_IF_ERROR(CommitChange(
      job, updated, {StatusEvent(updated, JobStatus::kCancelled, reason)}));
  Dequeue(job_id);
  const bool in_trainer =
      job.place == JobPlace::kInTrainer || job.place == JobPlace::kPausing;
  if (in_trainer) trainer_->Retire(job_id);
  JobRecord result = job.record;
  if (!in_trainer) Forget(job_id);
  return result;
}

absl::StatusOr<JobScheduler::LiveJob*> JobScheduler::ActiveJob(
    const std::string& tenant, const std::string& job_id) {
  auto it = live_.find(job_id);
  if (it == live_.end() || IsTerminal(it->second->record.status) ||
      (!tenant.empty() && it->second->record.tenant != tenant)) {
    LORAPLEX_ASSIGN_OR_RETURN(JobRecord stored, store_->GetJob(tenant, job_id));
    if (IsTerminal(stored.status)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job \"", job_id, "\" already finished as ",
                       JobStatusName(stored.status)));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is not active"));
  }
  return it->second.get();
}

void JobScheduler::Dequeue(const std::string& job_id) {
  queue_.erase(std::remove(queue_.begin(), queue_.end(), job_id), queue_.end());
}

void JobScheduler::Forget(const std::string& job_id) {
  auto it = live_.find(job_id);
  if (it == live_.end()) return;
  if (IsTerminal(it->second->record.status) && options_.on_job_finished) {
    options_.on_job_finished(job_id);
  }
  if (it->second->pause_done) {
    const JobRecord& record = it->second->record;
    it->second->pause_done(absl::FailedPreconditionError(absl::StrCat(
        "job \"", job_id, "\" finished as ", JobStatusName(record.status),
        " before it could be paused")));
  }
  live_.erase(it);
}

void JobScheduler::Pause(const std::string& tenant, const std::string& job_id,
                         std::function<void(absl::StatusOr<JobRecord>)> done) {
  absl::MutexLock lock(&mu_);
  if (!refused_.ok()) return done(refused_);
  absl::StatusOr<LiveJob*> active = ActiveJob(tenant, job_id);
  if (!active.ok()) return done(active.status());
  LiveJob& job = **active;
  if (job.record.status == JobStatus::kPaused) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is already paused")));
  }
  if (job.place == JobPlace::kPausing) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is already being paused")));
  }
  if (job.place == JobPlace::kInTrainer) {
    MoveTo(job, JobPlace::kPausing);
    job.pause_done = std::move(done);
    trainer_->Pause(job_id);
    return;
  }
  JobRecord updated = job.record;
  updated.status = JobStatus::kPaused;
  absl::Status stored = CommitChange(
      job, updated,
      {StatusEvent(updated, JobStatus::kPaused, "paused while queued")});
  if (!stored.ok()) return done(stored);
  Dequeue(job_id);
  done(job.record);
}

absl::StatusOr<JobRecord> JobScheduler::Resume(const std::string& tenant,
                                               const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  LORAPLEX_RETURN_IF_ERROR(refused_);
  LORAPLEX_ASSIGN_OR_RETURN(LiveJob * active, ActiveJob(tenant, job_id));
  LiveJob& job = *active;
  if (job.record.status != JobStatus::kPaused) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is ",
                     JobStatusName(job.record.status), ", not PAUSED"));
  }
  JobRecord updated = job.record;
  updated.status = JobStatus::kQueued;
  LORAPLEX_RETURN_IF_ERROR(CommitChange(
      job, updated,
      {StatusEvent(
          updated, JobStatus::kQueued,
          absl::StrCat("resumed: continues from step ", updated.metrics.step,
                       " when a slot is free"))}));
  queue_.push_back(job_id);
  JobRecord result = job.record;
  if (trainer_ != nullptr) FillSlots();
  return result;
}

void JobScheduler::ExportRunning(const std::string& job_id,
                                 const std::string& dir,
                                 std::function<void(absl::Status)> done) {
  {
    absl::MutexLock lock(&mu_);
    if (!refused_.ok()) return done(refused_);
  }
  trainer_->Export(job_id, dir, std::move(done));
}

void JobScheduler::Sample(SampleCommand command) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    refused = trainer_ == nullptr
                  ? absl::UnavailableError("the server is starting")
                  : refused_;
  }
  if (!refused.ok()) return command.done(refused, 0);
  trainer_->Sample(std::move(command));
}

void JobScheduler::OnTrainerReport(TrainerReport report) {
  {
    absl::MutexLock lock(&inbox_mu_);
    inbox_.push_back(std::move(report));
  }
  wake_.SignalAll();
}

void JobScheduler::Run() {
  using Clock = std::chrono::steady_clock;
  const auto interval =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
          options_.throughput_log_seconds > 0 ? options_.throughput_log_seconds
                                              : 3600.0));
  auto next_log = Clock::now() + interval;
  for (;;) {
    std::deque<TrainerReport> reports;
    bool stopping = false;
    bool prepare = false;
    {
      absl::MutexLock lock(&inbox_mu_);
      while (!stop_ && inbox_.empty() && !prepare_requested_ &&
             Clock::now() < next_log) {
        wake_.WaitWithTimeout(&inbox_mu_,
                              absl::FromChrono(next_log - Clock::now()));
      }
      stopping = stop_;
      prepare = std::exchange(prepare_requested_, false);
      reports.swap(inbox_);
    }
    if (prepare && !stopping) PrepareQueuedData();
    absl::MutexLock lock(&mu_);
    if (!reports.empty()) {
      HandleReports(std::move(reports));
      if (!stopping) FillSlots();
    }
    if (stopping) return;
    if (Clock::now() >= next_log) {
      if (options_.throughput_log_seconds > 0) LogThroughput();
      next_log = Clock::now() + interval;
    }
  }
}

absl::Status JobScheduler::ReserveSessionSlot(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  if (trainer_ == nullptr) {
    return absl::UnavailableError("the server is not scheduling yet");
  }
  LORAPLEX_RETURN_IF_ERROR(refused_);
  const int capacity = trainer_->capacity();
  if (reserved_ >= capacity) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "all ", capacity,
        " adapter slots are in use by jobs and sessions; close a session or "
        "wait for a job to end"));
  }
  if (reserved_by_tenant_[tenant] >= options_.slots_per_tenant) {
    return absl::ResourceExhaustedError(
        absl::StrCat("your jobs and sessions hold all ",
                     options_.slots_per_tenant, " slots of your quota"));
  }
  ++reserved_;
  ++reserved_by_tenant_[tenant];
  return absl::OkStatus();
}

void JobScheduler::ReleaseSessionSlot(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  --reserved_;
  --reserved_by_tenant_[tenant];
  FillSlots();
}

void JobScheduler::FillSlots() {
  const int capacity = trainer_->capacity();
  // The jobs that go next, in queue order under the quotas. They are
  // handed over together, so they start at the same step boundary.
  std::vector<std::string> next;
  int reserved = reserved_;
  std::map<std::string, int> reserved_by_tenant = reserved_by_tenant_;
  bool unprepared = false;
  for (auto it = queue_.begin(); it != queue_.end() && reserved < capacity;) {
    LiveJob& job = *live_.at(*it);
    const std::string& tenant = job.record.tenant;
    if (reserved_by_tenant[tenant] >= options_.slots_per_tenant) {
      ++it;
      continue;
    }
    if (!job.spec) {
      absl::StatusOr<JobSpec> spec = JobSpecFromJson(job.record.spec);
      if (!spec.ok()) {
        const std::string id = *it;
        it = queue_.erase(it);
        Fail(job, spec.status());
        Forget(id);
        continue;
      }
      job.spec = *std::move(spec);
    }
    if (job.place == JobPlace::kWaiting) MoveTo(job, JobPlace::kPreparing);
    if (job.place == JobPlace::kPreparing) unprepared = true;
    next.push_back(*it);
    ++reserved;
    ++reserved_by_tenant[tenant];
    ++it;
  }
  if (unprepared) {
    // Resumed and recovered jobs: their data is prepared on the
    // scheduler's thread, out of this lock, and they go then.
    {
      absl::MutexLock lock(&inbox_mu_);
      prepare_requested_ = true;
    }
    wake_.SignalAll();
    return;
  }
  std::vector<AttachCommand> commands;
  for (const std::string& id : next) {
    LiveJob& job = *live_.at(id);
    const std::string& tenant = job.record.tenant;
    AttachCommand command;
    command.job_id = job.record.id;
    command.tenant = tenant;
    command.spec = *job.spec;
    command.data = job.data.training;
    command.validation = job.data.validation;
    command.resume = true;  // From a checkpoint, if the job has one.
    command.preferred_slot = job.restarted_in_slot.value_or(-1);
    command.recovering = job.restarted_in_slot.has_value();
    job.restarted_in_slot.reset();
    command.job_spec = job.record.spec;
    if (!job.record.initial_adapter_id.empty()) {
      command.initial_adapter_dir = AdapterDir(job.record.initial_adapter_id);
    }
    if (job.data.training) {
      job.final_adapter_id = NewResourceId("adapter");
      command.final_adapter_dir = AdapterDir(job.final_adapter_id);
    }
    MoveTo(job, JobPlace::kInTrainer);
    ++reserved_;
    ++reserved_by_tenant_[tenant];
    queue_.erase(std::find(queue_.begin(), queue_.end(), id));
    commands.push_back(std::move(command));
  }
  if (!commands.empty()) trainer_->AttachAll(std::move(commands));
}

void JobScheduler::PrepareQueuedData() {
  struct Preparation {
    std::string id;
    JobRecord record;
    JobSpec spec;
    absl::StatusOr<JobData> data = absl::UnknownError("not prepared");
  };
  std::vector<Preparation> work;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : queue_) {
      const LiveJob& job = *live_.at(id);
      if (job.place == JobPlace::kPreparing) {
        work.push_back({id, job.record, *job.spec});
      }
    }
  }
  // Reads and tokenizes datasets: neither API calls nor reports wait.
  for (Preparation& job : work) {
    job.data = PrepareJobData(*datasets_, job.record, &job.spec);
  }
  absl::MutexLock lock(&mu_);
  for (Preparation& prepared : work) {
    auto live = live_.find(prepared.id);
    if (live == live_.end()) continue;  // Cancelled meanwhile.
    LiveJob& job = *live->second;
    if (job.place != JobPlace::kPreparing) continue;
    auto queued = std::find(queue_.begin(), queue_.end(), prepared.id);
    // Paused meanwhile: prepared again when resumed.
    if (queued == queue_.end()) {
      MoveTo(job, JobPlace::kWaiting);
      continue;
    }
    if (!prepared.data.ok()) {
      queue_.erase(queued);
      MoveTo(job, JobPlace::kWaiting);
      Fail(job, prepared.data.status());
      Forget(prepared.id);
      continue;
    }
    job.data = *std::move(prepared.data);
    MoveTo(job, JobPlace::kPrepared);
    job.record.total_steps = job.data.total_steps;
    job.record.spec = JobSpecToJson(prepared.spec);
    job.spec = std::move(prepared.spec);
  }
  bool stopping = false;
  {
    absl::MutexLock inbox(&inbox_mu_);
    stopping = stop_;
  }
  if (trainer_ != nullptr && !stopping) FillSlots();
}

absl::Status JobScheduler::CheckStatusChange(const LiveJob& job, JobStatus to) {
  if (IsAllowedStatusChange(job.stored_status, to)) return absl::OkStatus();
  const absl::Status refused = absl::InternalError(absl::StrCat(
      "job \"", job.record.id, "\" cannot go from ",
      JobStatusName(job.stored_status), " to ", JobStatusName(to)));
  logger_->Error(refused.message(), " (a bug: not stored)");
  return refused;
}

absl::Status JobScheduler::Commit(LiveJob& job,
                                  std::vector<JobEventRecord> events) {
  LORAPLEX_RETURN_IF_ERROR(CheckStatusChange(job, job.record.status));
  // The change is made (the live record has it) even if this write fails:
  // the next write of the record stores it.
  job.stored_status = job.record.status;
  absl::Status stored =
      store_->UpdateJob(job.record, std::move(events)).status();
  CountStoreWrite(stored);
  if (!stored.ok()) {
    logger_->Error("storing job ", job.record.id, ": ", stored.message());
  }
  hub_->Notify(job.record.id);
  return stored;
}

absl::Status JobScheduler::CommitChange(LiveJob& job, const JobRecord& updated,
                                        std::vector<JobEventRecord> events) {
  LORAPLEX_RETURN_IF_ERROR(CheckStatusChange(job, updated.status));
  absl::Status stored = store_->UpdateJob(updated, std::move(events)).status();
  CountStoreWrite(stored);
  if (!stored.ok()) {
    logger_->Error("storing job ", updated.id, ": ", stored.message());
    return absl::Status(
        stored.code(),
        absl::StrCat(
            "the change to job \"", updated.id,
            "\" could not be stored, so it was not made: ", stored.message()));
  }
  job.record = updated;
  job.stored_status = updated.status;
  hub_->Notify(job.record.id);
  return absl::OkStatus();
}

void JobScheduler::CountStoreWrite(const absl::Status& status) {
  if (status.ok()) {
    store_failures_ = 0;
    return;
  }
  if (++store_failures_ != options_.max_store_failures) return;
  logger_->Error("the job store failed ", store_failures_,
                 " writes in a row (last: ", status.message(),
                 "); stopping, as nothing more could be recorded");
  if (options_.on_store_failure) options_.on_store_failure(status);
}

JobEventRecord JobScheduler::StatusEvent(const JobRecord& job, JobStatus status,
                                         const std::string& message) {
  JobEventRecord event;
  event.job_id = job.id;
  event.time_ms = NowMillis();
  event.status = status;
  event.message = message;
  event.error_code = job.error_code;
  event.error_message = job.error_message;
  logger_->Info("job ", job.id, ": ", JobStatusName(status), " (", message,
                ")");
  return event;
}

void JobScheduler::MoveTo(LiveJob& job, JobPlace place) {
  if (!IsAllowedPlaceChange(job.place, place)) {
    logger_->Error("job ", job.record.id, ": moved from ",
                   JobPlaceName(job.place), " to ", JobPlaceName(place),
                   ", which the scheduler never does (a bug)");
  }
  job.place = place;
}

void JobScheduler::Release(LiveJob& job) {
  if (job.place != JobPlace::kInTrainer && job.place != JobPlace::kPausing) {
    return;
  }
  MoveTo(job, JobPlace::kWaiting);
  --reserved_;
  --reserved_by_tenant_[job.record.tenant];
}

void JobScheduler::Fail(LiveJob& job, const absl::Status& status) {
  job.record.status = JobStatus::kFailed;
  job.record.slot = -1;
  job.record.end_time_ms = NowMillis();
  job.record.error_code = absl::StatusCodeToString(status.code());
  job.record.error_message = std::string(status.message());
  Commit(job, {StatusEvent(job.record, JobStatus::kFailed,
                           std::string(status.message()))})
      .IgnoreError();  // Logged and counted.
}

}  // namespace loraplex
