#include "server/edges/sampling_request.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/resource_names.h"
#include "core/common/status_macros.h"
#include "core/runtime/exception_message.h"
#include "server/edges/checkpoint_access.h"
#include "server/edges/service_context.h"

namespace loraplex {
namespace {

uint64_t RandomSeed() {
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device();
}

absl::StatusOr<std::vector<int64_t>> PromptOf(const ServiceContext& context,
                                              const SamplingRequest& request) {
  const Tokenizer& tokenizer = context.datasets->tokenizer();
  switch (request.prompt) {
    case SamplePrompt::kText: {
      if (request.text.empty()) {
        return absl::InvalidArgumentError("text must not be empty");
      }
      LORAPLEX_ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                                tokenizer.Encode(request.text));
      if (tokenizer.bos_id().has_value()) {
        ids.insert(ids.begin(), *tokenizer.bos_id());
      }
      return ids;
    }
    case SamplePrompt::kTokens: {
      const std::vector<int64_t>& ids = request.tokens;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= context.model.vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrCat("tokens.ids[", i, "] must be in [0, ",
                           context.model.vocab_size, "), got ", ids[i]));
        }
      }
      return ids;
    }
    case SamplePrompt::kMessages: {
      if (context.chat_template == nullptr) {
        return absl::FailedPreconditionError(
            context.chat_template_error.ok()
                ? std::string("messages need the model's chat template, and "
                              "this model has none: send text or tokens")
                : absl::StrCat("the model's chat template cannot be used: ",
                               context.chat_template_error.message()));
      }
      nlohmann::ordered_json messages = request.message_objects;
      if (!messages.is_array()) {
        messages = nlohmann::ordered_json::array();
        for (const SampleChatMessage& message : request.messages) {
          messages.push_back(
              {{"role", message.role}, {"content", message.content}});
        }
      }
      if (messages.empty()) {
        return absl::InvalidArgumentError("messages must not be empty");
      }
      ChatRenderOptions options;
      options.add_generation_prompt = request.add_generation_prompt;
      options.tools = request.tools;
      if (const std::string& kwargs = request.chat_template_kwargs;
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
    case SamplePrompt::kNone:
      break;
  }
  return absl::InvalidArgumentError(
      "prompt is required: set text, tokens or messages");
}

// Fills the command's weights from the request's.
absl::Status ResolveWeights(const ServiceContext& context,
                            const std::string& tenant,
                            const SamplingRequest& request,
                            SampleCommand& command) {
  switch (request.weights_kind) {
    case SampleWeights::kAdapter: {
      LORAPLEX_ASSIGN_OR_RETURN(
          command.adapter_dir,
          FindStoredAdapter(context, tenant, request.weights, "adapter"));
      return absl::OkStatus();
    }
    case SampleWeights::kCheckpoint: {
      LORAPLEX_ASSIGN_OR_RETURN(
          CheckpointRef ref,
          ParseCheckpointName(request.weights, "checkpoint"));
      LORAPLEX_ASSIGN_OR_RETURN(
          command.adapter_dir,
          FindCheckpoint(context, tenant, request.weights, "checkpoint"));
      LORAPLEX_RETURN_IF_ERROR(
          CheckCheckpoint(command.adapter_dir, "checkpoint"));
      command.weights_step = ref.step;
      return absl::OkStatus();
    }
    case SampleWeights::kJob: {
      LORAPLEX_ASSIGN_OR_RETURN(JobWeights weights,
                                FindJobWeights(context, tenant, request.weights,
                                               "weights to sample from"));
      command.adapter_dir = weights.dir;
      command.job_id = weights.running_job_id;
      return absl::OkStatus();
    }
    case SampleWeights::kBaseModel:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::StatusOr<SampleCommand> CheckedSampleCommand(
    const ServiceContext& context, const std::string& tenant,
    const SamplingRequest& request) {
  SampleCommand command;
  command.tenant = tenant;
  LORAPLEX_ASSIGN_OR_RETURN(command.prompt, PromptOf(context, request));
  const int max_n = context.limits.max_samples_per_request;
  if (request.n < 1 || request.n > max_n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n must be in [1, ", max_n, "] (0 means 1), got ", request.n));
  }
  command.n = request.n;
  SamplingParams& params = command.params;
  params.max_tokens = request.max_tokens;
  if (request.max_tokens_fills_context) {
    const int64_t room = context.model.max_position_embeddings -
                         static_cast<int64_t>(command.prompt.size());
    params.max_tokens =
        std::max<int64_t>(1, std::min(context.limits.max_sample_tokens, room));
  }
  params.temperature = request.temperature;
  params.top_p = request.top_p;
  params.top_k = request.top_k;
  params.seed = request.seed.has_value() ? *request.seed : RandomSeed();
  params.stop = request.stop;
  params.stop_token_ids = request.stop_token_ids;
  const int64_t eos = context.datasets->tokenizer().eos_id();
  if (!request.ignore_eos &&
      (params.stop_token_ids.empty() ||
       (request.stop_token_ids_add_to_eos &&
        std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                  eos) == params.stop_token_ids.end()))) {
    params.stop_token_ids.push_back(eos);
  }
  params.top_logprobs = request.top_logprobs;
  params.prompt_logprobs = request.prompt_logprobs;
  SamplingLimits limits;
  limits.vocab_size = context.model.vocab_size;
  limits.max_positions = context.model.max_position_embeddings;
  limits.max_tokens = context.limits.max_sample_tokens;
  LORAPLEX_RETURN_IF_ERROR(ValidateSamplingParams(
      params, static_cast<int64_t>(command.prompt.size()), limits));
  LORAPLEX_RETURN_IF_ERROR(ResolveWeights(context, tenant, request, command));
  return command;
}

}  // namespace

absl::StatusOr<SampleCommand> SampleCommandOf(const ServiceContext& context,
                                              const std::string& tenant,
                                              const SamplingRequest& request) {
  // Every edge hands its callers' requests here: nothing may escape as an
  // exception (a template that throws, a file that vanishes mid-read).
  try {
    return CheckedSampleCommand(context, tenant, request);
  } catch (const std::exception& error) {
    return absl::InternalError(ExceptionMessage(error));
  }
}

}  // namespace loraplex
