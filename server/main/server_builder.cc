// Rank 0's components: built in order, started, stopped (server_builder.h).
#include "server/main/server_builder.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "core/common/atomic_file.h"
#include "core/common/read_file.h"
#include "core/common/status_macros.h"
#include "core/common/test_faults.h"
#include "server/checkpoints/checkpoint_files.h"
#include "server/grpc/request_counting.h"
#include "server/grpc/state_cleanup.h"
#include "server/grpc/unparsable_requests.h"
#include "server/http/metrics.h"
#include "server/main/follower.h"
#include "server/main/stop_signals.h"

namespace loraplex {

namespace fs = std::filesystem;

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
  // Checked before any rank joins the others: a rank that stopped after
  // joining would leave them waiting in a collective.
  CheckpointPolicy parsed;
  if (absl::Status mode =
          ParseCheckpointMode(flags.activation_checkpointing, &parsed);
      !mode.ok()) {
    return fail(mode);
  }
  if (env->rank > 0) return FollowRankZero(flags, *env, logger);
  Server server(flags, *env, logger);
  if (absl::Status built = server.Build(); !built.ok()) return fail(built);
  if (absl::Status started = server.Start(); !started.ok()) {
    return fail(started);
  }
  // Until SIGINT/SIGTERM, or the ranks fail.
  const int signal_number = WaitForStopSignal([&] { return server.failed(); });
  if (signal_number != 0) {
    logger.Info("received ", signal_number == SIGINT ? "SIGINT" : "SIGTERM",
                ": shutting down");
  }
  return server.Stop();
}

Server::Server(const ServerFlags& flags, const DistEnv& env, Logger& logger)
    : flags_(flags),
      env_(env),
      logger_(logger),
      auth_(TenantAuthenticator::SingleTenant()) {}

Server::~Server() = default;

absl::Status Server::Build() {
  LORAPLEX_RETURN_IF_ERROR(LoadTenants());
  LORAPLEX_RETURN_IF_ERROR(CreateStateDirs());
  LORAPLEX_RETURN_IF_ERROR(LoadBase(flags_, env_, logger_, base_));
  LORAPLEX_RETURN_IF_ERROR(OpenStore());
  BuildDatasets();
  BuildScheduler();
  BuildTrainer();
  LORAPLEX_RETURN_IF_ERROR(BuildSessions());
  BuildServiceContext();
  BuildGrpcServices();
  return ConfigureGrpcServer();
}

absl::Status Server::Start() {
  // Training and scheduling run before the first request can arrive.
  trainer_->Start();
  // Sessions that were open take their slots back before queued jobs do.
  absl::Status restored;
  if (absl::Status status = scheduler_->Start(
          trainer_.get(), [&] { restored = sessions_->Restore(); });
      !status.ok() || !restored.ok()) {
    trainer_->Stop();
    return status.ok() ? restored : status;
  }
  LORAPLEX_RETURN_IF_ERROR(StartGrpcServer());
  LORAPLEX_RETURN_IF_ERROR(StartHttpApi());
  AnnounceServing();
  return absl::OkStatus();
}

bool Server::failed() const {
  absl::MutexLock lock(&fatal_mu_);
  return !fatal_.ok();
}

int Server::Stop() {
  // Calls still open after a second (watch streams, idle connections of
  // clients) are cancelled; clients resume watches from their last event.
  // No call is left waiting for the trainer (a pause), and none is taken.
  scheduler_->RefuseCommands(
      absl::UnavailableError("the server is shutting down"));
  sessions_->Stop();  // No session call is left waiting for its turn.
  tinker_->Stop();    // Nor a long poll.
  openai_->Stop();    // Nor a stream.
  if (http_ != nullptr) http_->Stop();
  grpc_server_->Shutdown(std::chrono::system_clock::now() +
                         std::chrono::seconds(1));
  logger_.Debug("gRPC server stopped");
  // The trainer first, so the scheduler stores everything it reported.
  trainer_->Stop();
  // The sessions' last answers, before what they reach goes.
  sessions_->Drain();
  scheduler_->Stop();
  absl::MutexLock lock(&fatal_mu_);
  logger_.Info(fatal_.ok() ? "stopped" : "stopped after a failure");
  return fatal_.ok() ? 0 : 1;
}

absl::Status Server::LoadTenants() {
  if (!flags_.tokens_file.empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(
        auth_, TenantAuthenticator::FromTokensFile(flags_.tokens_file));
  }
  return CheckFlags(flags_, auth_);
}

