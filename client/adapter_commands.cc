// `loraplex adapters attach|retire|export|list`.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli_commands.h"
#include "client/display_format.h"
#include "client/job_flags.h"
#include "client/text_table.h"
#include "core/common/read_file.h"
#include "core/common/resource_names.h"
#include "nlohmann/json.hpp"

namespace loraplex {
namespace {

constexpr char kPeftConfigFile[] = "adapter_config.json";
constexpr char kPeftWeightsFile[] = "adapter_model.safetensors";

struct AdapterFlags {
  JobFlags job;
  std::string source;  // attach: PEFT directory or stored adapter.
  std::string evaluate;
  std::string adapter_name;
  bool wait = false;
  std::string id;
  std::string checkpoint;  // export --checkpoint.
  std::string out_dir;
};

// Whether the PEFT adapter in `dir` has LoRA on lm_head (which vLLM does
// not load).
bool AdaptsLmHead(const std::string& dir) {
  std::ifstream file(dir + "/" + kPeftConfigFile);
  const nlohmann::json config =
      nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return false;
  auto targets = config.find("target_modules");
  if (targets == config.end() || !targets->is_array()) return false;
  return std::find(targets->begin(), targets->end(), "lm_head") !=
         targets->end();
}

int RunAttach(const CliContext& context, const AdapterFlags& flags) {
  v1::AttachAdapterRequest request;
  absl::Status applied = ApplyJobFlags(flags.job, request.mutable_job());
  if (!applied.ok()) return context.UsageError(applied.message());
  const bool train = !request.job().training_dataset().empty();
  const bool evaluate = !flags.evaluate.empty();
  if (train == evaluate) {
    return context.UsageError(
        "adapters attach needs either --dataset ID (continue training) or "
        "--evaluate ID (measure the validation loss)");
  }
  if (evaluate) {
    absl::StatusOr<std::string> name = ResourceName(kDatasets, flags.evaluate);
    if (!name.ok()) return context.UsageError(name.status().message());
    request.mutable_job()->set_validation_dataset(*name);
  }

  std::error_code error;
  const std::filesystem::path dir(flags.source);
  if (std::filesystem::is_directory(dir, error)) {
    absl::StatusOr<std::string> config =
        ReadFile((dir / kPeftConfigFile).string());
    if (!config.ok()) return context.UsageError(config.status().message());
    absl::StatusOr<std::string> weights =
        ReadFile((dir / kPeftWeightsFile).string());
    if (!weights.ok()) return context.UsageError(weights.status().message());
    request.mutable_files()->set_adapter_config_json(*std::move(config));
    request.mutable_files()->set_adapter_model_safetensors(*std::move(weights));
    request.set_display_name(flags.adapter_name.empty()
                                 ? dir.filename().string()
                                 : flags.adapter_name);
  } else if (ResourceCollection(flags.source) == kAdapters) {
    absl::StatusOr<std::string> name = ResourceName(kAdapters, flags.source);
    if (!name.ok()) return context.UsageError(name.status().message());
    request.set_adapter(*name);
  } else {
    return context.UsageError(absl::StrCat(
        "PEFT_DIR: \"", flags.source, "\" is neither a directory with ",
        kPeftConfigFile, " and ", kPeftWeightsFile,
        " nor a stored adapter (adapters/ID)"));
  }

  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::AttachAdapterResponse> response =
      (*client)->AttachAdapter(request);
  if (!response.ok()) return context.ReportError(response.status());
  if (flags.wait) {
    if (!context.options().json) {
      context.out() << "Attached " << response->adapter().name() << " to "
                    << response->job().name() << "\n";
    }
    return WatchJobToEnd(context, **client, response->job().name());
  }
  if (context.PrintJsonIfRequested(*response)) return kExitSuccess;
  context.out() << "Attached " << response->adapter().name() << " to "
                << response->job().name() << " ("
                << JobStatusName(response->job().status()) << ")\n";
  return kExitSuccess;
}

int RunRetire(const CliContext& context, const AdapterFlags& flags) {
  absl::StatusOr<std::string> name = ResourceName(kJobs, flags.id);
  if (!name.ok()) return context.UsageError(name.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::RetireAdapterResponse> response =
      (*client)->RetireAdapter(*name);
  if (!response.ok()) return context.ReportError(response.status());
  if (context.PrintJsonIfRequested(*response)) return kExitSuccess;
  context.out() << "Retired the slot of " << response->job().name() << " ("
                << JobStatusName(response->job().status()) << ")\n";
  return kExitSuccess;
}

int RunExport(const CliContext& context, const AdapterFlags& flags) {
  if (flags.id.empty() == flags.checkpoint.empty()) {
    return context.UsageError(
        "adapters export needs exactly one source: a job or adapter ID, or "
        "--checkpoint jobs/ID/checkpoints/STEP");
  }
  // A bare ID may be a job's or an adapter's: try the job first.
  const std::string collection = ResourceCollection(flags.id);
  std::vector<v1::ExportAdapterRequest> candidates;
  std::string source = flags.id;
  if (!flags.checkpoint.empty()) {
    absl::StatusOr<std::string> name = CheckpointName(flags.checkpoint);
    if (!name.ok()) return context.UsageError(name.status().message());
    candidates.emplace_back().set_checkpoint(*name);
    source = *name;
  } else if (collection.empty() || collection == kJobs) {
    absl::StatusOr<std::string> name = ResourceName(kJobs, flags.id);
    if (!name.ok()) return context.UsageError(name.status().message());
    candidates.emplace_back().set_job(*name);
  }
  if (flags.checkpoint.empty() &&
      (collection.empty() || collection == kAdapters)) {
    absl::StatusOr<std::string> name = ResourceName(kAdapters, flags.id);
    if (!name.ok()) return context.UsageError(name.status().message());
    candidates.emplace_back().set_adapter(*name);
  }
  if (candidates.empty()) {
    return context.UsageError(absl::StrCat(
        "expected a job or adapter ID (or jobs/ID, adapters/ID), got \"",
        flags.id, "\""));
  }
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<std::vector<ExportedFile>> files;
  for (const v1::ExportAdapterRequest& request : candidates) {
    files = (*client)->ExportAdapter(request, flags.out_dir);
    if (files.ok() || files.status().code() != absl::StatusCode::kNotFound) {
      break;
    }
  }
  if (!files.ok()) return context.ReportError(files.status());
  std::vector<std::string> names;
  int64_t total_bytes = 0;
  for (const ExportedFile& file : *files) {
    names.push_back(file.file_name);
    total_bytes += file.size_bytes;
  }
  if (context.options().json) {
    // No API message describes a local directory; print a small object.
    nlohmann::json summary = {{"outDir", flags.out_dir},
                              {"files", nlohmann::json::array()}};
    for (const ExportedFile& file : *files) {
      summary["files"].push_back({{"fileName", file.file_name},
                                  {"path", file.path},
                                  {"sizeBytes", file.size_bytes}});
    }
    // Paths need not be UTF-8; JSON must be.
    context.out() << summary.dump(2, ' ', /*ensure_ascii=*/false,
                                  nlohmann::json::error_handler_t::replace)
                  << "\n";
    return kExitSuccess;
  }
  context.out() << "Exported " << source << " to " << flags.out_dir << " ("
                << absl::StrJoin(names, ", ") << "; "
                << FormatBytes(total_bytes) << ")\n";
  if (AdaptsLmHead(flags.out_dir)) {
    context.err() << "Note: this adapter has LoRA on lm_head; PEFT loads it, "
                     "vLLM does not.\n";
  }
  return kExitSuccess;
}

int RunList(const CliContext& context) {
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  auto adapters = (*client)->ListAllAdapters();
  if (!adapters.ok()) return context.ReportError(adapters.status());
  if (context.options().json) {
    v1::ListAdaptersResponse all;
    for (const auto& adapter : *adapters) *all.add_adapters() = adapter;
    context.PrintJsonIfRequested(all);
    return kExitSuccess;
  }
  TextTable table(
      {"ADAPTER", "NAME", "JOB", "RANK", "ALPHA", "BASE MODEL", "CREATED"});
  for (const v1::Adapter& adapter : *adapters) {
    table.AddRow(
        {ResourceId(adapter.name()), adapter.display_name(),
         adapter.job().empty() ? "(upload)" : ResourceId(adapter.job()),
         absl::StrCat(adapter.lora().rank()),
         FormatNumber(adapter.lora().alpha()), adapter.base_model(),
         FormatTimestamp(adapter.create_time())});
  }
  table.Print(context.out());
  return kExitSuccess;
}

}  // namespace

void AddAdapterCommands(CLI::App& app, CliContext& context,
                        CommandAction* action) {
  auto flags = std::make_shared<AdapterFlags>();
  CLI::App* adapters = app.add_subcommand(
      "adapters", "Attach, retire, export and list LoRA adapters");
  adapters->require_subcommand(1);

  CLI::App* attach = adapters->add_subcommand(
      "attach",
      "Attach a PEFT adapter to a slot: continue training it (--dataset) or "
      "measure its validation loss (--evaluate)");
  attach
      ->add_option("PEFT_DIR", flags->source,
                   "Directory with adapter_config.json and "
                   "adapter_model.safetensors, or a stored adapters/ID")
      ->required();
  JobFlagSet which;
  which.initial_adapter = false;
  which.initial_checkpoint = false;
  AddJobFlags(attach, &flags->job, which);
  attach
      ->add_option("--evaluate", flags->evaluate,
                   "Only evaluate the adapter on this dataset")
      ->group("Data")
      ->excludes(attach->get_option("--dataset"));
  attach
      ->add_option("--adapter-name", flags->adapter_name,
                   "Display name of the stored adapter (default: the "
                   "directory name)")
      ->group("Data");
  attach->add_flag("--wait", flags->wait,
                   "Show progress until the job finishes (exit 3 if it "
                   "fails or is cancelled)");
  SetAction(attach, action,
            [&context, flags] { return RunAttach(context, *flags); });

  CLI::App* retire = adapters->add_subcommand(
      "retire", "Stop the job in a slot (CANCELLED) and free the slot");
  retire->add_option("JOB", flags->id, "Job ID or jobs/ID")->required();
  SetAction(retire, action,
            [&context, flags] { return RunRetire(context, *flags); });

  CLI::App* export_command = adapters->add_subcommand(
      "export",
      "Write an adapter in the PEFT format (a running job's current "
      "weights, a finished job's adapter, a stored adapter, or a "
      "checkpoint's weights); give exactly one of ID and --checkpoint");
  export_command->add_option(
      "ID", flags->id,
      "Job ID, jobs/ID or adapters/ID (a bare ID is tried as a job, then as "
      "an adapter)");
  export_command->add_option(
      "--checkpoint", flags->checkpoint,
      "Export a checkpoint's adapter weights instead "
      "(jobs/ID/checkpoints/STEP, as listed by jobs checkpoints)");
  export_command->add_option("--out", flags->out_dir, "Output directory")
      ->required();
  SetAction(export_command, action,
            [&context, flags] { return RunExport(context, *flags); });

  CLI::App* remove = adapters->add_subcommand(
      "rm",
      "Delete a stored adapter (refused while an unfinished job starts from "
      "it)");
  remove->add_option("ID", flags->id, "Adapter ID or adapters/ID")->required();
  SetAction(remove, action, [&context, flags] {
    return RunDeleteCommand(context, kAdapters, flags->id,
                            &LoraplexClient::DeleteAdapter,
                            v1::DeleteAdapterResponse());
  });

  CLI::App* list = adapters->add_subcommand("list", "List stored adapters");
  SetAction(list, action, [&context] { return RunList(context); });
}

}  // namespace loraplex
