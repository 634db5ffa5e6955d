#include "server/openai/openai_api.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/resource_names.h"
#include "core/common/status_macros.h"
#include "server/edges/checkpoint_access.h"
#include "server/edges/stream_text.h"
#include "server/edges/tenant_auth.h"

namespace loraplex {
namespace {

constexpr char kJson[] = "application/json";

// Answers may carry text that is not valid UTF-8 (a sample cut inside a
// character): replaced, never a throw.
std::string Dump(const nlohmann::json& json) {
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Requests in flight at once over all tenants: each holds one of the HTTP
// listener's threads (128) until answered, and Tinker's long polls and
// /metrics need the rest.
constexpr int64_t kMaxInFlight = 64;

void Answer(httplib::Response& response, const absl::Status& status) {
  const OpenAiError error = OpenAiErrorOf(status);
  response.status = error.http_status;
  response.set_content(Dump(error.body), kJson);
}

// One sample's progress, from the trainer's thread to the stream's.
struct StreamEvent {
  int64_t sample = 0;
  OpenAiDrawn drawn;
};

// What a streamed request shares between the trainer's callbacks and the
// HTTP thread writing the events.
struct StreamState {
  std::mutex mu;
  std::condition_variable changed;
  std::deque<StreamEvent> events;
  bool finished = false;
  absl::StatusOr<SampleResult> result = absl::UnknownError("not finished");
  std::atomic<bool> cancelled{false};
};

}  // namespace

OpenAiApi::OpenAiApi(const ServiceContext* context, OpenAiApiOptions options)
    : context_(context), options_(std::move(options)) {
  if (options_.admissions == nullptr) {
    options_.admissions = std::make_shared<SampleAdmissions>(
        context_->limits.max_samples_per_tenant);
  }
}

OpenAiApi::~OpenAiApi() { Stop(); }

void OpenAiApi::Stop() { stopped_ = true; }

void OpenAiApi::Register(httplib::Server& server) {
  server.Post("/v1/chat/completions", [this](const httplib::Request& request,
                                             httplib::Response& response) {
    Complete(OpenAiEndpoint::kChatCompletions, request, response);
  });
  server.Post("/v1/completions", [this](const httplib::Request& request,
                                        httplib::Response& response) {
    Complete(OpenAiEndpoint::kCompletions, request, response);
  });
  server.Get("/v1/models", [this](const httplib::Request& request,
                                  httplib::Response& response) {
    ListModels(request, response);
  });
  // Model names hold slashes (adapters/{id}); the SDK may escape them.
  server.Get(R"(/v1/models/(.+))", [this](const httplib::Request& request,
                                          httplib::Response& response) {
    GetModel(request, response);
  });
}

absl::StatusOr<std::string> OpenAiApi::TenantOf(
    const httplib::Request& request) const {
  std::optional<std::string> authorization;
  if (request.has_header("Authorization")) {
    authorization = request.get_header_value("Authorization");
  }
  return context_->auth->AuthenticateBearer(authorization);
}

void OpenAiApi::Complete(OpenAiEndpoint endpoint,
                         const httplib::Request& http_request,
                         httplib::Response& response) {
  if (stopped_) {
    Answer(response, absl::UnavailableError("the server is shutting down"));
    return;
  }
  absl::StatusOr<std::string> tenant = TenantOf(http_request);
  if (!tenant.ok()) {
    Answer(response, tenant.status());
    return;
  }
  absl::StatusOr<nlohmann::ordered_json> body =
      ParseOpenAiBody(http_request.body);
  if (!body.ok()) {
    Answer(response, body.status());
    return;
  }
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(endpoint, *body);
  if (!parsed.ok()) {
    Answer(response, parsed.status());
    return;
  }
  auto request = std::make_shared<OpenAiRequest>(*std::move(parsed));
  std::function<absl::StatusOr<std::string>(const std::string&)> tinker;
  if (options_.tinker_adapter) {
    tinker = [this, tenant = *tenant](const std::string& path) {
      return options_.tinker_adapter(tenant, path);
    };
  }
  if (absl::Status resolved =
          ResolveOpenAiModel(request->model, context_->base_model_name, tinker,
                             &request->sampling);
      !resolved.ok()) {
    Answer(response, resolved);
    return;
  }
  absl::StatusOr<SampleCommand> command =
      SampleCommandOf(*context_, *tenant, request->sampling);
  if (!command.ok()) {
    // Weights the caller may not use read as a model that does not exist.
    Answer(response,
           command.status().code() == absl::StatusCode::kNotFound
               ? absl::NotFoundError(absl::StrCat(
                     "The model `", request->model,
                     "` does not exist: ", command.status().message()))
               : command.status());
    return;
  }
  if (in_flight_->fetch_add(1) >= kMaxInFlight) {
    in_flight_->fetch_sub(1);
    Answer(response, absl::ResourceExhaustedError(absl::StrCat(
                         "the server has ", kMaxInFlight,
                         " OpenAI requests in flight; retry shortly")));
    return;
  }
  if (absl::Status admitted = options_.admissions->Enter(*tenant);
      !admitted.ok()) {
    in_flight_->fetch_sub(1);
    Answer(response, admitted);
    return;
  }
  auto info = std::make_shared<OpenAiAnswerInfo>();
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  info->id = absl::StrFormat(
      "%s-%016x", chat ? "chatcmpl" : "cmpl",
      next_id_.fetch_add(1) ^ static_cast<uint64_t>(std::time(nullptr)) << 20);
  info->created = static_cast<int64_t>(std::time(nullptr));
  info->model = request->model;
  info->prompt_tokens = static_cast<int64_t>(command->prompt.size());
  info->tokenizer = &context_->datasets->tokenizer();
  const std::string tenant_id = *tenant;

  if (!request->stream) {
    auto promise =
        std::make_shared<std::promise<absl::StatusOr<SampleResult>>>();
    std::future<absl::StatusOr<SampleResult>> answer = promise->get_future();
    command->cancelled = [this] { return stopped_.load(); };
    command->done = [in_flight = in_flight_, admissions = options_.admissions,
                     promise,
                     tenant_id](absl::StatusOr<SampleResult> result, int64_t) {
      admissions->Leave(tenant_id);
      in_flight->fetch_sub(1);
      promise->set_value(std::move(result));
    };
    context_->scheduler->Sample(*std::move(command));
    absl::StatusOr<SampleResult> result = answer.get();
    if (!result.ok()) {
      Answer(response, result.status());
      return;
    }
    response.set_content(Dump(OpenAiResponse(*request, *result, *info)), kJson);
    return;
  }

  auto state = std::make_shared<StreamState>();
  command->on_token = [state](int64_t sample, const GeneratedSample& so_far) {
    StreamEvent event;
    event.sample = sample;
    event.drawn.token = so_far.tokens.back();
    if (!so_far.logprobs.empty()) event.drawn.logprob = so_far.logprobs.back();
    if (!so_far.top.empty()) event.drawn.top = so_far.top.back();
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->events.push_back(std::move(event));
    }
    state->changed.notify_one();
  };
  command->cancelled = [this, state] {
    return state->cancelled.load() || stopped_.load();
  };
  command->done = [in_flight = in_flight_, admissions = options_.admissions,
                   state,
                   tenant_id](absl::StatusOr<SampleResult> result, int64_t) {
    admissions->Leave(tenant_id);
    in_flight->fetch_sub(1);
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->result = std::move(result);
      state->finished = true;
    }
    state->changed.notify_one();
  };
  const int64_t n = command->n;
  context_->scheduler->Sample(*std::move(command));

