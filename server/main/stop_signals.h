// How loraplex-server learns that it should stop: SIGINT or SIGTERM.
//
//   InstallStopSignalHandlers();  // First thing in main, before threads.
//   ... block SIGINT and SIGTERM with pthread_sigmask, start the server ...
//   const int signal_number = WaitForStopSignal([&] { return failed; });
//
// main() blocks both signals in this program's threads so that the thread
// that waits takes them; the handlers catch what reaches threads that
// libraries start before main (OpenBLAS's) instead of the default action
// killing the process.
#ifndef LORAPLEX_SERVER_MAIN_STOP_SIGNALS_H_
#define LORAPLEX_SERVER_MAIN_STOP_SIGNALS_H_

#include "absl/functional/function_ref.h"

namespace loraplex {

// Makes SIGINT and SIGTERM record themselves for WaitForStopSignal.
void InstallStopSignalHandlers();

// Waits for SIGINT or SIGTERM (returns it) or for `failed` (returns 0),
// which is asked every tenth of a second.
int WaitForStopSignal(absl::FunctionRef<bool()> failed);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_MAIN_STOP_SIGNALS_H_
