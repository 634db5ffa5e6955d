// The trainer's reports (job_scheduler.h), handled on the scheduler's
// thread: each becomes a stored status change or step metrics, and a job
// that leaves the trainer frees its slot for the next.
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/clock.h"
#include "server/jobs/job_scheduler.h"

namespace loraplex {

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
    CountStoreWrite(stored);
    if (!stored.ok()) {
      logger_->Error("storing step metrics: ", stored.message());
    }
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
      metrics.expert_tokens = report.metrics.expert_tokens;
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
        Commit(job, std::move(events)).IgnoreError();  // Logged and counted.
        break;
      }
      case TrainerReport::Kind::kRetired:
        Release(job);
        if (cancelled && report.step > job.record.metrics.step) {
          // Trained on until the cancel reached the trainer: the record
          // says where its last checkpoint is.
          job.record.metrics.step = report.step;
          job.record.metrics.tokens = report.tokens;
          Commit(job, {}).IgnoreError();  // Logged and counted.
        }
        break;
      case TrainerReport::Kind::kStep:
        break;
    }
    if (IsTerminal(job.record.status) && job.place != JobPlace::kInTrainer &&
        job.place != JobPlace::kPausing) {
      Forget(report.job_id);
    }
  }
  flush_steps();
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
  Commit(job, {StatusEvent(job.record, JobStatus::kRunning, message)})
      .IgnoreError();  // Logged and counted.
}

void JobScheduler::OnPaused(LiveJob& job, const TrainerReport& report) {
  auto done = std::move(job.pause_done);
  job.pause_done = nullptr;
  if (!report.status.ok()) {
    if (job.place == JobPlace::kPausing) MoveTo(job, JobPlace::kInTrainer);
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
  absl::Status stored =
      Commit(job, {StatusEvent(job.record, JobStatus::kPaused,
                               absl::StrCat("paused at step ", report.step,
                                            " with a checkpoint"))});
  if (!done) return;
  if (!stored.ok()) {
    // Paused in the trainer, with its checkpoint; the store does not say
    // so, and a restart queues the job again from that checkpoint.
    return done(absl::Status(
        stored.code(),
        absl::StrCat(
            "job \"", job.record.id, "\" paused at step ", report.step,
            " but its status could not be stored: ", stored.message())));
  }
  done(job.record);
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
