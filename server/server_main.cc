// loraplex-server: serves the loraplex.v1 API over one frozen base model
// and a pool of LoRA slots. See README.md for the flags and a quick start.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "core/chat/chat_template.h"
#include "core/common/atomic_file.h"
#include "core/common/read_file.h"
#include "core/common/status_macros.h"
#include "core/common/test_faults.h"
#include "core/dist/dist_env.h"
#include "core/dist/process_group.h"
#include "core/model/model_family.h"
#include "core/model/model_presets.h"
#include "core/runtime/device.h"
#include "core/runtime/runtime_info.h"
#include "core/tokenizer/load_tokenizer.h"
#include "core/train/token_budget.h"
#include "proto/runtime_text.h"
#include "server/common/request_counters.h"
#include "server/common/work_queue.h"
#include "server/engine/checkpoint_files.h"
#include "server/engine/rank_setup.h"
#include "server/engine/trainer.h"
#include "server/http/http_listener.h"
#include "server/http/metrics.h"
#include "server/http/tinker_api.h"
#include "server/jobs/job_scheduler.h"
#include "server/jobs/session_manager.h"
#include "server/service/adapter_service.h"
#include "server/service/dataset_service.h"
#include "server/service/job_service.h"
#include "server/service/request_counting.h"
#include "server/service/sampling_service.h"
#include "server/service/server_info_service.h"
#include "server/service/session_service.h"
#include "server/service/state_cleanup.h"
#include "server/service/unparsable_requests.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

struct ServerFlags {
  std::string model_dir;
  std::string model_name;
  std::string state_dir = "./loraplex-state";
  std::string listen = "127.0.0.1:50051";
  std::string http_listen;  // Off.
  int tinker_poll_seconds = 30;
  int64_t tinker_max_samples = 1024;
  int slots = 8;
  int slots_per_tenant = 0;
  int64_t max_rank = 64;
  std::string tokens_file;
  std::string tls_cert;
  std::string tls_key;
  bool insecure_allow_remote = false;
  std::string log_level = "info";
  std::string device = "cpu";
  std::string dtype = "auto";
  int threads = 0;
  int64_t max_dataset_mb = 256;
  int64_t token_budget = -1;  // The device's default (DefaultTokenBudget).
  std::string activation_checkpointing = "auto";
  int64_t activation_memory_mb = -1;  // -1: from the device's memory.
  double throughput_log_seconds = 30.0;
  std::string ready_file;
  int64_t checkpoint_interval = 100;
  int64_t min_checkpoint_interval = 10;
  int keep_checkpoints = 3;
  int keep_finished_checkpoints = 1;
  double sample_share = 0.5;
  double session_idle_seconds = 1800;
  std::string test_faults;  // Test-only (core/common/test_faults.h).
};

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

bool IsLoopback(absl::string_view address) {
  return absl::StartsWith(address, "127.") ||
         absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]:") ||
         absl::StartsWith(address, "unix:");
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

// The last SIGINT or SIGTERM (0: none yet). main() blocks both in this
// program's threads and Serve waits for them, but threads that libraries
// start before main (OpenBLAS's) may take one: this handler records it
// there instead of the default action killing the process.
std::atomic<int> g_stop_signal{0};

extern "C" void RecordStopSignal(int number) { g_stop_signal.store(number); }

