#include "server/tinker/tinker_api.h"

#include <httplib.h>

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/common/json_parse.h"
#include "core/common/resource_names.h"
#include "core/common/status_macros.h"
#include "core/optim/config_json.h"
#include "core/runtime/exception_message.h"
#include "server/edges/sampling_request.h"
#include "server/http/http_listener.h"
#include "server/jobs/resource_id.h"
#include "server/sessions/session_requests.h"
#include "server/tinker/tinker_convert.h"

namespace loraplex {
namespace {

constexpr char kJson[] = "application/json";
constexpr char kProtobuf[] = "application/x-protobuf";

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

// An error answer: {"error", "code"} with the HTTP status of its code.
void Refuse(const absl::Status& status, httplib::Response& response) {
  response.status = HttpStatusOf(status.code());
  response.set_content(
      nlohmann::json{{"error", std::string(status.message())},
                     {"code", absl::StatusCodeToString(status.code())}}
          .dump(),
      kJson);
}

// A failed future as the SDK reads it (RequestFailedResponse): a caller's
// mistake is "user", anything else "server".
std::string FailedBody(const absl::Status& status) {
  const bool user = status.code() == absl::StatusCode::kInvalidArgument ||
                    status.code() == absl::StatusCode::kFailedPrecondition ||
                    status.code() == absl::StatusCode::kNotFound ||
                    status.code() == absl::StatusCode::kOutOfRange;
  nlohmann::json body = {{"error", std::string(status.message())},
                         {"category", user ? "user" : "server"}};
  return body.dump();
}

absl::StatusOr<nlohmann::json> JsonBody(const httplib::Request& request) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json body,
                            ParseUntrustedJson(request.body, "request body"));
  if (!body.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request body must be a JSON object, got ", DescribeJson(body)));
  }
  return body;
}

absl::StatusOr<std::string> StringField(const nlohmann::json& body,
                                        const char* key) {
  auto it = body.find(key);
  if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " is required (a non-empty string)"));
  }
  return it->get<std::string>();
}

absl::StatusOr<int64_t> IntegerField(const nlohmann::json& body,
                                     const char* key) {
  auto it = body.find(key);
  if (it == body.end() || !it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " is required (an integer)"));
  }
  return it->get<int64_t>();
}

std::string FutureAnswer(const std::string& request_id) {
  return nlohmann::json{{"request_id", request_id}}.dump();
}

// The checkpoint name of a save: Tinker allows what makes a path segment.
absl::Status CheckCheckpointName(const std::string& name) {
  LORAPLEX_RETURN_IF_ERROR(CheckDisplayName(name, "path"));
  if (name.empty() || absl::StrContains(name, "/")) {
    return absl::InvalidArgumentError(
        "path must be a non-empty checkpoint name without '/'");
  }
  return absl::OkStatus();
}

}  // namespace

TinkerApi::TinkerApi(const ServiceContext* context, TinkerApiOptions options)
    : context_(context),
      options_(options),
      futures_(ResultHubOptions{0, options.result_ttl, options.retrieved_ttl}),
      next_future_(absl::ToUnixMicros(absl::Now())) {
  LoadStored();
}

void TinkerApi::LoadStored() {
  JobStore* store = context_->store;
  if (store == nullptr) return;
  auto warn = [&](const absl::Status& status) {
    if (context_->logger != nullptr) {
      context_->logger->Warning("Tinker API: reading its names back: ",
                                status.message());
    }
  };
  absl::StatusOr<std::vector<TinkerNameRecord>> names =
      store->ListTinkerNames();
  if (!names.ok()) {
    warn(names.status());
    names = std::vector<TinkerNameRecord>();
  }
  {
    absl::MutexLock lock(&mu_);
    for (const TinkerNameRecord& name : *names) {
      const nlohmann::json& value = name.value;
      if (name.kind == "session") {
        sessions_[name.name] = name.tenant;
      } else if (name.kind == "model") {
        absl::StatusOr<LoraConfig> lora =
            LoraConfigFromJson(value.value("lora", nlohmann::json()));
        absl::StatusOr<OptimizerConfig> optimizer =
            OptimizerConfigFromJson(value.value("optimizer", nlohmann::json()));
        if (!lora.ok() || !optimizer.ok()) {
          warn(absl::DataLossError(
              absl::StrCat("model ", name.name, " does not read")));
          continue;
        }
        models_[name.name] =
            Model{name.tenant, value.value("session", ""),
                  value.value("native_id", ""), *lora, *optimizer};
      } else if (name.kind == "sampler") {
        samplers_[name.name] =
            Sampler{name.tenant, value.value("adapter_id", ""),
                    value.value("model_path", "")};
      } else if (name.kind == "weights") {
        states_[name.name] = SavedPath{name.tenant, value.value("id", "")};
      } else if (name.kind == "sampler_weights") {
        sampler_weights_[name.name] =
            SavedPath{name.tenant, value.value("id", "")};
      }
    }
  }
  // Finished futures still within their time.
  const int64_t since = absl::ToUnixMillis(absl::Now()) -
                        static_cast<int64_t>(options_.result_ttl.count());
  store->DeleteResultsBefore(since).IgnoreError();  // Tried again next time.
  absl::StatusOr<std::vector<StoredResultRecord>> results =
      store->ListResults(since);
  if (!results.ok()) {
    warn(results.status());
    return;
  }
  for (StoredResultRecord& result : *results) {
    futures_.Put(
        {result.owner, result.seq},
        Outcome{absl::Status(static_cast<absl::StatusCode>(result.code),
                             result.message),
                std::move(result.body), std::move(result.content_type)});
  }
}

