#include "server/openai/openai_convert.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/resource_names.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex {
namespace {

// The parameter an error is about, carried with the status to the answer.
constexpr char kParamPayload[] = "type.loraplex.dev/openai-param";

// The most alternatives per token either endpoint answers (vLLM's default
// max_logprobs).
constexpr int64_t kMaxTopLogprobs = 20;

// JSON has no -inf: a logprob below this is answered as this (as vLLM).
constexpr double kLowestLogprob = -9999.0;

absl::Status Invalid(const std::string& param, const std::string& reason) {
  absl::Status status =
      absl::InvalidArgumentError(absl::StrCat(param, " ", reason));
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

// The body's parameters, read once each; afterwards Unknown() finds the
// ones nobody read. A null value counts as absent (clients send nulls for
// what they leave unset).
class Params {
 public:
  explicit Params(const nlohmann::ordered_json& body) : body_(body) {}

  const nlohmann::ordered_json* Get(const std::string& key) {
    known_.insert(key);
    auto it = body_.find(key);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::Status Number(const std::string& key, double lo, double hi,
                      double* out) {
    const nlohmann::ordered_json* value = Get(key);
    if (value == nullptr) return absl::OkStatus();
    if (!value->is_number()) {
      return Invalid(key, absl::StrCat("must be a number, got ",
                                       DescribeJson(nlohmann::json(*value))));
    }
    const double number = value->get<double>();
    if (!(number >= lo && number <= hi)) {
      return Invalid(
          key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", number));
    }
    *out = number;
    return absl::OkStatus();
  }

  absl::Status Integer(const std::string& key, int64_t lo, int64_t hi,
                       int64_t* out) {
    const nlohmann::ordered_json* value = Get(key);
    if (value == nullptr) return absl::OkStatus();
    if (!value->is_number_integer()) {
      return Invalid(key, absl::StrCat("must be an integer, got ",
                                       DescribeJson(nlohmann::json(*value))));
    }
    const int64_t number =
        value->is_number_unsigned() &&
                value->get<uint64_t>() >
                    static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
            ? std::numeric_limits<int64_t>::max()
            : value->get<int64_t>();
    if (number < lo || number > hi) {
      return Invalid(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ",
                                       value->dump()));
    }
    *out = number;
    return absl::OkStatus();
  }

  absl::Status Bool(const std::string& key, bool* out) {
    const nlohmann::ordered_json* value = Get(key);
    if (value == nullptr) return absl::OkStatus();
    if (!value->is_boolean()) {
      return Invalid(key, absl::StrCat("must be true or false, got ",
                                       DescribeJson(nlohmann::json(*value))));
    }
    *out = value->get<bool>();
    return absl::OkStatus();
  }

  absl::Status String(const std::string& key, std::string* out) {
    const nlohmann::ordered_json* value = Get(key);
    if (value == nullptr) return absl::OkStatus();
    if (!value->is_string()) {
      return Invalid(key, absl::StrCat("must be a string, got ",
                                       DescribeJson(nlohmann::json(*value))));
    }
    *out = value->get<std::string>();
    return absl::OkStatus();
  }

  // A parameter loraplex accepts only at the value that changes nothing.
  absl::Status OnlyDefault(const std::string& key,
                           const nlohmann::ordered_json& neutral,
                           const std::string& why) {
    const nlohmann::ordered_json* value = Get(key);
    if (value == nullptr || *value == neutral) return absl::OkStatus();
    if (neutral.is_number() && value->is_number() &&
        value->get<double>() == neutral.get<double>()) {
      return absl::OkStatus();
    }
    return Invalid(key, absl::StrCat("is not supported (", why,
                                     "); leave it unset or ", neutral.dump()));
  }

  // Parameters that do not change what is sampled.
  void Ignore(std::initializer_list<const char*> keys) {
    for (const char* key : keys) known_.insert(key);
  }

  absl::Status Unknown() const {
    for (auto it = body_.begin(); it != body_.end(); ++it) {
      if (known_.count(it.key()) == 0) {
        return Invalid(it.key(), "is not a parameter loraplex supports");
      }
    }
    return absl::OkStatus();
  }

 private:
  const nlohmann::ordered_json& body_;
  std::set<std::string> known_;
};

// `stop`: one string or a list of them.
absl::Status ReadStop(Params& params, std::vector<std::string>* stop) {
  const nlohmann::ordered_json* value = params.Get("stop");
  if (value == nullptr) return absl::OkStatus();
  if (value->is_string()) {
    stop->push_back(value->get<std::string>());
    return absl::OkStatus();
  }
  if (!value->is_array()) {
    return Invalid("stop", "must be a string or a list of strings");
  }
  for (size_t i = 0; i < value->size(); ++i) {
    if (!(*value)[i].is_string()) {
      return Invalid(absl::StrCat("stop[", i, "]"), "must be a string");
    }
    stop->push_back((*value)[i].get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ReadTokenList(const nlohmann::ordered_json& value,
                           const std::string& param,
                           std::vector<int64_t>* ids) {
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_number_integer()) {
      return Invalid(absl::StrCat(param, "[", i, "]"),
                     "must be a token id (an integer)");
    }
    ids->push_back(value[i].get<int64_t>());
  }
  return absl::OkStatus();
}

// What both endpoints share: sampling parameters and unsupported knobs.
absl::Status ReadCommon(Params& params, OpenAiRequest* request) {
  SamplingRequest& sampling = request->sampling;
  const nlohmann::ordered_json* model = params.Get("model");
  if (model == nullptr || !model->is_string() ||
      model->get<std::string>().empty()) {
    return Invalid("model",
                   "is required: the base model's name, adapters/{id}, "
                   "jobs/{id} or jobs/{id}/checkpoints/{step}");
  }
  request->model = model->get<std::string>();
  LORAPLEX_RETURN_IF_ERROR(
      params.Number("temperature", 0.0, 2.0, &sampling.temperature));
  double top_p = 1.0;
  LORAPLEX_RETURN_IF_ERROR(params.Number("top_p", 0.0, 1.0, &top_p));
  if (top_p <= 0.0) return Invalid("top_p", "must be > 0, got 0");
  sampling.top_p = top_p;
  int64_t top_k = 0;
  LORAPLEX_RETURN_IF_ERROR(
      params.Integer("top_k", -1, std::numeric_limits<int32_t>::max(), &top_k));
  sampling.top_k = std::max<int64_t>(top_k, 0);  // -1 and 0: off.
  LORAPLEX_RETURN_IF_ERROR(
      params.Integer("n", 1, std::numeric_limits<int32_t>::max(), &sampling.n));
  int64_t seed = 0;
  if (params.Get("seed") != nullptr) {
    LORAPLEX_RETURN_IF_ERROR(
        params.Integer("seed", std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max(), &seed));
    sampling.seed = static_cast<uint64_t>(seed);
  }
  LORAPLEX_RETURN_IF_ERROR(ReadStop(params, &sampling.stop));
  if (const nlohmann::ordered_json* ids = params.Get("stop_token_ids")) {
    if (!ids->is_array()) {
      return Invalid("stop_token_ids", "must be a list of token ids");
    }
    LORAPLEX_RETURN_IF_ERROR(
        ReadTokenList(*ids, "stop_token_ids", &sampling.stop_token_ids));
  }
  // As vLLM: on top of EOS, not instead of it.
  sampling.stop_token_ids_add_to_eos = true;
  LORAPLEX_RETURN_IF_ERROR(params.Bool("ignore_eos", &sampling.ignore_eos));
  LORAPLEX_RETURN_IF_ERROR(params.Bool("stream", &request->stream));
  if (const nlohmann::ordered_json* options = params.Get("stream_options")) {
    if (!options->is_object()) {
      return Invalid("stream_options", "must be an object");
    }
    if (!request->stream) {
      return Invalid("stream_options", "is only allowed with stream: true");
    }
    Params stream_options(*options);
    bool include_usage = false;
    LORAPLEX_RETURN_IF_ERROR(
        stream_options.Bool("include_usage", &include_usage));
    bool continuous = false;
    LORAPLEX_RETURN_IF_ERROR(
        stream_options.Bool("continuous_usage_stats", &continuous));
    if (continuous) {
      return Invalid("stream_options.continuous_usage_stats",
                     "is not supported; usage comes once, at the end");
    }
    if (absl::Status unknown = stream_options.Unknown(); !unknown.ok()) {
      return Invalid("stream_options", std::string(unknown.message()));
    }
    request->include_usage = include_usage;
  }
  // Knobs that would change the distribution: only their neutral values.
  LORAPLEX_RETURN_IF_ERROR(params.OnlyDefault("presence_penalty", 0,
                                              "the sampler has no penalties"));
  LORAPLEX_RETURN_IF_ERROR(params.OnlyDefault("frequency_penalty", 0,
                                              "the sampler has no penalties"));
  LORAPLEX_RETURN_IF_ERROR(params.OnlyDefault("repetition_penalty", 1,
                                              "the sampler has no penalties"));
  LORAPLEX_RETURN_IF_ERROR(
      params.OnlyDefault("logit_bias", nlohmann::ordered_json::object(),
                         "the sampler takes no logit bias"));
  LORAPLEX_RETURN_IF_ERROR(
      params.OnlyDefault("min_tokens", 0, "EOS may end a sample at once"));
  LORAPLEX_RETURN_IF_ERROR(
      params.OnlyDefault("min_p", 0, "the sampler filters by top_p and top_k"));
  LORAPLEX_RETURN_IF_ERROR(
      params.OnlyDefault("include_stop_str_in_output", false,
                         "the text ends before its stop string"));
  LORAPLEX_RETURN_IF_ERROR(params.OnlyDefault(
      "skip_special_tokens", true, "the text leaves special tokens out"));
  // Bookkeeping that does not change the output.
  params.Ignore({"user", "metadata", "store", "service_tier",
                 "parallel_tool_calls", "prompt_cache_key",
                 "safety_identifier"});
  return absl::OkStatus();
}

absl::Status ReadCompletion(Params& params, OpenAiRequest* request) {
  SamplingRequest& sampling = request->sampling;
  const nlohmann::ordered_json* prompt = params.Get("prompt");
  if (prompt == nullptr) {
    return Invalid("prompt", "is required: a string or a list of token ids");
  }
  // One prompt per request: a string, token ids, or a list of one of them.
  const nlohmann::ordered_json* one = prompt;
  if (prompt->is_array() && !prompt->empty() &&
      ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    if (prompt->size() != 1) {
      return Invalid("prompt",
                     absl::StrCat("holds ", prompt->size(),
                                  " prompts; send one prompt per request"));
    }
    one = &(*prompt)[0];
  }
  if (one->is_string()) {
    sampling.prompt = SamplePrompt::kText;
    sampling.text = one->get<std::string>();
  } else if (one->is_array() && !one->empty()) {
    sampling.prompt = SamplePrompt::kTokens;
    LORAPLEX_RETURN_IF_ERROR(ReadTokenList(*one, "prompt", &sampling.tokens));
  } else {
    return Invalid("prompt",
                   "must be a string or a non-empty list of token ids");
  }
  // OpenAI's default for the legacy endpoint.
  sampling.max_tokens = 16;
  LORAPLEX_RETURN_IF_ERROR(params.Integer("max_tokens", 1,
                                          std::numeric_limits<int32_t>::max(),
                                          &sampling.max_tokens));
  int64_t logprobs = -1;
  LORAPLEX_RETURN_IF_ERROR(
      params.Integer("logprobs", 0, kMaxTopLogprobs, &logprobs));
  if (logprobs >= 0) {
    request->logprobs = true;
    sampling.top_logprobs = logprobs;
  }
  LORAPLEX_RETURN_IF_ERROR(params.OnlyDefault(
      "echo", false, "answers hold the completion, not the prompt"));
  LORAPLEX_RETURN_IF_ERROR(
      params.OnlyDefault("suffix", "", "the model samples left to right"));
  int64_t best_of = sampling.n;
  LORAPLEX_RETURN_IF_ERROR(params.Integer(
      "best_of", 1, std::numeric_limits<int32_t>::max(), &best_of));
  if (best_of != sampling.n) {
    return Invalid("best_of",
                   absl::StrCat("is not supported unless equal to n (",
                                sampling.n, "), got ", best_of));
  }
  return absl::OkStatus();
}

// A message's content as the template sees it: a string (text parts
// joined by newlines, as vLLM does for templates that take strings), or
// null.
absl::StatusOr<nlohmann::ordered_json> MessageContent(
    const nlohmann::ordered_json& content, const std::string& param) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) {
    return Invalid(param, "must be a string or a list of content parts");
  }
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const nlohmann::ordered_json& part = content[j];
    const std::string part_param = absl::StrCat(param, "[", j, "]");
    if (!part.is_object() || !part.contains("type") ||
        !part["type"].is_string()) {
      return Invalid(part_param, "must be an object with a type");
    }
    const std::string type = part["type"].get<std::string>();
    if (type != "text") {
      return Invalid(absl::StrCat(part_param, ".type"),
                     absl::StrCat("\"", type,
                                  "\" is not supported: this server takes "
                                  "text parts only"));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return Invalid(absl::StrCat(part_param, ".text"), "must be a string");
    }
    if (j > 0) text += "\n";
    text += part["text"].get<std::string>();
  }
  return nlohmann::ordered_json(text);
}

absl::Status ReadChat(Params& params, OpenAiRequest* request) {
  SamplingRequest& sampling = request->sampling;
  const nlohmann::ordered_json* messages = params.Get("messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return Invalid("messages", "is required: a non-empty list of messages");
  }
  sampling.prompt = SamplePrompt::kMessages;
  sampling.message_objects = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const nlohmann::ordered_json& message = (*messages)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!message.is_object()) return Invalid(param, "must be an object");
    if (!message.contains("role") || !message["role"].is_string()) {
      return Invalid(absl::StrCat(param, ".role"), "must be a string");
    }
    nlohmann::ordered_json copy = message;
    if (message.contains("content")) {
      LORAPLEX_ASSIGN_OR_RETURN(
          copy["content"],
          MessageContent(message["content"], absl::StrCat(param, ".content")));
    }
    sampling.message_objects.push_back(std::move(copy));
  }
  std::string tool_choice = "auto";
  if (const nlohmann::ordered_json* choice = params.Get("tool_choice")) {
    if (!choice->is_string() || (*choice != "auto" && *choice != "none")) {
      return Invalid("tool_choice",
                     "supports \"auto\" and \"none\" only: the server does "
                     "not parse tool calls out of the text, the client "
                     "reads them from it");
    }
    tool_choice = choice->get<std::string>();
  }
  if (const nlohmann::ordered_json* tools = params.Get("tools")) {
    if (!tools->is_array()) return Invalid("tools", "must be a list");
    // As vLLM: tool_choice "none" leaves the tools out of the prompt.
    if (tool_choice != "none" && !tools->empty()) sampling.tools = *tools;
  }
  if (params.Get("functions") != nullptr) {
    return Invalid("functions", "is not supported: use tools");
  }
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  if (const nlohmann::ordered_json* kwargs =
          params.Get("chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      return Invalid("chat_template_kwargs",
                     "must be an object of template variables");
    }
    variables = *kwargs;
  }
  std::string reasoning_effort;
  LORAPLEX_RETURN_IF_ERROR(
      params.String("reasoning_effort", &reasoning_effort));
  // Templates that take it (gpt-oss's) read it as a variable.
  if (!reasoning_effort.empty() && !variables.contains("reasoning_effort")) {
    variables["reasoning_effort"] = reasoning_effort;
  }
  if (!variables.empty()) sampling.chat_template_kwargs = variables.dump();
  LORAPLEX_RETURN_IF_ERROR(
      params.Bool("add_generation_prompt", &sampling.add_generation_prompt));
  LORAPLEX_RETURN_IF_ERROR(
      params.OnlyDefault("continue_final_message", false,
                         "the reply starts a new assistant message"));
  if (const nlohmann::ordered_json* format = params.Get("response_format")) {
    if (!format->is_object() || !format->contains("type") ||
        (*format)["type"] != "text") {
      return Invalid("response_format",
                     "supports {\"type\": \"text\"} only: the sampler does "
                     "not constrain the output");
    }
  }
  if (const nlohmann::ordered_json* modalities = params.Get("modalities")) {
    if (*modalities != nlohmann::ordered_json::array({"text"})) {
      return Invalid("modalities", "supports [\"text\"] only");
    }
  }
  for (const char* media : {"audio", "prediction", "web_search_options"}) {
    if (params.Get(media) != nullptr) {
      return Invalid(media, "is not supported");
    }
  }
  // max_completion_tokens is the current name; max_tokens the deprecated
  // one. Neither: as many as the context and the server's limit allow.
  int64_t max_tokens = 0;
  LORAPLEX_RETURN_IF_ERROR(params.Integer(
      "max_tokens", 1, std::numeric_limits<int32_t>::max(), &max_tokens));
  LORAPLEX_RETURN_IF_ERROR(params.Integer("max_completion_tokens", 1,
                                          std::numeric_limits<int32_t>::max(),
                                          &max_tokens));
  if (max_tokens > 0) {
    sampling.max_tokens = max_tokens;
  } else {
    sampling.max_tokens_fills_context = true;
  }
  LORAPLEX_RETURN_IF_ERROR(params.Bool("logprobs", &request->logprobs));
  int64_t top_logprobs = 0;
  LORAPLEX_RETURN_IF_ERROR(
      params.Integer("top_logprobs", 0, kMaxTopLogprobs, &top_logprobs));
  if (top_logprobs > 0 && !request->logprobs) {
    return Invalid("top_logprobs", "needs logprobs: true");
  }
  sampling.top_logprobs = top_logprobs;
  return absl::OkStatus();
}

