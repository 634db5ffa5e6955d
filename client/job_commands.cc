// `loraplex jobs create|list|get|cancel|pause|resume|checkpoints|watch|
// events`.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/cli_commands.h"
#include "client/display_format.h"
#include "client/job_flags.h"
#include "client/job_progress.h"
#include "client/text_table.h"
#include "core/common/resource_names.h"

namespace loraplex {
namespace {

struct JobCommandFlags {
  JobFlags job;
  bool wait = false;
  std::string statuses;  // jobs list --status.
  std::string id;
};

std::string StepProgress(const v1::Job& job) {
  if (job.total_steps() <= 0) return absl::StrCat(job.metrics().step());
  return absl::StrCat(job.metrics().step(), "/", job.total_steps());
}

// The loss of the last step of `metrics`; "-" before the first.
std::string LossText(const v1::JobMetrics& metrics) {
  if (metrics.step() <= 0) return "-";
  return absl::StrFormat("%.4f", metrics.loss());
}

std::string LrText(const v1::JobMetrics& metrics) {
  if (metrics.step() <= 0) return "-";
  return absl::StrFormat("%.2e", metrics.lr());
}

void PrintEventLine(std::ostream& out, const v1::JobEvent& event) {
  std::string details;
  if (event.has_status_change()) {
    const v1::JobStatusChange& change = event.status_change();
    details = JobStatusName(change.status());
    if (!change.message().empty())
      absl::StrAppend(&details, ": ", change.message());
    if (change.has_error() && !change.error().code().empty()) {
      absl::StrAppend(&details, " (", change.error().code(), ": ",
                      change.error().message(), ")");
    }
  } else if (event.has_metrics()) {
    details = absl::StrCat("step ", event.metrics().step(), "  ",
                           DescribeMetrics(event.metrics()));
  }
  out << absl::StrFormat("%5d  %s  %s\n", event.sequence(),
                         FormatTimestamp(event.time()), details);
}

int RunCreate(const CliContext& context, const JobCommandFlags& flags) {
  v1::CreateJobRequest request;
  absl::Status applied = ApplyJobFlags(flags.job, &request);
  if (!applied.ok()) return context.UsageError(applied.message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::Job> job = (*client)->CreateJob(request);
  if (!job.ok()) return context.ReportError(job.status());
  if (flags.wait) {
    if (!context.options().json) {
      context.out() << "Created " << job->name() << " ("
                    << JobStatusName(job->status()) << ")\n";
    }
    return WatchJobToEnd(context, **client, job->name());
  }
  if (context.PrintJsonIfRequested(*job)) return kExitSuccess;
  context.out() << "Created " << job->name() << " ("
                << JobStatusName(job->status()) << ")\n"
                << "Follow it with: loraplex jobs watch "
                << ResourceId(job->name()) << "\n";
  return kExitSuccess;
}

int RunList(const CliContext& context, const JobCommandFlags& flags) {
  std::vector<v1::JobStatus> statuses;
  for (absl::string_view text :
       absl::StrSplit(flags.statuses, ',', absl::SkipWhitespace())) {
    absl::StatusOr<v1::JobStatus> status = ParseJobStatus(text);
    if (!status.ok()) return context.UsageError(status.status().message());
    statuses.push_back(*status);
  }
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  auto jobs = (*client)->ListAllJobs(statuses);
  if (!jobs.ok()) return context.ReportError(jobs.status());
  if (context.options().json) {
    v1::ListJobsResponse all;
    for (const auto& job : *jobs) *all.add_jobs() = job;
    context.PrintJsonIfRequested(all);
    return kExitSuccess;
  }
  TextTable table({"JOB", "NAME", "STATUS", "OPTIMIZER", "RANK", "STEP", "LOSS",
                   "CREATED"});
  for (const v1::Job& job : *jobs) {
    table.AddRow({ResourceId(job.name()), job.display_name(),
                  JobStatusName(job.status()),
                  OptimizerFamilyName(job.optimizer().family()),
                  absl::StrCat(job.lora().rank()), StepProgress(job),
                  LossText(job.metrics()), FormatTimestamp(job.create_time())});
  }
  table.Print(context.out());
  return kExitSuccess;
}

int RunGet(const CliContext& context, const JobCommandFlags& flags) {
  absl::StatusOr<std::string> name = ResourceName(kJobs, flags.id);
  if (!name.ok()) return context.UsageError(name.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::Job> job = (*client)->GetJob(*name);
  if (!job.ok()) return context.ReportError(job.status());
  if (context.PrintJsonIfRequested(*job)) return kExitSuccess;
  PrintJobDetails(context.out(), *job);
  return kExitSuccess;
}

int RunCancel(const CliContext& context, const JobCommandFlags& flags) {
  absl::StatusOr<std::string> name = ResourceName(kJobs, flags.id);
  if (!name.ok()) return context.UsageError(name.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::Job> job = (*client)->CancelJob(*name);
  if (!job.ok()) return context.ReportError(job.status());
  if (context.PrintJsonIfRequested(*job)) return kExitSuccess;
  context.out() << "Cancelled " << job->name() << " ("
                << JobStatusName(job->status()) << ")\n";
  return kExitSuccess;
}

int RunPause(const CliContext& context, const JobCommandFlags& flags) {
  absl::StatusOr<std::string> name = ResourceName(kJobs, flags.id);
  if (!name.ok()) return context.UsageError(name.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::Job> job = (*client)->PauseJob(*name);
  if (!job.ok()) return context.ReportError(job.status());
  if (context.PrintJsonIfRequested(*job)) return kExitSuccess;
  // A job that finished before the pause took effect keeps its outcome.
  if (job->status() != v1::JOB_STATUS_PAUSED) {
    context.out() << job->name()
                  << (IsTerminalJobStatus(job->status())
                          ? " finished before the pause took effect ("
                          : " was not paused (")
                  << JobStatusName(job->status()) << ")\n";
    return kExitSuccess;
  }
  context.out() << "Paused " << job->name() << " (PAUSED)\n"
                << "Continue it with: loraplex jobs resume "
                << ResourceId(job->name()) << "\n";
  return kExitSuccess;
}

int RunResume(const CliContext& context, const JobCommandFlags& flags) {
  absl::StatusOr<std::string> name = ResourceName(kJobs, flags.id);
  if (!name.ok()) return context.UsageError(name.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::Job> job = (*client)->ResumeJob(*name);
  if (!job.ok()) return context.ReportError(job.status());
  if (context.PrintJsonIfRequested(*job)) return kExitSuccess;
  context.out() << "Resumed " << job->name() << " ("
                << JobStatusName(job->status()) << ")\n"
                << "Follow it with: loraplex jobs watch "
                << ResourceId(job->name()) << "\n";
  return kExitSuccess;
}

int RunCheckpoints(const CliContext& context, const JobCommandFlags& flags) {
  absl::StatusOr<std::string> name = ResourceName(kJobs, flags.id);
  if (!name.ok()) return context.UsageError(name.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::ListCheckpointsResponse> checkpoints =
      (*client)->ListCheckpoints(*name);
  if (!checkpoints.ok()) return context.ReportError(checkpoints.status());
  if (context.PrintJsonIfRequested(*checkpoints)) return kExitSuccess;
  // The full name is what --initial-checkpoint and export --checkpoint take.
  TextTable table({"CHECKPOINT", "STEP", "CREATED", "LOSS", "LR", "SIZE"});
  for (const v1::Checkpoint& checkpoint : checkpoints->checkpoints()) {
    table.AddRow({checkpoint.name(), absl::StrCat(checkpoint.step()),
                  FormatTimestamp(checkpoint.create_time()),
                  LossText(checkpoint.metrics()), LrText(checkpoint.metrics()),
                  FormatBytes(checkpoint.size_bytes())});
  }
  table.Print(context.out());
  return kExitSuccess;
}

// --json watch: each event as one line of JSON, as it arrives. A stream
// that ends before the job's final event is resumed after the last event
// seen, with the retries of the human-readable watch.
int WatchAsJsonLines(const CliContext& context, LoraplexClient& client,
                     const std::string& name) {
  const int max_reconnects = JobProgressOptions().max_reconnects;
  v1::JobStatus last_status = v1::JOB_STATUS_UNSPECIFIED;
  int64_t after_sequence = 0;
  int failures = 0;
  bool output_failed = false;
  while (true) {
    absl::Status status =
        client.WatchJob(name, after_sequence, [&](const v1::JobEvent& event) {
          context.out() << MessageToJson(event, /*multiline=*/false) << "\n"
                        << std::flush;
          // Nobody reads the events any more (e.g. `| head -1`): stop.
          if (!context.out()) {
            output_failed = true;
            return false;
          }
          after_sequence = std::max(after_sequence, event.sequence());
          failures = 0;
          if (event.has_status_change()) {
            last_status = event.status_change().status();
          }
          return true;
        });
    if (output_failed) {
      context.err() << "loraplex: error: cannot write the events to stdout\n";
      return kExitServerError;
    }
    if (IsTerminalJobStatus(last_status)) break;
    if (!IsResumableWatchStatus(status)) return context.ReportError(status);
    if (++failures > max_reconnects) {
      if (!status.ok()) return context.ReportError(status);
      return context.ReportError(absl::UnavailableError(absl::StrCat(
          "the watch of ", name, " kept ending before the job finished")));
    }
    absl::StatusOr<v1::Job> job = client.GetJob(name);
    if (job.ok() && IsTerminalJobStatus(job->status())) {
      last_status = job->status();
      break;
    }
    std::this_thread::sleep_for(std::chrono::seconds(std::min(failures, 5)));
  }
  return IsUnsuccessfulJobStatus(last_status) ? kExitJobUnsuccessful
                                              : kExitSuccess;
}

int RunWatch(const CliContext& context, const JobCommandFlags& flags) {
  absl::StatusOr<std::string> name = ResourceName(kJobs, flags.id);
  if (!name.ok()) return context.UsageError(name.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  if (context.options().json) return WatchAsJsonLines(context, **client, *name);
  return WatchJobToEnd(context, **client, *name);
}

int RunEvents(const CliContext& context, const JobCommandFlags& flags) {
  absl::StatusOr<std::string> name = ResourceName(kJobs, flags.id);
  if (!name.ok()) return context.UsageError(name.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  auto events = (*client)->ListAllJobEvents(*name);
  if (!events.ok()) return context.ReportError(events.status());
  if (context.options().json) {
    v1::ListJobEventsResponse all;
    for (const auto& event : *events) *all.add_events() = event;
    context.PrintJsonIfRequested(all);
    return kExitSuccess;
  }
  for (const v1::JobEvent& event : *events)
    PrintEventLine(context.out(), event);
  return kExitSuccess;
}

}  // namespace

void PrintJobDetails(std::ostream& out, const v1::Job& job) {
  std::string status = JobStatusName(job.status());
  if (job.status() == v1::JOB_STATUS_RUNNING && job.slot() >= 0) {
    absl::StrAppend(&status, " (slot ", job.slot(), ")");
  }
  std::string progress;
  if (job.metrics().step() > 0 || job.total_steps() > 0) {
    progress = absl::StrCat(StepProgress(job), " steps");
    const std::string metrics = DescribeMetrics(job.metrics());
    if (!metrics.empty()) absl::StrAppend(&progress, "; ", metrics);
  }
  std::string error;
  if (!job.error().code().empty() || !job.error().message().empty()) {
    error = absl::StrCat(job.error().code(), ": ", job.error().message());
  }
  PrintKeyValues(out, {{"Job", job.name()},
                       {"Display name", job.display_name()},
                       {"Status", status},
                       {"Error", error},
                       {"Base model", job.base_model()},
                       {"Dataset", job.training_dataset()},
                       {"Validation", job.validation_dataset()},
                       {"Initial adapter", job.initial_adapter()},
                       {"LoRA", DescribeLora(job.lora())},
                       {"Optimizer", DescribeOptimizer(job.optimizer())},
                       {"Schedule", DescribeSchedule(job.schedule())},
                       {"Training", DescribeTraining(job.training())},
                       {"Progress", progress},
                       {"Adapter", job.adapter()},
                       {"Created", FormatTimestamp(job.create_time())},
                       {"Started", FormatTimestamp(job.start_time())},
                       {"Ended", FormatTimestamp(job.end_time())}});
}

int WatchJobToEnd(const CliContext& context, LoraplexClient& client,
                  const std::string& job_name) {
  JobProgressOptions options;
  options.quiet = context.options().json;
  options.interactive = !options.quiet && context.StdoutIsTerminal();
  options.width = context.TerminalWidth();
  auto results = WatchJobsWithProgress(
      client, {{job_name, ResourceId(job_name)}}, options, context.out());
  if (!results.ok()) return context.ReportError(results.status());
  const JobProgressResult& result = results->front();
  const v1::Job& job = result.job;
  if (!context.PrintJsonIfRequested(job)) {
    std::string summary =
        absl::StrCat(job.name(), " ", JobStatusName(job.status()));
    if (result.first_loss.has_value() && result.last_loss.has_value()) {
      absl::StrAppend(&summary,
                      absl::StrFormat(", loss %.4f -> %.4f", *result.first_loss,
                                      *result.last_loss));
    }
    if (job.metrics().has_validation_loss()) {
      absl::StrAppend(&summary,
                      absl::StrFormat(", validation loss %.4f",
                                      job.metrics().validation_loss()));
    }
    if (!job.adapter().empty()) {
      absl::StrAppend(&summary, ", adapter ", job.adapter());
    }
    if (!job.error().code().empty()) {
      absl::StrAppend(&summary, ": ", job.error().code(), ": ",
                      job.error().message());
    }
    context.out() << summary << "\n";
    if (!job.adapter().empty()) {
      context.out() << "Export it with: loraplex adapters export "
                    << ResourceId(job.name()) << " --out DIR\n";
    }
  }
  return IsUnsuccessfulJobStatus(job.status()) ? kExitJobUnsuccessful
                                               : kExitSuccess;
}

void AddJobCommands(CLI::App& app, CliContext& context, CommandAction* action) {
  auto flags = std::make_shared<JobCommandFlags>();
  CLI::App* jobs = app.add_subcommand(
      "jobs", "Create, follow, pause and resume training jobs");
  jobs->require_subcommand(1);

  CLI::App* create = jobs->add_subcommand(
      "create",
      "Create a fine-tuning job; unset flags take the server's defaults");
  AddJobFlags(create, &flags->job);
  create->get_option("--dataset")->required();
  create->add_flag("--wait", flags->wait,
                   "Show progress until the job finishes (exit 3 if it "
                   "fails or is cancelled)");
  SetAction(create, action,
            [&context, flags] { return RunCreate(context, *flags); });

  CLI::App* list = jobs->add_subcommand("list", "List jobs");
  list->add_option("--status", flags->statuses,
                   "Only these statuses, e.g. running,queued");
  SetAction(list, action,
            [&context, flags] { return RunList(context, *flags); });

  CLI::App* get =
      jobs->add_subcommand("get", "Show a job and its configuration");
  get->add_option("ID", flags->id, "Job ID or jobs/ID")->required();
  SetAction(get, action, [&context, flags] { return RunGet(context, *flags); });

  CLI::App* remove = jobs->add_subcommand(
      "rm",
      "Delete a finished job: its record, events and checkpoints (its "
      "trained adapter stays)");
  remove->add_option("ID", flags->id, "Job ID or jobs/ID")->required();
  SetAction(remove, action, [&context, flags] {
    return RunDeleteCommand(context, kJobs, flags->id,
                            &LoraplexClient::DeleteJob,
                            v1::DeleteJobResponse());
  });

  CLI::App* cancel = jobs->add_subcommand("cancel", "Cancel a job");
  cancel->add_option("ID", flags->id, "Job ID or jobs/ID")->required();
  SetAction(cancel, action,
            [&context, flags] { return RunCancel(context, *flags); });

  CLI::App* pause = jobs->add_subcommand(
      "pause",
      "Checkpoint a running job and free its slot (a queued job pauses at "
      "once); the job stays PAUSED until resumed");
  pause->add_option("ID", flags->id, "Job ID or jobs/ID")->required();
  SetAction(pause, action,
            [&context, flags] { return RunPause(context, *flags); });

  CLI::App* resume = jobs->add_subcommand(
      "resume",
      "Queue a paused job again; it continues from its latest checkpoint");
  resume->add_option("ID", flags->id, "Job ID or jobs/ID")->required();
  SetAction(resume, action,
            [&context, flags] { return RunResume(context, *flags); });

  CLI::App* checkpoints = jobs->add_subcommand(
      "checkpoints",
      "List a job's checkpoints on disk, oldest first (start a job from one "
      "with jobs create --initial-checkpoint, or export its adapter with "
      "adapters export --checkpoint)");
  checkpoints->add_option("ID", flags->id, "Job ID or jobs/ID")->required();
  SetAction(checkpoints, action,
            [&context, flags] { return RunCheckpoints(context, *flags); });

  CLI::App* watch = jobs->add_subcommand(
      "watch",
      "Show a job's progress until it finishes (exit 3 if it fails or is "
      "cancelled; with --json, one event per line)");
  watch->add_option("ID", flags->id, "Job ID or jobs/ID")->required();
  SetAction(watch, action,
            [&context, flags] { return RunWatch(context, *flags); });

  CLI::App* events =
      jobs->add_subcommand("events", "List a job's status changes and metrics");
  events->add_option("ID", flags->id, "Job ID or jobs/ID")->required();
  SetAction(events, action,
            [&context, flags] { return RunEvents(context, *flags); });
}

}  // namespace loraplex
