// `loraplex quickstart`: a first run in one command. Uses the server at
// --server, or starts loraplex-server (found next to this program) when
// none answers; uploads the bundled word-reversal dataset, trains three
// adapters with different optimizers and ranks side by side, exports them
// and prints a summary.
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli_commands.h"
#include "client/display_format.h"
#include "client/job_progress.h"
#include "client/local_server.h"
#include "client/quickstart_data.h"
#include "client/text_table.h"
#include "core/common/resource_names.h"

namespace loraplex {
namespace {

struct QuickstartFlags {
  std::string dir = "./loraplex-quickstart";
  int64_t steps = 60;
};

// One of the adapters the quickstart trains.
struct QuickstartRecipe {
  v1::OptimizerFamily family;
  int64_t rank;
  double lr;  // Muon's orthogonalised updates take a larger step.
};

constexpr QuickstartRecipe kRecipes[] = {
    {v1::OPTIMIZER_FAMILY_ADAMW, 8, 2e-3},
    {v1::OPTIMIZER_FAMILY_MUON, 16, 2e-2},
    {v1::OPTIMIZER_FAMILY_ADAM, 4, 2e-3},
};
constexpr int64_t kQuickstartSeqLen = 64;
constexpr int64_t kQuickstartBatchSize = 4;

v1::CreateJobRequest JobRequest(const QuickstartRecipe& recipe,
                                const std::string& dataset, int64_t steps) {
  v1::CreateJobRequest request;
  request.set_display_name(absl::StrCat(
      "quickstart-", OptimizerFamilyName(recipe.family), "-r", recipe.rank));
  request.set_training_dataset(dataset);
  request.mutable_lora()->set_rank(recipe.rank);
  request.mutable_optimizer()->set_family(recipe.family);
  request.mutable_optimizer()->set_lr(recipe.lr);
  request.mutable_training()->set_seq_len(kQuickstartSeqLen);
  request.mutable_training()->set_batch_size(kQuickstartBatchSize);
  request.mutable_training()->set_max_steps(steps);
  return request;
}

int RunQuickstart(const CliContext& context, const QuickstartFlags& flags) {
  if (flags.steps < 1) {
    return context.UsageError(
        absl::StrCat("--steps must be at least 1, got ", flags.steps));
  }
  // With --json, stdout carries only the JSON; the narrative goes to stderr.
  std::ostream& say = context.options().json ? context.err() : context.out();
  std::error_code error;
  std::filesystem::create_directories(flags.dir, error);
  if (error) {
    return context.UsageError(absl::StrCat(
        "--dir ", flags.dir, ": cannot create: ", error.message()));
  }

  std::string address = context.options().server;
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::ServerInfo> info = (*client)->GetServerInfo();
  std::unique_ptr<LocalServer> local_server;
  if (!info.ok() && info.status().code() == absl::StatusCode::kUnavailable) {
    LocalServerOptions server_options;
    server_options.binary = ServerBinaryNextTo(SelfExecutablePath());
    server_options.state_dir =
        (std::filesystem::path(flags.dir) / "state").string();
    if (::access(server_options.binary.c_str(), X_OK) != 0) {
      context.ReportError(info.status(), address);
      context.err() << "loraplex: and there is no loraplex-server next to "
                       "this program to start ("
                    << server_options.binary
                    << "); start one yourself or pass --server ADDR\n";
      return kExitServerError;
    }
    say << "No loraplex-server answers at " << address << "; starting "
        << server_options.binary << "\n  (state in " << server_options.state_dir
        << ", log in " << server_options.state_dir << "/server.log)\n"
        << std::flush;
    auto started = LocalServer::Start(server_options);
    if (!started.ok()) {
      context.err() << "loraplex: error: could not start loraplex-server: "
                    << started.status().message() << "\n";
      return kExitServerError;
    }
    local_server = *std::move(started);
    address = local_server->address();
    say << "Started loraplex-server at " << address << " (pid "
        << local_server->pid() << ")\n";
    client = context.Connect(address);
    if (!client.ok()) return context.UsageError(client.status().message());
    info = (*client)->GetServerInfo();
  }
  if (!info.ok()) return context.ReportError(info.status(), address);
  say << "Server: base model " << info->base_model().name() << " ("
      << info->base_model().family() << "), " << info->slot_capacity()
      << " slots on " << info->device() << "\n";

  absl::StatusOr<v1::Dataset> dataset = (*client)->UploadDatasetContents(
      QuickstartDatasetJsonl(), "quickstart-reverse-words");
  if (!dataset.ok()) return context.ReportError(dataset.status(), address);
  say << "Uploaded " << dataset->name() << ": " << dataset->num_examples()
      << " examples of reversing a word (\"reverse: lamp\" -> \"pmal\")\n";

  std::vector<v1::Job> created;
  std::vector<WatchedJob> watched;
  for (const QuickstartRecipe& recipe : kRecipes) {
    absl::StatusOr<v1::Job> job =
        (*client)->CreateJob(JobRequest(recipe, dataset->name(), flags.steps));
    if (!job.ok()) return context.ReportError(job.status(), address);
    say << "Created " << job->name() << ": "
        << OptimizerFamilyName(recipe.family) << ", rank " << recipe.rank
        << ", lr " << FormatNumber(recipe.lr) << ", " << flags.steps
        << " steps\n";
    watched.push_back(
        {job->name(),
         absl::StrCat(ResourceId(job->name()), " ",
                      OptimizerFamilyName(recipe.family), " r", recipe.rank)});
    created.push_back(*std::move(job));
  }
  say << "Training the three adapters together in one co-batched step...\n"
      << std::flush;

  JobProgressOptions progress;
  progress.quiet = context.options().json;
  progress.interactive = !progress.quiet && context.StdoutIsTerminal();
  progress.width = context.TerminalWidth();
  auto results = WatchJobsWithProgress(**client, watched, progress, say);
  if (!results.ok()) return context.ReportError(results.status(), address);

  bool all_succeeded = true;
  // A failed export is a server error (exit 1), not an unsuccessful job.
  bool export_failed = false;
  TextTable table({"JOB", "OPTIMIZER", "RANK", "STATUS", "LOSS (FIRST -> LAST)",
                   "EXPORTED TO"});
  v1::ListJobsResponse final_jobs;
  for (size_t i = 0; i < results->size(); ++i) {
    const JobProgressResult& result = (*results)[i];
    const v1::Job& job = result.job;
    *final_jobs.add_jobs() = job;
    std::string loss = "-";
    if (result.first_loss.has_value() && result.last_loss.has_value()) {
      loss = absl::StrFormat("%.4f -> %.4f", *result.first_loss,
                             *result.last_loss);
    }
    std::string exported = "-";
    if (job.status() == v1::JOB_STATUS_SUCCEEDED) {
      const std::string out_dir = (std::filesystem::path(flags.dir) /
                                   "adapters" / ResourceId(job.name()))
                                      .string();
      v1::ExportAdapterRequest request;
      request.set_job(job.name());
      auto files = (*client)->ExportAdapter(request, out_dir);
      if (files.ok()) {
        exported = out_dir;
      } else {
        context.ReportError(files.status(), address);
        all_succeeded = false;
        export_failed = true;
      }
    } else {
      all_succeeded = false;
      if (!job.error().code().empty()) {
        context.err() << "loraplex: " << job.name()
                      << " failed: " << job.error().code() << ": "
                      << job.error().message() << "\n";
      }
    }
    table.AddRow({ResourceId(job.name()),
                  OptimizerFamilyName(job.optimizer().family()),
                  absl::StrCat(job.lora().rank()), JobStatusName(job.status()),
                  loss, exported});
  }
  say << "\n";
  table.Print(say);
  // Each trained adapter answers one prompt (greedy), as a first look.
  const bool json = context.options().json;
  for (const v1::Job& job : final_jobs.jobs()) {
    if (job.status() != v1::JOB_STATUS_SUCCEEDED || json) continue;
    v1::SampleRequest request;
    request.set_text(kQuickstartSamplePrompt);
    request.set_job(job.name());
    request.set_temperature(0);
    request.set_max_tokens(16);
    request.add_stop("\n");
    absl::StatusOr<v1::SampleResponse> sample = (*client)->Sample(request);
    if (!sample.ok()) {
      context.ReportError(sample.status(), address);
      export_failed = true;
      continue;
    }
    say << "Sample " << ResourceId(job.name()) << ": \""
        << absl::CEscape(kQuickstartSamplePrompt) << "\" -> \""
        << absl::CEscape(sample->samples(0).text()) << "\"\n";
  }
  if (!context.PrintJsonIfRequested(final_jobs) && all_succeeded) {
    say << "\nThe adapters are PEFT directories: load one with\n"
        << "  PeftModel.from_pretrained(base_model, \"" << flags.dir
        << "/adapters/" << ResourceId(created.front().name()) << "\")\n"
        << "or sample one here: loraplex sample --job "
        << ResourceId(created.front().name()) << " --prompt \"...\"\n";
  }

  if (local_server != nullptr) {
    say << "Stopping the loraplex-server started for the quickstart\n";
    absl::Status stopped = local_server->Stop();
    if (!stopped.ok()) {
      context.err() << "loraplex: warning: " << stopped.message() << "\n";
    }
  }
  if (export_failed) return kExitServerError;
  return all_succeeded ? kExitSuccess : kExitJobUnsuccessful;
}

}  // namespace

void AddQuickstartCommand(CLI::App& app, CliContext& context,
                          CommandAction* action) {
  auto flags = std::make_shared<QuickstartFlags>();
  CLI::App* quickstart = app.add_subcommand(
      "quickstart",
      "Train three adapters (AdamW r8, Muon r16, Adam r4) on a bundled toy "
      "dataset side by side, starting loraplex-server if none is running, "
      "and export them");
  quickstart
      ->add_option("--dir", flags->dir,
                   "Where the exported adapters (and a started "
                   "server's state) go")
      ->capture_default_str();
  quickstart->add_option("--steps", flags->steps, "Training steps per job")
      ->capture_default_str();
  SetAction(quickstart, action,
            [&context, flags] { return RunQuickstart(context, *flags); });
}

}  // namespace loraplex
