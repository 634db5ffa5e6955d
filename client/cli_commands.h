// The `loraplex` subcommand groups. Each Add*Commands registers its
// subcommands on `app`; the one parsed sets *action to its work.
#ifndef LORAPLEX_CLIENT_CLI_COMMANDS_H_
#define LORAPLEX_CLIENT_CLI_COMMANDS_H_

#include <string>

#include "CLI/CLI.hpp"
#include "client/cli_context.h"
#include "client/client.h"

namespace loraplex {

// `info`, `slots`.
void AddServerCommands(CLI::App& app, CliContext& context,
                       CommandAction* action);
// `datasets upload|list|get|rm`.
void AddDatasetCommands(CLI::App& app, CliContext& context,
                        CommandAction* action);
// `jobs create|list|get|cancel|pause|resume|checkpoints|watch|events`.
void AddJobCommands(CLI::App& app, CliContext& context, CommandAction* action);
// `adapters attach|retire|export|list`.
void AddAdapterCommands(CLI::App& app, CliContext& context,
                        CommandAction* action);
// `sample`.
void AddSampleCommand(CLI::App& app, CliContext& context,
                      CommandAction* action);
// `chat`.
void AddChatCommand(CLI::App& app, CliContext& context, CommandAction* action);
// `quickstart`.
void AddQuickstartCommand(CLI::App& app, CliContext& context,
                          CommandAction* action);

// Shows `job_name`'s progress until it finishes (JSON of the final job with
// --json) and returns the exit code: 0 for SUCCEEDED, 3 for FAILED or
// CANCELLED, 1 when the watch fails.
int WatchJobToEnd(const CliContext& context, LoraplexClient& client,
                  const std::string& job_name);

// Prints a job's details ("Key: value" lines).
void PrintJobDetails(std::ostream& out, const v1::Job& job);

}  // namespace loraplex

#endif  // LORAPLEX_CLIENT_CLI_COMMANDS_H_
