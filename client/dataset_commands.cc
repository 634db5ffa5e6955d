// `loraplex datasets upload|list|get|rm`.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cli_commands.h"
#include "client/display_format.h"
#include "client/text_table.h"
#include "core/common/resource_names.h"

namespace loraplex {
namespace {

struct DatasetFlags {
  std::string file;
  std::string display_name;
  std::string id;
  DatasetUploadOptions upload;  // --chat-template-kwargs, --turns.
};

void PrintDataset(const CliContext& context, const v1::Dataset& dataset) {
  if (context.PrintJsonIfRequested(dataset)) return;
  PrintKeyValues(context.out(),
                 {{"Dataset", dataset.name()},
                  {"Display name", dataset.display_name()},
                  {"Examples", absl::StrCat(dataset.num_examples())},
                  {"Size", FormatBytes(dataset.size_bytes())},
                  {"SHA-256", dataset.sha256()},
                  {"Created", FormatTimestamp(dataset.create_time())}});
}

int RunUpload(const CliContext& context, const DatasetFlags& flags) {
  std::error_code error;
  // Pipes (e.g. /dev/stdin) are fine; directories and missing paths not.
  if (!std::filesystem::exists(flags.file, error) ||
      std::filesystem::is_directory(flags.file, error)) {
    return context.UsageError(
        absl::StrCat("dataset file ", flags.file, " is not a readable file"));
  }
  // A regular file is opened here so that one without read permission is a
  // usage error rather than a failed upload. (Reopening a FIFO could lose
  // its writer, so pipes are left to the upload.)
  if (std::filesystem::is_regular_file(flags.file, error) &&
      !std::ifstream(flags.file, std::ios::binary)) {
    return context.UsageError(
        absl::StrCat("dataset file ", flags.file,
                     ": cannot open for reading: ", std::strerror(errno)));
  }
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  const std::string display_name =
      flags.display_name.empty()
          ? std::filesystem::path(flags.file).filename().string()
          : flags.display_name;
  absl::StatusOr<v1::Dataset> dataset =
      (*client)->UploadDatasetFile(flags.file, display_name, flags.upload);
  if (!dataset.ok()) return context.ReportError(dataset.status());
  if (context.PrintJsonIfRequested(*dataset)) return kExitSuccess;
  context.out() << "Uploaded " << dataset->name() << " ("
                << dataset->num_examples() << " examples, "
                << FormatBytes(dataset->size_bytes()) << ")\n";
  return kExitSuccess;
}

int RunList(const CliContext& context) {
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  auto datasets = (*client)->ListAllDatasets();
  if (!datasets.ok()) return context.ReportError(datasets.status());
  if (context.options().json) {
    v1::ListDatasetsResponse all;
    for (const auto& dataset : *datasets) *all.add_datasets() = dataset;
    context.PrintJsonIfRequested(all);
    return kExitSuccess;
  }
  TextTable table({"DATASET", "NAME", "EXAMPLES", "SIZE", "CREATED"});
  for (const v1::Dataset& dataset : *datasets) {
    table.AddRow({ResourceId(dataset.name()), dataset.display_name(),
                  absl::StrCat(dataset.num_examples()),
                  FormatBytes(dataset.size_bytes()),
                  FormatTimestamp(dataset.create_time())});
  }
  table.Print(context.out());
  return kExitSuccess;
}

int RunGet(const CliContext& context, const DatasetFlags& flags) {
  absl::StatusOr<std::string> name = ResourceName(kDatasets, flags.id);
  if (!name.ok()) return context.UsageError(name.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::Dataset> dataset = (*client)->GetDataset(*name);
  if (!dataset.ok()) return context.ReportError(dataset.status());
  PrintDataset(context, *dataset);
  return kExitSuccess;
}

}  // namespace

void AddDatasetCommands(CLI::App& app, CliContext& context,
                        CommandAction* action) {
  auto flags = std::make_shared<DatasetFlags>();
  CLI::App* datasets =
      app.add_subcommand("datasets", "Upload and manage training datasets");
  datasets->require_subcommand(1);

  CLI::App* upload = datasets->add_subcommand(
      "upload", "Upload a JSONL dataset (validated in full by the server)");
  upload->add_option("FILE", flags->file, "JSONL file")->required();
  upload->add_option("--name", flags->display_name,
                     "Display name (default: the file name)");
  upload->add_option("--chat-template-kwargs",
                     flags->upload.chat_template_kwargs,
                     "Template variables for every chat line, a JSON object "
                     "(e.g. '{\"enable_thinking\": false}'); a line's own "
                     "chat_template_kwargs merge over them");
  upload->add_option("--turns", flags->upload.turns,
                     "Which assistant turns of a messages line train where "
                     "the line does not say: all (default) or last");
  SetAction(upload, action,
            [&context, flags] { return RunUpload(context, *flags); });

  CLI::App* list = datasets->add_subcommand("list", "List datasets");
  SetAction(list, action, [&context] { return RunList(context); });

  CLI::App* get = datasets->add_subcommand("get", "Show one dataset");
  get->add_option("ID", flags->id, "Dataset ID or datasets/ID")->required();
  SetAction(get, action, [&context, flags] { return RunGet(context, *flags); });

  CLI::App* remove = datasets->add_subcommand(
      "rm", "Delete a dataset (refused while a queued or running job uses it)");
  remove->add_option("ID", flags->id, "Dataset ID or datasets/ID")->required();
  SetAction(remove, action, [&context, flags] {
    return RunDeleteCommand(context, kDatasets, flags->id,
                            &LoraplexClient::DeleteDataset,
                            v1::DeleteDatasetResponse());
  });
}

}  // namespace loraplex
