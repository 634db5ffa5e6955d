// `loraplex sample`: generate from the base model, a stored adapter, a job
// (its current weights while it runs) or a checkpoint. Streams the text as
// it is drawn; --json prints the whole response (token ids, logprobs).
// `loraplex chat`: a conversation with the same weights, one user turn per
// line of input, each reply streamed.
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli_commands.h"
#include "core/common/read_file.h"
#include "core/common/resource_names.h"
#include "core/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace loraplex {
namespace {

// The weights to sample, shared by `sample` and `chat`: at most one of them
// (none: the base model).
struct WeightsFlags {
  std::string adapter;
  std::string job;
  std::string checkpoint;
};

// How each token is drawn, shared by `sample` and `chat`.
struct DrawFlags {
  int64_t max_tokens;
  double temperature;
  double top_p = 1.0;
  int64_t top_k = 0;
  std::optional<uint64_t> seed = std::nullopt;
};

void AddWeightsFlags(CLI::App* command, WeightsFlags* flags) {
  command->add_option("--adapter", flags->adapter, "Adapter ID or adapters/ID")
      ->group("Weights");
  command->add_option("--job", flags->job, "Job ID or jobs/ID")
      ->group("Weights");
  command
      ->add_option("--checkpoint", flags->checkpoint,
                   "jobs/ID/checkpoints/STEP")
      ->group("Weights");
}

void AddDrawFlags(CLI::App* command, DrawFlags* flags, const std::string& per,
                  const std::string& seed_help) {
  command->add_option("--max-tokens", flags->max_tokens, "Tokens per " + per)
      ->capture_default_str();
  command->add_option("--temperature", flags->temperature, "0 for greedy")
      ->capture_default_str();
  command->add_option("--top-p", flags->top_p)->capture_default_str();
  command->add_option("--top-k", flags->top_k, "0: off")->capture_default_str();
  command->add_option("--seed", flags->seed, seed_help);
}

void SetDraw(const DrawFlags& flags, v1::SampleRequest* request) {
  request->set_max_tokens(flags.max_tokens);
  request->set_temperature(flags.temperature);
  request->set_top_p(flags.top_p);
  request->set_top_k(flags.top_k);
  if (flags.seed.has_value()) request->set_seed(*flags.seed);
}

struct SampleFlags {
  WeightsFlags weights;
  DrawFlags draw{.max_tokens = 256, .temperature = 1.0};
  std::string prompt;
  std::string messages_file;
  std::string chat_template_kwargs;
  std::string tokens;
  int n = 1;
  std::vector<std::string> stop;
  int top_logprobs = 0;
  bool prompt_logprobs = false;
  bool ignore_eos = false;
};

// The messages of a JSON file: a list of {"role", "content"} objects, or an
// object with such a "messages" list (one line of a chat dataset, whose
// chat_template_kwargs come along).
absl::Status ReadMessages(const std::string& path, v1::ChatPrompt* prompt) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  nlohmann::json parsed = nlohmann::json::parse(*text, nullptr, false);
  if (parsed.is_object() && parsed.contains("messages")) {
    if (parsed.contains("chat_template_kwargs")) {
      prompt->set_chat_template_kwargs(parsed["chat_template_kwargs"].dump());
    }
    parsed = parsed["messages"];
  }
  if (!parsed.is_array() || parsed.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": expected a JSON list of messages or an object "
                     "with \"messages\""));
  }
  for (size_t i = 0; i < parsed.size(); ++i) {
    const nlohmann::json& message = parsed[i];
    if (!message.is_object() || !message.contains("role") ||
        !message["role"].is_string() || !message.contains("content") ||
        !message["content"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": message ", i,
                       " needs string \"role\" and \"content\" fields"));
    }
    v1::ChatMessage* out = prompt->add_messages();
    out->set_role(message["role"].get<std::string>());
    out->set_content(message["content"].get<std::string>());
  }
  return absl::OkStatus();
}

// The weights of --adapter, --job or --checkpoint (none: the base model).
absl::Status SetWeights(const WeightsFlags& flags, v1::SampleRequest* request) {
  const std::string& adapter = flags.adapter;
  const std::string& job = flags.job;
  const std::string& checkpoint = flags.checkpoint;
  const int weights = !adapter.empty() + !job.empty() + !checkpoint.empty();
  if (weights > 1) {
    return absl::InvalidArgumentError(
        "give at most one of --adapter, --job and --checkpoint (none: the "
        "base model)");
  }
  if (!adapter.empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(std::string name,
                              ResourceName(kAdapters, adapter));
    request->set_adapter(name);
  }
  if (!job.empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(std::string name, ResourceName(kJobs, job));
    request->set_job(name);
  }
  if (!checkpoint.empty()) request->set_checkpoint(checkpoint);
  return absl::OkStatus();
}

