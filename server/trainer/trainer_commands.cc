// The dispatch of trainer_commands.h: each hook a command has, or the
// default where it has none.
#include "server/trainer/trainer_commands.h"

#include <type_traits>
#include <utility>

#include "server/trainer/trainer_parts.h"

namespace loraplex {
namespace {

template <typename C, typename = void>
struct HasReadFiles : std::false_type {};
template <typename C>
struct HasReadFiles<C, std::void_t<decltype(std::declval<C&>().ReadFiles(
                           std::declval<TrainerParts&>()))>> : std::true_type {
};

template <typename C, typename = void>
struct HasPrepare : std::false_type {};
template <typename C>
struct HasPrepare<C, std::void_t<decltype(std::declval<C&>().Prepare(
                         std::declval<TrainerParts&>()))>> : std::true_type {};

template <typename C, typename = void>
struct HasPlanEntry : std::false_type {};
template <typename C>
struct HasPlanEntry<
    C, std::void_t<decltype(C::kPlanKind),
                   decltype(std::declval<const C&>().PlanEntry()),
                   decltype(C::FromPlanEntry(std::declval<StepPlan::Entry>()))>>
    : std::true_type {};

template <typename C, typename = void>
struct HasAbandon : std::false_type {};
template <typename C>
struct HasAbandon<C, std::void_t<decltype(std::declval<C&>().Abandon(
                         std::declval<const absl::Status&>()))>>
    : std::true_type {};

// Makes `command` the command of type C when the entry names C.
template <typename C>
bool FromEntry(StepPlan::Entry& entry, std::optional<TrainerCommand>& command) {
  if constexpr (HasPlanEntry<C>::value) {
    if (entry.kind == C::kPlanKind) {
      command.emplace(C::FromPlanEntry(std::move(entry)));
      return true;
    }
  }
  return false;
}

template <size_t... I>
std::optional<TrainerCommand> CommandOfKind(StepPlan::Entry& entry,
                                            std::index_sequence<I...>) {
  std::optional<TrainerCommand> command;
  (FromEntry<std::variant_alternative_t<I, TrainerCommand>>(entry, command) ||
   ...);
  return command;
}

}  // namespace

bool CommandReadsFiles(const TrainerCommand& command) {
  return std::visit(
      [](const auto& c) {
        return HasReadFiles<std::decay_t<decltype(c)>>::value;
      },
      command);
}

void ReadCommandFiles(TrainerCommand& command, TrainerParts& parts) {
  std::visit(
      [&parts](auto& c) {
        if constexpr (HasReadFiles<std::decay_t<decltype(c)>>::value) {
          c.ReadFiles(parts);
        }
      },
      command);
}

void PrepareCommand(TrainerCommand& command, TrainerParts& parts) {
  std::visit(
      [&parts](auto& c) {
        if constexpr (HasPrepare<std::decay_t<decltype(c)>>::value) {
          c.Prepare(parts);
        }
      },
      command);
}

void ApplyCommand(TrainerCommand& command, TrainerParts& parts) {
  std::visit([&parts](auto& c) { c.Apply(parts); }, command);
}

std::optional<StepPlan::Entry> PlanEntryOf(const TrainerCommand& command) {
  return std::visit(
      [](const auto& c) -> std::optional<StepPlan::Entry> {
        if constexpr (HasPlanEntry<std::decay_t<decltype(c)>>::value) {
          return c.PlanEntry();
        } else {
          return std::nullopt;
        }
      },
      command);
}

std::optional<TrainerCommand> CommandOf(StepPlan::Entry entry) {
  return CommandOfKind(
      entry, std::make_index_sequence<std::variant_size_v<TrainerCommand>>());
}

void Abandon(TrainerCommand& command, const absl::Status& status) {
  std::visit(
      [&status](auto& c) {
        if constexpr (HasAbandon<std::decay_t<decltype(c)>>::value) {
          c.Abandon(status);
        }
      },
      command);
}

}  // namespace loraplex
