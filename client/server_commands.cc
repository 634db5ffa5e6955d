// `loraplex info` and `loraplex slots`.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli_commands.h"
#include "client/display_format.h"
#include "client/text_table.h"
#include "proto/resource_names.h"
#include "proto/runtime_text.h"

namespace loraplex {
namespace {

int RunInfo(const CliContext& context) {
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::ServerInfo> info = (*client)->GetServerInfo();
  if (!info.ok()) return context.ReportError(info.status());
  if (context.PrintJsonIfRequested(*info)) return kExitSuccess;
  const v1::BaseModel& model = info->base_model();
  std::vector<std::pair<std::string, std::string>> facts = {
      {"Server", context.options().server},
      {"Version", info->version()},
      {"Base model",
       absl::StrCat(model.name(), " (", model.family(), ", ",
                    model.num_hidden_layers(), " layers, hidden ",
                    model.hidden_size(), ", vocab ", model.vocab_size(), ", ",
                    model.dtype(), ")")},
      {"Device", info->device()},
      {"Slots", absl::StrCat(info->slot_capacity(), " (",
                             info->slots_per_tenant(), " per tenant)")},
      {"Max rank", absl::StrCat(info->max_rank())},
      {"Max dataset", FormatBytes(info->max_dataset_bytes())},
      {"Tenant", info->tenant()}};
  if (info->has_runtime()) {
    for (auto& fact : RuntimeFacts(info->runtime())) {
      facts.push_back(std::move(fact));
    }
  }
  PrintKeyValues(context.out(), facts);
  return kExitSuccess;
}

int RunSlots(const CliContext& context) {
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::StatusOr<v1::ListSlotsResponse> slots = (*client)->ListSlots();
  if (!slots.ok()) return context.ReportError(slots.status());
  if (context.PrintJsonIfRequested(*slots)) return kExitSuccess;
  TextTable table({"SLOT", "STATE", "JOB", "RANK", "OPTIMIZER", "STEP", "LR"});
  for (const v1::Slot& slot : slots->slots()) {
    const bool attached = slot.state() == v1::SLOT_STATE_ATTACHED;
    table.AddRow(
        {absl::StrCat(slot.index()), SlotStateName(slot.state()),
         slot.job().empty() ? (attached ? "(other tenant)" : "-")
                            : ResourceId(slot.job()),
         attached ? absl::StrCat(slot.rank()) : "-",
         attached ? OptimizerFamilyName(slot.family()) : "-",
         attached ? absl::StrCat(slot.step(), "/", slot.total_steps()) : "-",
         attached ? absl::StrFormat("%.2e", slot.lr()) : "-"});
  }
  table.Print(context.out());
  return kExitSuccess;
}

}  // namespace

void AddServerCommands(CLI::App& app, CliContext& context,
                       CommandAction* action) {
  CLI::App* info = app.add_subcommand(
      "info", "Show the server's base model, slots and limits");
  SetAction(info, action, [&context] { return RunInfo(context); });
  CLI::App* slots =
      app.add_subcommand("slots", "Show every slot of the pool and its job");
  SetAction(slots, action, [&context] { return RunSlots(context); });
}

}  // namespace loraplex