absl::StatusOr<v1::SampleRequest> RequestOf(const SampleFlags& flags) {
  v1::SampleRequest request;
  const int prompts = !flags.prompt.empty() + !flags.messages_file.empty() +
                      !flags.tokens.empty();
  if (prompts != 1) {
    return absl::InvalidArgumentError(
        "sample needs exactly one of --prompt TEXT, --messages FILE and "
        "--tokens IDS");
  }
  if (!flags.prompt.empty()) request.set_text(flags.prompt);
  if (!flags.messages_file.empty()) {
    absl::Status read =
        ReadMessages(flags.messages_file, request.mutable_messages());
    if (!read.ok()) return read;
    if (!flags.chat_template_kwargs.empty()) {
      request.mutable_messages()->set_chat_template_kwargs(
          flags.chat_template_kwargs);
    }
  } else if (!flags.chat_template_kwargs.empty()) {
    return absl::InvalidArgumentError(
        "--chat-template-kwargs goes with --messages");
  }
  if (!flags.tokens.empty()) {
    for (absl::string_view piece : absl::StrSplit(flags.tokens, ',')) {
      int64_t id = 0;
      if (!absl::SimpleAtoi(piece, &id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tokens: \"", piece,
                         "\" is not a token id (give ids like 1,2,3)"));
      }
      request.mutable_tokens()->add_ids(id);
    }
  }
  LORAPLEX_RETURN_IF_ERROR(SetWeights(flags.weights, &request));
  request.set_n(flags.n);
  SetDraw(flags.draw, &request);
  for (const std::string& stop : flags.stop) request.add_stop(stop);
  request.set_top_logprobs(flags.top_logprobs);
  request.set_prompt_logprobs(flags.prompt_logprobs);
  request.set_ignore_eos(flags.ignore_eos);
  return request;
}

// Streams one sample's text to stdout as it is drawn, then what the stream
// held back (text that could have been the start of a stop string: the
// response's text is the whole sample) and a newline.
absl::StatusOr<v1::SampleResponse> StreamToOut(
    const CliContext& context, LoraplexClient& client,
    const v1::SampleRequest& request) {
  std::string printed;
  absl::StatusOr<v1::SampleResponse> response =
      client.StreamSample(request, [&](const v1::SampledToken& token) {
        context.out() << token.text() << std::flush;
        printed += token.text();
        return static_cast<bool>(context.out());
      });
  if (!response.ok()) return response;
  const std::string& text = response->samples(0).text();
  if (text.compare(0, printed.size(), printed) == 0) {
    context.out() << text.substr(printed.size());
  }
  context.out() << "\n" << std::flush;
  return response;
}

