// The OpenAI API's request and answer bodies to and from loraplex's
// sampling types: each parameter as the OpenAI API reference and vLLM's
// OpenAI-compatible server define it, and a 400 naming every parameter
// that is malformed or not supported. The SDK's own view of these bodies
// is tested against the real server in tests/openai/openai_sdk_test.py.
#include "server/openai/openai_convert.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"

namespace loraplex {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ordered_json = nlohmann::ordered_json;

absl::StatusOr<OpenAiRequest> Chat(ordered_json body) {
  return ParseOpenAiRequest(OpenAiEndpoint::kChatCompletions, body);
}
absl::StatusOr<OpenAiRequest> Completion(ordered_json body) {
  return ParseOpenAiRequest(OpenAiEndpoint::kCompletions, body);
}

ordered_json UserSays(const std::string& text) {
  return ordered_json::array({{{"role", "user"}, {"content", text}}});
}

// The `param` and HTTP status an error is answered with.
void ExpectRefused(const absl::StatusOr<OpenAiRequest>& parsed,
                   const std::string& param, const std::string& words) {
  ASSERT_FALSE(parsed.ok()) << param;
  const OpenAiError error = OpenAiErrorOf(parsed.status());
  EXPECT_EQ(error.http_status, 400) << parsed.status();
  EXPECT_EQ(error.body["error"]["param"], param) << parsed.status();
  EXPECT_EQ(error.body["error"]["type"], "invalid_request_error");
  EXPECT_THAT(error.body["error"]["message"].get<std::string>(),
              HasSubstr(words));
}

TEST(OpenAiConvertTest, CompletionParameters) {
  auto parsed = Completion({{"model", "base"},
                            {"prompt", "hello"},
                            {"max_tokens", 7},
                            {"temperature", 0.5},
                            {"top_p", 0.9},
                            {"top_k", 40},
                            {"n", 3},
                            {"best_of", 3},
                            {"seed", 11},
                            {"stop", "\n"},
                            {"stop_token_ids", {5, 6}},
                            {"logprobs", 2},
                            {"ignore_eos", true},
                            {"user", "someone"},
                            {"presence_penalty", 0},
                            {"stream", true},
                            {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const SamplingRequest& s = parsed->sampling;
  EXPECT_EQ(parsed->model, "base");
  EXPECT_EQ(s.prompt, SamplePrompt::kText);
  EXPECT_EQ(s.text, "hello");
  EXPECT_EQ(s.max_tokens, 7);
  EXPECT_EQ(s.temperature, 0.5);
  EXPECT_EQ(s.top_p, 0.9);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_EQ(s.n, 3);
  EXPECT_EQ(s.seed, 11u);
  EXPECT_THAT(s.stop, ElementsAre("\n"));
  EXPECT_THAT(s.stop_token_ids, ElementsAre(5, 6));
  EXPECT_TRUE(s.stop_token_ids_add_to_eos);  // As vLLM: besides EOS.
  EXPECT_EQ(s.top_logprobs, 2);
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_TRUE(parsed->logprobs);
  EXPECT_TRUE(parsed->stream);
  EXPECT_TRUE(parsed->include_usage);

  // OpenAI's defaults: 16 tokens, temperature 1, no logprobs; top_k -1 is
  // off; nulls are absent.
  parsed = Completion({{"model", "base"},
                       {"prompt", ordered_json::array({{1, 2, 3}})},
                       {"top_k", -1},
                       {"logprobs", nullptr},
                       {"suffix", nullptr}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->sampling.prompt, SamplePrompt::kTokens);
  EXPECT_THAT(parsed->sampling.tokens, ElementsAre(1, 2, 3));
  EXPECT_EQ(parsed->sampling.max_tokens, 16);
  EXPECT_EQ(parsed->sampling.temperature, 1.0);
  EXPECT_EQ(parsed->sampling.top_k, 0);
  EXPECT_FALSE(parsed->logprobs);
  EXPECT_FALSE(parsed->stream);
}

TEST(OpenAiConvertTest, ChatParameters) {
  ordered_json messages = ordered_json::array(
      {{{"role", "system"}, {"content", "be brief"}},
       {{"role", "user"},
        {"content",
         {{{"type", "text"}, {"text", "one"}},
          {{"type", "text"}, {"text", "two"}}}}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls",
         {{{"id", "c1"},
           {"type", "function"},
           {"function", {{"name", "f"}, {"arguments", "{}"}}}}}}},
       {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "42"}}});
  ordered_json tools = {{{"type", "function"},
                         {"function", {{"name", "f"}, {"parameters", {}}}}}};
  auto parsed = Chat({{"model", "adapters/a1"},
                      {"messages", messages},
                      {"tools", tools},
                      {"tool_choice", "auto"},
                      {"max_completion_tokens", 9},
                      {"logprobs", true},
                      {"top_logprobs", 3},
                      {"chat_template_kwargs", {{"enable_thinking", false}}},
                      {"reasoning_effort", "low"},
                      {"response_format", {{"type", "text"}}}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const SamplingRequest& s = parsed->sampling;
  EXPECT_EQ(s.prompt, SamplePrompt::kMessages);
  ASSERT_EQ(s.message_objects.size(), 4u);
  // Text parts joined by a newline, as vLLM gives string templates; the
  // other fields as sent, in their order.
  EXPECT_EQ(s.message_objects[1]["content"], "one\ntwo");
  EXPECT_EQ(s.message_objects[2].dump(), messages[2].dump());
  EXPECT_EQ(s.message_objects[3].dump(), messages[3].dump());
  EXPECT_EQ(s.tools, tools);
  EXPECT_EQ(s.max_tokens, 9);
  EXPECT_FALSE(s.max_tokens_fills_context);
  EXPECT_EQ(s.top_logprobs, 3);
  EXPECT_TRUE(parsed->logprobs);
  EXPECT_EQ(s.chat_template_kwargs,
            R"({"enable_thinking":false,"reasoning_effort":"low"})");
  EXPECT_TRUE(s.add_generation_prompt);

  // No token limit: as many as the context allows; tool_choice "none"
  // leaves the tools out of the prompt (as vLLM).
  parsed = Chat({{"model", "m"},
                 {"messages", UserSays("hi")},
                 {"tools", tools},
                 {"tool_choice", "none"},
                 {"max_tokens", nullptr}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->sampling.max_tokens_fills_context);
  EXPECT_TRUE(parsed->sampling.tools.is_null());
}

TEST(OpenAiConvertTest, BadOrUnsupportedParametersAreNamed) {
  const ordered_json base = {{"model", "m"}, {"prompt", "x"}};
  auto with = [&](const char* key, ordered_json value) {
    ordered_json body = base;
    body[key] = std::move(value);
    return Completion(body);
  };
  ExpectRefused(with("temperature", 2.5), "temperature", "[0, 2]");
  ExpectRefused(with("temperature", "hot"), "temperature", "a number");
  ExpectRefused(with("top_p", 0), "top_p", "> 0");
  ExpectRefused(with("n", 0), "n", "[1, ");
  ExpectRefused(with("max_tokens", 0), "max_tokens", "[1, ");
  ExpectRefused(with("logprobs", 21), "logprobs", "[0, 20]");
  ExpectRefused(with("presence_penalty", 0.5), "presence_penalty",
                "not supported");
  ExpectRefused(with("frequency_penalty", -1), "frequency_penalty",
                "not supported");
  ExpectRefused(with("logit_bias", {{"5", 100}}), "logit_bias",
                "not supported");
  ExpectRefused(with("echo", true), "echo", "not supported");
  ExpectRefused(with("suffix", "end"), "suffix", "not supported");
  ExpectRefused(with("best_of", 4), "best_of", "equal to n");
  ExpectRefused(with("stop", {1}), "stop[0]", "a string");
  ExpectRefused(with("stream_options", {{"include_usage", true}}),
                "stream_options", "stream: true");
  ExpectRefused(with("mirostat_tau", 5), "mirostat_tau",
                "not a parameter loraplex supports");
  ExpectRefused(with("prompt", {"a", "b"}), "prompt", "one prompt");
  ExpectRefused(with("prompt", {1, "x"}), "prompt[1]", "token id");
  ExpectRefused(Completion({{"prompt", "x"}}), "model", "required");
  ExpectRefused(Completion({{"model", "m"}}), "prompt", "required");

  const ordered_json chat = {{"model", "m"}, {"messages", UserSays("hi")}};
  auto chat_with = [&](const char* key, ordered_json value) {
    ordered_json body = chat;
    body[key] = std::move(value);
    return Chat(body);
  };
  ExpectRefused(chat_with("messages", ordered_json::array()), "messages",
                "non-empty");
  ExpectRefused(
      chat_with("messages",
                {{{"role", "user"},
                  {"content",
                   {{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}}}}}),
      "messages[0].content[0].type", "text parts only");
  ExpectRefused(chat_with("messages", {{{"content", "no role"}}}),
                "messages[0].role", "a string");
  ExpectRefused(chat_with("tool_choice", "required"), "tool_choice",
                "\"auto\" and \"none\"");
  ExpectRefused(chat_with("top_logprobs", 2), "top_logprobs",
                "needs logprobs: true");
  ExpectRefused(chat_with("response_format", {{"type", "json_object"}}),
                "response_format", "text");
  ExpectRefused(chat_with("response_format", {{"type", 1}}), "response_format",
                "text");
  ExpectRefused(chat_with("functions", ordered_json::array({{}})), "functions",
                "use tools");
  ExpectRefused(chat_with("continue_final_message", true),
                "continue_final_message", "not supported");
  ExpectRefused(chat_with("prompt", "x"), "prompt",
                "not a parameter loraplex supports");
}

// Bodies keep the client's key order; a body nested past 64 levels is
// refused while it is parsed, before anything recurses into it.
TEST(OpenAiConvertTest, BodiesAreParsedWithABoundedDepth) {
  auto body = ParseOpenAiBody(R"({"zeta": 1, "alpha": [2, {"b": 3}]})");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(body->begin().key(), "zeta");
  const std::string deep =
      "{\"n\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const absl::Status refused = ParseOpenAiBody(deep).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("deeper than 64 levels"));
  const std::string fits =
      "{\"n\": " + std::string(62, '[') + std::string(62, ']') + "}";
  EXPECT_TRUE(ParseOpenAiBody(fits).ok());
  EXPECT_THAT(ParseOpenAiBody("{\"model\": ").status().message(),
              HasSubstr("not valid JSON"));
}

TEST(OpenAiConvertTest, ModelNamesPickTheWeights) {
  SamplingRequest s;
  ASSERT_TRUE(ResolveOpenAiModel("base", "base", nullptr, &s).ok());
  EXPECT_EQ(s.weights_kind, SampleWeights::kBaseModel);
  ASSERT_TRUE(ResolveOpenAiModel("adapters/a1", "base", nullptr, &s).ok());
  EXPECT_EQ(s.weights_kind, SampleWeights::kAdapter);
  EXPECT_EQ(s.weights, "adapters/a1");
  ASSERT_TRUE(ResolveOpenAiModel("jobs/j1", "base", nullptr, &s).ok());
  EXPECT_EQ(s.weights_kind, SampleWeights::kJob);
  ASSERT_TRUE(
      ResolveOpenAiModel("jobs/j1/checkpoints/20", "base", nullptr, &s).ok());
  EXPECT_EQ(s.weights_kind, SampleWeights::kCheckpoint);
  EXPECT_EQ(s.weights, "jobs/j1/checkpoints/20");
  const std::string path = "tinker://s:train:0/sampler_weights/w";
  auto tinker = [&](const std::string& name) -> absl::StatusOr<std::string> {
    if (name == path) return std::string("a7");
    return absl::NotFoundError("no");
  };
  ASSERT_TRUE(ResolveOpenAiModel(path, "base", tinker, &s).ok());
  EXPECT_EQ(s.weights_kind, SampleWeights::kAdapter);
  EXPECT_EQ(s.weights, "adapters/a7");
  for (const char* unknown : {"gpt-4o", "tinker://s:train:0/weights/x", ""}) {
    const absl::Status status = ResolveOpenAiModel(unknown, "base", tinker, &s);
    const OpenAiError error = OpenAiErrorOf(status);
    EXPECT_EQ(error.http_status, 404) << unknown;
    EXPECT_EQ(error.body["error"]["param"], "model");
    EXPECT_EQ(error.body["error"]["code"], "model_not_found");
  }
}

OpenAiAnswerInfo Info(const Tokenizer* tokenizer) {
  OpenAiAnswerInfo info;
  info.id = "chatcmpl-1";
  info.created = 1700000000;
  info.model = "adapters/a1";
  info.prompt_tokens = 5;
  info.tokenizer = tokenizer;
  return info;
}

SampleResult TwoSamples() {
  SampleResult result;
  GeneratedSample a;
  a.tokens = {'h', 'i', ByteTokenizer::kEos};
  a.logprobs = {-0.5, -1.5, -0.25};
  a.top = {{{'h', -0.5}, {'x', -2.0}}, {{'i', -1.5}}, {{257, -0.25}}};
  a.stop_reason = StopReason::kStopToken;
  a.text = "hi";
  GeneratedSample b;
  b.tokens = {0xC3, 0xA9};  // "é" in two byte tokens.
  b.logprobs = {-1.0, -std::numeric_limits<double>::infinity()};
  b.top = {{}, {}};
  b.stop_reason = StopReason::kLength;
  b.text = "\xC3\xA9";
  result.samples = {a, b};
  return result;
}

TEST(OpenAiConvertTest, ChatAnswerAsOpenAiDefinesIt) {
  ByteTokenizer tokenizer;
  auto request = Chat({{"model", "adapters/a1"},
                       {"messages", UserSays("hi")},
                       {"logprobs", true},
                       {"top_logprobs", 2}});
  ASSERT_TRUE(request.ok());
  const nlohmann::json answer =
      OpenAiResponse(*request, TwoSamples(), Info(&tokenizer));
  EXPECT_EQ(answer["object"], "chat.completion");
  EXPECT_EQ(answer["id"], "chatcmpl-1");
  EXPECT_EQ(answer["created"], 1700000000);
  EXPECT_EQ(answer["model"], "adapters/a1");
  EXPECT_EQ(answer["usage"], nlohmann::json({{"prompt_tokens", 5},
                                             {"completion_tokens", 5},
                                             {"total_tokens", 10}}));
  const nlohmann::json& first = answer["choices"][0];
  EXPECT_EQ(first["index"], 0);
  EXPECT_EQ(first["message"],
            nlohmann::json({{"role", "assistant"}, {"content", "hi"}}));
  EXPECT_EQ(first["finish_reason"], "stop");
  const nlohmann::json& content = first["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  EXPECT_EQ(content[0]["token"], "h");
  EXPECT_EQ(content[0]["bytes"], nlohmann::json({104}));
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "x");
  EXPECT_EQ(content[0]["top_logprobs"][1]["logprob"], -2.0);
  // A special token has no text.
  EXPECT_EQ(content[2]["token"], "");
  EXPECT_EQ(content[2]["bytes"], nlohmann::json::array());
  const nlohmann::json& second = answer["choices"][1];
  EXPECT_EQ(second["index"], 1);
  EXPECT_EQ(second["finish_reason"], "length");
  // Half a character: a replacement character, with its byte; -inf as
  // vLLM answers it.
  EXPECT_EQ(second["logprobs"]["content"][0]["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(second["logprobs"]["content"][0]["bytes"], nlohmann::json({0xC3}));
  EXPECT_EQ(second["logprobs"]["content"][1]["logprob"], -9999.0);

  // Without logprobs: null.
  request = Chat({{"model", "m"}, {"messages", UserSays("hi")}});
  ASSERT_TRUE(request.ok());
  EXPECT_TRUE(OpenAiResponse(*request, TwoSamples(),
                             Info(&tokenizer))["choices"][0]["logprobs"]
                  .is_null());
}

TEST(OpenAiConvertTest, CompletionAnswerAndStreamChunks) {
  ByteTokenizer tokenizer;
  auto request = Completion({{"model", "m"}, {"prompt", "x"}, {"logprobs", 1}});
  ASSERT_TRUE(request.ok());
  const nlohmann::json answer =
      OpenAiResponse(*request, TwoSamples(), Info(&tokenizer));
  EXPECT_EQ(answer["object"], "text_completion");
  const nlohmann::json& choice = answer["choices"][0];
  EXPECT_EQ(choice["text"], "hi");
  EXPECT_EQ(choice["logprobs"]["tokens"], nlohmann::json({"h", "i", ""}));
  EXPECT_EQ(choice["logprobs"]["token_logprobs"],
            nlohmann::json({-0.5, -1.5, -0.25}));
  EXPECT_EQ(choice["logprobs"]["top_logprobs"][0],
            nlohmann::json({{"h", -0.5}, {"x", -2.0}}));
  EXPECT_EQ(choice["logprobs"]["text_offset"], nlohmann::json({0, 1, 2}));

  // A streamed chunk: the text settled, its tokens' logprobs at their
  // character offset in the choice's text (a two-byte character counts
  // one), then a last chunk with the reason.
  std::vector<OpenAiDrawn> drawn(3);
  drawn[0].token = 'i';
  drawn[0].logprob = -1.5;
  drawn[1].token = 0xC3;  // Half a character: one replacement character.
  drawn[2].token = 'x';
  int64_t offset = 4;
  nlohmann::json chunk = OpenAiStreamChunk(*request, Info(&tokenizer), 1, false,
                                           "i", drawn, &offset, std::nullopt);
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_EQ(chunk["choices"][0]["index"], 1);
  EXPECT_EQ(chunk["choices"][0]["text"], "i");
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["text_offset"],
            nlohmann::json({4, 5, 6}));
  EXPECT_EQ(offset, 7);
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  chunk = OpenAiStreamChunk(*request, Info(&tokenizer), 1, false, "", {},
                            &offset, StopReason::kStopString);
  EXPECT_EQ(chunk["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(chunk["choices"][0]["logprobs"].is_null());

  auto chat = Chat({{"model", "m"},
                    {"messages", UserSays("hi")},
                    {"stream", true},
                    {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(chat.ok());
  offset = 0;
  chunk = OpenAiStreamChunk(*chat, Info(&tokenizer), 0, true, "", {}, &offset,
                            std::nullopt);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["delta"],
            nlohmann::json({{"role", "assistant"}, {"content", ""}}));
  chunk = OpenAiStreamChunk(*chat, Info(&tokenizer), 0, false, "yo", {},
                            &offset, std::nullopt);
  EXPECT_EQ(chunk["choices"][0]["delta"], nlohmann::json({{"content", "yo"}}));
  const nlohmann::json usage = OpenAiUsageChunk(*chat, Info(&tokenizer), 3);
  EXPECT_EQ(usage["choices"], nlohmann::json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 8);
}

TEST(OpenAiConvertTest, StatusCodesAsOpenAiAnswersThem) {
  EXPECT_EQ(OpenAiErrorOf(absl::UnauthenticatedError("x")).http_status, 401);
  EXPECT_EQ(
      OpenAiErrorOf(absl::UnauthenticatedError("x")).body["error"]["code"],
      "invalid_api_key");
  EXPECT_EQ(OpenAiErrorOf(absl::ResourceExhaustedError("x")).http_status, 429);
  EXPECT_EQ(OpenAiErrorOf(absl::UnavailableError("x")).http_status, 503);
  EXPECT_EQ(OpenAiErrorOf(absl::InternalError("x")).http_status, 500);
  // A sampling check's message names its field first.
  const OpenAiError error = OpenAiErrorOf(
      absl::InvalidArgumentError("max_tokens must be in [1, 4096], got 9999"));
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.body["error"]["param"], "max_tokens");
}

}  // namespace
}  // namespace loraplex
