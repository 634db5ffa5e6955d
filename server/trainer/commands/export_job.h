// The export command (trainer_commands.h): writes the job's adapter as
// PEFT files into `dir`, then calls `done`. Rank 0's alone.
#ifndef LORAPLEX_SERVER_TRAINER_COMMANDS_EXPORT_JOB_H_
#define LORAPLEX_SERVER_TRAINER_COMMANDS_EXPORT_JOB_H_

#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"

namespace loraplex {

struct ExportJob {
  std::string job_id;
  std::string dir;
  std::function<void(absl::Status)> done;

  template <typename Parts>
  void Apply(Parts& parts) {
    parts.jobs.Export(*this);
  }
  void Abandon(const absl::Status& status) {
    if (done) std::exchange(done, nullptr)(status);
  }
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_COMMANDS_EXPORT_JOB_H_
