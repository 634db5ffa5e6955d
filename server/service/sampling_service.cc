#include "server/service/sampling_service.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/unicode_text.h"
#include "proto/resource_names.h"
#include "server/service/checkpoint_access.h"

namespace loraplex {
namespace {

constexpr char kReplacementCharacter[] = "\xEF\xBF\xBD";

uint64_t RandomSeed() {
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device();
}

absl::StatusOr<std::vector<int64_t>> PromptOf(
    const ServiceContext& context, const v1::SampleRequest& request) {
  const Tokenizer& tokenizer = context.datasets->tokenizer();
  switch (request.prompt_case()) {
    case v1::SampleRequest::kText: {
      if (request.text().empty()) {
        return absl::InvalidArgumentError("text must not be empty");
      }
      LORAPLEX_ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                                tokenizer.Encode(request.text()));
      if (tokenizer.bos_id().has_value()) {
        ids.insert(ids.begin(), *tokenizer.bos_id());
      }
      return ids;
    }
    case v1::SampleRequest::kTokens: {
      std::vector<int64_t> ids(request.tokens().ids().begin(),
                               request.tokens().ids().end());
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= context.model.vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrCat("tokens.ids[", i, "] must be in [0, ",
                           context.model.vocab_size, "), got ", ids[i]));
        }
      }
      return ids;
    }
    case v1::SampleRequest::kMessages: {
      if (context.chat_template == nullptr) {
        return absl::FailedPreconditionError(
            context.chat_template_error.ok()
                ? std::string("messages need the model's chat template, and "
                              "this model has none: send text or tokens")
                : absl::StrCat("the model's chat template cannot be used: ",
                               context.chat_template_error.message()));
      }
      if (request.messages().messages().empty()) {
        return absl::InvalidArgumentError("messages must not be empty");
      }
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      for (const v1::ChatMessage& message : request.messages().messages()) {
        messages.push_back(
            {{"role", message.role()}, {"content", message.content()}});
      }
      ChatRenderOptions options;
      options.add_generation_prompt = true;
      if (const std::string& kwargs = request.messages().chat_template_kwargs();
          !kwargs.empty()) {
        absl::StatusOr<nlohmann::json> parsed =
            ParseUntrustedJson(kwargs, "messages.chat_template_kwargs");
        if (!parsed.ok()) return parsed.status();
        if (!parsed->is_object()) {
          return absl::InvalidArgumentError(
              absl::StrCat("messages.chat_template_kwargs must be a JSON "
                           "object of template variables, got ",
                           DescribeJson(*parsed)));
        }
        // Key order as sent: templates may show it (tojson, items()).
        options.variables = nlohmann::ordered_json::parse(kwargs);
        for (const char* reserved :
             {"messages", "tools", "add_generation_prompt"}) {
          if (options.variables.contains(reserved)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "messages.chat_template_kwargs.", reserved,
                ": set by the request itself, not a template variable"));
          }
        }
      }
      absl::StatusOr<jinja::Rendering> rendering =
          context.chat_template->Render(messages, options);
      if (!rendering.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("messages: ", rendering.status().message()));
      }
      return tokenizer.Encode(rendering->text);
    }
    case v1::SampleRequest::PROMPT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "prompt is required: set text, tokens or messages");
}

// Fills the command's weights from the request's oneof.
absl::Status ResolveWeights(const ServiceContext& context,
                            const std::string& tenant,
                            const v1::SampleRequest& request,
                            SampleCommand& command) {
  switch (request.weights_case()) {
    case v1::SampleRequest::kAdapter: {
      LORAPLEX_ASSIGN_OR_RETURN(
          command.adapter_dir,
          FindStoredAdapter(context, tenant, request.adapter(), "adapter"));
      return absl::OkStatus();
    }
    case v1::SampleRequest::kCheckpoint: {
      LORAPLEX_ASSIGN_OR_RETURN(
          CheckpointRef ref,
          ParseCheckpointName(request.checkpoint(), "checkpoint"));
      LORAPLEX_ASSIGN_OR_RETURN(
          command.adapter_dir,
          FindCheckpoint(context, tenant, request.checkpoint(), "checkpoint"));
      LORAPLEX_RETURN_IF_ERROR(
          CheckCheckpoint(command.adapter_dir, "checkpoint"));
      command.weights_step = ref.step;
      return absl::OkStatus();
    }
    case v1::SampleRequest::kJob: {
      LORAPLEX_ASSIGN_OR_RETURN(JobWeights weights,
                                FindJobWeights(context, tenant, request.job(),
                                               "weights to sample from"));
      command.adapter_dir = weights.dir;
      command.job_id = weights.running_job_id;
      return absl::OkStatus();
    }
    case v1::SampleRequest::WEIGHTS_NOT_SET:
      return absl::OkStatus();  // The base model.
  }
  return absl::OkStatus();
}

