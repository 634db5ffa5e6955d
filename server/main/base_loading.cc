// Rank 0's base model and what is resolved around it (base_loading.h).
#include "server/main/base_loading.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/atomic_file.h"
#include "core/common/status_macros.h"
#include "core/dist/base_sharding.h"
#include "core/model/model_presets.h"
#include "core/model/sharded_base.h"
#include "core/runtime/device.h"
#include "core/runtime/runtime_text.h"
#include "core/tokenizer/load_tokenizer.h"
#include "server/grpc/proto_convert.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

// The last component of `dir` ("models/qwen/" -> "qwen").
std::string DirectoryName(const std::string& dir) {
  const fs::path path = fs::path(dir).lexically_normal();
  return path.filename().empty() ? path.parent_path().filename().string()
                                 : path.filename().string();
}

// base_model_name_or_path of exported adapters: what PEFT, vLLM and
// transformers resolve the base with. A Hub id (--model-name, else the
// checkpoint's own `_name_or_path`) or, failing both, the directory itself.
std::string ExportedBaseModel(const std::string& model_name,
                              const ModelConfig& config,
                              const std::string& model_dir) {
  if (!model_name.empty()) return model_name;
  if (!config.name_or_path.empty()) return config.name_or_path;
  std::error_code error;
  std::string path = fs::absolute(model_dir, error).lexically_normal().string();
  if (error) return model_dir;
  if (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// The built-in tiny model, written into the state dir on first start.
absl::StatusOr<std::string> DefaultModelDir(const std::string& state_dir,
                                            Logger& logger) {
  const std::string dir = state_dir + "/models/tiny";
  if (fs::exists(dir + "/config.json")) return dir;
  logger.Info("writing the built-in tiny model to ", dir);
  const std::string staged = dir + ".staged";
  std::error_code error;
  fs::remove_all(staged, error);
  LORAPLEX_RETURN_IF_ERROR(WritePresetModel("tiny", 0, staged));
  LORAPLEX_RETURN_IF_ERROR(PublishDirectory(staged, dir));
  return dir;
}

// What the base's weights take on this rank: a sharded base's share (and
// gather buffers), or -1 for the whole base's (from its config).
int64_t HeldWeightBytes(const LlamaModel& model) {
  return model.sharded_base() != nullptr ? model.FrozenWeightBytes() : -1;
}

// The memory training runs in: a GPU's, or the host's for the CPU (0 when
// unknown).
int64_t DeviceMemoryBytes(const torch::Device& device,
                          const v1::Runtime& runtime) {
  if (!device.is_cuda()) {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page_size > 0 ? int64_t{pages} * page_size : 0;
  }
  const int index = device.has_index() ? device.index() : 0;
  for (const v1::CudaDevice& cuda : runtime.cuda_devices()) {
    if (cuda.index() == index) return cuda.total_memory_bytes();
  }
  return 0;
}

// --token-budget, or with none (-1) the default for the device (logged):
// the CPU's, or on a GPU what its memory holds beside the base's weights,
// with the layers `checkpointing` always recomputes counted as such.
int64_t ResolveTokenBudget(int64_t flag, const LlamaModel& model,
                           const torch::Device& device,
                           const v1::Runtime& runtime,
                           const CheckpointPolicy& checkpointing,
                           Logger& logger) {
  if (flag >= 0) return flag;
  const int64_t memory =
      device.is_cuda() ? DeviceMemoryBytes(device, runtime) : 0;
  // A sharded base runs every layer checkpointed (sharded_base.h).
  const int64_t every = model.sharded_base() != nullptr ? 1
                        : checkpointing.mode == CheckpointMode::kEvery
                            ? checkpointing.every
                            : 0;
  const int64_t budget =
      DefaultTokenBudget(model.config(), device.is_cuda(), memory,
                         static_cast<int64_t>(c10::elementSize(model.dtype())),
                         every, HeldWeightBytes(model));
  logger.Info("token budget: ", budget, " tokens per micro-batch (the default ",
              "on ", device.str(), "; --token-budget sets it)");
  return budget;
}

// Loads the model of `model_dir` on `device` as `sharding` says, and checks
// that `tokenizer` (when set) fits it.
absl::StatusOr<std::unique_ptr<LlamaModel>> LoadAndCheck(
    const std::string& model_dir, const ServerFlags& flags,
    torch::Device device, std::optional<BaseSharding> sharding,
    const Tokenizer* tokenizer) {
  ModelLoadOptions load_options;
  load_options.device = device;
  load_options.dtype = ComputeDtype(flags.dtype);
  load_options.shard_base = std::move(sharding);
  LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                            LlamaModel::Load(model_dir, load_options));
  // Ids past the embedding would fail in the middle of training.
  if (tokenizer != nullptr &&
      tokenizer->vocab_size() > model->config().vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir, ": the tokenizer has ", tokenizer->vocab_size(),
                     " tokens but the model's embedding only ",
                     model->config().vocab_size, " rows"));
  }
  return model;
}

}  // namespace