void TinkerApi::Remember(const std::string& name, const std::string& kind,
                         const std::string& tenant, nlohmann::json value) {
  if (context_->store == nullptr) return;
  absl::Status stored =
      context_->store->PutTinkerName({name, kind, tenant, std::move(value)});
  if (!stored.ok() && context_->logger != nullptr) {
    context_->logger->Error(
        "Tinker API: storing ", kind, " ", name,
        " failed (it will not resolve after a restart): ", stored.message());
  }
}

void TinkerApi::Forget(const std::string& name) {
  if (context_->store == nullptr) return;
  absl::Status erased = context_->store->DeleteTinkerName(name);
  if (!erased.ok() && context_->logger != nullptr) {
    context_->logger->Error("Tinker API: forgetting ", name,
                            " failed: ", erased.message());
  }
}

TinkerApi::~TinkerApi() { Stop(); }

void TinkerApi::Stop() { futures_.Stop(); }

void TinkerApi::Register(httplib::Server& server) {
  struct Route {
    const char* path;
    Handler handler;
  };
  const Route posts[] = {
      {"/api/v1/create_session", &TinkerApi::CreateSession},
      {"/api/v1/session_heartbeat", &TinkerApi::Heartbeat},
      {R"(/api/v1/sessions/([^/]+)/finish)", &TinkerApi::FinishSession},
      {"/api/v1/create_model", &TinkerApi::CreateModel},
      {"/api/v1/get_info", &TinkerApi::GetInfo},
      {"/api/v1/unload_model", &TinkerApi::UnloadModel},
      {"/api/v1/forward_backward", &TinkerApi::ForwardBackward},
      {"/api/v1/optim_step", &TinkerApi::OptimStep},
      {"/api/v1/save_weights", &TinkerApi::SaveWeights},
      {"/api/v1/save_weights_for_sampler", &TinkerApi::SaveWeightsForSampler},
      {"/api/v1/load_weights", &TinkerApi::LoadWeights},
      {"/api/v1/create_sampling_session", &TinkerApi::CreateSamplingSession},
      {"/api/v1/asample", &TinkerApi::ASample},
  };
  for (const Route& route : posts) {
    Handler handler = route.handler;
    server.Post(route.path, [this, handler](const httplib::Request& request,
                                            httplib::Response& response) {
      Serve(request, response, handler);
    });
  }
  server.Get(
      R"(/api/v1/samplers/([^/]+))",
      [this](const httplib::Request& request, httplib::Response& response) {
        Serve(request, response, &TinkerApi::GetSampler);
      });
  server.Get(
      "/api/v1/get_server_capabilities",
      [this](const httplib::Request& request, httplib::Response& response) {
        Serve(request, response, &TinkerApi::Capabilities);
      });
  server.Post("/api/v1/retrieve_future", [this](const httplib::Request& request,
                                                httplib::Response& response) {
    RetrieveFuture(request, response);
  });
  // Bootstrap and housekeeping: every flag of the client config has a
  // default, and telemetry is accepted and dropped.
  server.Post("/api/v1/client/config",
              [](const httplib::Request&, httplib::Response& response) {
                response.set_content("{}", kJson);
              });
  server.Post("/api/v1/client/dynamic_config", [](const httplib::Request&,
                                                  httplib::Response& response) {
    response.set_content(
        R"({"refresh_interval_sec":300,"sample_cancel_enabled":false})", kJson);
  });
  server.Post("/api/v1/telemetry",
              [](const httplib::Request&, httplib::Response& response) {
                response.set_content(R"({"status":"accepted"})", kJson);
              });
  server.Get("/api/v1/healthz",
             [](const httplib::Request&, httplib::Response& response) {
               response.set_content(R"({"status":"ok"})", kJson);
             });
}

