#include "server/jobs/job_scheduler.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
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

absl::Status JobScheduler::Start(JobTrainer* trainer) {
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
  absl::MutexLock lock(&mu_);
  trainer_ = trainer;
  for (JobRecord& record : unfinished) {
    if (live_.count(record.id) > 0) continue;
    auto job = std::make_unique<LiveJob>();
    job->record = std::move(record);
    LiveJob& live = *job;
    const std::string id = live.record.id;
    live_[id] = std::move(job);
    if (live.record.status == JobStatus::kPaused) continue;
    queue_.push_back(id);
    live.recovering = true;
    if (live.record.status != JobStatus::kQueued) {
      live.resume_slot = live.record.slot;
      live.record.status = JobStatus::kQueued;
      live.record.slot = -1;
      Commit(live, {StatusEvent(live.record, JobStatus::kQueued,
                                "queued again: the server restarted; it "
                                "continues from its latest checkpoint")});
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

absl::StatusOr<JobRecord> JobScheduler::Submit(JobRecord record, JobSpec spec,
                                               JobData data) {
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
  LORAPLEX_RETURN_IF_ERROR(
      store_->InsertJob(record, std::move(events)).status());
  auto job = std::make_unique<LiveJob>();
  job->record = record;
  job->spec = std::move(spec);
  job->data = std::move(data);
  job->data_ready = true;
  live_[record.id] = std::move(job);
  queue_.push_back(record.id);
  if (trainer_ != nullptr) FillSlots();
  return record;
}

absl::StatusOr<JobRecord> JobScheduler::Cancel(const std::string& tenant,
                                               const std::string& job_id,
                                               const std::string& reason) {
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(LiveJob * active, ActiveJob(tenant, job_id));
  LiveJob& job = *active;
  job.record.status = JobStatus::kCancelled;
  job.record.slot = -1;
  job.record.end_time_ms = NowMillis();
  Dequeue(job_id);
  if (job.in_trainer) trainer_->Retire(job_id);
  Commit(job, {StatusEvent(job.record, JobStatus::kCancelled, reason)});
  JobRecord result = job.record;
  if (!job.in_trainer) Forget(job_id);
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
  absl::StatusOr<LiveJob*> active = ActiveJob(tenant, job_id);
  if (!active.ok()) return done(active.status());
  LiveJob& job = **active;
  if (job.record.status == JobStatus::kPaused) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is already paused")));
  }
  if (job.pause_done) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is already being paused")));
  }
  if (job.in_trainer) {
    job.pause_done = std::move(done);
    trainer_->Pause(job_id);
    return;
  }
  Dequeue(job_id);
  job.record.status = JobStatus::kPaused;
  Commit(job,
         {StatusEvent(job.record, JobStatus::kPaused, "paused while queued")});
  done(job.record);
}

absl::StatusOr<JobRecord> JobScheduler::Resume(const std::string& tenant,
                                               const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  LORAPLEX_ASSIGN_OR_RETURN(LiveJob * active, ActiveJob(tenant, job_id));
  LiveJob& job = *active;
  if (job.record.status != JobStatus::kPaused) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is ",
                     JobStatusName(job.record.status), ", not PAUSED"));
  }
  job.record.status = JobStatus::kQueued;
  queue_.push_back(job_id);
  Commit(job, {StatusEvent(job.record, JobStatus::kQueued,
                           absl::StrCat("resumed: continues from step ",
                                        job.record.metrics.step,
                                        " when a slot is free"))});
  JobRecord result = job.record;
  if (trainer_ != nullptr) FillSlots();
  return result;
}