v1::StopReason StopReasonToProto(StopReason reason) {
  switch (reason) {
    case StopReason::kLength:
      return v1::STOP_REASON_LENGTH;
    case StopReason::kStopToken:
      return v1::STOP_REASON_STOP_TOKEN;
    case StopReason::kStopString:
      return v1::STOP_REASON_STOP_STRING;
  }
  return v1::STOP_REASON_UNSPECIFIED;
}

// Streams the tokens of a StreamSample call as the trainer draws them,
// then the whole response. The trainer only queues tokens (on_token); a
// worker decodes their text. Owned by gRPC until OnDone and by the pending
// command until its `done`; the last to let go deletes it.
class SampleStreamReactor
    : public grpc::ServerWriteReactor<v1::SampleStreamChunk> {
 public:
  SampleStreamReactor(const ServiceContext* context,
                      std::vector<std::string> stops)
      : context_(context), stops_(std::move(stops)) {
    for (const std::string& stop : stops_) {
      if (!stop.empty()) holdback_ = std::max(holdback_, stop.size() - 1);
    }
  }

  void Retain() { ++owners_; }
  void Release() {
    if (--owners_ == 0) delete this;
  }

  // Trainer thread: sample `sample` drew `token`.
  void OnToken(int64_t sample, int64_t token, double logprob) {
    bool post = false;
    {
      absl::MutexLock lock(&mu_);
      drawn_.push_back({sample, token, logprob});
      post = !flush_posted_;
      flush_posted_ = true;
    }
    if (post) {
      Retain();
      context_->work->Post([this] {
        Flush();
        Release();
      });
    }
  }

  // Worker: the whole response (or the error), after every token.
  void Complete(const grpc::Status& status, v1::SampleResponse response) {
    Flush();
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      v1::SampleStreamChunk chunk;
      *chunk.mutable_response() = std::move(response);
      chunks_.push_back(std::move(chunk));
    }
    final_status_ = status;
    complete_ = true;
    NextLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      cancelled_ = true;
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed"));
      return;
    }
    NextLocked();
  }
  void OnCancel() override {
    cancelled_ = true;
    absl::MutexLock lock(&mu_);
    FinishLocked(
        grpc::Status(grpc::StatusCode::CANCELLED, "the sample was cancelled"));
  }
  // The client went away (or the stream broke): decoding can stop.
  bool cancelled() const { return cancelled_; }
  void OnDone() override { Release(); }

  // Finishes at once (the request never reached the trainer).
  void Fail(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    FinishLocked(status);
  }

 private:
  struct Drawn {
    int64_t sample;
    int64_t token;
    double logprob;
  };
  struct Stream {
    std::vector<int64_t> tokens;
    size_t sent_bytes = 0;
  };

  // Turns the drawn tokens into chunks, each with the text that can no
  // longer change: not an incomplete character, not what could still turn
  // out to be the start of a stop string.
  void Flush() {
    // One flush at a time, so chunks keep the order the tokens came in.
    absl::MutexLock flushing(&flush_mu_);
    std::deque<Drawn> drawn;
    {
      absl::MutexLock lock(&mu_);
      drawn.swap(drawn_);
      flush_posted_ = false;
    }
    std::vector<v1::SampleStreamChunk> chunks;
    for (const Drawn& d : drawn) {
      Stream& stream = streams_[d.sample];
      stream.tokens.push_back(d.token);
      v1::SampleStreamChunk chunk;
      v1::SampledToken* token = chunk.mutable_token();
      token->set_sample(static_cast<int32_t>(d.sample));
      token->set_token(d.token);
      token->set_logprob(d.logprob);
      absl::StatusOr<std::string> text =
          context_->datasets->tokenizer().Decode(stream.tokens);
      if (text.ok()) *text = Utf8Lossy(*text);
      if (text.ok()) {
        size_t stable = text->size();
        while (stable >= 3 &&
               text->compare(stable - 3, 3, kReplacementCharacter) == 0) {
          stable -= 3;
        }
        // A stop string already in the text ends it before the string; one
        // still to come can start only in the last holdback_ bytes.
        // The same cut as the final text's.
        const size_t match = StopStringCut(*text, stops_);
        if (match != std::string::npos) {
          stable = std::min(stable, match);
        } else {
          stable = stable > holdback_ ? stable - holdback_ : 0;
        }
        // Never inside a character.
        while (stable > 0 && stable < text->size() &&
               (static_cast<unsigned char>((*text)[stable]) & 0xC0) == 0x80) {
          --stable;
        }
        if (stable > stream.sent_bytes &&
            text->compare(0, stream.sent_bytes, *text, 0, stream.sent_bytes) ==
                0) {
          token->set_text(
              text->substr(stream.sent_bytes, stable - stream.sent_bytes));
          stream.sent_bytes = stable;
        }
      }
      chunks.push_back(std::move(chunk));
    }
    absl::MutexLock lock(&mu_);
    for (v1::SampleStreamChunk& chunk : chunks) {
      chunks_.push_back(std::move(chunk));
    }
    NextLocked();
  }

  void NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return;
    if (next_ < chunks_.size()) {
      writing_ = true;
      StartWrite(&chunks_[next_++]);
      return;
    }
    if (complete_) FinishLocked(final_status_);
  }

  void FinishLocked(const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  const ServiceContext* context_;
  const std::vector<std::string> stops_;
  size_t holdback_ = 0;
  std::atomic<int> owners_{1};
  std::atomic<bool> cancelled_{false};
  absl::Mutex flush_mu_;  // Taken before mu_.
  std::map<int64_t, Stream> streams_ ABSL_GUARDED_BY(flush_mu_);
  absl::Mutex mu_;
  std::deque<Drawn> drawn_ ABSL_GUARDED_BY(mu_);
  bool flush_posted_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::SampleStreamChunk> chunks_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status SamplingServiceImpl::Admissions::Enter(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  int& count = in_flight_[tenant];
  if (count >= limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "at most ", limit_, " sample requests per tenant may be in flight"));
  }
  ++count;
  return absl::OkStatus();
}