void TinkerApi::Serve(const httplib::Request& request,
                      httplib::Response& response, Handler handler) {
  absl::StatusOr<std::string> answer = [&]() -> absl::StatusOr<std::string> {
    LORAPLEX_ASSIGN_OR_RETURN(std::string tenant, TenantOf(request));
    try {
      return (this->*handler)(tenant, request);
    } catch (const nlohmann::json::exception& error) {
      // A field of the wrong type, read with json::value().
      return absl::InvalidArgumentError(absl::StrCat(
          "the request body has a field of the wrong type: ", error.what()));
    } catch (const std::exception& error) {
      return absl::InternalError(ExceptionMessage(error));
    }
  }();
  if (answer.ok()) {
    response.set_content(*answer, kJson);
    return;
  }
  Refuse(answer.status(), response);
}

absl::StatusOr<std::string> TinkerApi::TenantOf(
    const httplib::Request& request) const {
  return context_->auth->AuthenticateApiKey(ApiKeyHeader(request));
}

ResultKey TinkerApi::NewFuture(const std::string& tenant) {
  const ResultKey future{tenant, next_future_.fetch_add(1)};
  futures_.Expect(future);
  return future;
}

std::string TinkerApi::RequestId(const ResultKey& future) {
  return absl::StrCat("req-", future.seq);
}

void TinkerApi::Finish(const ResultKey& future, Outcome outcome) {
  result_writer_.Post([this, future, outcome = std::move(outcome)]() mutable {
    if (context_->store != nullptr) {
      StoredResultRecord record;
      record.owner = future.owner;
      record.seq = future.seq;
      record.code = static_cast<int>(outcome.status.code());
      record.message = std::string(outcome.status.message());
      record.body = outcome.body;
      record.content_type = outcome.content_type;
      record.time_ms = absl::ToUnixMillis(absl::Now());
      absl::Status stored = context_->store->PutResult(record);
      if (!stored.ok() && context_->logger != nullptr) {
        context_->logger->Error(
            "Tinker API: storing the result of ", RequestId(future),
            " failed (a restart forgets it): ", stored.message());
      }
    }
    futures_.Put(future, std::move(outcome));
  });
}

void TinkerApi::RetrieveFuture(const httplib::Request& request,
                               httplib::Response& response) {
  auto fail = [&](const absl::Status& status) { Refuse(status, response); };
  absl::StatusOr<std::string> tenant = TenantOf(request);
  if (!tenant.ok()) return fail(tenant.status());
  absl::StatusOr<nlohmann::json> body = JsonBody(request);
  if (!body.ok()) return fail(body.status());
  absl::StatusOr<std::string> id = StringField(*body, "request_id");
  if (!id.ok()) return fail(id.status());

  // An id of another form is as unknown as one never given out.
  ResultKey future{*tenant, -1};
  if (absl::StartsWith(*id, "req-")) {
    int64_t seq = -1;
    if (absl::SimpleAtoi(absl::string_view(*id).substr(4), &seq)) {
      future.seq = seq;
    }
  }
  absl::Notification answered;
  ResultHub<Outcome>::Answer answer = std::optional<Outcome>();
  futures_.Wait(future, options_.max_wait, [&](ResultHub<Outcome>::Answer a) {
    answer = std::move(a);
    answered.Notify();
  });
  answered.WaitForNotification();
  if (absl::IsNotFound(answer.status())) {
    return fail(absl::NotFoundError(
        absl::StrCat("no request ", *id,
                     " (unknown, another key's, or its result expired)")));
  }
  if (!answer.ok()) return fail(answer.status());
  if (!answer->has_value()) {
    response.set_content(nlohmann::json{{"type", "try_again"},
                                        {"request_id", *id},
                                        {"queue_state", "active"}}
                             .dump(),
                         kJson);
    return;
  }
  const Outcome& outcome = **answer;
  if (!outcome.status.ok()) {
    response.set_content(FailedBody(outcome.status), kJson);
    return;
  }
  response.set_content(outcome.body, outcome.content_type);
}

absl::StatusOr<std::string> TinkerApi::CreateSession(
    const std::string& tenant, const httplib::Request& request) {
  LORAPLEX_RETURN_IF_ERROR(JsonBody(request).status());
  const std::string id = NewResourceId("tinker");
  Remember(id, "session", tenant, nlohmann::json::object());
  absl::MutexLock lock(&mu_);
  sessions_[id] = tenant;
  return nlohmann::json{{"session_id", id}}.dump();
}

absl::StatusOr<std::string> TinkerApi::Heartbeat(
    const std::string& tenant, const httplib::Request& request) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json body, JsonBody(request));
  LORAPLEX_ASSIGN_OR_RETURN(std::string session,
                            StringField(body, "session_id"));
  absl::MutexLock lock(&mu_);
  LORAPLEX_RETURN_IF_ERROR(CheckSession(tenant, session));
  return std::string("{}");
}

