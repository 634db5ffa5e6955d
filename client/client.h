// LoraplexClient: a C++ client of the loraplex gRPC API (package
// loraplex.v1). Every RPC returns absl::Status / absl::StatusOr with the
// server's gRPC code and message; unary calls carry a deadline.
//
//   ClientOptions options;
//   options.address = "127.0.0.1:50051";
//   options.token = "secret";  // Sent as "authorization: Bearer secret".
//   LORAPLEX_ASSIGN_OR_RETURN(auto client, LoraplexClient::Connect(options));
//   LORAPLEX_ASSIGN_OR_RETURN(v1::Dataset dataset,
//                             client->UploadDatasetFile("train.jsonl",
//                             "demo"));
//   v1::CreateJobRequest request;
//   request.set_training_dataset(dataset.name());
//   LORAPLEX_ASSIGN_OR_RETURN(v1::Job job, client->CreateJob(request));
//   LORAPLEX_RETURN_IF_ERROR(client->WatchJob(
//       job.name(), /*after_sequence=*/0, [](const v1::JobEvent& event) {
//         return true;  // Keep watching until the job finishes.
//       }));
//
// Connect() does not contact the server; the first call does. A client is
// safe to use from several threads at once.
#ifndef LORAPLEX_CLIENT_CLIENT_H_
#define LORAPLEX_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "loraplex/v1/adapters.grpc.pb.h"
#include "loraplex/v1/datasets.grpc.pb.h"
#include "loraplex/v1/jobs.grpc.pb.h"
#include "loraplex/v1/sampling.grpc.pb.h"
#include "loraplex/v1/server.grpc.pb.h"
#include "loraplex/v1/sessions.grpc.pb.h"

namespace loraplex {

// What an upload's header carries besides the file: defaults for the
// dataset's chat lines (UploadDatasetHeader); empty: none.
struct DatasetUploadOptions {
  std::string chat_template_kwargs;  // A JSON object of template variables.
  std::string turns;                 // "all" or "last".
};

// Bytes per UploadDataset chunk message after the header.
inline constexpr size_t kUploadChunkBytes = 1 << 20;

struct ClientOptions {
  // "host:port" of loraplex-server.
  std::string address = "127.0.0.1:50051";
  // Bearer token; empty sends no authorization metadata.
  std::string token;
  // PEM file of the CA that signed the server's certificate; empty connects
  // in plaintext.
  std::string tls_ca_file;
  // Deadline of each unary call.
  absl::Duration timeout = absl::Seconds(30);
  // Deadline of a whole dataset upload or adapter export.
  absl::Duration transfer_timeout = absl::Minutes(30);
  // Tries of CreateJob, UploadDataset and AttachAdapter when one ends in
  // UNAVAILABLE or DEADLINE_EXCEEDED: each carries a request_id (one is
  // made when the request has none), so a retry never creates twice.
  int attempts = 3;
  // Wait before the first retry; doubled before each later one.
  absl::Duration retry_backoff = absl::Milliseconds(500);
};

// A fresh random request_id (32 hex digits).
std::string NewRequestId();

// One file ExportAdapter wrote.
struct ExportedFile {
  std::string file_name;  // e.g. "adapter_config.json".
  std::string path;       // out_dir/file_name.
  int64_t size_bytes = 0;
};

// Lets another thread end WatchJob calls, e.g. the other watches of a group
// once one has failed. Cancel() ends every call registered with it (a
// thread blocked waiting for the next event wakes up) and makes later calls
// return CANCELLED at once. Thread-safe; it must outlive the calls.
class WatchCancellation {
 public:
  WatchCancellation() = default;
  WatchCancellation(const WatchCancellation&) = delete;
  WatchCancellation& operator=(const WatchCancellation&) = delete;

  void Cancel();
  bool cancelled() const;

 private:
  friend class LoraplexClient;

  // Adds a live call's context; false (nothing added) once cancelled.
  bool Register(grpc::ClientContext* context);
  void Unregister(grpc::ClientContext* context);

  mutable std::mutex mu_;
  bool cancelled_ = false;
  std::vector<grpc::ClientContext*> contexts_;
};

// The gRPC status as an absl::Status with the same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

class LoraplexClient {
 public:
  // Checks the options and creates the channel (INVALID_ARGUMENT naming
  // the option when one is bad, e.g. an unreadable tls_ca_file).
  static absl::StatusOr<std::unique_ptr<LoraplexClient>> Connect(
      const ClientOptions& options);