  // Per sample: its text so far and whether its first chunk went out.
  struct Choice {
    std::unique_ptr<StreamText> text;
    bool started = false;
    int64_t tokens = 0;
    int64_t text_offset = 0;  // Characters of the tokens' text so far.
  };
  auto choices = std::make_shared<std::vector<Choice>>(n);
  for (Choice& choice : *choices) {
    choice.text =
        std::make_unique<StreamText>(info->tokenizer, request->sampling.stop);
  }
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream",
      [this, state, request, info, choices](size_t /*offset*/,
                                            httplib::DataSink& sink) {
        auto send = [&](const nlohmann::json& event) {
          const std::string line = absl::StrCat("data: ", Dump(event), "\n\n");
          return sink.write(line.data(), line.size());
        };
        std::deque<StreamEvent> events;
        bool finished = false;
        {
          std::unique_lock<std::mutex> lock(state->mu);
          state->changed.wait_for(lock, std::chrono::milliseconds(200), [&] {
            return !state->events.empty() || state->finished;
          });
          events.swap(state->events);
          finished = state->finished;
        }
        if (!sink.is_writable()) {
          state->cancelled = true;
          return false;
        }
        // Consecutive tokens of one sample go out as one chunk.
        size_t next = 0;
        while (next < events.size()) {
          const int64_t sample = events[next].sample;
          std::vector<OpenAiDrawn> drawn;
          std::string text;
          while (next < events.size() && events[next].sample == sample) {
            drawn.push_back(events[next].drawn);
            text += (*choices)[sample].text->Append(events[next].drawn.token);
            ++next;
          }
          Choice& choice = (*choices)[sample];
          choice.tokens += static_cast<int64_t>(drawn.size());
          // Nothing settled and nothing to report: no chunk.
          if (choice.started && text.empty() && !request->logprobs) continue;
          if (!send(OpenAiStreamChunk(*request, *info, sample, !choice.started,
                                      text, drawn, &choice.text_offset,
                                      std::nullopt))) {
            state->cancelled = true;
            return false;
          }
          choice.started = true;
        }
        const std::string done = "data: [DONE]\n\n";
        if (!finished) {
          if (stopped_) {
            // The reply is cut short: say so, then end the stream.
            state->cancelled = true;
            send(OpenAiErrorOf(absl::UnavailableError(
                                   "the server is shutting down; the reply "
                                   "was cut short"))
                     .body);
            sink.write(done.data(), done.size());
            sink.done();
          }
          return true;
        }
        if (!state->result.ok()) {
          // The stream has begun: the error goes as an event.
          send(OpenAiErrorOf(state->result.status()).body);
        } else {
          int64_t completion_tokens = 0;
          const SampleResult& result = *state->result;
          for (size_t i = 0; i < result.samples.size() && i < choices->size();
               ++i) {
            const GeneratedSample& sample = result.samples[i];
            Choice& choice = (*choices)[i];
            completion_tokens += static_cast<int64_t>(sample.tokens.size());
            if (!send(OpenAiStreamChunk(
                    *request, *info, static_cast<int64_t>(i), !choice.started,
                    choice.text->Finish(sample.text), {}, &choice.text_offset,
                    sample.stop_reason))) {
              return false;
            }
          }
          if (request->include_usage) {
            send(OpenAiUsageChunk(*request, *info, completion_tokens));
          }
        }
        sink.write(done.data(), done.size());
        sink.done();
        return true;
      },
      [state](bool /*success*/) { state->cancelled = true; });
}