// JSON numbers cannot be -inf.
double JsonLogprob(double logprob) {
  return std::isfinite(logprob) ? logprob : kLowestLogprob;
}

std::string TokenBytes(const Tokenizer* tokenizer, int64_t id) {
  if (tokenizer == nullptr) return "";
  absl::StatusOr<std::string> text = tokenizer->Decode({id});
  return text.ok() ? *text : std::string();
}

nlohmann::json ByteList(const std::string& bytes) {
  nlohmann::json list = nlohmann::json::array();
  for (unsigned char byte : bytes) list.push_back(static_cast<int>(byte));
  return list;
}

// One token of a chat answer's logprobs.content.
nlohmann::json ChatLogprobEntry(const Tokenizer* tokenizer,
                                const OpenAiDrawn& drawn) {
  auto entry = [&](int64_t id, double logprob) {
    const std::string bytes = TokenBytes(tokenizer, id);
    return nlohmann::json{{"token", Utf8Lossy(bytes)},
                          {"logprob", JsonLogprob(logprob)},
                          {"bytes", ByteList(bytes)}};
  };
  nlohmann::json answer = entry(drawn.token, drawn.logprob);
  nlohmann::json top = nlohmann::json::array();
  for (const TokenLogprob& alternative : drawn.top) {
    top.push_back(entry(alternative.id, alternative.logprob));
  }
  answer["top_logprobs"] = std::move(top);
  return answer;
}

