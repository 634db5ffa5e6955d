// What every `loraplex` subcommand shares: the global flags, connecting to
// the server, --json output, and the exit codes with the error messages
// that go with them.
//
// Subcommands register with CLI11 and, when parsed, leave the work to do
// in a CommandAction that main() runs after parsing:
//
//   auto* list = jobs->add_subcommand("list", "List jobs");
//   SetAction(list, action, [&context] { return RunJobsList(context); });
#ifndef LORAPLEX_CLIENT_CLI_CONTEXT_H_
#define LORAPLEX_CLIENT_CLI_CONTEXT_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/client.h"
#include "google/protobuf/message.h"

namespace loraplex {

// Process exit codes of `loraplex` (also listed in --help).
inline constexpr int kExitSuccess = 0;
inline constexpr int kExitServerError = 1;      // Server or connection error.
inline constexpr int kExitUsage = 2;            // Bad command line.
inline constexpr int kExitJobUnsuccessful = 3;  // Waited job FAILED/CANCELLED.

inline constexpr absl::string_view kDefaultServerAddress = "127.0.0.1:50051";

// The --help footer: exit codes and environment variables.
std::string CliHelpFooter();

// The global flags.
struct CliOptions {
  std::string server = std::string(kDefaultServerAddress);
  std::string token;
  std::string tls_ca_file;
  bool json = false;
  double timeout_seconds = 30;
};

// The work of the parsed subcommand; returns the exit code.
using CommandAction = std::function<int()>;

// Makes `action` the one main() runs when `command` is on the command line.
void SetAction(CLI::App* command, CommandAction* slot, CommandAction action);

class CliContext {
 public:
  CliContext(std::ostream& out, std::ostream& err) : out_(out), err_(err) {}

  CliOptions& options() { return options_; }
  const CliOptions& options() const { return options_; }
  std::ostream& out() const { return out_; }
  std::ostream& err() const { return err_; }

  // A client for the global flags (`address` overrides --server).
  absl::StatusOr<std::unique_ptr<LoraplexClient>> Connect(
      const std::string& address = "") const;

  // Prints "loraplex: error: CODE: message" and a hint for UNAVAILABLE
  // (server not running) and UNAUTHENTICATED (token); returns
  // kExitServerError. `address` is the server the call went to (default:
  // --server).
  int ReportError(const absl::Status& status,
                  const std::string& address = "") const;

  // Prints "loraplex: error: message" and where to find the usage; returns
  // kExitUsage.
  int UsageError(absl::string_view message) const;

  // With --json, prints the message as JSON and returns true; the caller
  // prints its human-readable form otherwise.
  bool PrintJsonIfRequested(const google::protobuf::Message& message) const;

  // Whether stdout is a terminal, and its width in columns (80 when
  // unknown).
  bool StdoutIsTerminal() const;
  int TerminalWidth() const;

 private:
  std::ostream& out_;
  std::ostream& err_;
  CliOptions options_;
};

// `rm`: deletes `id` of `collection` (e.g. "datasets") with `remove` and
// prints "Deleted NAME" (with --json, `response`).
int RunDeleteCommand(const CliContext& context, absl::string_view collection,
                     const std::string& id,
                     absl::Status (LoraplexClient::*remove)(const std::string&),
                     const google::protobuf::Message& response);

}  // namespace loraplex

#endif  // LORAPLEX_CLIENT_CLI_CONTEXT_H_