absl::StatusOr<nlohmann::json> OpenAiApi::Models(
    const std::string& tenant) const {
  const std::string& base = context_->base_model_name;
  const int64_t max_len = context_->model.max_position_embeddings;
  nlohmann::json data = nlohmann::json::array();
  auto add = [&](const std::string& id, int64_t created_ms,
                 const std::string& owner, bool adapter) {
    data.push_back(
        {{"id", id},
         {"object", "model"},
         {"created", created_ms / 1000},
         {"owned_by", owner},
         {"root", base},
         {"parent", adapter ? nlohmann::json(base) : nlohmann::json(nullptr)},
         {"max_model_len", max_len}});
  };
  add(base, 0, "loraplex", false);
  std::string token;
  do {
    LORAPLEX_ASSIGN_OR_RETURN(
        Page<AdapterRecord> page,
        context_->store->ListAdapters(tenant, 1000, token));
    for (const AdapterRecord& adapter : page.items) {
      add(FormatResourceName(kAdapters, adapter.id), adapter.create_time_ms,
          tenant, true);
    }
    token = page.next_page_token;
  } while (!token.empty());
  do {
    LORAPLEX_ASSIGN_OR_RETURN(
        Page<JobRecord> page,
        context_->store->ListJobs(
            tenant,
            {JobStatus::kRunning, JobStatus::kPaused, JobStatus::kSucceeded},
            1000, token));
    for (const JobRecord& job : page.items) {
      add(FormatResourceName(kJobs, job.id), job.create_time_ms, tenant, true);
    }
    token = page.next_page_token;
  } while (!token.empty());
  if (options_.tinker_paths) {
    for (const std::string& path : options_.tinker_paths(tenant)) {
      add(path, 0, tenant, true);
    }
  }
  return data;
}

void OpenAiApi::ListModels(const httplib::Request& http_request,
                           httplib::Response& response) {
  absl::StatusOr<std::string> tenant = TenantOf(http_request);
  if (!tenant.ok()) {
    Answer(response, tenant.status());
    return;
  }
  absl::StatusOr<nlohmann::json> data = Models(*tenant);
  if (!data.ok()) {
    Answer(response, data.status());
    return;
  }
  response.set_content(Dump({{"object", "list"}, {"data", *std::move(data)}}),
                       kJson);
}

void OpenAiApi::GetModel(const httplib::Request& http_request,
                         httplib::Response& response) {
  absl::StatusOr<std::string> tenant = TenantOf(http_request);
  if (!tenant.ok()) {
    Answer(response, tenant.status());
    return;
  }
  const std::string id = http_request.matches[1].str();
  absl::StatusOr<nlohmann::json> data = Models(*tenant);
  if (!data.ok()) {
    Answer(response, data.status());
    return;
  }
  for (const nlohmann::json& model : *data) {
    if (model["id"] == id) {
      response.set_content(Dump(model), kJson);
      return;
    }
  }
  // Checkpoints are not listed (a job may have hundreds) but are models.
  if (absl::StrContains(id, "/checkpoints/") &&
      FindCheckpoint(*context_, *tenant, id, "model").ok()) {
    nlohmann::json model = data->at(0);
    model["id"] = id;
    model["owned_by"] = *tenant;
    model["parent"] = context_->base_model_name;
    response.set_content(Dump(model), kJson);
    return;
  }
  Answer(response, absl::NotFoundError(
                       absl::StrCat("The model `", id, "` does not exist")));
}

}  // namespace loraplex