void JobScheduler::ExportRunning(const std::string& job_id,
                                 const std::string& dir,
                                 std::function<void(absl::Status)> done) {
  trainer_->Export(job_id, dir, std::move(done));
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
    {
      absl::MutexLock lock(&inbox_mu_);
      while (!stop_ && inbox_.empty() && Clock::now() < next_log) {
        wake_.WaitWithTimeout(&inbox_mu_,
                              absl::FromChrono(next_log - Clock::now()));
      }
      stopping = stop_;
      reports.swap(inbox_);
    }
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

void JobScheduler::HandleReports(std::deque<TrainerReport> reports) {
  // Steps of all slots are stored in one transaction (one fsync).
  std::map<std::string, std::vector<JobEventRecord>> step_events;
  auto flush_steps = [&] {
    if (step_events.empty()) return;
    std::vector<JobStore::JobUpdate> updates;
    for (auto& [id, events] : step_events) {
      updates.push_back({live_.at(id)->record, std::move(events)});
    }
    absl::Status stored = store_->UpdateJobs(std::move(updates)).status();
    if (!stored.ok())
      logger_->Error("storing step metrics: ", stored.message());
    for (const auto& [id, events] : step_events) hub_->Notify(id);
    step_events.clear();
  };

  for (TrainerReport& report : reports) {
    auto it = live_.find(report.job_id);
    if (it == live_.end()) continue;
    LiveJob& job = *it->second;
    const bool cancelled = job.record.status == JobStatus::kCancelled;
    if (report.kind == TrainerReport::Kind::kStep) {
      if (cancelled) continue;
      JobMetricsRecord& metrics = job.record.metrics;
      metrics.step = report.step;
      metrics.loss = report.metrics.loss;
      metrics.lr = report.metrics.lr;
      metrics.grad_norm = report.metrics.grad_norm;
      metrics.tokens_per_second = report.tokens_per_second;
      metrics.tokens = report.tokens;
      metrics.skipped_steps = report.skipped_steps;
      if (report.validation_loss) {
        metrics.validation_loss = report.validation_loss;
      }
      JobEventRecord event;
      event.job_id = job.record.id;
      event.time_ms = NowMillis();
      event.metrics = metrics;
      event.metrics.validation_loss = report.validation_loss;
      step_events[job.record.id].push_back(std::move(event));
      window_tokens_ += report.metrics.tokens;
      ++window_steps_;
      continue;
    }
    flush_steps();
    switch (report.kind) {
      case TrainerReport::Kind::kAttached:
        if (!report.status.ok()) {
          Release(job);
          if (!cancelled) Fail(job, report.status);
        } else if (!cancelled) {
          OnAttached(job, report);
        }
        break;
      case TrainerReport::Kind::kPaused:
        OnPaused(job, report);
        break;
      case TrainerReport::Kind::kCheckpoint:
        OnCheckpoint(job, report);
        break;
      case TrainerReport::Kind::kFinished: {
        Release(job);
        if (cancelled) {
          // Cancelled while its last step ran: its export is not kept.
          if (!job.final_adapter_id.empty()) {
            std::error_code ignored;
            std::filesystem::remove_all(AdapterDir(job.final_adapter_id),
                                        ignored);
          }
          break;
        }
        if (!report.status.ok()) {
          Fail(job, report.status);
          break;
        }
        JobMetricsRecord& metrics = job.record.metrics;
        metrics.step = report.step;
        metrics.tokens = report.tokens;
        metrics.skipped_steps = report.skipped_steps;
        metrics.validation_loss = report.validation_loss;
        std::vector<JobEventRecord> events;
        if (report.validation_loss) {
          JobEventRecord event;
          event.job_id = job.record.id;
          event.time_ms = NowMillis();
          event.metrics = metrics;
          events.push_back(std::move(event));
        }
        if (!job.final_adapter_id.empty()) {
          AdapterRecord adapter;
          adapter.id = job.final_adapter_id;
          adapter.tenant = job.record.tenant;
          adapter.display_name = job.record.display_name;
          adapter.job_id = job.record.id;
          adapter.base_model = job.record.base_model;
          adapter.lora =
              job.record.spec.value("lora", nlohmann::json::object());
          adapter.create_time_ms = NowMillis();
          absl::Status stored = store_->InsertAdapter(adapter);
          if (!stored.ok()) {
            Fail(job, stored);
            break;
          }
          job.record.adapter_id = adapter.id;
        }
        job.record.status = JobStatus::kSucceeded;
        job.record.slot = -1;
        job.record.end_time_ms = NowMillis();
        events.push_back(StatusEvent(
            job.record, JobStatus::kSucceeded,
            job.final_adapter_id.empty()
                ? absl::StrCat("evaluated: validation loss ",
                               report.validation_loss.value_or(0.0))
                : absl::StrCat("trained ", report.step, " steps; adapter ",
                               job.final_adapter_id)));
        Commit(job, std::move(events));
        break;
      }
      case TrainerReport::Kind::kRetired:
        Release(job);
        break;
      case TrainerReport::Kind::kStep:
        break;
    }
    if (IsTerminal(job.record.status) && !job.in_trainer) {
      Forget(report.job_id);
    }
  }
  flush_steps();
}

void JobScheduler::FillSlots() {
  const int capacity = trainer_->capacity();
  // Handed over together, so they start at the same step boundary.
  std::vector<AttachCommand> commands;
  for (auto it = queue_.begin(); it != queue_.end() && reserved_ < capacity;) {
    LiveJob& job = *live_.at(*it);
    const std::string& tenant = job.record.tenant;
    if (reserved_by_tenant_[tenant] >= options_.slots_per_tenant) {
      ++it;
      continue;
    }
    absl::StatusOr<JobSpec> spec =
        job.spec ? *job.spec : JobSpecFromJson(job.record.spec);
    if (spec.ok() && !job.data_ready) {
      absl::StatusOr<JobData> data =
          PrepareJobData(*datasets_, job.record, &*spec);
      if (data.ok()) {
        job.data = *std::move(data);
        job.data_ready = true;
        job.record.total_steps = job.data.total_steps;
        job.record.spec = JobSpecToJson(*spec);
        job.spec = *spec;
      } else {
        spec = data.status();
      }
    }
    if (!spec.ok()) {
      const std::string id = *it;
      it = queue_.erase(it);
      Fail(job, spec.status());
      Forget(id);
      continue;
    }
    AttachCommand command;
    command.job_id = job.record.id;
    command.tenant = tenant;
    command.spec = *std::move(spec);
    command.data = job.data.training;
    command.validation = job.data.validation;
    command.resume = true;  // From a checkpoint, if the job has one.
    command.preferred_slot = job.resume_slot;
    command.recovering = job.recovering;
    job.resume_slot = -1;
    job.recovering = false;
    command.job_spec = job.record.spec;
    if (!job.record.initial_adapter_id.empty()) {
      command.initial_adapter_dir = AdapterDir(job.record.initial_adapter_id);
    }
    if (job.data.training) {
      job.final_adapter_id = NewResourceId("adapter");
      command.final_adapter_dir = AdapterDir(job.final_adapter_id);
    }
    job.in_trainer = true;
    ++reserved_;
    ++reserved_by_tenant_[tenant];
    it = queue_.erase(it);
    commands.push_back(std::move(command));
  }
  if (!commands.empty()) trainer_->AttachAll(std::move(commands));
}

void JobScheduler::OnAttached(LiveJob& job, const TrainerReport& report) {
  for (const std::string& rejected : report.rejected_checkpoints) {
    logger_->Warning("job ", job.record.id,
                     ": checkpoint rejected: ", rejected);
  }
  job.record.status = JobStatus::kRunning;
  job.record.slot = report.slot;
  if (job.record.start_time_ms == 0) job.record.start_time_ms = NowMillis();
  std::string message = absl::StrCat(
      job.record.training_dataset_id.empty() ? "evaluating" : "training",
      " in slot ", report.slot);
  if (report.resumed_step >= 0) {
    job.record.metrics.step = report.resumed_step;
    job.record.metrics.tokens = report.tokens;
    absl::StrAppend(&message, ", resumed from the checkpoint at step ",
                    report.resumed_step);
  } else if (job.record.metrics.step > 0) {
    job.record.metrics = JobMetricsRecord{};
    absl::StrAppend(&message, ", from step 0: no checkpoint to resume from");
  }
  if (!report.rejected_checkpoints.empty()) {
    absl::StrAppend(&message, " (", report.rejected_checkpoints.size(),
                    " newer checkpoint(s) failed verification: ",
                    report.rejected_checkpoints.front(), ")");
  }
  Commit(job, {StatusEvent(job.record, JobStatus::kRunning, message)});
}

void JobScheduler::OnPaused(LiveJob& job, const TrainerReport& report) {
  auto done = std::move(job.pause_done);
  job.pause_done = nullptr;
  if (!report.status.ok()) {
    if (done) {
      done(absl::Status(
          report.status.code(),
          absl::StrCat("job \"", job.record.id,
                       "\" was not paused: ", report.status.message())));
    }
    return;
  }
  Release(job);
  if (job.record.status == JobStatus::kCancelled) {
    if (done) {
      done(absl::FailedPreconditionError(
          absl::StrCat("job \"", job.record.id, "\" was cancelled")));
    }
    return;
  }
  job.record.status = JobStatus::kPaused;
  job.record.slot = -1;
  job.record.metrics.step = report.step;
  // Paused jobs may wait long: their data is prepared again on resume.
  job.data = JobData{};
  job.data_ready = false;
  Commit(job, {StatusEvent(job.record, JobStatus::kPaused,
                           absl::StrCat("paused at step ", report.step,
                                        " with a checkpoint"))});
  if (done) done(job.record);
}

void JobScheduler::OnCheckpoint(const LiveJob& job,
                                const TrainerReport& report) {
  if (report.status.ok()) {
    logger_->Info("job ", job.record.id, ": checkpoint at step ", report.step);
    return;
  }
  logger_->Error("job ", job.record.id, ": checkpoint at step ", report.step,
                 " failed; the job keeps its previous checkpoint and trains "
                 "on: ",
                 report.status.message());
}

void JobScheduler::Commit(LiveJob& job, std::vector<JobEventRecord> events) {
  absl::Status stored =
      store_->UpdateJob(job.record, std::move(events)).status();
  if (!stored.ok()) {
    logger_->Error("storing job ", job.record.id, ": ", stored.message());
  }
  hub_->Notify(job.record.id);
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

void JobScheduler::Release(LiveJob& job) {
  if (!job.in_trainer) return;
  job.in_trainer = false;
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
                           std::string(status.message()))});
}

void JobScheduler::LogThroughput() {
  if (window_steps_ == 0) return;
  logger_->Info("throughput: ", window_tokens_, " tokens in ", window_steps_,
                " slot-steps over the last ", options_.throughput_log_seconds,
                " s (", window_tokens_ / options_.throughput_log_seconds,
                " tokens/s); ", reserved_, "/", trainer_->capacity(),
                " slots busy, ", queue_.size(), " queued");
  window_tokens_ = 0;
  window_steps_ = 0;
}

}  // namespace loraplex