void InstallStopSignalHandlers() {
  struct sigaction action = {};
  action.sa_handler = RecordStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

// Waits for SIGINT or SIGTERM (returns it) or for `failed` (returns 0).
template <typename Failed>
int WaitForStopSignal(Failed failed) {
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

// --dtype: the base's compute dtype (unset: the checkpoint's).
std::optional<torch::ScalarType> ComputeDtype(const std::string& flag) {
  if (flag == "float32") return torch::kFloat32;
  if (flag == "bfloat16") return torch::kBFloat16;
  if (flag == "float64") return torch::kFloat64;
  return std::nullopt;
}

v1::Runtime RuntimeProto(const RuntimeInfo& info) {
  v1::Runtime proto;
  proto.set_torch_version(info.torch_version);
  proto.set_blas(info.blas);
  proto.set_cpu_capability(info.cpu_capability);
  proto.set_intra_op_threads(info.intra_op_threads);
  proto.set_inter_op_threads(info.inter_op_threads);
  proto.set_openmp_wait_policy(info.openmp_wait_policy);
  proto.set_cuda_compiled(info.cuda_compiled);
  proto.set_cuda_runtime_version(info.cuda_runtime_version);
  proto.set_cuda_driver_version(info.cuda_driver_version);
  for (const CudaDeviceInfo& device : info.cuda_devices) {
    v1::CudaDevice* out = proto.add_cuda_devices();
    out->set_index(device.index);
    out->set_name(device.name);
    out->set_compute_capability_major(device.compute_capability_major);
    out->set_compute_capability_minor(device.compute_capability_minor);
    out->set_total_memory_bytes(device.total_memory_bytes);
  }
  proto.set_cuda_note(info.cuda_note);
  return proto;
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

// --activation-checkpointing with the activation memory it plans for:
// --activation-memory-mb, or by default three quarters of what the base's
// weights leave of the device's memory. Logged with the longest row it trains.
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

// What --version prints: the version, then what it runs on.
std::string VersionText() {
  std::string text = absl::StrCat("loraplex-server ", LORAPLEX_VERSION,
                                  "\nmodel families: ", SupportedModelTypes());
  for (const std::string& line : RuntimeLines(RuntimeProto(InspectRuntime()))) {
    absl::StrAppend(&text, "\n", line);
  }
  return text;
}

// --device, with a CUDA device of no index taken as the rank's LOCAL_RANK.
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

// A rank other than 0: no API, store or files; it trains its share of every
// step as rank 0's plans say, until rank 0 stops.
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
  ModelLoadOptions load_options;
  load_options.device = *device;
  load_options.dtype = ComputeDtype(flags.dtype);
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      LlamaModel::Load(model_dir, load_options);
  std::error_code error;
  if (!built_in.empty()) fs::remove_all(built_in, error);
  if (!model.ok()) return fail(model.status());
  std::optional<DistContext> dist;
  absl::StatusOr<RankSetup> setup =
      JoinRanks(env, *device, **model, RankSetup(), dist, logger);
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

absl::Status CheckFlags(const ServerFlags& flags,
                        const TenantAuthenticator& auth) {
  const std::pair<const char*, const std::string*> listeners[] = {
      {"--listen", &flags.listen}, {"--http-listen", &flags.http_listen}};
  for (const auto& [flag, address] : listeners) {
    if (!address->empty() && !IsLoopback(*address) && !auth.requires_tokens() &&
        !flags.insecure_allow_remote) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " ", *address,
          " is not a loopback address and there is no --tokens-file: anyone "
          "who can reach it could use the server. Give --tokens-file, or "
          "--insecure-allow-remote to accept that."));
    }
  }
  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key must be given together");
  }
  return absl::OkStatus();
}