void SamplingServiceImpl::Admissions::Leave(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  if (--in_flight_[tenant] <= 0) in_flight_.erase(tenant);
}

SamplingServiceImpl::SamplingServiceImpl(const ServiceContext* context)
    : context_(context),
      admissions_(std::make_shared<Admissions>(
          context->limits.max_samples_per_tenant)) {}

absl::StatusOr<SampleCommand> SampleCommandOf(
    const ServiceContext& context, const std::string& tenant,
    const v1::SampleRequest& request) {
  SampleCommand command;
  command.tenant = tenant;
  LORAPLEX_ASSIGN_OR_RETURN(command.prompt, PromptOf(context, request));
  const int max_n = context.limits.max_samples_per_request;
  if (request.n() < 0 || request.n() > max_n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n must be in [1, ", max_n, "] (0 means 1), got ", request.n()));
  }
  command.n = request.n() == 0 ? 1 : request.n();
  SamplingParams& params = command.params;
  params.max_tokens = request.max_tokens() == 0 ? 256 : request.max_tokens();
  params.temperature = request.has_temperature() ? request.temperature() : 1.0;
  params.top_p = request.top_p() == 0 ? 1.0 : request.top_p();
  params.top_k = request.top_k();
  params.seed = request.has_seed() ? request.seed() : RandomSeed();
  params.stop.assign(request.stop().begin(), request.stop().end());
  params.stop_token_ids.assign(request.stop_token_ids().begin(),
                               request.stop_token_ids().end());
  if (!request.ignore_eos() && params.stop_token_ids.empty()) {
    params.stop_token_ids.push_back(context.datasets->tokenizer().eos_id());
  }
  params.top_logprobs = request.top_logprobs();
  params.prompt_logprobs = request.prompt_logprobs();
  SamplingLimits limits;
  limits.vocab_size = context.model.vocab_size;
  limits.max_positions = context.model.max_position_embeddings;
  limits.max_tokens = context.limits.max_sample_tokens;
  LORAPLEX_RETURN_IF_ERROR(ValidateSamplingParams(
      params, static_cast<int64_t>(command.prompt.size()), limits));
  LORAPLEX_RETURN_IF_ERROR(ResolveWeights(context, tenant, request, command));
  return command;
}

