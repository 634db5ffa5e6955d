// The training flags of `loraplex jobs create` and `loraplex adapters
// attach` (LoRA, optimizer, schedule, training), turned into a
// CreateJobRequest. Only the flags given on the command line are set in
// the request, so every other value is the server's default.
//
//   JobFlags flags;
//   AddJobFlags(command, &flags);  // Before parsing.
//   ...
//   v1::CreateJobRequest request;
//   absl::Status status = ApplyJobFlags(flags, &request);  // After parsing.
#ifndef LORAPLEX_CLIENT_JOB_FLAGS_H_
#define LORAPLEX_CLIENT_JOB_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loraplex/v1/jobs.pb.h"

namespace loraplex {

// Values of the flags, and the options that say whether each was given.
struct JobFlags {
  // Datasets and starting point (names or bare IDs).
  std::string dataset;
  std::string validation_dataset;
  std::string initial_adapter;
  std::string initial_checkpoint;  // "jobs/ID/checkpoints/STEP".
  std::string display_name;

  // LoRA.
  int64_t rank = 0;
  double alpha = 0;
  double dropout = 0;
  bool rslora = false;
  std::string targets;  // Comma-separated.

  // Optimizer.
  std::string optimizer;
  double lr = 0;
  double weight_decay = 0;
  std::string betas;  // "B1,B2".
  double eps = 0;
  double momentum = 0;
  bool nesterov = false;
  std::string weight_decay_mode;
  int32_t ns_steps = 0;
  std::string coefficient_set;
  std::string custom_coefficients;  // "A,B,C;A,B,C;...".
  std::string scale_mode;
  double extra_scale_factor = 0;
  std::string ns_precision;
  std::string scalar_optimizer;
  std::string lion_betas;  // "B1,B2".
  std::string soap_betas;  // "B1,B2".
  double shampoo_beta = 0;
  int32_t precondition_frequency = 0;
  int32_t max_precond_dim = 0;
  int32_t power_iter_steps = 0;
  bool use_eigh = false;
  double max_update_rms = 0;

  // Schedule.
  std::string schedule;
  int64_t warmup_steps = 0;
  double init_lr = 0;
  double min_lr = 0;
  int64_t total_steps = 0;
  double decay_fraction = 0;

  // Training.
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  bool pack = false;
  int64_t max_steps = 0;
  int64_t epochs = 0;
  double grad_clip = 0;
  uint64_t seed = 0;
  int64_t eval_interval = 0;
  int64_t checkpoint_interval = 0;

  // Each option registered by AddJobFlags, to ask whether it was given.
  std::vector<CLI::Option*> options;
};

// Which dataset flags AddJobFlags registers.
struct JobFlagSet {
  // --dataset (the training dataset) and --validation-dataset.
  bool datasets = true;
  // --initial-adapter.
  bool initial_adapter = true;
  // --initial-checkpoint.
  bool initial_checkpoint = true;
};

// Registers the flags on `command`, storing into `flags` (which must
// outlive the parse).
void AddJobFlags(CLI::App* command, JobFlags* flags,
                 const JobFlagSet& which = {});

// Sets the request fields of the given flags. INVALID_ARGUMENT naming the
// flag for a value that cannot be a field's (e.g. --betas 0.9), and for
// both --initial-adapter and --initial-checkpoint (one starting point).
absl::Status ApplyJobFlags(const JobFlags& flags,
                           v1::CreateJobRequest* request);

// "running" or "JOB_STATUS_RUNNING" (any case) -> JOB_STATUS_RUNNING.
absl::StatusOr<v1::JobStatus> ParseJobStatus(absl::string_view text);

}  // namespace loraplex

#endif  // LORAPLEX_CLIENT_JOB_FLAGS_H_