absl::StatusOr<std::string> TinkerApi::FinishSession(
    const std::string& tenant, const httplib::Request& request) {
  const std::string session = request.matches[1];
  std::vector<std::string> native_ids;
  std::vector<std::string> forgotten = {session};
  {
    absl::MutexLock lock(&mu_);
    LORAPLEX_RETURN_IF_ERROR(CheckSession(tenant, session));
    sessions_.erase(session);  // Later calls naming it are refused.
    for (auto model = models_.begin(); model != models_.end();) {
      if (model->second.session == session) {
        // One still opening is closed when it opens (OpenModel).
        if (!model->second.native_id.empty()) {
          native_ids.push_back(model->second.native_id);
        }
        forgotten.push_back(model->first);
        model = models_.erase(model);
      } else {
        ++model;
      }
    }
  }
  for (const std::string& name : forgotten) Forget(name);
  // Each model's slot is freed once the operations it was sent are done.
  for (const std::string& native_id : native_ids) {
    context_->sessions->Close(tenant, native_id,
                              [](absl::StatusOr<SessionInfo>) {});
  }
  return std::string("{}");
}

std::string TinkerApi::OpenModel(const std::string& tenant,
                                 const std::string& session,
                                 const std::string& model_id, SessionSpec spec,
                                 nlohmann::json answer) {
  const ResultKey future = NewFuture(tenant);
  Model model;
  model.tenant = tenant;
  model.session = session;
  model.lora = spec.lora;
  model.optimizer = spec.optimizer;
  spec.display_name = model_id;
  context_->sessions->Create(
      tenant, std::move(spec),
      [this, future, model, model_id,
       answer = std::move(answer)](absl::StatusOr<SessionInfo> info) mutable {
        bool finished = false;  // The Tinker session ended meanwhile.
        {
          absl::MutexLock lock(&mu_);
          auto it = models_.find(model_id);
          finished = it == models_.end();
          if (!info.ok() || finished) {
            if (!finished) models_.erase(it);
          } else {
            model.native_id = info->id;
            it->second = model;
          }
        }
        if (info.ok() && !finished) {
          Remember(model_id, "model", model.tenant,
                   {{"session", model.session},
                    {"native_id", model.native_id},
                    {"lora", LoraConfigToJson(model.lora)},
                    {"optimizer", OptimizerConfigToJson(model.optimizer)}});
        }
        if (!info.ok()) {
          Finish(future, {info.status(), "", ""});
          return;
        }
        if (finished) {
          context_->sessions->Close(model.tenant, info->id,
                                    [](absl::StatusOr<SessionInfo>) {});
          Finish(future, {absl::FailedPreconditionError(absl::StrCat(
                              "session ", model.session, " was finished")),
                          "", ""});
          return;
        }
        Finish(future, {absl::OkStatus(), answer.dump(), kJson});
      });
  return RequestId(future);
}

absl::StatusOr<TinkerApi::NewModel> TinkerApi::NewModelOf(
    const std::string& tenant, const nlohmann::json& body) {
  NewModel model;
  LORAPLEX_ASSIGN_OR_RETURN(model.session, StringField(body, "session_id"));
  LORAPLEX_ASSIGN_OR_RETURN(int64_t model_seq_id,
                            IntegerField(body, "model_seq_id"));
  model.id = absl::StrCat(model.session, ":train:", model_seq_id);
  absl::MutexLock lock(&mu_);
  LORAPLEX_RETURN_IF_ERROR(CheckSession(tenant, model.session));
  if (models_.count(model.id) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_seq_id ", model_seq_id, " of session ",
                     model.session, " is already a model"));
  }
  // Reserved until its session opens (native_id empty meanwhile).
  Model& reserved = models_[model.id];
  reserved.tenant = tenant;
  reserved.session = model.session;
  return model;
}

absl::StatusOr<std::string> TinkerApi::CreateModel(
    const std::string& tenant, const httplib::Request& request) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json body, JsonBody(request));
  const std::string base = body.value("base_model", "");
  if (base != context_->base_model_name) {
    return absl::InvalidArgumentError(absl::StrCat(
        "base_model: this server trains \"", context_->base_model_name, "\" (",
        base.size(), " bytes given)"));
  }
  SessionSpec spec;
  const nlohmann::json lora =
      body.contains("lora_config") ? body["lora_config"] : nlohmann::json();
  LORAPLEX_ASSIGN_OR_RETURN(spec.lora, TinkerLoraConfig(lora, &spec.seed));
  if (spec.lora.rank > context_->limits.max_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_config.rank must be at most this server's max_rank ",
                     context_->limits.max_rank, ", got ", spec.lora.rank));
  }
  const nlohmann::json* optimizer =
      body.contains("optimizer_config") ? &body["optimizer_config"] : nullptr;
  LORAPLEX_ASSIGN_OR_RETURN(spec.optimizer, TinkerOptimizerConfig(optimizer));
  LORAPLEX_ASSIGN_OR_RETURN(NewModel model, NewModelOf(tenant, body));
  const std::string future =
      OpenModel(tenant, model.session, model.id, std::move(spec),
                nlohmann::json{{"model_id", model.id}});
  return nlohmann::json{{"request_id", future}, {"model_id", model.id}}.dump();
}

