// SIGINT and SIGTERM, recorded by a handler or taken by sigtimedwait.
#include "server/main/stop_signals.h"

#include <signal.h>

#include <atomic>

namespace loraplex {
namespace {

// The last SIGINT or SIGTERM (0: none yet). main() blocks both in this
// program's threads and Serve waits for them, but threads that libraries
// start before main (OpenBLAS's) may take one: this handler records it
// there instead of the default action killing the process. Global because
// a signal handler can reach nothing else.
std::atomic<int> g_stop_signal{0};

extern "C" void RecordStopSignal(int number) { g_stop_signal.store(number); }

}  // namespace

void InstallStopSignalHandlers() {
  struct sigaction action = {};
  action.sa_handler = RecordStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int WaitForStopSignal(absl::FunctionRef<bool()> failed) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  const timespec tick = {0, 100 * 1000 * 1000};
  for (;;) {
    const int number = sigtimedwait(&signals, nullptr, &tick);
    if (number > 0) return number;
    if (g_stop_signal.load() != 0) return g_stop_signal.load();
    if (failed()) return 0;
  }
}

}  // namespace loraplex
