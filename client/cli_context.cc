#include "client/cli_context.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/display_format.h"
#include "core/common/resource_names.h"

namespace loraplex {

std::string CliHelpFooter() {
  return "IDs may be given bare (abc) or as names (jobs/abc); checkpoints as\n"
         "jobs/ID/checkpoints/STEP or ID/checkpoints/STEP.\n"
         "\n"
         "Environment:\n"
         "  LORAPLEX_SERVER  default for --server\n"
         "  LORAPLEX_TOKEN   default for --token\n"
         "\n"
         "Exit codes:\n"
         "  0  success\n"
         "  1  server or connection error, or stdout could not be written\n"
         "  2  usage error (bad command line)\n"
         "  3  a waited-for or watched job ended FAILED or CANCELLED";
}

void SetAction(CLI::App* command, CommandAction* slot, CommandAction action) {
  command->callback([slot, action = std::move(action)] { *slot = action; });
}

absl::StatusOr<std::unique_ptr<LoraplexClient>> CliContext::Connect(
    const std::string& address) const {
  ClientOptions client_options;
  client_options.address = address.empty() ? options_.server : address;
  client_options.token = options_.token;
  client_options.tls_ca_file = options_.tls_ca_file;
  if (!std::isfinite(options_.timeout_seconds) ||
      options_.timeout_seconds <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout must be a finite positive number of seconds, "
                     "got ",
                     options_.timeout_seconds));
  }
  client_options.timeout = absl::Seconds(options_.timeout_seconds);
  return LoraplexClient::Connect(client_options);
}

int CliContext::ReportError(const absl::Status& status,
                            const std::string& address) const {
  const std::string& server = address.empty() ? options_.server : address;
  err_ << "loraplex: error: " << absl::StatusCodeToString(status.code()) << ": "
       << status.message() << "\n";
  if (status.code() == absl::StatusCode::kUnavailable) {
    err_ << "loraplex: cannot reach loraplex-server at " << server
         << " (is it running? start it with: loraplex-server)\n";
    // A refused connection means no server; anything else may be a TLS
    // server spoken to in plaintext.
    if (options_.tls_ca_file.empty() &&
        !absl::StrContains(status.message(), "Connection refused")) {
      err_ << "loraplex: if the server uses TLS, pass --tls-ca CA.pem\n";
    }
  } else if (status.code() == absl::StatusCode::kUnauthenticated) {
    err_ << "loraplex: the server wants a token: pass --token TOKEN or set "
            "LORAPLEX_TOKEN\n";
  } else if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    err_ << "loraplex: no answer from " << server << " within "
         << options_.timeout_seconds << " s (raise it with --timeout)\n";
  }
  return kExitServerError;
}

int CliContext::UsageError(absl::string_view message) const {
  err_ << "loraplex: error: " << message << "\n"
       << "Run 'loraplex --help' (or 'loraplex COMMAND --help') for usage.\n";
  return kExitUsage;
}

bool CliContext::PrintJsonIfRequested(
    const google::protobuf::Message& message) const {
  if (!options_.json) return false;
  out_ << MessageToJson(message, /*multiline=*/true) << "\n";
  return true;
}

bool CliContext::StdoutIsTerminal() const { return ::isatty(STDOUT_FILENO); }

int CliContext::TerminalWidth() const {
  winsize size{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    return size.ws_col;
  }
  int columns = 0;
  const char* env = std::getenv("COLUMNS");
  if (env != nullptr && absl::SimpleAtoi(env, &columns) && columns > 0) {
    return columns;
  }
  return 80;
}

int RunDeleteCommand(const CliContext& context, absl::string_view collection,
                     const std::string& id,
                     absl::Status (LoraplexClient::*remove)(const std::string&),
                     const google::protobuf::Message& response) {
  absl::StatusOr<std::string> name = ResourceName(collection, id);
  if (!name.ok()) return context.UsageError(name.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  absl::Status status = ((**client).*remove)(*name);
  if (!status.ok()) return context.ReportError(status);
  if (!context.PrintJsonIfRequested(response)) {
    context.out() << "Deleted " << *name << "\n";
  }
  return kExitSuccess;
}

}  // namespace loraplex
