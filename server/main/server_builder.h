// Rank 0 of loraplex-server (or its only process): builds every component
// from the flags in the order each needs the ones before it, starts them,
// and stops them in the order that lets calls, sessions and jobs end
// cleanly. Serve is the whole life of the program after parsing its flags:
//
//   int main(...) { ... return Serve(flags, logger); }  // The exit code.
//
// which for rank 0 is
//
//   Server server(flags, env, logger);
//   LORAPLEX_RETURN_IF_ERROR(server.Build());  // Nothing runs yet.
//   LORAPLEX_RETURN_IF_ERROR(server.Start());  // Serving.
//   WaitForStopSignal([&] { return server.failed(); });
//   return server.Stop();
//
// Ranks other than 0 only train (follower.h). The members are declared in
// the order they are built, so that whatever Build or Start left behind on
// a failure is destroyed in reverse.
#ifndef LORAPLEX_SERVER_MAIN_SERVER_BUILDER_H_
#define LORAPLEX_SERVER_MAIN_SERVER_BUILDER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/chat/chat_template.h"
#include "core/data/dataset.h"
#include "core/dist/dist_env.h"
#include "server/common/logger.h"
#include "server/common/request_counters.h"
#include "server/common/work_queue.h"
#include "server/grpc/adapter_service.h"
#include "server/edges/tenant_auth.h"
#include "server/grpc/dataset_service.h"
#include "server/grpc/job_service.h"
#include "server/grpc/sampling_service.h"
#include "server/grpc/server_info_service.h"
#include "server/grpc/unary_calls.h"
#include "server/http/http_listener.h"
#include "server/jobs/job_data.h"
#include "server/jobs/job_event_hub.h"
#include "server/jobs/job_scheduler.h"
#include "server/main/base_loading.h"
#include "server/main/server_flags.h"
#include "server/openai/openai_api.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_service.h"
#include "server/store/job_store.h"
#include "server/tinker/tinker_api.h"
#include "server/trainer/trainer.h"

namespace loraplex {

// Runs loraplex-server with parsed flags until SIGINT or SIGTERM (or, on
// rank 0, until the store or the ranks fail). Returns the exit code: 0 after
// a clean stop, 2 when it could not start for an INVALID_ARGUMENT reason
// (a flag, a file), 1 otherwise.
int Serve(const ServerFlags& flags, Logger& logger);

class Server {
 public:
  // `flags`, `env` and `logger` must outlive the server.
  Server(const ServerFlags& flags, const DistEnv& env, Logger& logger);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Builds everything in order: tenants, state dirs, the base model, the
  // store (cleaned up), datasets, scheduler, trainer, session manager,
  // service context, gRPC services and the gRPC server's settings. Nothing
  // runs yet. Call once.
  absl::Status Build();
  // After Build: starts the trainer and the scheduler, then the gRPC server,
  // the Tinker API and the HTTP listener; then logs that it serves and
  // writes --ready-file. On a failure it stops what it had started.
  absl::Status Start();
  // Whether the store or the ranks failed: the server should stop.
  bool failed() const;
  // After Start: stops everything in order. Returns the exit code: 0, or 1
  // after a failure.
  int Stop();

 private:
  // Sets the trainer pointer of the job-finished callback to null when
  // destroyed; declared right after trainer_, so it is destroyed just
  // before the trainer.
  struct ForgetCheckpointWriter {
    Trainer** writer;
    ~ForgetCheckpointWriter() { *writer = nullptr; }
  };

  // Build's phases, in order.
  absl::Status LoadTenants();
  absl::Status CreateStateDirs();
  absl::Status OpenStore();
  void BuildDatasets();
  void BuildScheduler();
  void BuildTrainer();
  absl::Status BuildSessions();
  void BuildServiceContext();
  void BuildGrpcServices();
  absl::Status ConfigureGrpcServer();
  // Start's phases, after the trainer and the scheduler.
  absl::Status StartGrpcServer();
  absl::Status StartHttpApi();
  void AnnounceServing();

  // --slots-per-tenant, or all the slots.
  int SlotsPerTenant() const;
  // Keeps only the newest --keep-finished-checkpoints of a finished job.
  void PruneFinishedCheckpoints(const std::string& job_id);
  // The first failure is kept: it is why the server stops.
  void RecordFailure(const absl::Status& status);

  const ServerFlags& flags_;
  const DistEnv& env_;
  Logger& logger_;

  TenantAuthenticator auth_;
  LoadedBase base_;
  std::unique_ptr<JobStore> store_;
  // What chat lines are rendered with (pointed to by parse_options_).
  absl::StatusOr<std::optional<ChatTemplate>> chat_template_;
  DatasetParseOptions parse_options_;
  std::unique_ptr<DatasetLoader> datasets_;
  JobEventHub hub_;
  mutable absl::Mutex fatal_mu_;
  absl::Status fatal_ ABSL_GUARDED_BY(fatal_mu_);  // Set: the server stops.
  // Null until the trainer exists (jobs finish only after that).
  Trainer* checkpoint_writer_ = nullptr;
  std::unique_ptr<JobScheduler> scheduler_;
  std::unique_ptr<Trainer> trainer_;
  ForgetCheckpointWriter forget_checkpoint_writer_{&checkpoint_writer_};
  std::unique_ptr<WorkQueue> work_;
  std::unique_ptr<SessionManager> sessions_;
  RequestCounters requests_;
  ServiceContext context_;
  std::unique_ptr<DatasetServiceImpl> dataset_service_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<AdapterServiceImpl> adapter_service_;
  std::unique_ptr<ServerInfoServiceImpl> info_service_;
  std::unique_ptr<SamplingServiceImpl> sampling_service_;
  std::unique_ptr<SessionServiceImpl> session_service_;
  // Made after the reflection plugin is registered, which it picks up.
  std::unique_ptr<grpc::ServerBuilder> grpc_builder_;
  int grpc_port_ = 0;  // The bound port, once the gRPC server has started.
  std::unique_ptr<grpc::Server> grpc_server_;
  std::string address_;  // HOST:PORT the gRPC server serves on.
  std::unique_ptr<TinkerApi> tinker_;
  std::unique_ptr<OpenAiApi> openai_;
  std::shared_ptr<SampleAdmissions> sample_admissions_;
  std::unique_ptr<HttpListener> http_;  // Null without --http-listen.
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_MAIN_SERVER_BUILDER_H_
