// The Tinker REST API (`/api/v1/...`, as the tinker==0.38.0 SDK speaks it;
// shared/tinker-api.md) over loraplex's training sessions and sampler.
//
//   TinkerApi tinker(&context, TinkerApiOptions());
//   tinker.Register(http_server);   // an httplib::Server
//   ...
//   tinker.Stop();                  // answers the long polls still waiting
//
// Tinker names, and what each one is here:
//   - a session (create_session) groups a client's models and samplers;
//   - a model "{session}:train:{n}" is one loraplex training session (a
//     slot), created by create_model or by load_weights from a saved state;
//   - a sampler "{session}:sample:{n}" samples the base model or a saved
//     adapter;
//   - "tinker://{model}/weights/{name}" is a saved state (SaveState) and
//     "tinker://{model}/sampler_weights/{name}" a saved adapter.
// Calls that the SDK treats as futures answer {"request_id"} at once and
// finish through retrieve_future, which waits at most max_wait and then
// answers "try_again"; their results are kept in a ResultHub
// (server/results/result_hub.h) keyed by (tenant, request number), and in
// the store once finished, for result_ttl. Handlers convert each call to a
// native request at the edge; the trainer is never waited on by them. The
// names above and the finished futures are kept in the store, and the
// models' training sessions survive a restart (session_manager.h): a client
// retrying through a restart finds its sessions, models, samplers and
// tinker:// paths, and the answers of the calls that had finished. API keys
// (`X-API-Key`) are the tokens of --tokens-file. Thread-safe.
#ifndef LORAPLEX_SERVER_TINKER_TINKER_API_H_
#define LORAPLEX_SERVER_TINKER_TINKER_API_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/lora/lora_config.h"
#include "core/optim/optimizer_config.h"
#include "nlohmann/json.hpp"
#include "server/common/work_queue.h"
#include "server/edges/service_context.h"
#include "server/results/result_hub.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace loraplex {

struct TinkerApiOptions {
  // Longest retrieve_future wait (the SDK's own timeout is 45 s).
  std::chrono::milliseconds max_wait{30000};
  // A finished future's result is kept this long for retrieve_future.
  std::chrono::milliseconds result_ttl{std::chrono::minutes(30)};
  // ... and this long once retrieved (a client whose answer was lost on
  // the way asks again).
  std::chrono::milliseconds retrieved_ttl{std::chrono::minutes(2)};
  // Samples a tenant may have queued or running (beyond: HTTP 429, which
  // the SDK retries).
  int64_t max_samples_per_tenant = 1024;
};

class TinkerApi {
 public:
  TinkerApi(const ServiceContext* context, TinkerApiOptions options);
  ~TinkerApi();
  TinkerApi(const TinkerApi&) = delete;
  TinkerApi& operator=(const TinkerApi&) = delete;

  // Adds the routes under /api/v1/.
  void Register(httplib::Server& server);
  // Answers the retrieve_future calls waiting and refuses new ones.
  void Stop();

  // The adapter a tenant saved at a sampler path
  // ("tinker://…/sampler_weights/…"), for the OpenAI API's `model`;
  // NOT_FOUND when the tenant has none there.
  absl::StatusOr<std::string> SamplerWeightsAdapter(
      const std::string& tenant, const std::string& path) const;
  // The tenant's sampler paths.
  std::vector<std::string> SamplerWeightsPaths(const std::string& tenant) const;

 private:
  // A call's result: a body with its content type, or an error.
  struct Outcome {
    absl::Status status;
    std::string body;
    std::string content_type;
  };
  struct Model {
    std::string tenant;
    std::string session;  // The Tinker session.
    std::string native_id;
    LoraConfig lora;
    OptimizerConfig optimizer;
  };
  struct Sampler {
    std::string tenant;
    std::string adapter_id;  // Empty: the base model.
    std::string model_path;  // The tinker:// path it was made from, if any.
  };
  struct SavedPath {
    std::string tenant;
    std::string id;  // A session state's or an adapter's.
  };

  using Handler = absl::StatusOr<std::string> (TinkerApi::*)(
      const std::string& tenant, const httplib::Request& request);

  // Runs `handler` for an authenticated call: a JSON body (its answer) or
  // an error as {"error": ...} with the HTTP status of its code.
  void Serve(const httplib::Request& request, httplib::Response& response,
             Handler handler);