absl::Status LoadBase(const ServerFlags& flags, const DistEnv& env,
                      Logger& logger, LoadedBase& base) {
  base.model_dir = flags.model_dir;
  if (base.model_dir.empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(base.model_dir,
                              DefaultModelDir(flags.state_dir, logger));
  }
  LORAPLEX_ASSIGN_OR_RETURN(base.device, RankDevice(flags.device, env));
  LORAPLEX_RETURN_IF_ERROR(ConfigureThreads(flags.threads).status());
  const RuntimeInfo runtime_info = InspectRuntime();
  for (const std::string& line : RuntimeLines(runtime_info)) logger.Info(line);
  base.runtime_info = runtime_info;
  base.runtime = RuntimeProto(runtime_info);
  LORAPLEX_ASSIGN_OR_RETURN(base.tokenizer, LoadTokenizer(base.model_dir));
  if (env.distributed()) {
    LORAPLEX_RETURN_IF_ERROR(JoinRanks(env, base.device, base.dist, logger));
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      base.model, LoadRankModel(base.model_dir, flags, base.device,
                                base.dist.has_value() ? &*base.dist : nullptr,
                                base.tokenizer.get(), logger));
  LORAPLEX_ASSIGN_OR_RETURN(
      base.checkpointing, ResolveCheckpointing(flags, *base.model, base.device,
                                               base.runtime, logger));
  base.token_budget =
      ResolveTokenBudget(flags.token_budget, *base.model, base.device,
                         base.runtime, base.checkpointing, logger);
  if (base.dist.has_value()) {
    RankSetup mine;
    mine.slots = flags.slots;
    mine.max_rank = flags.max_rank;
    mine.token_budget = base.token_budget;
    mine.checkpoints = true;
    LORAPLEX_RETURN_IF_ERROR(
        AgreeWithRanks(*base.dist, *base.model, base.model_dir, mine).status());
  }
  base.config = base.model->config();
  base.model_name = flags.model_name.empty() ? DirectoryName(base.model_dir)
                                             : flags.model_name;
  base.export_name =
      ExportedBaseModel(flags.model_name, base.config, base.model_dir);
  return absl::OkStatus();
}

std::optional<torch::ScalarType> ComputeDtype(const std::string& flag) {
  if (flag == "float32") return torch::kFloat32;
  if (flag == "bfloat16") return torch::kBFloat16;
  if (flag == "float64") return torch::kFloat64;
  return std::nullopt;
}