absl::StatusOr<TinkerApi::Model> TinkerApi::FindModel(
    const std::string& tenant, const std::string& model_id) const {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(model_id);
  if (it == models_.end() || it->second.tenant != tenant ||
      it->second.native_id.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no model ", model_id, " (unknown, or not open yet)"));
  }
  return it->second;
}

absl::Status TinkerApi::CheckSession(const std::string& tenant,
                                     const std::string& session) const {
  auto it = sessions_.find(session);
  if (it == sessions_.end() || it->second != tenant) {
    return absl::NotFoundError(absl::StrCat("no session ", session));
  }
  return absl::OkStatus();
}

absl::StatusOr<TinkerApi::Sampler> TinkerApi::FindSampler(
    const std::string& tenant, const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = samplers_.find(id);
  if (it == samplers_.end() || it->second.tenant != tenant) {
    return absl::NotFoundError(absl::StrCat("no sampler ", id));
  }
  return it->second;
}

absl::StatusOr<std::string> TinkerApi::SavedId(
    const std::map<std::string, SavedPath>& saved, const std::string& tenant,
    const std::string& path, absl::string_view unknown) const {
  auto it = saved.find(path);
  if (it == saved.end() || it->second.tenant != tenant) {
    return absl::NotFoundError(absl::StrCat(
        unknown, " ", path,
        " (paths given out before a server restart are not kept)"));
  }
  return it->second.id;
}

absl::StatusOr<std::string> TinkerApi::SamplerWeightsAdapter(
    const std::string& tenant, const std::string& path) const {
  absl::MutexLock lock(&mu_);
  return SavedId(sampler_weights_, tenant, path, "no sampler weights at");
}

std::vector<std::string> TinkerApi::SamplerWeightsPaths(
    const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> paths;
  for (const auto& [path, saved] : sampler_weights_) {
    if (saved.tenant == tenant) paths.push_back(path);
  }
  return paths;
}

absl::StatusOr<std::string> TinkerApi::GetInfo(
    const std::string& tenant, const httplib::Request& request) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json body, JsonBody(request));
  LORAPLEX_ASSIGN_OR_RETURN(std::string model_id,
                            StringField(body, "model_id"));
  LORAPLEX_ASSIGN_OR_RETURN(Model model, FindModel(tenant, model_id));
  nlohmann::json answer = {
      {"model_id", model_id},
      {"model_data",
       {{"model_name", context_->base_model_name}, {"arch", "llama"}}},
      {"is_lora", true},
      {"lora_rank", model.lora.rank},
      {"model_name", context_->base_model_name},
      {"optimizer_config",
       {{"type", std::string(OptimizerFamilyName(model.optimizer.family))}}}};
  return answer.dump();
}

absl::StatusOr<std::string> TinkerApi::UnloadModel(
    const std::string& tenant, const httplib::Request& request) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json body, JsonBody(request));
  LORAPLEX_ASSIGN_OR_RETURN(std::string model_id,
                            StringField(body, "model_id"));
  LORAPLEX_ASSIGN_OR_RETURN(Model model, FindModel(tenant, model_id));
  const ResultKey future = NewFuture(tenant);
  context_->sessions->Close(
      tenant, model.native_id,
      [this, future, model_id](absl::StatusOr<SessionInfo> info) {
        if (info.ok()) {
          Forget(model_id);
          absl::MutexLock lock(&mu_);
          models_.erase(model_id);
        }
        Finish(future, {info.status(),
                        nlohmann::json{{"model_id", model_id}}.dump(), kJson});
      });
  return FutureAnswer(RequestId(future));
}

absl::StatusOr<std::string> TinkerApi::SubmitToModel(
    const std::string& tenant, const std::string& model_id, int64_t seq_id,
    SessionRequest native,
    std::function<absl::StatusOr<Outcome>(const SessionResult&)> result) {
  LORAPLEX_ASSIGN_OR_RETURN(Model model, FindModel(tenant, model_id));
  const ResultKey future = NewFuture(tenant);
  context_->sessions->Submit(
      tenant, model.native_id, seq_id, std::move(native),
      [this, future,
       result = std::move(result)](absl::StatusOr<SessionResult> done) {
        if (!done.ok()) {
          Finish(future, {done.status(), "", ""});
          return;
        }
        absl::StatusOr<Outcome> outcome = result(*done);
        Finish(future, outcome.ok() ? *std::move(outcome)
                                    : Outcome{outcome.status(), "", ""});
      });
  return FutureAnswer(RequestId(future));
}