absl::Status Server::CreateStateDirs() {
  std::error_code error;
  for (const char* sub : {"datasets", "adapters", "tmp"}) {
    fs::create_directories(fs::path(flags_.state_dir) / sub, error);
    if (error) {
      return absl::InternalError(absl::StrCat(
          "cannot create ", flags_.state_dir, "/", sub, ": ", error.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Server::OpenStore() {
  LORAPLEX_ASSIGN_OR_RETURN(store_,
                            JobStore::Open(flags_.state_dir + "/loraplex.db"));
  // Before anything writes: what an interrupted write left goes, and
  // finished jobs keep only their newest checkpoints.
  LORAPLEX_ASSIGN_OR_RETURN(const StateCleanup cleaned,
                            CleanUpState(flags_.state_dir, *store_,
                                         flags_.keep_finished_checkpoints));
  if (cleaned.orphans > 0 || cleaned.finished_checkpoints > 0) {
    logger_.Info("state dir: removed ", cleaned.orphans,
                 " leftover(s) of interrupted writes and ",
                 cleaned.finished_checkpoints,
                 " checkpoint(s) of finished jobs");
  }
  return absl::OkStatus();
}

void Server::BuildDatasets() {
  parse_options_.vocab_size = base_.config.vocab_size;
  // The model's own chat template renders chat lines. One the Jinja subset
  // cannot run fails chat uploads with the reason; other lines still work.
  chat_template_ = LoadChatTemplate(base_.model_dir);
  if (!chat_template_.ok()) {
    logger_.Warning(
        "the model's chat template cannot be used, so chat ",
        "datasets will be refused: ", chat_template_.status().message());
    parse_options_.chat_template_error = chat_template_.status();
  } else if (chat_template_->has_value()) {
    logger_.Info("chat lines are rendered with ", (*chat_template_)->label());
    parse_options_.chat_template = &**chat_template_;
  } else {
    logger_.Info(
        "the model has no chat template: chat lines use loraplex's "
        "built-in format");
  }
  datasets_ = std::make_unique<DatasetLoader>(
      flags_.state_dir + "/datasets", base_.tokenizer.get(),
      /*cache_entries=*/4, parse_options_);
}

void Server::BuildScheduler() {
  SchedulerOptions options;
  options.on_job_finished = [this](const std::string& job_id) {
    // After the job's checkpoints still being written, on the thread that
    // writes (and prunes) them: pruning beside it could miss the newest or
    // leave an older one.
    if (checkpoint_writer_ != nullptr) {
      checkpoint_writer_->AfterQueuedCheckpoints(
          [this, job_id] { PruneFinishedCheckpoints(job_id); });
    } else {
      PruneFinishedCheckpoints(job_id);
    }
  };
  options.on_store_failure = [this](const absl::Status& status) {
    RecordFailure(status);
  };
  options.state_dir = flags_.state_dir;
  options.slots_per_tenant = SlotsPerTenant();
  options.throughput_log_seconds = flags_.throughput_log_seconds;
  scheduler_ = std::make_unique<JobScheduler>(store_.get(), datasets_.get(),
                                              &hub_, &logger_, options);
}

void Server::BuildTrainer() {
  TrainerOptions options;
  options.pool.capacity = flags_.slots;
  options.pool.max_rank = flags_.max_rank;
  options.pool.device = base_.device;
  options.co_batch.token_budget = base_.token_budget;
  options.co_batch.checkpointing = base_.checkpointing;
  options.base_model_name = base_.export_name;
  options.checkpoint_root = absl::StrCat(flags_.state_dir, "/checkpoints");
  options.checkpoint_interval = flags_.checkpoint_interval;
  options.keep_checkpoints = flags_.keep_checkpoints;
  options.sample_share = flags_.sample_share;
  options.session_checkpoint_root =
      absl::StrCat(flags_.state_dir, "/session_checkpoints");
  options.session_checkpoint_interval = flags_.session_checkpoint_interval;
  options.on_session_checkpoint = [this](const std::string& session_id,
                                         int64_t seq_id,
                                         const absl::Status& written) {
    if (written.ok()) {
      logger_.Debug("session ", session_id, ": checkpoint after seq_id ",
                    seq_id);
    } else {
      logger_.Error("session ", session_id, ": checkpoint after seq_id ",
                    seq_id,
                    " failed; a restart continues from the one "
                    "before: ",
                    written.message());
    }
  };
  options.tokenizer = base_.tokenizer.get();
  options.dist = base_.dist ? &*base_.dist : nullptr;
  options.on_fatal = [this](const absl::Status& status) {
    logger_.Error("training stopped: ", status.message(),
                  ". Restart every rank; the jobs resume from their "
                  "checkpoints.");
    scheduler_->RefuseCommands(absl::UnavailableError(
        absl::StrCat("training stopped: ", status.message())));
    RecordFailure(status);
  };
  trainer_ = std::make_unique<Trainer>(
      std::move(base_.model), options,
      [scheduler = scheduler_.get()](TrainerReport report) {
        scheduler->OnTrainerReport(std::move(report));
      });
  checkpoint_writer_ = trainer_.get();
}

absl::Status Server::BuildSessions() {
  work_ = std::make_unique<WorkQueue>(2);
  SessionManagerOptions options;
  options.base_model = base_.export_name;
  options.states_dir = absl::StrCat(flags_.state_dir, "/session_states");
  options.idle_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(flags_.session_idle_seconds * 1000));
  options.checkpoint_root =
      absl::StrCat(flags_.state_dir, "/session_checkpoints");
  options.logger = &logger_;
  std::error_code created;
  fs::create_directories(options.states_dir, created);
  if (created) {
    return absl::InternalError(absl::StrCat(
        "cannot create ", options.states_dir, ": ", created.message()));
  }
  sessions_ = std::make_unique<SessionManager>(scheduler_.get(), trainer_.get(),
                                               store_.get(), options);
  return absl::OkStatus();
}

void Server::BuildServiceContext() {
  context_.sessions = sessions_.get();
  context_.requests = &requests_;
  context_.store = store_.get();
  context_.scheduler = scheduler_.get();
  context_.datasets = datasets_.get();
  context_.auth = &auth_;
  context_.logger = &logger_;
  context_.work = work_.get();
  context_.model = base_.config;
  context_.check_adapter =
      [this](const std::string& dir) -> absl::StatusOr<LoraConfig> {
    LORAPLEX_ASSIGN_OR_RETURN(PeftAdapter adapter,
                              LoadPeftAdapter(dir, base_.config));
    return adapter.config;
  };
  context_.base_model_name = base_.model_name;
  context_.chat_template = parse_options_.chat_template;
  context_.chat_template_error = parse_options_.chat_template_error;
  context_.state_dir = flags_.state_dir;
  context_.device = flags_.device;
  context_.version = LORAPLEX_VERSION;
  context_.runtime = base_.runtime_info;
  context_.limits.max_dataset_bytes = flags_.max_dataset_mb << 20;
  context_.limits.max_rank = flags_.max_rank;
  context_.limits.max_row_tokens =
      MaxRowTokens(base_.checkpointing, base_.config);
  context_.limits.min_checkpoint_interval = flags_.min_checkpoint_interval;
  context_.limits.slot_capacity = flags_.slots;
  context_.limits.slots_per_tenant = SlotsPerTenant();
}

void Server::BuildGrpcServices() {
  dataset_service_ = std::make_unique<DatasetServiceImpl>(&context_);
  job_service_ = std::make_unique<JobServiceImpl>(&context_, &hub_);
  adapter_service_ = std::make_unique<AdapterServiceImpl>(&context_);
  info_service_ = std::make_unique<ServerInfoServiceImpl>(&context_);
  // One in-flight quota per tenant for every edge that samples.
  sample_admissions_ = std::make_shared<SampleAdmissions>(
      context_.limits.max_samples_per_tenant);
  sampling_service_ =
      std::make_unique<SamplingServiceImpl>(&context_, sample_admissions_);
  session_service_ = std::make_unique<SessionServiceImpl>(&context_);
}

absl::Status Server::ConfigureGrpcServer() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::InsecureServerCredentials();
  if (!flags_.tls_cert.empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(std::string key, ReadFile(flags_.tls_key));
    LORAPLEX_ASSIGN_OR_RETURN(std::string cert, ReadFile(flags_.tls_cert));
    grpc::SslServerCredentialsOptions tls;
    tls.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
    credentials = grpc::SslServerCredentials(tls);
  }
  grpc_builder_ = std::make_unique<grpc::ServerBuilder>();
  grpc::ServerBuilder& builder = *grpc_builder_;
  builder.AddListeningPort(flags_.listen, credentials, &grpc_port_);
  // Keepalive pings find dead peers of long watch streams; clients may
  // ping as often as every 10 s, also between calls.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10 * 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(context_.limits.max_adapter_bytes + (int64_t{1} << 20)));
  builder.RegisterService(dataset_service_.get());
  builder.RegisterService(job_service_.get());
  builder.RegisterService(adapter_service_.get());
  builder.RegisterService(info_service_.get());
  builder.RegisterService(sampling_service_.get());
  builder.RegisterService(session_service_.get());
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  // First: the requests counted are counted with the status sent.
  interceptors.push_back(RefuseUnparsableRequestsInterceptor());
  interceptors.push_back(CountRequestsInterceptor(&requests_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  return absl::OkStatus();
}

absl::Status Server::StartGrpcServer() {
  grpc_server_ = grpc_builder_->BuildAndStart();
  if (grpc_server_ == nullptr || grpc_port_ == 0) {
    trainer_->Stop();
    scheduler_->Stop();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", flags_.listen));
  }
  // Health checks by service name (what Kubernetes' gRPC probes and
  // grpc_health_probe -service send) answer as the whole server does.
  if (grpc::HealthCheckServiceInterface* health =
          grpc_server_->GetHealthCheckService()) {
    for (const char* name :
         {"loraplex.v1.DatasetService", "loraplex.v1.JobService",
          "loraplex.v1.AdapterService", "loraplex.v1.ServerService",
          "loraplex.v1.SamplingService",
          "loraplex.v1.TrainingSessionService"}) {
      health->SetServingStatus(name, true);
    }
  }
  const std::string host = flags_.listen.substr(0, flags_.listen.rfind(':'));
  address_ = absl::StrCat(host, ":", grpc_port_);
  return absl::OkStatus();
}

absl::Status Server::StartHttpApi() {
  // The Tinker REST API, when asked for.
  TinkerApiOptions tinker_options;
  tinker_options.max_wait = std::chrono::seconds(flags_.tinker_poll_seconds);
  tinker_options.max_samples_per_tenant = flags_.tinker_max_samples;
  tinker_ = std::make_unique<TinkerApi>(&context_, tinker_options);
  // The OpenAI API; `model` may name a Tinker sampler's weights.
  OpenAiApiOptions openai_options;
  openai_options.admissions = sample_admissions_;
  openai_options.tinker_adapter = [this](const std::string& tenant,
                                         const std::string& path) {
    return tinker_->SamplerWeightsAdapter(tenant, path);
  };
  openai_options.tinker_paths = [this](const std::string& tenant) {
    return tinker_->SamplerWeightsPaths(tenant);
  };
  openai_ = std::make_unique<OpenAiApi>(&context_, openai_options);
  if (flags_.http_listen.empty()) return absl::OkStatus();
  HttpListenerOptions http_options;
  http_options.address = flags_.http_listen;
  http_options.tls_cert = flags_.tls_cert;
  http_options.tls_key = flags_.tls_key;
  http_options.counters = &requests_;
  absl::StatusOr<std::unique_ptr<HttpListener>> started =
      HttpListener::Start(http_options, [this](httplib::Server& routes) {
        tinker_->Register(routes);
        openai_->Register(routes);
        RegisterMetrics(routes, &context_);
      });
  if (!started.ok()) {
    grpc_server_->Shutdown();
    sessions_->Stop();
    trainer_->Stop();
    scheduler_->Stop();
    return started.status();
  }
  http_ = *std::move(started);
  const std::string http_host =
      flags_.http_listen.substr(0, flags_.http_listen.rfind(':'));
  const std::string root =
      absl::StrCat(flags_.tls_cert.empty() ? "http" : "https", "://", http_host,
                   ":", http_->port());
  logger_.Info("Tinker API on ", root, "/api/v1");
  logger_.Info("OpenAI API on ", root, "/v1");
  return absl::OkStatus();
}

void Server::AnnounceServing() {
  logger_.Info(
      "loraplex-server ", LORAPLEX_VERSION, " serving ", base_.model_name, " (",
      base_.config.num_hidden_layers, " layers, hidden ",
      base_.config.hidden_size, ") with ", flags_.slots, " slots on ", address_,
      auth_.requires_tokens() ? " (tokens required)" : "",
      flags_.tls_cert.empty() ? "" : " (TLS)",
      env_.distributed()
          ? absl::StrCat(", data parallel over ", env_.world_size, " ranks")
          : "");
  if (!flags_.ready_file.empty()) {
    if (absl::Status status =
            WriteFileAtomically(flags_.ready_file, address_ + "\n");
        !status.ok()) {
      logger_.Warning("cannot write the ready file: ", status.message());
    }
  }
}

int Server::SlotsPerTenant() const {
  return flags_.slots_per_tenant > 0 ? flags_.slots_per_tenant : flags_.slots;
}

void Server::PruneFinishedCheckpoints(const std::string& job_id) {
  const int removed = KeepNewestCheckpoints(
      absl::StrCat(flags_.state_dir, "/checkpoints/", job_id),
      flags_.keep_finished_checkpoints);
  if (removed > 0) {
    logger_.Debug("job ", job_id, ": removed ", removed,
                  " checkpoint(s) (--keep-finished-checkpoints=",
                  flags_.keep_finished_checkpoints, ")");
  }
}

void Server::RecordFailure(const absl::Status& status) {
  absl::MutexLock lock(&fatal_mu_);
  if (fatal_.ok()) fatal_ = status;
}

}  // namespace loraplex
