// `loraplex`: the command-line client of loraplex-server.
//
//   loraplex info
//   loraplex datasets upload train.jsonl
//   loraplex jobs create --dataset abc --optimizer muon --rank 16 --wait
//   loraplex jobs pause abc && loraplex jobs resume abc
//   loraplex quickstart
//
// Exit codes: 0 success, 1 server or connection error (or stdout could not
// be written, e.g. a closed pipe), 2 usage error, 3 a waited-for or watched
// job ended FAILED or CANCELLED.
#include <cmath>
#include <csignal>
#include <iostream>
#include <stdexcept>
#include <string>

#include "CLI/CLI.hpp"
#include "client/cli_commands.h"
#include "client/cli_context.h"

namespace loraplex {
namespace {

int Main(int argc, char** argv) {
  CliContext context(std::cout, std::cerr);
  CLI::App app(
      "loraplex: fine-tune many LoRA adapters at once on one base model "
      "served by loraplex-server.",
      "loraplex");
  // Global flags may also follow the subcommand ("loraplex jobs list
  // --json"); subcommands inherit this.
  app.fallthrough();
  app.require_subcommand(1);
  app.footer(CliHelpFooter());
  CliOptions& options = context.options();
  app.add_option("--server", options.server,
                 "Address of loraplex-server (host:port)")
      ->envname("LORAPLEX_SERVER")
      ->capture_default_str();
  app.add_option("--token", options.token,
                 "Bearer token, when the server requires one")
      ->envname("LORAPLEX_TOKEN");
  app.add_option("--tls-ca", options.tls_ca_file,
                 "PEM file of the CA that signed the server's TLS "
                 "certificate (default: plaintext)")
      ->check(CLI::ExistingFile);
  app.add_flag("--json", options.json,
               "Print responses as JSON (proto3 JSON mapping) for scripts");
  app.add_option("--timeout", options.timeout_seconds,
                 "Seconds to wait for each request")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            double seconds = 0;
            try {
              seconds = std::stod(text);
            } catch (const std::exception&) {
              return "--timeout must be a number of seconds, got " + text;
            }
            if (!std::isfinite(seconds) || seconds <= 0) {
              return "--timeout must be a finite positive number of "
                     "seconds, got " +
                     text;
            }
            return "";
          },
          "POSITIVE"))
      ->capture_default_str();

  CommandAction action;
  AddServerCommands(app, context, &action);
  AddDatasetCommands(app, context, &action);
  AddJobCommands(app, context, &action);
  AddAdapterCommands(app, context, &action);
  AddSampleCommand(app, context, &action);
  AddChatCommand(app, context, &action);
  AddQuickstartCommand(app, context, &action);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version are "errors" with exit code 0.
    if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      return app.exit(error);
    }
    return context.UsageError(error.what());
  }
  if (!action) return context.UsageError("no command given");
  const int code = action();
  std::cout.flush();
  if (!std::cout && code == kExitSuccess) {
    std::cerr << "loraplex: error: cannot write to stdout\n";
    return kExitServerError;
  }
  return code;
}

}  // namespace
}  // namespace loraplex

int main(int argc, char** argv) {
  // Writing to a closed pipe (`loraplex jobs watch X | head -1`) then fails
  // with EPIPE and ends in exit code 1, instead of killing the process.
  std::signal(SIGPIPE, SIG_IGN);
  return loraplex::Main(argc, argv);
}