int Serve(const ServerFlags& flags, Logger& logger) {
  auto fail = [&](const absl::Status& status) {
    logger.Error(status.message());
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  };
  absl::StatusOr<DistEnv> env = DistEnvFromProcess();
  if (!env.ok()) return fail(env.status());
  if (!flags.test_faults.empty()) {
    if (absl::Status armed = ConfigureTestFaults(flags.test_faults, env->rank);
        !armed.ok()) {
      return fail(armed);
    }
    logger.Warning("test faults armed: ", flags.test_faults);
  }
  if (env->rank > 0) return FollowRankZero(flags, *env, logger);
  TenantAuthenticator auth = TenantAuthenticator::SingleTenant();
  if (!flags.tokens_file.empty()) {
    absl::StatusOr<TenantAuthenticator> loaded =
        TenantAuthenticator::FromTokensFile(flags.tokens_file);
    if (!loaded.ok()) return fail(loaded.status());
    auth = *std::move(loaded);
  }
  if (absl::Status status = CheckFlags(flags, auth); !status.ok()) {
    return fail(status);
  }
  std::error_code error;
  for (const char* sub : {"datasets", "adapters", "tmp"}) {
    fs::create_directories(fs::path(flags.state_dir) / sub, error);
    if (error) {
      return fail(absl::InternalError(absl::StrCat(
          "cannot create ", flags.state_dir, "/", sub, ": ", error.message())));
    }
  }
  std::string model_dir = flags.model_dir;
  if (model_dir.empty()) {
    absl::StatusOr<std::string> dir = DefaultModelDir(flags.state_dir, logger);
    if (!dir.ok()) return fail(dir.status());
    model_dir = *dir;
  }
  absl::StatusOr<torch::Device> device = RankDevice(flags.device, *env);
  if (!device.ok()) return fail(device.status());
  absl::StatusOr<int> threads = ConfigureThreads(flags.threads);
  if (!threads.ok()) return fail(threads.status());
  const v1::Runtime runtime = RuntimeProto(InspectRuntime());
  for (const std::string& line : RuntimeLines(runtime)) logger.Info(line);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadTokenizer(model_dir);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  ModelLoadOptions load_options;
  load_options.device = *device;
  load_options.dtype = ComputeDtype(flags.dtype);
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      LlamaModel::Load(model_dir, load_options);
  if (!model.ok()) return fail(model.status());
  // Ids past the embedding would fail in the middle of training.
  if ((*tokenizer)->vocab_size() > (*model)->config().vocab_size) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        model_dir, ": the tokenizer has ", (*tokenizer)->vocab_size(),
        " tokens but the model's embedding only ",
        (*model)->config().vocab_size, " rows")));
  }
  absl::StatusOr<CheckpointPolicy> checkpointing =
      ResolveCheckpointing(flags, **model, *device, runtime, logger);
  if (!checkpointing.ok()) return fail(checkpointing.status());
  const int64_t token_budget = ResolveTokenBudget(
      flags.token_budget, **model, *device, runtime, *checkpointing, logger);
  std::optional<DistContext> dist;
  if (env->distributed()) {
    RankSetup mine;
    mine.slots = flags.slots;
    mine.max_rank = flags.max_rank;
    mine.token_budget = token_budget;
    mine.checkpoints = true;
    absl::StatusOr<RankSetup> setup =
        JoinRanks(*env, *device, **model, mine, dist, logger);
    if (!setup.ok()) return fail(setup.status());
  }
  const ModelConfig model_config = (*model)->config();
  const std::string model_name =
      flags.model_name.empty() ? DirectoryName(model_dir) : flags.model_name;
  const std::string export_name =
      ExportedBaseModel(flags.model_name, model_config, model_dir);

  absl::StatusOr<std::unique_ptr<JobStore>> store =
      JobStore::Open(flags.state_dir + "/loraplex.db");
  if (!store.ok()) return fail(store.status());
  // Before anything writes: what an interrupted write left goes, and
  // finished jobs keep only their newest checkpoints.
  absl::StatusOr<StateCleanup> cleaned =
      CleanUpState(flags.state_dir, **store, flags.keep_finished_checkpoints);
  if (!cleaned.ok()) return fail(cleaned.status());
  if (cleaned->orphans > 0 || cleaned->finished_checkpoints > 0) {
    logger.Info("state dir: removed ", cleaned->orphans,
                " leftover(s) of interrupted writes and ",
                cleaned->finished_checkpoints,
                " checkpoint(s) of finished jobs");
  }

  const int slots_per_tenant =
      flags.slots_per_tenant > 0 ? flags.slots_per_tenant : flags.slots;
  DatasetParseOptions parse_options;
  parse_options.vocab_size = model_config.vocab_size;
  // The model's own chat template renders chat lines. One the Jinja subset
  // cannot run fails chat uploads with the reason; other lines still work.
  absl::StatusOr<std::optional<ChatTemplate>> chat_template =
      LoadChatTemplate(model_dir);
  if (!chat_template.ok()) {
    logger.Warning(
        "the model's chat template cannot be used, so chat ",
        "datasets will be refused: ", chat_template.status().message());
    parse_options.chat_template_error = chat_template.status();
  } else if (chat_template->has_value()) {
    logger.Info("chat lines are rendered with ", (*chat_template)->label());
    parse_options.chat_template = &**chat_template;
  } else {
    logger.Info(
        "the model has no chat template: chat lines use loraplex's "
        "built-in format");
  }
  DatasetLoader datasets(flags.state_dir + "/datasets", tokenizer->get(),
                         /*cache_entries=*/4, parse_options);
  JobEventHub hub;
  std::mutex fatal_mu;
  absl::Status fatal;  // Set: the server shuts down (below).
  SchedulerOptions scheduler_options;
  // Set once the trainer exists (jobs finish only after that).
  Trainer* checkpoint_writer = nullptr;
  scheduler_options.on_job_finished = [&](const std::string& job_id) {
    auto prune = [&flags, &logger, job_id] {
      const int removed = KeepNewestCheckpoints(
          absl::StrCat(flags.state_dir, "/checkpoints/", job_id),
          flags.keep_finished_checkpoints);
      if (removed > 0) {
        logger.Debug("job ", job_id, ": removed ", removed,
                     " checkpoint(s) (--keep-finished-checkpoints=",
                     flags.keep_finished_checkpoints, ")");
      }
    };
    // After the job's checkpoints still being written, on the thread that
    // writes (and prunes) them: pruning beside it could miss the newest or
    // leave an older one.
    if (checkpoint_writer != nullptr) {
      checkpoint_writer->AfterQueuedCheckpoints(std::move(prune));
    } else {
      prune();
    }
  };
  scheduler_options.on_store_failure = [&](const absl::Status& status) {
    std::lock_guard<std::mutex> lock(fatal_mu);
    if (fatal.ok()) fatal = status;
  };
  scheduler_options.state_dir = flags.state_dir;
  scheduler_options.slots_per_tenant = slots_per_tenant;
  scheduler_options.throughput_log_seconds = flags.throughput_log_seconds;
  JobScheduler scheduler(store->get(), &datasets, &hub, &logger,
                         scheduler_options);
  TrainerOptions trainer_options;
  trainer_options.pool.capacity = flags.slots;
  trainer_options.pool.max_rank = flags.max_rank;
  trainer_options.pool.device = *device;
  trainer_options.co_batch.token_budget = token_budget;
  trainer_options.co_batch.checkpointing = *checkpointing;
  trainer_options.base_model_name = export_name;
  trainer_options.checkpoint_root =
      absl::StrCat(flags.state_dir, "/checkpoints");
  trainer_options.checkpoint_interval = flags.checkpoint_interval;
  trainer_options.keep_checkpoints = flags.keep_checkpoints;
  trainer_options.sample_share = flags.sample_share;
  trainer_options.tokenizer = tokenizer->get();
  trainer_options.dist = dist ? &*dist : nullptr;
  trainer_options.on_fatal = [&](const absl::Status& status) {
    logger.Error("training stopped: ", status.message(),
                 ". Restart every rank; the jobs resume from their "
                 "checkpoints.");
    scheduler.RefuseCommands(absl::UnavailableError(
        absl::StrCat("training stopped: ", status.message())));
    std::lock_guard<std::mutex> lock(fatal_mu);
    if (fatal.ok()) fatal = status;
  };
  Trainer trainer(*std::move(model), trainer_options,
                  [&scheduler](TrainerReport report) {
                    scheduler.OnTrainerReport(std::move(report));
                  });
  checkpoint_writer = &trainer;
  // Gone before the trainer is.
  absl::Cleanup no_writer = [&checkpoint_writer] {
    checkpoint_writer = nullptr;
  };
  WorkQueue work(2);
  SessionManagerOptions session_options;
  session_options.base_model = export_name;
  session_options.states_dir = absl::StrCat(flags.state_dir, "/session_states");
  session_options.idle_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(flags.session_idle_seconds * 1000));
  {
    std::error_code created;
    std::filesystem::create_directories(session_options.states_dir, created);
    if (created) {
      return fail(absl::InternalError(absl::StrCat("cannot create ",
                                                   session_options.states_dir,
                                                   ": ", created.message())));
    }
  }
  SessionManager sessions(&scheduler, &trainer, store->get(), session_options);

  RequestCounters requests;
  ServiceContext context;
  context.sessions = &sessions;
  context.requests = &requests;
  context.store = store->get();
  context.scheduler = &scheduler;
  context.datasets = &datasets;
  context.auth = &auth;
  context.logger = &logger;
  context.work = &work;
  context.model = model_config;
  context.check_adapter =
      [&model_config](const std::string& dir) -> absl::StatusOr<LoraConfig> {
    LORAPLEX_ASSIGN_OR_RETURN(PeftAdapter adapter,
                              LoadPeftAdapter(dir, model_config));
    return adapter.config;
  };
  context.base_model_name = model_name;
  context.chat_template = parse_options.chat_template;
  context.chat_template_error = parse_options.chat_template_error;
  context.state_dir = flags.state_dir;
  context.device = flags.device;
  context.version = LORAPLEX_VERSION;
  context.runtime = runtime;
  context.limits.max_dataset_bytes = flags.max_dataset_mb << 20;
  context.limits.max_rank = flags.max_rank;
  context.limits.max_row_tokens = MaxRowTokens(*checkpointing, model_config);
  context.limits.min_checkpoint_interval = flags.min_checkpoint_interval;
  context.limits.slot_capacity = flags.slots;
  context.limits.slots_per_tenant = slots_per_tenant;

  DatasetServiceImpl dataset_service(&context);
  JobServiceImpl job_service(&context, &hub);
  AdapterServiceImpl adapter_service(&context);
  ServerInfoServiceImpl info_service(&context);
  SamplingServiceImpl sampling_service(&context);
  SessionServiceImpl session_service(&context);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::InsecureServerCredentials();
  if (!flags.tls_cert.empty()) {
    absl::StatusOr<std::string> key = ReadFile(flags.tls_key);
    if (!key.ok()) return fail(key.status());
    absl::StatusOr<std::string> cert = ReadFile(flags.tls_cert);
    if (!cert.ok()) return fail(cert.status());
    grpc::SslServerCredentialsOptions tls;
    tls.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
    credentials = grpc::SslServerCredentials(tls);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(flags.listen, credentials, &port);
  // Keepalive pings find dead peers of long watch streams; clients may
  // ping as often as every 10 s, also between calls.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10 * 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(context.limits.max_adapter_bytes + (int64_t{1} << 20)));
  builder.RegisterService(&dataset_service);
  builder.RegisterService(&job_service);
  builder.RegisterService(&adapter_service);
  builder.RegisterService(&info_service);
  builder.RegisterService(&sampling_service);
  builder.RegisterService(&session_service);
  {
    std::vector<
        std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    // First: the requests counted are counted with the status sent.
    interceptors.push_back(RefuseUnparsableRequestsInterceptor());
    interceptors.push_back(CountRequestsInterceptor(&requests));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  // Training and scheduling run before the first request can arrive.
  trainer.Start();
  if (absl::Status status = scheduler.Start(&trainer); !status.ok()) {
    trainer.Stop();
    return fail(status);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    trainer.Stop();
    scheduler.Stop();
    return fail(absl::UnavailableError(
        absl::StrCat("cannot listen on ", flags.listen)));
  }
  // Health checks by service name (what Kubernetes' gRPC probes and
  // grpc_health_probe -service send) answer as the whole server does.
  if (grpc::HealthCheckServiceInterface* health =
          server->GetHealthCheckService()) {
    for (const char* name :
         {"loraplex.v1.DatasetService", "loraplex.v1.JobService",
          "loraplex.v1.AdapterService", "loraplex.v1.ServerService",
          "loraplex.v1.SamplingService",
          "loraplex.v1.TrainingSessionService"}) {
      health->SetServingStatus(name, true);
    }
  }
  const std::string host = flags.listen.substr(0, flags.listen.rfind(':'));
  const std::string address = absl::StrCat(host, ":", port);
  // The Tinker REST API, when asked for.
  TinkerApiOptions tinker_options;
  tinker_options.max_wait = std::chrono::seconds(flags.tinker_poll_seconds);
  tinker_options.max_samples_per_tenant = flags.tinker_max_samples;
  TinkerApi tinker(&context, tinker_options);
  std::unique_ptr<HttpListener> http;
  if (!flags.http_listen.empty()) {
    HttpListenerOptions http_options;
    http_options.address = flags.http_listen;
    http_options.tls_cert = flags.tls_cert;
    http_options.tls_key = flags.tls_key;
    http_options.counters = &requests;
    absl::StatusOr<std::unique_ptr<HttpListener>> started =
        HttpListener::Start(http_options, [&](httplib::Server& routes) {
          tinker.Register(routes);
          RegisterMetrics(routes, &context);
        });
    if (!started.ok()) {
      server->Shutdown();
      sessions.Stop();
      trainer.Stop();
      scheduler.Stop();
      return fail(started.status());
    }
    http = *std::move(started);
    const std::string http_host =
        flags.http_listen.substr(0, flags.http_listen.rfind(':'));
    logger.Info("Tinker API on ", flags.tls_cert.empty() ? "http" : "https",
                "://", http_host, ":", http->port(), "/api/v1");
  }
  logger.Info("loraplex-server ", LORAPLEX_VERSION, " serving ", model_name,
              " (", model_config.num_hidden_layers, " layers, hidden ",
              model_config.hidden_size, ") with ", flags.slots, " slots on ",
              address, auth.requires_tokens() ? " (tokens required)" : "",
              flags.tls_cert.empty() ? "" : " (TLS)",
              env->distributed() ? absl::StrCat(", data parallel over ",
                                                env->world_size, " ranks")
                                 : "");
  if (!flags.ready_file.empty()) {
    if (absl::Status status =
            WriteFileAtomically(flags.ready_file, address + "\n");
        !status.ok()) {
      logger.Warning("cannot write the ready file: ", status.message());
    }
  }

  // Until SIGINT/SIGTERM, or the ranks fail.
  const int signal_number = WaitForStopSignal([&] {
    std::lock_guard<std::mutex> lock(fatal_mu);
    return !fatal.ok();
  });
  if (signal_number != 0) {
    logger.Info("received ", signal_number == SIGINT ? "SIGINT" : "SIGTERM",
                ": shutting down");
  }
  // Calls still open after a second (watch streams, idle connections of
  // clients) are cancelled; clients resume watches from their last event.
  // No call is left waiting for the trainer (a pause), and none is taken.
  scheduler.RefuseCommands(
      absl::UnavailableError("the server is shutting down"));
  sessions.Stop();  // No session call is left waiting for its turn.
  tinker.Stop();    // Nor a long poll.
  if (http != nullptr) http->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  logger.Debug("gRPC server stopped");
  // The trainer first, so the scheduler stores everything it reported.
  trainer.Stop();
  scheduler.Stop();
  std::lock_guard<std::mutex> lock(fatal_mu);
  logger.Info(fatal.ok() ? "stopped" : "stopped after a failure");
  return fatal.ok() ? 0 : 1;
}

}  // namespace
}  // namespace loraplex

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
  app.set_version_flag("--version", loraplex::VersionText,
                       "Print the version and what the server runs on "
                       "(LibTorch, BLAS, threads, CUDA devices)");
  app.add_option("--model", flags.model_dir,
                 "Base model directory (config.json + safetensors); default: "
                 "the built-in tiny model, written to the state dir");
  app.add_option("--model-name", flags.model_name,
                 "The base model's name: clients' jobs name it, and exported "
                 "adapters write it as base_model_name_or_path (default: "
                 "the directory's name; exports then write config.json's "
                 "_name_or_path, else the directory's absolute path)");
  app.add_option("--state-dir", flags.state_dir,
                 "Where datasets, adapters and the job database live")
      ->capture_default_str();
  app.add_option("--listen", flags.listen,
                 "Address to serve on (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--http-listen", flags.http_listen,
                 "HOST:PORT of the HTTP listener: the Tinker REST API and "
                 "/metrics (off by default)");
  app.add_option("--tinker-poll-seconds", flags.tinker_poll_seconds,
                 "Longest a Tinker retrieve_future waits for its result "
                 "before answering try_again (the SDK gives up after 45 s)")
      ->check(CLI::Range(1, 40))
      ->capture_default_str();
  app.add_option("--tinker-max-samples", flags.tinker_max_samples,
                 "Tinker samples one key may have queued or running "
                 "(beyond: HTTP 429, which the SDK retries)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--slots", flags.slots, "Adapter slots that train together")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--slots-per-tenant", flags.slots_per_tenant,
                 "Slots one tenant's jobs may hold at once (default: all)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--max-rank", flags.max_rank, "Largest LoRA rank accepted")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--tokens-file", flags.tokens_file,
                 "File of \"<tenant> <token>\" lines; every call then needs "
                 "\"authorization: Bearer <token>\"");
  app.add_option("--tls-cert", flags.tls_cert, "PEM certificate chain for TLS");
  app.add_option("--tls-key", flags.tls_key, "PEM private key for TLS");
  app.add_flag("--insecure-allow-remote", flags.insecure_allow_remote,
               "Allow a non-loopback --listen without --tokens-file");
  app.add_option("--log-level", flags.log_level, "debug, info, warning, error")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}))
      ->capture_default_str();
  app.add_option("--device", flags.device, "cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_option("--dtype", flags.dtype,
                 "Compute dtype of the base model: auto (the checkpoint's; "
                 "float16 computes in float32), float32, bfloat16, or "
                 "float64 (LoRA in float64 too: slow, for checking results "
                 "beyond float32 rounding)")
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float64"}))
      ->capture_default_str();
  app.add_option("--threads", flags.threads,
                 "CPU threads for tensor work (0: one per core)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--max-dataset-mb", flags.max_dataset_mb,
                 "Largest dataset upload in MiB")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--token-budget", flags.token_budget,
                 "Most padded tokens per micro-batch (0: no limit; default: "
                 "2048 on the CPU, on a GPU as many as half its memory "
                 "beside the base's weights holds activations for, up to "
                 "65536)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--activation-checkpointing", flags.activation_checkpointing,
                 "Recompute decoder layers in the backward pass instead of "
                 "keeping their activations: off, all, every:K (layers 0, K, "
                 "2K, ...) or auto (only a micro-batch that would not fit "
                 "the activation memory otherwise, as few layers as fit)")
      ->capture_default_str();
  app.add_option(
         "--activation-memory-mb", flags.activation_memory_mb,
         "MiB one micro-batch's saved activations may take: what auto "
         "checkpointing plans for and what bounds a trained row's "
         "length (default: three quarters of the device's memory beside the "
         "base's weights)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--sample-share", flags.sample_share,
                 "Share of the trainer's time decoding takes while jobs train")
      ->check(CLI::Range(0.05, 0.95))
      ->capture_default_str();
  app.add_option("--session-idle-seconds", flags.session_idle_seconds,
                 "A training session without a call for this long is saved "
                 "(SaveState) and closed, freeing its slot (0: never)")
      ->check(CLI::Range(0.0, 30.0 * 86400))
      ->capture_default_str();
  app.add_option("--throughput-log-seconds", flags.throughput_log_seconds,
                 "Seconds between throughput log lines (0: none)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--checkpoint-interval", flags.checkpoint_interval,
                 "Steps between checkpoints of jobs that do not set "
                 "training.checkpoint_interval (0: only on pause, cancel "
                 "and shutdown)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--min-checkpoint-interval", flags.min_checkpoint_interval,
                 "Smallest training.checkpoint_interval a job may ask for "
                 "(a due job checkpoints every slot)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--keep-checkpoints", flags.keep_checkpoints,
                 "Newest checkpoints kept per job")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--keep-finished-checkpoints", flags.keep_finished_checkpoints,
                 "Newest checkpoints kept once a job has finished (0: none; "
                 "its final adapter is kept either way)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_option("--ready-file", flags.ready_file,
                 "Once serving, write the bound address here");
  // Test-only and so not in --help: makes chosen jobs or ranks fail at
  // chosen points (core/common/test_faults.h).
  app.add_option("--test-faults", flags.test_faults)->group("");
  CLI11_PARSE(app, argc, argv);

  loraplex::Logger logger(*loraplex::ParseLogLevel(flags.log_level));
  return loraplex::Serve(flags, logger);
}
