// A sampling call as both API edges parse it (the v1 gRPC SamplingService
// from its proto, the Tinker REST API from its JSON body), and its one
// check into the trainer's SampleCommand: the prompt tokenized, the
// parameters checked, the weights found. No protobuf here.
//
//   SamplingRequest request;  // filled at the edge
//   request.prompt = SamplePrompt::kTokens;
//   request.tokens = {5, 17, 33};
//   LORAPLEX_ASSIGN_OR_RETURN(SampleCommand command,
//                             SampleCommandOf(context, tenant, request));
#ifndef LORAPLEX_SERVER_EDGES_SAMPLING_REQUEST_H_
#define LORAPLEX_SERVER_EDGES_SAMPLING_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/jobs/job_trainer.h"

namespace loraplex {

struct ServiceContext;

// Which of a request's prompts is set.
enum class SamplePrompt {
  kNone,      // None: refused.
  kText,      // `text`, tokenized with BOS first when the model has one.
  kTokens,    // `tokens`, as given.
  kMessages,  // `messages`, rendered with the model's chat template.
};

// Which weights a request samples; all but the base model are named by
// `SamplingRequest::weights`.
enum class SampleWeights {
  kBaseModel,   // The base model alone.
  kAdapter,     // A stored adapter: "adapters/{adapter_id}".
  kJob,         // A job's current (RUNNING) or trained weights.
  kCheckpoint,  // "jobs/{job_id}/checkpoints/{step}".
};

struct SampleChatMessage {
  std::string role;  // "system", "user", "assistant", "tool", ...
  std::string content;
};

// One sampling call, unchecked. The defaults are the APIs' defaults.
struct SamplingRequest {
  SamplePrompt prompt = SamplePrompt::kNone;
  std::string text;
  std::vector<int64_t> tokens;
  std::vector<SampleChatMessage> messages;
  // The chat messages as JSON objects, as the OpenAI API sends them (role,
  // content, tool_calls, tool_call_id, ...): used instead of `messages`
  // when not null.
  nlohmann::ordered_json message_objects;
  // The template's `tools` (null: none).
  nlohmann::ordered_json tools;
  // Further template variables of `messages`, a JSON object's text; empty:
  // none.
  std::string chat_template_kwargs;
  // Whether the rendered prompt ends with the assistant's turn opening.
  bool add_generation_prompt = true;

  SampleWeights weights_kind = SampleWeights::kBaseModel;
  std::string weights;

  int64_t n = 1;  // Samples drawn from the prompt.
  int64_t max_tokens = 256;
  // Instead of max_tokens: as many as the server's max_sample_tokens and
  // the model's context after the prompt allow.
  bool max_tokens_fills_context = false;
  double temperature = 1.0;      // 0: greedy.
  double top_p = 1.0;            // 1: off.
  int64_t top_k = 0;             // 0: off.
  std::optional<uint64_t> seed;  // None: a random one.
  std::vector<std::string> stop;
  // Empty: the tokenizer's EOS, unless ignore_eos.
  std::vector<int64_t> stop_token_ids;
  // stop_token_ids stop besides EOS (vLLM's meaning) rather than instead
  // of it; ignore_eos still leaves EOS out.
  bool stop_token_ids_add_to_eos = false;
  bool ignore_eos = false;
  int64_t top_logprobs = 0;
  bool prompt_logprobs = false;
};

// The trainer's command for `request` of `tenant`: its prompt tokenized,
// its weights found, its parameters checked. Errors are INVALID_ARGUMENT
// naming the field, NOT_FOUND / FAILED_PRECONDITION for the weights,
// INTERNAL for anything thrown (never an exception). Reads files (a
// checkpoint is verified): call on a worker.
absl::StatusOr<SampleCommand> SampleCommandOf(const ServiceContext& context,
                                              const std::string& tenant,
                                              const SamplingRequest& request);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_EDGES_SAMPLING_REQUEST_H_