absl::StatusOr<std::string> TinkerApi::ForwardBackward(
    const std::string& tenant, const httplib::Request& request) {
  if (!absl::StartsWith(request.get_header_value("Content-Type"), kProtobuf)) {
    return absl::InvalidArgumentError(
        "forward_backward takes a protobuf body (Content-Type: "
        "application/x-protobuf), as tinker >= 0.25 sends it");
  }
  if (request.has_header("Content-Encoding")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Content-Encoding ", request.get_header_value("Content-Encoding"),
        " is not supported: send the body uncompressed"));
  }
  tinker_public::ForwardBackwardRequest proto;
  if (!proto.ParseFromString(request.body)) {
    return absl::InvalidArgumentError(
        "the body is not a tinker_public.ForwardBackwardRequest");
  }
  LORAPLEX_ASSIGN_OR_RETURN(ForwardBackwardInput native,
                            TinkerForwardBackwardInput(proto));
  LORAPLEX_ASSIGN_OR_RETURN(
      SessionRequest session_request,
      SessionForwardBackwardOf(*context_, std::move(native)));
  std::vector<int64_t> targets = TargetsPerPosition(*session_request.data);
  return SubmitToModel(
      tenant, proto.model_id(), proto.seq_id(), std::move(session_request),
      [targets = std::move(targets)](
          const SessionResult& result) -> absl::StatusOr<Outcome> {
        tinker_public::ForwardBackwardOutput out;
        TinkerForwardBackwardOutput(result.result.forward_backward, targets,
                                    &out);
        return Outcome{absl::OkStatus(), out.SerializeAsString(), kProtobuf};
      });
}

absl::StatusOr<std::string> TinkerApi::OptimStep(
    const std::string& tenant, const httplib::Request& request) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json body, JsonBody(request));
  LORAPLEX_ASSIGN_OR_RETURN(std::string model_id,
                            StringField(body, "model_id"));
  LORAPLEX_ASSIGN_OR_RETURN(int64_t seq_id, IntegerField(body, "seq_id"));
  SessionRequest native;
  native.kind = SessionOp::Kind::kOptimStep;
  LORAPLEX_ASSIGN_OR_RETURN(Model model, FindModel(tenant, model_id));
  LORAPLEX_ASSIGN_OR_RETURN(native.step,
                            TinkerOptimStep(body, model.optimizer.family));
  return SubmitToModel(
      tenant, model_id, seq_id, std::move(native),
      [](const SessionResult& result) -> absl::StatusOr<Outcome> {
        const SlotStepMetrics& step = result.result.step;
        // Keys carry one ':' and a reduction, as the SDK's metrics do.
        nlohmann::json metrics = {
            {"grad_norm:mean", step.grad_norm},
            {"learning_rate:mean", step.lr},
            {"skipped:sum", step.skipped ? 1.0 : 0.0},
            {"steps:max", static_cast<double>(result.result.steps)}};
        return Outcome{absl::OkStatus(),
                       nlohmann::json{{"metrics", metrics}}.dump(), kJson};
      });
}

absl::StatusOr<std::string> TinkerApi::SaveWeights(
    const std::string& tenant, const httplib::Request& request) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json body, JsonBody(request));
  LORAPLEX_ASSIGN_OR_RETURN(std::string model_id,
                            StringField(body, "model_id"));
  LORAPLEX_ASSIGN_OR_RETURN(int64_t seq_id, IntegerField(body, "seq_id"));
  LORAPLEX_ASSIGN_OR_RETURN(std::string name, StringField(body, "path"));
  LORAPLEX_RETURN_IF_ERROR(CheckCheckpointName(name));
  const std::string path =
      absl::StrCat("tinker://", model_id, "/weights/", name);
  {
    absl::MutexLock lock(&mu_);
    if (states_.count(path) > 0 && !body.value("overwrite", false)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " exists; set overwrite to replace it"));
    }
  }
  SessionRequest native;
  native.kind = SessionOp::Kind::kSaveState;
  native.display_name = name;
  return SubmitToModel(
      tenant, model_id, seq_id, std::move(native),
      [this, tenant,
       path](const SessionResult& result) -> absl::StatusOr<Outcome> {
        Remember(path, "weights", tenant, {{"id", result.state_id}});
        {
          absl::MutexLock lock(&mu_);
          states_[path] = {tenant, result.state_id};
        }
        return Outcome{absl::OkStatus(), nlohmann::json{{"path", path}}.dump(),
                       kJson};
      });
}

