// libFuzzer target: an OpenAI API request body (/v1/completions and
// /v1/chat/completions) through what the server runs on it: the bounded
// parse, the request checks of both endpoints, and, for a request that
// passes, its whole answer and stream chunks built over a sample.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tokenizer/tokenizer.h"
#include "server/openai/openai_convert.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loraplex::ByteTokenizer* tokenizer =
      new loraplex::ByteTokenizer();
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<nlohmann::ordered_json> body = loraplex::ParseOpenAiBody(text);
  if (!body.ok()) {
    loraplex::OpenAiErrorOf(body.status()).body.dump();
    return 0;
  }
  for (loraplex::OpenAiEndpoint endpoint :
       {loraplex::OpenAiEndpoint::kCompletions,
        loraplex::OpenAiEndpoint::kChatCompletions}) {
    absl::StatusOr<loraplex::OpenAiRequest> request =
        loraplex::ParseOpenAiRequest(endpoint, *body);
    if (!request.ok()) {
      loraplex::OpenAiErrorOf(request.status()).body.dump();
      continue;
    }
    loraplex::ResolveOpenAiModel(request->model, "base", nullptr,
                                 &request->sampling)
        .IgnoreError();
    // A sample with a cut character, an EOS and alternatives.
    loraplex::SampleResult result;
    loraplex::GeneratedSample sample;
    sample.tokens = {'o', 0xC3, loraplex::ByteTokenizer::kEos};
    sample.logprobs = {-0.5, -1.0, -2.0};
    sample.top = {{{'o', -0.5}}, {}, {{'x', -3.0}}};
    sample.text = "o\xC3";
    result.samples = {sample};
    loraplex::OpenAiAnswerInfo info;
    info.model = request->model;
    info.tokenizer = tokenizer;
    loraplex::OpenAiResponse(*request, result, info)
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::vector<loraplex::OpenAiDrawn> drawn(1);
    drawn[0].token = 0xC3;
    int64_t offset = 0;
    loraplex::OpenAiStreamChunk(*request, info, 0, true, "o", drawn, &offset,
                                std::nullopt)
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return 0;
}
