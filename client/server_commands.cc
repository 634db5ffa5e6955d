// `loraplex info` and `loraplex slots`.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli_commands.h"
#include "client/display_format.h"
#include "client/text_table.h"
#include "core/common/resource_names.h"
#include "core/runtime/runtime_text.h"

namespace loraplex {
namespace {

// GetServerInfo's runtime, read back into the struct RuntimeFacts writes.
RuntimeInfo RuntimeFromProto(const v1::Runtime& proto) {
  RuntimeInfo info;
  info.torch_version = proto.torch_version();
  info.blas = proto.blas();
  info.cpu_capability = proto.cpu_capability();
  info.intra_op_threads = proto.intra_op_threads();
  info.inter_op_threads = proto.inter_op_threads();
  info.openmp_wait_policy = proto.openmp_wait_policy();
  info.cuda_compiled = proto.cuda_compiled();
  info.cuda_runtime_version = proto.cuda_runtime_version();
  info.cuda_driver_version = proto.cuda_driver_version();
  for (const v1::CudaDevice& device : proto.cuda_devices()) {
    info.cuda_devices.push_back(
        {device.index(), device.name(), device.compute_capability_major(),
         device.compute_capability_minor(), device.total_memory_bytes()});
  }
  info.cuda_note = proto.cuda_note();
  return info;
}

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
    for (auto& fact : RuntimeFacts(RuntimeFromProto(info->runtime()))) {
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