std::string TinkerApi::NewSampler(const std::string& tenant,
                                  const std::string& id, Sampler sampler) {
  sampler.tenant = tenant;
  Remember(
      id, "sampler", tenant,
      {{"adapter_id", sampler.adapter_id}, {"model_path", sampler.model_path}});
  absl::MutexLock lock(&mu_);
  samplers_[id] = std::move(sampler);
  return id;
}

absl::StatusOr<std::string> TinkerApi::SaveWeightsForSampler(
    const std::string& tenant, const httplib::Request& request) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json body, JsonBody(request));
  LORAPLEX_ASSIGN_OR_RETURN(std::string model_id,
                            StringField(body, "model_id"));
  LORAPLEX_ASSIGN_OR_RETURN(int64_t seq_id, IntegerField(body, "seq_id"));
  LORAPLEX_ASSIGN_OR_RETURN(Model model, FindModel(tenant, model_id));
  const bool named = body.contains("path") && !body["path"].is_null();
  SessionRequest native;
  native.kind = SessionOp::Kind::kSaveWeights;
  std::string path;
  std::string sampler_id;
  if (named) {
    LORAPLEX_ASSIGN_OR_RETURN(native.display_name, StringField(body, "path"));
    LORAPLEX_RETURN_IF_ERROR(CheckCheckpointName(native.display_name));
    path = absl::StrCat("tinker://", model_id, "/sampler_weights/",
                        native.display_name);
  } else {
    LORAPLEX_ASSIGN_OR_RETURN(int64_t sampler_seq,
                              IntegerField(body, "sampling_session_seq_id"));
    sampler_id = absl::StrCat(model.session, ":sample:", sampler_seq);
    native.display_name = absl::StrCat(model_id, " for ", sampler_id);
  }
  return SubmitToModel(
      tenant, model_id, seq_id, std::move(native),
      [this, tenant, path,
       sampler_id](const SessionResult& result) -> absl::StatusOr<Outcome> {
        if (!path.empty()) {
          Remember(path, "sampler_weights", tenant,
                   {{"id", result.adapter_id}});
          absl::MutexLock lock(&mu_);
          sampler_weights_[path] = {tenant, result.adapter_id};
          return Outcome{absl::OkStatus(),
                         nlohmann::json{{"path", path}}.dump(), kJson};
        }
        Sampler sampler;
        sampler.adapter_id = result.adapter_id;
        NewSampler(tenant, sampler_id, std::move(sampler));
        return Outcome{
            absl::OkStatus(),
            nlohmann::json{{"sampling_session_id", sampler_id}}.dump(), kJson};
      });
}

absl::StatusOr<std::string> TinkerApi::LoadWeights(
    const std::string& tenant, const httplib::Request& request) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json body, JsonBody(request));
  LORAPLEX_ASSIGN_OR_RETURN(std::string path, StringField(body, "path"));
  const bool with_optimizer = body.value("optimizer", false);
  std::string state_id;
  {
    absl::MutexLock lock(&mu_);
    LORAPLEX_ASSIGN_OR_RETURN(state_id,
                              SavedId(states_, tenant, path, "no saved state"));
  }
  if (body.contains("model_id")) {
    // The deprecated TrainingClient.load_state: into an open model.
    LORAPLEX_ASSIGN_OR_RETURN(std::string model_id,
                              StringField(body, "model_id"));
    LORAPLEX_ASSIGN_OR_RETURN(int64_t seq_id, IntegerField(body, "seq_id"));
    SessionRequest native;
    native.kind = SessionOp::Kind::kLoadState;
    native.state = state_id;
    native.with_optimizer = with_optimizer;
    return SubmitToModel(
        tenant, model_id, seq_id, std::move(native),
        [path, model_id](const SessionResult&) -> absl::StatusOr<Outcome> {
          return Outcome{
              absl::OkStatus(),
              nlohmann::json{{"path", path}, {"model_id", model_id}}.dump(),
              kJson};
        });
  }
  // Create-via-load: a new model of the session from the state.
  LORAPLEX_ASSIGN_OR_RETURN(SessionSpec spec,
                            context_->sessions->StateSpec(tenant, state_id));
  spec.with_optimizer = with_optimizer;
  LORAPLEX_ASSIGN_OR_RETURN(NewModel model, NewModelOf(tenant, body));
  const std::string future =
      OpenModel(tenant, model.session, model.id, std::move(spec),
                nlohmann::json{{"path", path}, {"model_id", model.id}});
  return nlohmann::json{{"request_id", future}, {"model_id", model.id}}.dump();
}

