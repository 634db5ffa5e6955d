// Rank 0's start-up up to the base model: which directory, device and
// dtype, the tokenizer and the model, the activation checkpointing and
// token budget they train with, and the process group of a multi-process
// run. The helpers are shared with the ranks that follow rank 0
// (follower.h).
//
//   LoadedBase base;
//   LORAPLEX_RETURN_IF_ERROR(LoadBase(flags, env, logger, base));
//   ... base.model goes to the trainer, base.tokenizer to the datasets ...
#ifndef LORAPLEX_SERVER_MAIN_BASE_LOADING_H_
#define LORAPLEX_SERVER_MAIN_BASE_LOADING_H_

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dist/dist_env.h"
#include "core/dist/process_group.h"
#include "core/model/llama_model.h"
#include "core/model/model_config.h"
#include "core/runtime/runtime_info.h"
#include "core/tokenizer/tokenizer.h"
#include "core/train/token_budget.h"
#include "loraplex/v1/server.pb.h"
#include "server/common/logger.h"
#include "server/main/server_flags.h"
#include "server/trainer/rank_setup.h"

namespace loraplex {

// The base model rank 0 serves and what was resolved around it. Filled in
// place: `dist` is not moved once the ranks have joined.
struct LoadedBase {
  // --model, or the built-in tiny model's directory in the state dir.
  std::string model_dir;
  // --device (a CUDA device of no index: the rank's LOCAL_RANK).
  torch::Device device = torch::kCPU;
  // What the server runs on (logged, and sent by GetServerInfo), and as
  // the proto.
  RuntimeInfo runtime_info;
  v1::Runtime runtime;
  // Must outlive the datasets and the trainer, which point to it.
  std::unique_ptr<Tokenizer> tokenizer;
  // Loaded on `device`; the trainer takes it.
  std::unique_ptr<LlamaModel> model;
  // The activation checkpointing micro-batches train with.
  CheckpointPolicy checkpointing;
  // Most padded tokens per micro-batch (0: no limit).
  int64_t token_budget = 0;
  // The process group, when the run has several ranks; must outlive the
  // trainer.
  std::optional<DistContext> dist;
  // The model's config (a copy: the model itself moves to the trainer).
  ModelConfig config;
  // What clients' jobs name the base (--model-name, else the directory's).
  std::string model_name;
  // base_model_name_or_path of exported adapters.
  std::string export_name;
};

// Fills `base` from the flags, logging what it resolves, and on a
// multi-process run joins the other ranks. Failures name the flag or file.
absl::Status LoadBase(const ServerFlags& flags, const DistEnv& env,
                      Logger& logger, LoadedBase& base);

// --dtype: the base's compute dtype (unset: the checkpoint's).
std::optional<torch::ScalarType> ComputeDtype(const std::string& flag);

// --device, with a CUDA device of no index taken as the rank's LOCAL_RANK.
absl::StatusOr<torch::Device> RankDevice(const std::string& flag,
                                         const DistEnv& env);

// --activation-checkpointing with the activation memory it plans for:
// --activation-memory-mb, or by default three quarters of what the base's
// weights leave of the device's memory. Logged with the longest row it trains.
absl::StatusOr<CheckpointPolicy> ResolveCheckpointing(
    const ServerFlags& flags, const LlamaModel& model,
    const torch::Device& device, const v1::Runtime& runtime, Logger& logger);

// Joins the process group of a multi-process run (into `dist`).
absl::Status JoinRanks(const DistEnv& env, torch::Device device,
                       std::optional<DistContext>& dist, Logger& logger);

// The base of `model_dir` on `device`. Data parallel (`dist` set;
// collective), sharded over the ranks when rank 0's --shard-base says so,
// and an error on every rank when one rank cannot load it. `tokenizer`
// (rank 0's) must fit the model's embedding. Alone, --shard-base is
// INVALID_ARGUMENT.
absl::StatusOr<std::unique_ptr<LlamaModel>> LoadRankModel(
    const std::string& model_dir, const ServerFlags& flags,
    torch::Device device, DistContext* dist, const Tokenizer* tokenizer,
    Logger& logger);

// Collective: agrees with the other ranks on the setup (rank 0's) and the
// base model (its fingerprint; a sharded base's gathered layers are checked
// against each rank's `model_dir`).
absl::StatusOr<RankSetup> AgreeWithRanks(DistContext& dist,
                                         const LlamaModel& model,
                                         const std::string& model_dir,
                                         RankSetup mine);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_MAIN_BASE_LOADING_H_