// Characters (code points) of UTF-8 `text`, as vLLM counts text_offset.
int64_t CharacterCount(const std::string& text) {
  int64_t count = 0;
  for (unsigned char byte : text) count += (byte & 0xC0) != 0x80;
  return count;
}

// A completion's logprobs object over `tokens`, whose text starts at
// character `text_offset` of the choice's text.
nlohmann::json CompletionLogprobs(const Tokenizer* tokenizer,
                                  const std::vector<OpenAiDrawn>& tokens,
                                  int64_t text_offset) {
  nlohmann::json strings = nlohmann::json::array();
  nlohmann::json logprobs = nlohmann::json::array();
  nlohmann::json tops = nlohmann::json::array();
  nlohmann::json offsets = nlohmann::json::array();
  int64_t offset = text_offset;
  for (const OpenAiDrawn& drawn : tokens) {
    const std::string text = Utf8Lossy(TokenBytes(tokenizer, drawn.token));
    strings.push_back(text);
    logprobs.push_back(JsonLogprob(drawn.logprob));
    nlohmann::json top = nlohmann::json::object();
    for (const TokenLogprob& alternative : drawn.top) {
      top[Utf8Lossy(TokenBytes(tokenizer, alternative.id))] =
          JsonLogprob(alternative.logprob);
    }
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += CharacterCount(text);
  }
  return {{"tokens", std::move(strings)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

std::vector<OpenAiDrawn> DrawnOf(const GeneratedSample& sample) {
  std::vector<OpenAiDrawn> drawn(sample.tokens.size());
  for (size_t t = 0; t < sample.tokens.size(); ++t) {
    drawn[t].token = sample.tokens[t];
    if (t < sample.logprobs.size()) drawn[t].logprob = sample.logprobs[t];
    if (t < sample.top.size()) drawn[t].top = sample.top[t];
  }
  return drawn;
}

nlohmann::json Usage(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

bool IsChat(const OpenAiRequest& request) {
  return request.endpoint == OpenAiEndpoint::kChatCompletions;
}

// Nesting beyond this is refused while parsing.
constexpr int kMaxBodyDepth = 64;

}  // namespace

absl::StatusOr<nlohmann::ordered_json> ParseOpenAiBody(
    const std::string& text) {
  using Event = nlohmann::ordered_json::parse_event_t;
  bool too_deep = false;
  auto on_event = [&](int depth, Event event, nlohmann::ordered_json&) {
    if ((event == Event::object_start || event == Event::array_start) &&
        depth >= kMaxBodyDepth) {
      too_deep = true;
    }
    // What lies too deep is discarded, so no deep value is ever built.
    return !too_deep;
  };
  nlohmann::ordered_json body =
      nlohmann::ordered_json::parse(text, on_event, /*allow_exceptions=*/false);
  if (too_deep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request body nests JSON deeper than ", kMaxBodyDepth, " levels"));
  }
  if (body.is_discarded()) {
    return absl::InvalidArgumentError("the request body is not valid JSON");
  }
  return body;
}

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(
    OpenAiEndpoint endpoint, const nlohmann::ordered_json& body) {
  if (!body.is_object()) {
    return Invalid("body", "must be a JSON object");
  }
  OpenAiRequest request;
  request.endpoint = endpoint;
  Params params(body);
  // Every field is type-checked before it is read; a JSON exception would
  // be a missed check, answered as a bad field rather than escaping.
  try {
    LORAPLEX_RETURN_IF_ERROR(ReadCommon(params, &request));
    if (endpoint == OpenAiEndpoint::kCompletions) {
      LORAPLEX_RETURN_IF_ERROR(ReadCompletion(params, &request));
    } else {
      LORAPLEX_RETURN_IF_ERROR(ReadChat(params, &request));
    }
  } catch (const nlohmann::json::exception& error) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request body has a field of the wrong type: ", error.what()));
  }
  LORAPLEX_RETURN_IF_ERROR(params.Unknown());
  return request;
}

absl::Status ResolveOpenAiModel(
    const std::string& model, const std::string& base_model_name,
    const std::function<absl::StatusOr<std::string>(const std::string&)>&
        tinker_adapter,
    SamplingRequest* sampling) {
  if (model == base_model_name) {
    sampling->weights_kind = SampleWeights::kBaseModel;
    return absl::OkStatus();
  }
  if (absl::StartsWith(model, "tinker://") && tinker_adapter) {
    absl::StatusOr<std::string> adapter = tinker_adapter(model);
    if (adapter.ok()) {
      sampling->weights_kind = SampleWeights::kAdapter;
      sampling->weights = FormatResourceName(kAdapters, *adapter);
      return absl::OkStatus();
    }
  }
  if (absl::StartsWith(model, "adapters/")) {
    sampling->weights_kind = SampleWeights::kAdapter;
    sampling->weights = model;
    return absl::OkStatus();
  }
  if (absl::StartsWith(model, "jobs/")) {
    sampling->weights_kind = absl::StrContains(model, "/checkpoints/")
                                 ? SampleWeights::kCheckpoint
                                 : SampleWeights::kJob;
    sampling->weights = model;
    return absl::OkStatus();
  }
  absl::Status status = absl::NotFoundError(absl::StrCat(
      "The model `", model, "` does not exist: use \"", base_model_name,
      "\" (the base model), adapters/{id}, jobs/{id}, "
      "jobs/{id}/checkpoints/{step} or a Tinker sampler path; GET /v1/models "
      "lists them"));
  status.SetPayload(kParamPayload, absl::Cord("model"));
  return status;
}

const char* OpenAiFinishReason(StopReason reason) {
  return reason == StopReason::kLength ? "length" : "stop";
}

nlohmann::json OpenAiResponse(const OpenAiRequest& request,
                              const SampleResult& result,
                              const OpenAiAnswerInfo& info) {
  nlohmann::json choices = nlohmann::json::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < result.samples.size(); ++i) {
    const GeneratedSample& sample = result.samples[i];
    completion_tokens += static_cast<int64_t>(sample.tokens.size());
    nlohmann::json choice = {{"index", i}};
    nlohmann::json logprobs = nullptr;
    if (request.logprobs) {
      const std::vector<OpenAiDrawn> drawn = DrawnOf(sample);
      if (IsChat(request)) {
        nlohmann::json content = nlohmann::json::array();
        for (const OpenAiDrawn& token : drawn) {
          content.push_back(ChatLogprobEntry(info.tokenizer, token));
        }
        logprobs = {{"content", std::move(content)}};
      } else {
        logprobs = CompletionLogprobs(info.tokenizer, drawn, 0);
      }
    }
    // Bytes that are not UTF-8 (a sample cut inside a character) as
    // replacement characters, as the stream and the gRPC API show them.
    const std::string text = Utf8Lossy(sample.text);
    if (IsChat(request)) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      choice["text"] = text;
    }
    choice["logprobs"] = std::move(logprobs);
    choice["finish_reason"] = OpenAiFinishReason(sample.stop_reason);
    choices.push_back(std::move(choice));
  }
  return {{"id", info.id},
          {"object", IsChat(request) ? "chat.completion" : "text_completion"},
          {"created", info.created},
          {"model", info.model},
          {"choices", std::move(choices)},
          {"usage", Usage(info.prompt_tokens, completion_tokens)}};
}