absl::StatusOr<std::string> TinkerApi::CreateSamplingSession(
    const std::string& tenant, const httplib::Request& request) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json body, JsonBody(request));
  LORAPLEX_ASSIGN_OR_RETURN(std::string session,
                            StringField(body, "session_id"));
  LORAPLEX_ASSIGN_OR_RETURN(int64_t seq,
                            IntegerField(body, "sampling_session_seq_id"));
  Sampler sampler;
  const std::string model_path = body.value("model_path", "");
  {
    absl::MutexLock lock(&mu_);
    LORAPLEX_RETURN_IF_ERROR(CheckSession(tenant, session));
    if (!model_path.empty()) {
      LORAPLEX_ASSIGN_OR_RETURN(sampler.adapter_id,
                                SavedId(sampler_weights_, tenant, model_path,
                                        "model_path: no sampler weights"));
      sampler.model_path = model_path;
    }
  }
  if (model_path.empty()) {
    const std::string base = body.value("base_model", "");
    if (base != context_->base_model_name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "base_model: this server samples \"", context_->base_model_name,
          "\" (", base.size(), " bytes given); or give model_path"));
    }
  }
  const std::string id = NewSampler(
      tenant, absl::StrCat(session, ":sample:", seq), std::move(sampler));
  return nlohmann::json{{"sampling_session_id", id}}.dump();
}

absl::StatusOr<std::string> TinkerApi::GetSampler(
    const std::string& tenant, const httplib::Request& request) {
  const std::string id = request.matches[1];
  LORAPLEX_ASSIGN_OR_RETURN(Sampler sampler, FindSampler(tenant, id));
  nlohmann::json answer = {{"sampler_id", id},
                           {"base_model", context_->base_model_name}};
  if (!sampler.model_path.empty()) answer["model_path"] = sampler.model_path;
  return answer.dump();
}

absl::StatusOr<std::string> TinkerApi::ASample(
    const std::string& tenant, const httplib::Request& request) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json body, JsonBody(request));
  LORAPLEX_ASSIGN_OR_RETURN(std::string sampler_id,
                            StringField(body, "sampling_session_id"));
  LORAPLEX_ASSIGN_OR_RETURN(Sampler sampler, FindSampler(tenant, sampler_id));
  LORAPLEX_ASSIGN_OR_RETURN(SamplingRequest native,
                            TinkerSamplingRequest(body));
  if (!sampler.adapter_id.empty()) {
    native.weights_kind = SampleWeights::kAdapter;
    native.weights = FormatResourceName(kAdapters, sampler.adapter_id);
  }
  const bool prompt_logprobs = native.prompt_logprobs;
  LORAPLEX_ASSIGN_OR_RETURN(SampleCommand command,
                            SampleCommandOf(*context_, tenant, native));
  {
    absl::MutexLock lock(&mu_);
    int64_t& in_flight = samples_in_flight_[tenant];
    if (in_flight >= options_.max_samples_per_tenant) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this key has ", in_flight,
                       " samples queued or running; retry "
                       "when some have finished"));
    }
    ++in_flight;
  }
  const ResultKey future = NewFuture(tenant);
  command.done = [this, future, tenant, prompt_logprobs](
                     absl::StatusOr<SampleResult> result, int64_t /*step*/) {
    {
      absl::MutexLock lock(&mu_);
      if (--samples_in_flight_[tenant] <= 0) samples_in_flight_.erase(tenant);
    }
    // Here, on the trainer's thread: the conversion copies the tokens and
    // logprobs once, which is quick.
    if (!result.ok()) {
      Finish(future, {result.status(), "", ""});
      return;
    }
    tinker_public::SampleResponse out;
    TinkerSampleResponse(*result, prompt_logprobs, &out);
    Finish(future, {absl::OkStatus(), out.SerializeAsString(), kProtobuf});
  };
  const int64_t n = command.n;
  context_->scheduler->Sample(std::move(command));
  nlohmann::json ids = nlohmann::json::array();
  for (int64_t i = 0; i < n; ++i)
    ids.push_back(absl::StrCat(RequestId(future), ":", i));
  return nlohmann::json{{"request_id", RequestId(future)},
                        {"sample_sequence_ids", ids}}
      .dump();
}

absl::StatusOr<std::string> TinkerApi::Capabilities(
    const std::string& /*tenant*/, const httplib::Request& /*request*/) {
  nlohmann::json model = {
      {"model_name", context_->base_model_name},
      {"max_context_length", context_->model.max_position_embeddings},
      {"trainable", true},
      {"sampleable", true}};
  return nlohmann::json{{"supported_models", nlohmann::json::array({model})}}
      .dump();
}

}  // namespace loraplex