  LoraplexClient(const LoraplexClient&) = delete;
  LoraplexClient& operator=(const LoraplexClient&) = delete;
  ~LoraplexClient();

  const ClientOptions& options() const { return options_; }

  // ServerService.
  absl::StatusOr<v1::ServerInfo> GetServerInfo();

  // DatasetService. Uploads send the header, then the bytes in chunks of
  // kUploadChunkBytes; UploadDatasetFile reads the file as it sends.
  absl::StatusOr<v1::Dataset> UploadDatasetFile(
      const std::string& path, const std::string& display_name,
      const DatasetUploadOptions& upload_options = {});
  absl::StatusOr<v1::Dataset> UploadDatasetContents(
      absl::string_view contents, const std::string& display_name,
      const DatasetUploadOptions& upload_options = {});
  absl::StatusOr<v1::Dataset> GetDataset(const std::string& name);
  absl::StatusOr<v1::ListDatasetsResponse> ListDatasets(
      const v1::ListDatasetsRequest& request);
  // Every page of ListDatasets, oldest first.
  absl::StatusOr<std::vector<v1::Dataset>> ListAllDatasets();
  absl::Status DeleteDataset(const std::string& name);
  // A finished job (record, events, checkpoints) / a stored adapter.
  absl::Status DeleteJob(const std::string& name);
  absl::Status DeleteAdapter(const std::string& name);

  // JobService.
  // CreateJob and AttachAdapter set a request_id when the request has none
  // and retry (ClientOptions::attempts).
  absl::StatusOr<v1::Job> CreateJob(const v1::CreateJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(const std::string& name);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(
      const v1::ListJobsRequest& request);
  // Every page of ListJobs with one of `statuses` (empty: all), oldest
  // first.
  absl::StatusOr<std::vector<v1::Job>> ListAllJobs(
      const std::vector<v1::JobStatus>& statuses = {});
  absl::StatusOr<v1::Job> CancelJob(const std::string& name);
  // Returns the job PAUSED once its checkpoint is on disk (a queued job at
  // once), or in the status it finished with first. A running job's pause
  // waits for its current step, within options().timeout.
  absl::StatusOr<v1::Job> PauseJob(const std::string& name);
  // Queues a paused job again; it continues from its latest checkpoint.
  absl::StatusOr<v1::Job> ResumeJob(const std::string& name);
  // The job's checkpoints on disk, oldest first.
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const std::string& name);
  // Streams the job's events after `after_sequence` to `on_event` until the
  // server ends the stream (after the job's final event) or `on_event`
  // returns false. OK in both cases; otherwise the stream's error, or
  // CANCELLED when `cancellation` (optional) is cancelled. No deadline: a
  // job may train for hours.
  absl::Status WatchJob(
      const std::string& name, int64_t after_sequence,
      const std::function<bool(const v1::JobEvent&)>& on_event,
      WatchCancellation* cancellation = nullptr);
  absl::StatusOr<v1::ListJobEventsResponse> ListJobEvents(
      const v1::ListJobEventsRequest& request);
  // Every page of ListJobEvents after `after_sequence`.
  absl::StatusOr<std::vector<v1::JobEvent>> ListAllJobEvents(
      const std::string& name, int64_t after_sequence = 0);

  // AdapterService.
  absl::StatusOr<v1::AttachAdapterResponse> AttachAdapter(
      const v1::AttachAdapterRequest& request);
  absl::StatusOr<v1::RetireAdapterResponse> RetireAdapter(
      const std::string& job);
  // Receives the adapter's files into `out_dir` (created if missing) from
  // the request's source: a job, a stored adapter or a checkpoint. No
  // file is renamed into place until the stream ended OK and every file
  // is complete, so a failed export leaves `out_dir` as it was (and
  // removes it if this call created it). A file name that is empty,
  // contains '/' or "..", or repeats is rejected (INTERNAL), as is a file
  // whose bytes do not match its announced size.
  absl::StatusOr<std::vector<ExportedFile>> ExportAdapter(
      const v1::ExportAdapterRequest& request, const std::string& out_dir);
  absl::StatusOr<v1::Adapter> GetAdapter(const std::string& name);
  absl::StatusOr<v1::ListAdaptersResponse> ListAdapters(
      const v1::ListAdaptersRequest& request);
  // Every page of ListAdapters, oldest first.
  absl::StatusOr<std::vector<v1::Adapter>> ListAllAdapters();
  absl::StatusOr<v1::ListSlotsResponse> ListSlots();

