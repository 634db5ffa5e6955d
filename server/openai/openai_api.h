// The OpenAI API over loraplex's sampler, on the HTTP listener:
//
//   POST /v1/chat/completions   messages rendered with the model's chat
//                               template, then sampled
//   POST /v1/completions        a text or token-id prompt
//   GET  /v1/models             the weights the caller may name as `model`
//   GET  /v1/models/{model}     one of them (a checkpoint too)
//
// `model` names the weights (openai_convert.h: the base model's name,
// adapters/{id}, jobs/{id}, jobs/{id}/checkpoints/{step}, a Tinker sampler
// path). Requests are sampled by the trainer's sampler, co-batched with
// everything else (docs/DESIGN.md §11); `stream: true` answers server-sent
// events as the tokens are drawn, ending with `data: [DONE]`. Keys are
// `Authorization: Bearer <token>` with a --tokens-file token (any key, or
// none, without a tokens file); each tenant has at most
// limits.max_samples_per_tenant sampling requests in flight, these and the
// gRPC API's together (beyond: 429). Errors
// are OpenAI's shape, {"error": {"message", "type", "param", "code"}}.
//
//   OpenAiApi openai(&context, OpenAiApiOptions());
//   openai.Register(http_server);
//   ...
//   openai.Stop();  // ends the open streams
#ifndef LORAPLEX_SERVER_OPENAI_OPENAI_API_H_
#define LORAPLEX_SERVER_OPENAI_OPENAI_API_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/edges/sample_admissions.h"
#include "server/edges/service_context.h"
#include "server/openai/openai_convert.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace loraplex {

struct OpenAiApiOptions {
  // The adapter id behind a tenant's Tinker sampler path
  // ("tinker://…/sampler_weights/…"); may be empty.
  std::function<absl::StatusOr<std::string>(const std::string& tenant,
                                            const std::string& path)>
      tinker_adapter;
  // The tenants' sampling requests in flight, shared with the gRPC
  // sampler (one quota per tenant); null: this API's own, of
  // limits.max_samples_per_tenant.
  std::shared_ptr<SampleAdmissions> admissions;
  // The tenant's Tinker sampler paths, listed by /v1/models; may be empty.
  std::function<std::vector<std::string>(const std::string& tenant)>
      tinker_paths;
};

class OpenAiApi {
 public:
  OpenAiApi(const ServiceContext* context, OpenAiApiOptions options);
  ~OpenAiApi();
  OpenAiApi(const OpenAiApi&) = delete;
  OpenAiApi& operator=(const OpenAiApi&) = delete;

  // Adds the routes under /v1/.
  void Register(httplib::Server& server);
  // Ends the streams still open (their samples stop) and refuses new
  // calls with 503.
  void Stop();

 private:
  void Complete(OpenAiEndpoint endpoint, const httplib::Request& request,
                httplib::Response& response);
  void ListModels(const httplib::Request& request, httplib::Response& response);
  void GetModel(const httplib::Request& request, httplib::Response& response);
  // The models a tenant may name, as /v1/models lists them.
  absl::StatusOr<nlohmann::json> Models(const std::string& tenant) const;
  absl::StatusOr<std::string> TenantOf(const httplib::Request& request) const;

  const ServiceContext* context_;
  OpenAiApiOptions options_;
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> next_id_{1};
  // Requests in flight over all tenants, shared with their callbacks.
  std::shared_ptr<std::atomic<int64_t>> in_flight_ =
      std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_OPENAI_OPENAI_API_H_