nlohmann::json OpenAiStreamChunk(const OpenAiRequest& request,
                                 const OpenAiAnswerInfo& info, int64_t index,
                                 bool first, const std::string& text,
                                 const std::vector<OpenAiDrawn>& tokens,
                                 int64_t* text_offset,
                                 std::optional<StopReason> finish) {
  nlohmann::json choice = {{"index", index}};
  nlohmann::json logprobs = nullptr;
  if (request.logprobs && !tokens.empty()) {
    if (IsChat(request)) {
      nlohmann::json content = nlohmann::json::array();
      for (const OpenAiDrawn& token : tokens) {
        content.push_back(ChatLogprobEntry(info.tokenizer, token));
      }
      logprobs = {{"content", std::move(content)}};
    } else {
      logprobs = CompletionLogprobs(info.tokenizer, tokens, *text_offset);
    }
  }
  for (const OpenAiDrawn& token : tokens) {
    *text_offset +=
        CharacterCount(Utf8Lossy(TokenBytes(info.tokenizer, token.token)));
  }
  if (IsChat(request)) {
    nlohmann::json delta = nlohmann::json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish.has_value()
                                ? nlohmann::json(OpenAiFinishReason(*finish))
                                : nlohmann::json(nullptr);
  return {
      {"id", info.id},
      {"object", IsChat(request) ? "chat.completion.chunk" : "text_completion"},
      {"created", info.created},
      {"model", info.model},
      {"choices", nlohmann::json::array({std::move(choice)})}};
}

nlohmann::json OpenAiUsageChunk(const OpenAiRequest& request,
                                const OpenAiAnswerInfo& info,
                                int64_t completion_tokens) {
  return {
      {"id", info.id},
      {"object", IsChat(request) ? "chat.completion.chunk" : "text_completion"},
      {"created", info.created},
      {"model", info.model},
      {"choices", nlohmann::json::array()},
      {"usage", Usage(info.prompt_tokens, completion_tokens)}};
}

OpenAiError OpenAiErrorOf(const absl::Status& status) {
  OpenAiError error;
  std::string type = "server_error";
  nlohmann::json code = nullptr;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      error.http_status = 400;
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      error.http_status = 401;
      type = "invalid_request_error";
      code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      error.http_status = 403;
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kNotFound:
      error.http_status = 404;
      type = "invalid_request_error";
      code = "model_not_found";
      break;
    case absl::StatusCode::kResourceExhausted:
      error.http_status = 429;
      type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      error.http_status = 503;
      break;
    default:
      error.http_status = 500;
      break;
  }
  nlohmann::json param = nullptr;
  if (auto carried = status.GetPayload(kParamPayload)) {
    param = std::string(*carried);
  } else if (error.http_status == 400) {
    // Errors from the sampling checks begin with the field they are about
    // ("max_tokens must be ...", "n must be ...").
    const std::string message(status.message());
    const size_t end = message.find_first_of(" :");
    const std::string first = message.substr(0, end);
    if (!first.empty() && std::all_of(first.begin(), first.end(), [](char c) {
          return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                 c == '_' || c == '.' || c == '[' || c == ']';
        })) {
      param = first;
    }
  }
  // What these endpoints cannot find is the weights `model` names.
  if (error.http_status == 404 && param.is_null()) param = "model";
  error.body = {{"error",
                 {{"message", std::string(status.message())},
                  {"type", type},
                  {"param", param},
                  {"code", code}}}};
  return error;
}

}  // namespace loraplex
