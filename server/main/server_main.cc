// loraplex-server: serves the loraplex.v1 API over one frozen base model
// and a pool of LoRA slots. See README.md for the flags and a quick start.
// The flags are in server_flags.h; what the server builds and runs, in
// server_builder.h.
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>

#include "core/runtime/device.h"
#include "server/common/logger.h"
#include "server/main/server_builder.h"
#include "server/main/server_flags.h"
#include "server/main/stop_signals.h"

int main(int argc, char** argv) {
  loraplex::ReexecWithPassiveOpenMpWait(argv);
  loraplex::InstallStopSignalHandlers();
  // Blocked before this program starts threads; Serve waits for them. Ranks
  // other than 0 never do: they stop when rank 0 does.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A file over RLIMIT_FSIZE is a write error to handle (a checkpoint that
  // fails), not a reason to die.
  signal(SIGXFSZ, SIG_IGN);

  loraplex::ServerFlags flags;
  CLI::App app{
      "loraplex-server: multi-LoRA fine-tuning over one frozen base model. "
      "Clients talk to it with the `loraplex` CLI or the loraplex.v1 gRPC "
      "API."};
  loraplex::AddServerFlags(app, flags);
  CLI11_PARSE(app, argc, argv);

  loraplex::Logger logger(*loraplex::ParseLogLevel(flags.log_level));
  return loraplex::Serve(flags, logger);
}