  // Samples and answers the whole response (deadline: transfer_timeout,
  // since decoding shares the trainer with training).
  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& request);
  // StreamSample: `on_token` gets each token as it is drawn (return false
  // to cancel the call: then CANCELLED); the whole response comes last.
  absl::StatusOr<v1::SampleResponse> StreamSample(
      const v1::SampleRequest& request,
      const std::function<bool(const v1::SampledToken&)>& on_token);

  // TrainingSessionService. The calls that run on the trainer
  // (ForwardBackward, OptimStep, SaveWeightsForSampler, CloseSession)
  // have transfer_timeout as their deadline; a call cut short keeps
  // running on the server, and RetrieveResult collects it by seq_id.
  absl::StatusOr<v1::Session> CreateSession(
      const v1::CreateSessionRequest& request);
  absl::StatusOr<v1::Session> GetSession(const std::string& name);
  absl::StatusOr<v1::ListSessionsResponse> ListSessions();
  absl::StatusOr<v1::SessionResult> ForwardBackward(
      const v1::ForwardBackwardRequest& request);
  absl::StatusOr<v1::SessionResult> OptimStep(
      const v1::OptimStepRequest& request);
  absl::StatusOr<v1::SessionResult> SaveWeightsForSampler(
      const v1::SaveWeightsForSamplerRequest& request);
  absl::StatusOr<v1::SessionResult> SaveState(
      const v1::SaveStateRequest& request);
  absl::StatusOr<v1::SessionResult> LoadState(
      const v1::LoadStateRequest& request);
  absl::StatusOr<v1::RetrieveResultResponse> RetrieveResult(
      const v1::RetrieveResultRequest& request);
  absl::StatusOr<v1::Session> CloseSession(const std::string& name);

 private:
  LoraplexClient(ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  // Sets the authorization metadata and a deadline `timeout` from now
  // (none when timeout is infinite).
  void PrepareContext(grpc::ClientContext* context,
                      absl::Duration timeout) const;

  // One unary call with the token and a deadline of `timeout` (default:
  // options_.timeout).
  template <typename Stub, typename Request, typename Response>
  absl::StatusOr<Response> CallUnary(
      Stub* stub,
      grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                   Response*),
      const Request& request,
      std::optional<absl::Duration> timeout = std::nullopt) const;

  // ExportAdapter into the existing `out_dir`.
  absl::StatusOr<std::vector<ExportedFile>> ReceiveExport(
      const v1::ExportAdapterRequest& request, const std::string& out_dir);

  // Fills *chunk with the next bytes and sets *done after the last (or
  // fails).
  using ChunkSource =
      std::function<absl::Status(std::string* chunk, bool* done)>;
  // Sends the header (with the upload's size and SHA-256, which the server
  // checks, and a request_id) and then the chunks of a source `open` gives,
  // a fresh one for each try.
  absl::StatusOr<v1::Dataset> Upload(
      const std::string& display_name, int64_t total_bytes,
      const std::string& sha256, const DatasetUploadOptions& upload_options,
      const std::function<absl::StatusOr<ChunkSource>()>& open);
  absl::StatusOr<v1::Dataset> UploadOnce(const v1::UploadDatasetRequest& header,
                                         const ChunkSource& next_chunk);
  // `call` until it succeeds, fails otherwise than UNAVAILABLE or
  // DEADLINE_EXCEEDED, or options_.attempts are used.
  template <typename Result>
  Result Retrying(const std::function<Result()>& call) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ServerService::Stub> server_stub_;
  std::unique_ptr<v1::DatasetService::Stub> dataset_stub_;
  std::unique_ptr<v1::JobService::Stub> job_stub_;
  std::unique_ptr<v1::AdapterService::Stub> adapter_stub_;
  std::unique_ptr<v1::SamplingService::Stub> sampling_stub_;
  std::unique_ptr<v1::TrainingSessionService::Stub> session_stub_;
};

}  // namespace loraplex

#endif  // LORAPLEX_CLIENT_CLIENT_H_