int RunSample(const CliContext& context, const SampleFlags& flags) {
  absl::StatusOr<v1::SampleRequest> request = RequestOf(flags);
  if (!request.ok()) return context.UsageError(request.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  if (context.options().json || flags.n > 1) {
    absl::StatusOr<v1::SampleResponse> response = (*client)->Sample(*request);
    if (!response.ok()) return context.ReportError(response.status());
    if (context.PrintJsonIfRequested(*response)) return kExitSuccess;
    for (int i = 0; i < response->samples_size(); ++i) {
      context.out() << "--- sample " << i + 1 << " ---\n"
                    << response->samples(i).text() << "\n";
    }
    return kExitSuccess;
  }
  absl::StatusOr<v1::SampleResponse> response =
      StreamToOut(context, **client, *request);
  if (!response.ok()) return context.ReportError(response.status());
  return kExitSuccess;
}

struct ChatFlags {
  WeightsFlags weights;
  DrawFlags draw{.max_tokens = 1024, .temperature = 0.7};
  std::string system;
  std::string chat_template_kwargs;
};

// One chat turn's request: the history so far, the weights and parameters.
absl::StatusOr<v1::SampleRequest> ChatRequestOf(
    const ChatFlags& flags,
    const std::vector<std::pair<std::string, std::string>>& history) {
  v1::SampleRequest request;
  v1::ChatPrompt* prompt = request.mutable_messages();
  for (const auto& [role, content] : history) {
    v1::ChatMessage* message = prompt->add_messages();
    message->set_role(role);
    message->set_content(content);
  }
  if (!flags.chat_template_kwargs.empty()) {
    prompt->set_chat_template_kwargs(flags.chat_template_kwargs);
  }
  LORAPLEX_RETURN_IF_ERROR(SetWeights(flags.weights, &request));
  SetDraw(flags.draw, &request);
  return request;
}

// Reads user turns from stdin, one per line, and streams each reply.
int RunChat(const CliContext& context, const ChatFlags& flags) {
  std::vector<std::pair<std::string, std::string>> history;
  if (!flags.system.empty()) history.emplace_back("system", flags.system);
  // Checked once before the first turn: a bad flag is a usage error.
  absl::StatusOr<v1::SampleRequest> checked = ChatRequestOf(flags, history);
  if (!checked.ok()) return context.UsageError(checked.status().message());
  auto client = context.Connect();
  if (!client.ok()) return context.UsageError(client.status().message());
  const bool interactive = isatty(STDIN_FILENO) != 0;
  if (interactive) {
    context.err() << "Chatting (/reset forgets the conversation, /exit or "
                     "Ctrl-D leaves).\n";
  }
  int exit_code = kExitSuccess;
  std::string line;
  for (;;) {
    if (interactive) context.err() << "you> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    const std::string turn(absl::StripAsciiWhitespace(line));
    if (turn.empty()) continue;
    // Commands start the line; " /path" is a message.
    const bool command = line[0] == '/';
    if (command && (turn == "/exit" || turn == "/quit")) break;
    if (command && turn == "/reset") {
      history.resize(flags.system.empty() ? 0 : 1);
      context.err() << "(the conversation starts over)\n";
      continue;
    }
    if (command) {
      context.err() << "unknown command " << turn
                    << " (/reset, /exit); to send a line starting with '/', "
                       "start it with a space\n";
      continue;
    }
    history.emplace_back("user", line);
    absl::StatusOr<v1::SampleRequest> request = ChatRequestOf(flags, history);
    if (!request.ok()) return context.UsageError(request.status().message());
    absl::StatusOr<v1::SampleResponse> response =
        StreamToOut(context, **client, *request);
    if (!response.ok()) {
      // The turn is forgotten; the conversation goes on.
      history.pop_back();
      context.ReportError(response.status());
      exit_code = kExitServerError;
      continue;
    }
    history.emplace_back("assistant", response->samples(0).text());
  }
  return exit_code;
}

}  // namespace

void AddSampleCommand(CLI::App& app, CliContext& context,
                      CommandAction* action) {
  auto flags = std::make_shared<SampleFlags>();
  CLI::App* sample = app.add_subcommand(
      "sample",
      "Generate text from the base model, a stored adapter, a job (its "
      "current weights while it runs) or a checkpoint");
  sample->add_option("--prompt", flags->prompt, "Prompt text")->group("Prompt");
  sample
      ->add_option("--messages", flags->messages_file,
                   "JSON file of chat messages, rendered with the model's "
                   "chat template")
      ->group("Prompt");
  sample
      ->add_option("--chat-template-kwargs", flags->chat_template_kwargs,
                   "Template variables for --messages, a JSON object: "
                   "'{\"enable_thinking\": false}'")
      ->group("Prompt");
  sample->add_option("--tokens", flags->tokens, "Prompt token ids: 1,2,3")
      ->group("Prompt");
  AddWeightsFlags(sample, &flags->weights);
  sample->add_option("-n,--n", flags->n, "Samples to draw")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  AddDrawFlags(sample, &flags->draw, "sample",
               "Seed (default: random, shown with --json)");
  sample->add_option("--stop", flags->stop, "Stop string (repeatable)");
  sample->add_option("--logprobs", flags->top_logprobs,
                     "Alternatives per token (with --json)");
  sample->add_flag("--prompt-logprobs", flags->prompt_logprobs,
                   "Also the prompt's logprobs (with --json)");
  sample->add_flag("--ignore-eos", flags->ignore_eos,
                   "Do not stop at the tokenizer's EOS");
  SetAction(sample, action,
            [&context, flags] { return RunSample(context, *flags); });
}

void AddChatCommand(CLI::App& app, CliContext& context, CommandAction* action) {
  auto flags = std::make_shared<ChatFlags>();
  CLI::App* chat = app.add_subcommand(
      "chat",
      "Chat in the terminal with the base model, an adapter, a job or a "
      "checkpoint: each line is a user turn, the reply streams as it is "
      "drawn (the model's chat template renders the conversation)");
  AddWeightsFlags(chat, &flags->weights);
  chat->add_option("--system", flags->system, "A system message first");
  chat->add_option("--chat-template-kwargs", flags->chat_template_kwargs,
                   "Template variables, a JSON object: "
                   "'{\"enable_thinking\": false}'");
  AddDrawFlags(chat, &flags->draw, "reply", "Seed (default: random)");
  SetAction(chat, action,
            [&context, flags] { return RunChat(context, *flags); });
}

}  // namespace loraplex
