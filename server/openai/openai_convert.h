// The OpenAI API's completions and chat completions (as OpenAI defines
// them, with the extensions vLLM's OpenAI-compatible server accepts:
// top_k, stop_token_ids, ignore_eos, chat_template_kwargs) in and out of
// loraplex's sampling types. Pure JSON work, no HTTP (openai_api.h serves
// it).
//
//   LORAPLEX_ASSIGN_OR_RETURN(
//       OpenAiRequest request,
//       ParseOpenAiRequest(OpenAiEndpoint::kChatCompletions, body));
//   ... request.sampling.weights_kind from ResolveOpenAiModel ...
//   nlohmann::json answer = OpenAiResponse(request, result, answer_info);
//
// A parameter loraplex does not support (e.g. presence_penalty != 0, echo)
// is INVALID_ARGUMENT naming it, as is an unknown one: nothing is silently
// ignored but what OpenAI documents as having no effect on the output
// (user, metadata, store, service_tier, parallel_tool_calls).
#ifndef LORAPLEX_SERVER_OPENAI_OPENAI_CONVERT_H_
#define LORAPLEX_SERVER_OPENAI_OPENAI_CONVERT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/sample/sample_output.h"
#include "nlohmann/json.hpp"
#include "server/edges/sampling_request.h"

namespace loraplex {

class Tokenizer;

enum class OpenAiEndpoint {
  kCompletions,      // POST /v1/completions: `prompt`.
  kChatCompletions,  // POST /v1/chat/completions: `messages`.
};

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string model;
  // The prompt and the sampling parameters; the weights are filled by
  // ResolveOpenAiModel.
  SamplingRequest sampling;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage.
  bool logprobs = false;       // Answer each token's logprob.
};

// A request body, in the key order the client sent (chat templates may show
// it). INVALID_ARGUMENT for text that is not JSON or that nests deeper than
// 64 levels (refused before anything recurses into it: copies, dumps and
// error messages do).
absl::StatusOr<nlohmann::ordered_json> ParseOpenAiBody(const std::string& text);

// INVALID_ARGUMENT naming the parameter for a missing, malformed,
// out-of-range or unsupported one. `body` keeps the key order the client
// sent (chat templates may show it).
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(
    OpenAiEndpoint endpoint, const nlohmann::ordered_json& body);

// A model name of the API, as the weights it samples:
//   the base model's name     the base model alone
//   adapters/{id}             a stored adapter
//   jobs/{id}                 a job's weights (a running job's current ones)
//   jobs/{id}/checkpoints/{n} a checkpoint
//   tinker://…/sampler_weights/…  a Tinker sampler's adapter, through
//                             `tinker_adapter` (empty: not resolvable)
// NOT_FOUND for any other name.
absl::Status ResolveOpenAiModel(
    const std::string& model, const std::string& base_model_name,
    const std::function<absl::StatusOr<std::string>(const std::string&)>&
        tinker_adapter,
    SamplingRequest* sampling);

// What an answer says besides the samples.
struct OpenAiAnswerInfo {
  std::string id;       // "chatcmpl-…" / "cmpl-…".
  int64_t created = 0;  // Unix seconds.
  std::string model;
  int64_t prompt_tokens = 0;
  const Tokenizer* tokenizer = nullptr;  // Token strings of logprobs.
};

// The whole (non-streamed) answer: a chat.completion or text_completion
// object with its choices and usage.
nlohmann::json OpenAiResponse(const OpenAiRequest& request,
                              const SampleResult& result,
                              const OpenAiAnswerInfo& info);

// The finish_reason of a sample: "stop" or "length".
const char* OpenAiFinishReason(StopReason reason);

// One streamed chunk of choice `index`: `text` newly settled, the logprobs
// of `tokens` drawn since the last chunk (when the request asked), and the
// finish reason on the last chunk (nullopt before). `first` chunks of a
// chat carry the assistant role. `*text_offset`: the character where the
// tokens' text starts in the choice's (a completion's text_offset),
// advanced past them.
struct OpenAiDrawn {
  int64_t token = 0;
  double logprob = 0;
  std::vector<TokenLogprob> top;
};
nlohmann::json OpenAiStreamChunk(const OpenAiRequest& request,
                                 const OpenAiAnswerInfo& info, int64_t index,
                                 bool first, const std::string& text,
                                 const std::vector<OpenAiDrawn>& tokens,
                                 int64_t* text_offset,
                                 std::optional<StopReason> finish);
// The final chunk of stream_options.include_usage: no choices, the usage.
nlohmann::json OpenAiUsageChunk(const OpenAiRequest& request,
                                const OpenAiAnswerInfo& info,
                                int64_t completion_tokens);

// An error as OpenAI answers it: the HTTP status and
// {"error": {"message", "type", "param", "code"}}.
struct OpenAiError {
  int http_status = 500;
  nlohmann::json body;
};
OpenAiError OpenAiErrorOf(const absl::Status& status);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_OPENAI_OPENAI_CONVERT_H_
