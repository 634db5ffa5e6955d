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
#include "core/model/model_presets.h"
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
  const int64_t every =
      checkpointing.mode == CheckpointMode::kEvery ? checkpointing.every : 0;
  const int64_t budget = DefaultTokenBudget(
      model.config(), device.is_cuda(), memory,
      static_cast<int64_t>(c10::elementSize(model.dtype())), every);
  logger.Info("token budget: ", budget, " tokens per micro-batch (the default ",
              "on ", device.str(), "; --token-budget sets it)");
  return budget;
}

// Loads the tokenizer and the model of `base.model_dir` on `base.device`,
// and checks that they fit together.
absl::Status LoadTokenizerAndModel(const ServerFlags& flags, LoadedBase& base) {
  LORAPLEX_ASSIGN_OR_RETURN(base.tokenizer, LoadTokenizer(base.model_dir));
  ModelLoadOptions load_options;
  load_options.device = base.device;
  load_options.dtype = ComputeDtype(flags.dtype);
  LORAPLEX_ASSIGN_OR_RETURN(base.model,
                            LlamaModel::Load(base.model_dir, load_options));
  // Ids past the embedding would fail in the middle of training.
  if (base.tokenizer->vocab_size() > base.model->config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        base.model_dir, ": the tokenizer has ", base.tokenizer->vocab_size(),
        " tokens but the model's embedding only ",
        base.model->config().vocab_size, " rows"));
  }
  return absl::OkStatus();
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
  LORAPLEX_RETURN_IF_ERROR(LoadTokenizerAndModel(flags, base));
  LORAPLEX_ASSIGN_OR_RETURN(
      base.checkpointing, ResolveCheckpointing(flags, *base.model, base.device,
                                               base.runtime, logger));
  base.token_budget =
      ResolveTokenBudget(flags.token_budget, *base.model, base.device,
                         base.runtime, base.checkpointing, logger);
  if (env.distributed()) {
    RankSetup mine;
    mine.slots = flags.slots;
    mine.max_rank = flags.max_rank;
    mine.token_budget = base.token_budget;
    mine.checkpoints = true;
    LORAPLEX_RETURN_IF_ERROR(
        JoinRanks(env, base.device, *base.model, mine, base.dist, logger)
            .status());
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
                                  policy.element_bytes);
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

// Joins the process group of a multi-process run and agrees with the other
// ranks on the setup (rank 0's) and the base model.
absl::StatusOr<RankSetup> JoinRanks(const DistEnv& env, torch::Device device,
                                    const LlamaModel& model, RankSetup mine,
                                    std::optional<DistContext>& dist,
                                    Logger& logger) {
  logger.Info("rank ", env.rank, " of ", env.world_size,
              ": waiting for the other ranks at ", env.master_addr, ":",
              env.master_port, " (up to ", env.timeout.count(), " s)");
  LORAPLEX_ASSIGN_OR_RETURN(DistContext joined,
                            DistContext::Create(env, device));
  dist.emplace(std::move(joined));
  mine.model = ModelFingerprint(model);
  return AgreeOnSetup(*dist, mine);
}

}  // namespace loraplex