void SampleResponseOf(const SampleCommand& command, const SampleResult& result,
                      int64_t weights_step, v1::SampleResponse* response) {
  for (const GeneratedSample& sample : result.samples) {
    v1::Sample* out = response->add_samples();
    out->mutable_tokens()->Add(sample.tokens.begin(), sample.tokens.end());
    out->mutable_logprobs()->Add(sample.logprobs.begin(),
                                 sample.logprobs.end());
    for (const std::vector<TokenLogprob>& top : sample.top) {
      v1::TokenAlternatives* alternatives = out->add_top_logprobs();
      for (const TokenLogprob& alternative : top) {
        v1::TokenAlternative* a = alternatives->add_alternatives();
        a->set_token(alternative.id);
        a->set_logprob(alternative.logprob);
      }
    }
    // Proto strings are UTF-8: bytes a tokenizer decodes to that are not
    // (a byte tokenizer's, a cut character) become U+FFFD.
    out->set_text(Utf8Lossy(sample.text));
    out->set_stop_reason(StopReasonToProto(sample.stop_reason));
  }
  response->mutable_prompt_tokens()->Add(command.prompt.begin(),
                                         command.prompt.end());
  response->mutable_prompt_logprobs()->Add(result.prompt_logprobs.begin(),
                                           result.prompt_logprobs.end());
  response->set_seed(command.params.seed);
  response->set_weights_step(weights_step);
}

absl::StatusOr<std::string> SamplingServiceImpl::Admit(
    grpc::CallbackServerContext* call) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string tenant, Authenticate(*context_, call));
  LORAPLEX_RETURN_IF_ERROR(admissions_->Enter(tenant));
  return tenant;
}

grpc::ServerUnaryReactor* SamplingServiceImpl::Sample(
    grpc::CallbackServerContext* call, const v1::SampleRequest* request,
    v1::SampleResponse* response) {
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  absl::StatusOr<std::string> tenant = Admit(call);
  if (!tenant.ok()) {
    reactor->Finish(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  const ServiceContext* context = context_;
  std::shared_ptr<Admissions> admissions = admissions_;
  auto finish = [reactor, admissions, tenant = *tenant](absl::Status status) {
    admissions->Leave(tenant);
    reactor->Finish(ToGrpcStatus(status));
  };
  context->work->Post(
      [context, call, request, response, tenant = *tenant, finish] {
        absl::StatusOr<SampleCommand> command =
            SampleCommandOf(*context, tenant, *request);
        if (!command.ok()) {
          finish(command.status());
          return;
        }
        // The call stays open (and `call` valid) until `done` finishes it.
        command->cancelled = [call] { return call->IsCancelled(); };
        // The prompt and params, for the response.
        auto shared = std::make_shared<SampleCommand>(*command);
        command->done = [context, shared, response, finish](
                            absl::StatusOr<SampleResult> result, int64_t step) {
          context->work->Post(
              [shared, response, finish, result = std::move(result), step] {
                if (result.ok())
                  SampleResponseOf(*shared, *result, step, response);
                finish(result.status());
              });
        };
        context->scheduler->Sample(*std::move(command));
      });
  return reactor;
}

grpc::ServerWriteReactor<v1::SampleStreamChunk>*
SamplingServiceImpl::StreamSample(grpc::CallbackServerContext* call,
                                  const v1::SampleRequest* request) {
  auto* reactor = new SampleStreamReactor(
      context_,
      std::vector<std::string>(request->stop().begin(), request->stop().end()));
  absl::StatusOr<std::string> tenant = Admit(call);
  if (!tenant.ok()) {
    reactor->Fail(ToGrpcStatus(tenant.status()));
    return reactor;
  }
  const ServiceContext* context = context_;
  std::shared_ptr<Admissions> admissions = admissions_;
  reactor->Retain();  // Released once the command is answered.
  context->work->Post([context, request, reactor, admissions,
                       tenant = *tenant] {
    absl::StatusOr<SampleCommand> command =
        SampleCommandOf(*context, tenant, *request);
    if (!command.ok()) {
      admissions->Leave(tenant);
      reactor->Complete(ToGrpcStatus(command.status()), {});
      reactor->Release();
      return;
    }
    auto shared = std::make_shared<SampleCommand>(*command);
    command->cancelled = [reactor] { return reactor->cancelled(); };
    command->on_token = [reactor](int64_t sample,
                                  const GeneratedSample& so_far) {
      reactor->OnToken(sample, so_far.tokens.back(), so_far.logprobs.back());
    };
    command->done = [context, shared, reactor, admissions, tenant](
                        absl::StatusOr<SampleResult> result, int64_t step) {
      context->work->Post([shared, reactor, admissions, tenant,
                           result = std::move(result), step] {
        admissions->Leave(tenant);
        v1::SampleResponse response;
        if (result.ok()) SampleResponseOf(*shared, *result, step, &response);
        reactor->Complete(ToGrpcStatus(result.status()), std::move(response));
        reactor->Release();
      });
    };
    context->scheduler->Sample(*std::move(command));
  });
  return reactor;
}

}  // namespace loraplex
