#include "server/grpc/sampling_service.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/unicode_text.h"
#include "server/edges/stream_text.h"

namespace loraplex {
namespace {

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
      : context_(context), stops_(std::move(stops)) {}

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
      auto stream = streams_.find(d.sample);
      if (stream == streams_.end()) {
        stream =
            streams_
                .emplace(d.sample,
                         StreamText(&context_->datasets->tokenizer(), stops_))
                .first;
      }
      v1::SampleStreamChunk chunk;
      v1::SampledToken* token = chunk.mutable_token();
      token->set_sample(static_cast<int32_t>(d.sample));
      token->set_token(d.token);
      token->set_logprob(d.logprob);
      std::string text = stream->second.Append(d.token);
      if (!text.empty()) token->set_text(std::move(text));
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
  std::atomic<int> owners_{1};
  std::atomic<bool> cancelled_{false};
  absl::Mutex flush_mu_;  // Taken before mu_.
  std::map<int64_t, StreamText> streams_ ABSL_GUARDED_BY(flush_mu_);
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

SamplingServiceImpl::SamplingServiceImpl(
    const ServiceContext* context, std::shared_ptr<SampleAdmissions> admissions)
    : context_(context),
      admissions_(admissions != nullptr
                      ? std::move(admissions)
                      : std::make_shared<SampleAdmissions>(
                            context->limits.max_samples_per_tenant)) {}

SamplingRequest SamplingRequestOf(const v1::SampleRequest& request) {
  SamplingRequest native;
  switch (request.prompt_case()) {
    case v1::SampleRequest::kText:
      native.prompt = SamplePrompt::kText;
      native.text = request.text();
      break;
    case v1::SampleRequest::kTokens:
      native.prompt = SamplePrompt::kTokens;
      native.tokens.assign(request.tokens().ids().begin(),
                           request.tokens().ids().end());
      break;
    case v1::SampleRequest::kMessages:
      native.prompt = SamplePrompt::kMessages;
      for (const v1::ChatMessage& message : request.messages().messages()) {
        native.messages.push_back({message.role(), message.content()});
      }
      native.chat_template_kwargs = request.messages().chat_template_kwargs();
      break;
    case v1::SampleRequest::PROMPT_NOT_SET:
      break;
  }
  switch (request.weights_case()) {
    case v1::SampleRequest::kAdapter:
      native.weights_kind = SampleWeights::kAdapter;
      native.weights = request.adapter();
      break;
    case v1::SampleRequest::kJob:
      native.weights_kind = SampleWeights::kJob;
      native.weights = request.job();
      break;
    case v1::SampleRequest::kCheckpoint:
      native.weights_kind = SampleWeights::kCheckpoint;
      native.weights = request.checkpoint();
      break;
    case v1::SampleRequest::WEIGHTS_NOT_SET:
      break;
  }
  // The proto's zeros are its defaults.
  native.n = request.n() == 0 ? 1 : request.n();
  if (request.max_tokens() != 0) native.max_tokens = request.max_tokens();
  if (request.has_temperature()) native.temperature = request.temperature();
  if (request.top_p() != 0) native.top_p = request.top_p();
  native.top_k = request.top_k();
  if (request.has_seed()) native.seed = request.seed();
  native.stop.assign(request.stop().begin(), request.stop().end());
  native.stop_token_ids.assign(request.stop_token_ids().begin(),
                               request.stop_token_ids().end());
  native.ignore_eos = request.ignore_eos();
  native.top_logprobs = request.top_logprobs();
  native.prompt_logprobs = request.prompt_logprobs();
  return native;
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
  std::shared_ptr<SampleAdmissions> admissions = admissions_;
  auto finish = [reactor, admissions, tenant = *tenant](absl::Status status) {
    admissions->Leave(tenant);
    reactor->Finish(ToGrpcStatus(status));
  };
  context->work->Post(
      [context, call, request, response, tenant = *tenant, finish] {
        absl::StatusOr<SampleCommand> command =
            SampleCommandOf(*context, tenant, SamplingRequestOf(*request));
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
  std::shared_ptr<SampleAdmissions> admissions = admissions_;
  reactor->Retain();  // Released once the command is answered.
  context->work->Post([context, request, reactor, admissions,
                       tenant = *tenant] {
    absl::StatusOr<SampleCommand> command =
        SampleCommandOf(*context, tenant, SamplingRequestOf(*request));
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
