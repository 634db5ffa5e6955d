// A rank other than 0: trains rank 0's plans (follower.h).
#include "server/main/follower.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/model/model_presets.h"
#include "core/runtime/device.h"
#include "server/grpc/proto_convert.h"
#include "server/main/base_loading.h"
#include "server/trainer/trainer.h"

namespace loraplex {

namespace fs = std::filesystem;

int FollowRankZero(const ServerFlags& flags, const DistEnv& env,
                   Logger& logger) {
  auto fail = [&](const absl::Status& status) {
    logger.Error("rank ", env.rank, ": ", status.message());
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  };
  absl::StatusOr<torch::Device> device = RankDevice(flags.device, env);
  if (!device.ok()) return fail(device.status());
  absl::StatusOr<int> threads = ConfigureThreads(flags.threads);
  if (!threads.ok()) return fail(threads.status());
  std::string model_dir = flags.model_dir;
  std::string built_in;  // The built-in model, written for this rank alone.
  if (model_dir.empty()) {
    built_in = (fs::temp_directory_path() /
                absl::StrCat("loraplex-rank", env.rank, "-", getpid()))
                   .string();
    if (absl::Status written = WritePresetModel("tiny", 0, built_in);
        !written.ok()) {
      return fail(written);
    }
    model_dir = built_in;
  }
  std::optional<DistContext> dist;
  absl::StatusOr<std::unique_ptr<LlamaModel>> model;
  absl::StatusOr<RankSetup> setup;
  if (absl::Status joined = JoinRanks(env, *device, dist, logger);
      !joined.ok()) {
    setup = joined;
  } else {
    model = LoadRankModel(model_dir, flags, *device, &*dist,
                          /*tokenizer=*/nullptr, logger);
    setup = model.ok() ? AgreeWithRanks(*dist, **model, model_dir, RankSetup())
                       : absl::StatusOr<RankSetup>(model.status());
  }
  std::error_code error;
  if (!built_in.empty()) fs::remove_all(built_in, error);
  if (!setup.ok()) return fail(setup.status());
  TrainerOptions options;
  options.pool.capacity = setup->slots;
  options.pool.max_rank = setup->max_rank;
  options.pool.device = *device;
  options.co_batch.token_budget = setup->token_budget;
  absl::StatusOr<CheckpointPolicy> checkpointing = ResolveCheckpointing(
      flags, **model, *device, RuntimeProto(InspectRuntime()), logger);
  if (!checkpointing.ok()) return fail(checkpointing.status());
  options.co_batch.checkpointing = *checkpointing;
  options.leader_checkpoints = setup->checkpoints;
  options.dist = &*dist;
  Trainer trainer(*std::move(model), options, [](TrainerReport) {});
  // SIGINT and SIGTERM are recorded, not acted on: this rank stops when
  // rank 0 does.
  logger.Info("rank ", env.rank, " of ", env.world_size,
              ": training with rank 0 (", setup->slots, " slots)");
  if (absl::Status followed = trainer.Follow(); !followed.ok()) {
    logger.Error("rank ", env.rank, ": ", followed.message());
    return 1;
  }
  logger.Info("rank ", env.rank, ": rank 0 stopped; stopped");
  return 0;
}

}  // namespace loraplex