absl::StatusOr<CheckpointPolicy> ResolveCheckpointing(
    const ServerFlags& flags, const LlamaModel& model,
    const torch::Device& device, const v1::Runtime& runtime, Logger& logger) {
  CheckpointPolicy policy;
  LORAPLEX_RETURN_IF_ERROR(
      ParseCheckpointMode(flags.activation_checkpointing, &policy));
  policy.element_bytes = static_cast<int64_t>(c10::elementSize(model.dtype()));
  policy.activation_bytes =
      flags.activation_memory_mb >= 0
          ? flags.activation_memory_mb << 20
          : ActivationMemoryBytes(model.config(),
                                  DeviceMemoryBytes(device, runtime),
                                  policy.element_bytes, HeldWeightBytes(model));
  const int64_t longest = MaxRowTokens(policy, model.config());
  logger.Info("activation checkpointing: ", CheckpointModeName(policy),
              "; activation memory ", policy.activation_bytes >> 20,
              " MiB per micro-batch (--activation-memory-mb): rows of up to ",
              longest > 0 ? absl::StrCat(longest) : "any number of",
              " tokens train");
  return policy;
}

absl::StatusOr<torch::Device> RankDevice(const std::string& flag,
                                         const DistEnv& env) {
  LORAPLEX_ASSIGN_OR_RETURN(torch::Device device, ParseDevice(flag));
  if (device.is_cuda() && !device.has_index() && env.distributed()) {
    return torch::Device(torch::kCUDA,
                         static_cast<torch::DeviceIndex>(env.local_rank));
  }
  return device;
}

absl::Status JoinRanks(const DistEnv& env, torch::Device device,
                       std::optional<DistContext>& dist, Logger& logger) {
  logger.Info("rank ", env.rank, " of ", env.world_size,
              ": waiting for the other ranks at ", env.master_addr, ":",
              env.master_port, " (up to ", env.timeout.count(), " s)");
  LORAPLEX_ASSIGN_OR_RETURN(DistContext joined,
                            DistContext::Create(env, device));
  dist.emplace(std::move(joined));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LoadRankModel(
    const std::string& model_dir, const ServerFlags& flags,
    torch::Device device, DistContext* dist, const Tokenizer* tokenizer,
    Logger& logger) {
  bool shard = flags.shard_base;
  if (dist == nullptr) {
    if (shard) {
      return absl::InvalidArgumentError(
          "--shard-base shards the base over the ranks of a data-parallel "
          "run: launch 2 or more ranks (RANK, WORLD_SIZE, MASTER_ADDR and "
          "MASTER_PORT as torchrun sets them, docs/DESIGN.md §6)");
    }
    return LoadAndCheck(model_dir, flags, device, std::nullopt, tokenizer);
  }
  LORAPLEX_ASSIGN_OR_RETURN(shard, AgreeOnShardBase(*dist, shard));
  std::optional<BaseSharding> sharding;
  if (shard) sharding = BaseShardingOver(*dist);
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      LoadAndCheck(model_dir, flags, device, std::move(sharding), tokenizer);
  LORAPLEX_RETURN_IF_ERROR(
      AgreeAllOk(*dist, model.status(), "load the base model"));
  if (const ShardedBase* base = (*model)->sharded_base()) {
    const int64_t whole =
        StorageBytes((*model)->weights()) + base->WholeLayerBytes();
    logger.Info("rank ", dist->rank(), ": the base is sharded over ",
                dist->world_size(), " ranks: this rank holds ",
                (*model)->FrozenWeightBytes() >> 20,
                " MiB of its frozen weights (the whole base: ", whole >> 20,
                " MiB; the gather buffers: ", base->BufferBytes() >> 20,
                " MiB)");
  }
  return model;
}

absl::StatusOr<RankSetup> AgreeWithRanks(DistContext& dist,
                                         const LlamaModel& model,
                                         const std::string& model_dir,
                                         RankSetup mine) {
  LORAPLEX_RETURN_IF_ERROR(AgreeOnShardLayout(dist, model));
  absl::StatusOr<std::string> fingerprint =
      ShardedModelFingerprint(model, model_dir);
  LORAPLEX_RETURN_IF_ERROR(
      AgreeAllOk(dist, fingerprint.status(), "check the base model"));
  mine.model = *std::move(fingerprint);
  return AgreeOnSetup(dist, mine);
}

}  // namespace loraplex