  absl::StatusOr<std::string> CreateSession(const std::string& tenant,
                                            const httplib::Request& request);
  absl::StatusOr<std::string> Heartbeat(const std::string& tenant,
                                        const httplib::Request& request);
  absl::StatusOr<std::string> FinishSession(const std::string& tenant,
                                            const httplib::Request& request);
  absl::StatusOr<std::string> CreateModel(const std::string& tenant,
                                          const httplib::Request& request);
  absl::StatusOr<std::string> GetInfo(const std::string& tenant,
                                      const httplib::Request& request);
  absl::StatusOr<std::string> UnloadModel(const std::string& tenant,
                                          const httplib::Request& request);
  absl::StatusOr<std::string> ForwardBackward(const std::string& tenant,
                                              const httplib::Request& request);
  absl::StatusOr<std::string> OptimStep(const std::string& tenant,
                                        const httplib::Request& request);
  absl::StatusOr<std::string> SaveWeights(const std::string& tenant,
                                          const httplib::Request& request);
  absl::StatusOr<std::string> SaveWeightsForSampler(
      const std::string& tenant, const httplib::Request& request);
  absl::StatusOr<std::string> LoadWeights(const std::string& tenant,
                                          const httplib::Request& request);
  absl::StatusOr<std::string> CreateSamplingSession(
      const std::string& tenant, const httplib::Request& request);
  absl::StatusOr<std::string> GetSampler(const std::string& tenant,
                                         const httplib::Request& request);
  absl::StatusOr<std::string> ASample(const std::string& tenant,
                                      const httplib::Request& request);
  absl::StatusOr<std::string> Capabilities(const std::string& tenant,
                                           const httplib::Request& request);
  void RetrieveFuture(const httplib::Request& request,
                      httplib::Response& response);

  // The session and id of the model a create_model or create-via-load
  // body names: NOT_FOUND for another tenant's or an unknown session,
  // INVALID_ARGUMENT for a model_seq_id in use.
  struct NewModel {
    std::string session;
    std::string id;
  };
  // Reserves the id until the model opens (OpenModel).
  absl::StatusOr<NewModel> NewModelOf(const std::string& tenant,
                                      const nlohmann::json& body);
  // The caller's tenant, from its X-API-Key header.
  absl::StatusOr<std::string> TenantOf(const httplib::Request& request) const;
  // NOT_FOUND unless `session` is an open Tinker session of `tenant`.
  absl::Status CheckSession(const std::string& tenant,
                            const std::string& session) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Sampler> FindSampler(const std::string& tenant,
                                      const std::string& id) const;
  // The id `path` names in `saved` for `tenant`; NOT_FOUND starting with
  // `unknown` otherwise.
  absl::StatusOr<std::string> SavedId(
      const std::map<std::string, SavedPath>& saved, const std::string& tenant,
      const std::string& path, absl::string_view unknown) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads back the names and the finished futures the store keeps.
  void LoadStored();
  // Keeps `name` (of `kind`: "session", "model", "sampler", "weights",
  // "sampler_weights") in the store, or forgets it; a failed write is
  // logged (the name then does not survive a restart).
  void Remember(const std::string& name, const std::string& kind,
                const std::string& tenant, nlohmann::json value);
  void Forget(const std::string& name);
  // A new pending future of `tenant`'s.
  ResultKey NewFuture(const std::string& tenant);
  // Its request_id: "req-{seq}".
  static std::string RequestId(const ResultKey& future);
  void Finish(const ResultKey& future, Outcome outcome);
  // The model `model_id` of `tenant` (NOT_FOUND otherwise).
  absl::StatusOr<Model> FindModel(const std::string& tenant,
                                  const std::string& model_id) const;
  // Submits `native` as operation `seq_id` of the model and answers a
  // future that `result` turns into the call's answer.
  absl::StatusOr<std::string> SubmitToModel(
      const std::string& tenant, const std::string& model_id, int64_t seq_id,
      SessionRequest native,
      std::function<absl::StatusOr<Outcome>(const SessionResult&)> result);
  // Opens a loraplex session for the Tinker model `model_id` of `session`
  // and answers a future with `answer` once it is open.
  std::string OpenModel(const std::string& tenant, const std::string& session,
                        const std::string& model_id, SessionSpec spec,
                        nlohmann::json answer);
  std::string NewSampler(const std::string& tenant, const std::string& id,
                         Sampler sampler);

  const ServiceContext* context_;
  TinkerApiOptions options_;

  ResultHub<Outcome> futures_;
  // The next future's number: from the clock at start, so that request ids
  // given out before a restart are not given out again.
  std::atomic<int64_t> next_future_;
  mutable absl::Mutex mu_;
  // Tinker session -> its tenant.
  std::map<std::string, std::string> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Model> models_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Sampler> samplers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, SavedPath> states_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, SavedPath> sampler_weights_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> samples_in_flight_ ABSL_GUARDED_BY(mu_);
  // Finished futures go to the store here, in order, and then to futures_
  // (Finish may run on the trainer's thread). Last: drained first.
  WorkQueue result_writer_{1};
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TINKER_TINKER_API_H_
