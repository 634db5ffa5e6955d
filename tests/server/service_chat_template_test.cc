// A Hugging Face style checkpoint directory (tokenizer.json, a
// tokenizer_config.json with its chat_template) served by the real
// loraplex-server: chat lines are rendered with the model's own template,
// tokenized as transformers tokenizes them (ids checked against the
// committed transformers rendering), trained and exported.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/model/model_presets.h"
#include "tests/common/cli_process.h"
#include "tests/common/golden_files.h"
#include "tests/common/test_dir.h"
#include "tests/server/chat_model_dir.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Golden(const std::string& relative) {
  return ChatFixture(relative);
}

std::vector<ordered_json> GoldenLines(const std::string& file) {
  return ReadGoldenLines(Golden(file));
}

// A tiny random Llama with room for the fixture tokenizer's 1015 tokens,
// laid out as a downloaded instruct model: the template comes from
// tokenizer_config.json.
std::string WriteChatModel(const std::string& template_name) {
  const std::string dir = FreshTestDir("chat-model");
  auto config = PresetConfig("tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  config->vocab_size = 1024;
  EXPECT_TRUE(WriteRandomModel(*config, /*seed=*/5, dir).ok());
  WriteChatTokenizer(dir, template_name);
  return dir;
}

TEST(ServiceChatTemplateTest, ChatJobTrainsOnTheModelsOwnRendering) {
  const std::string kTemplate = "qwen25";
  const std::string model_dir = WriteChatModel(kTemplate);
  std::map<std::string, ordered_json> expected;
  for (const ordered_json& line : GoldenLines("expected.jsonl")) {
    if (line["template"] == kTemplate &&
        line["add_generation_prompt"] == false) {
      expected[line["conversation"].get<std::string>()] = line;
    }
  }
  // Every fixture conversation the template renders and trains on.
  std::string jsonl;
  std::vector<ordered_json> goldens;
  int64_t tokens = 0, targets = 0;
  for (const ordered_json& c : GoldenLines("conversations.jsonl")) {
    const ordered_json& golden = expected.at(c["name"].get<std::string>());
    if (c.contains("kwargs") || golden["prefix_mask"].is_null()) continue;
    int64_t trained = 0;
    for (size_t i = 1; i < golden["prefix_mask"].size(); ++i) {
      trained += golden["prefix_mask"][i].get<int>();
    }
    bool has_answer = false;
    for (const ordered_json& m : c["messages"]) {
      has_answer = has_answer ||
                   (m["role"] == "assistant" && m.value("weight", 1) == 1 &&
                    m.value("content", ordered_json()).is_string() &&
                    !m["content"].get<std::string>().empty());
    }
    if (!has_answer) continue;
    ordered_json line = {{"messages", c["messages"]}};
    if (c.contains("tools")) line["tools"] = c["tools"];
    jsonl += line.dump() + "\n";
    goldens.push_back(golden);
    tokens += static_cast<int64_t>(golden["ids"].size());
    targets += trained;
  }
  ASSERT_GE(goldens.size(), 10u);

  // What training sees, shown by loraplex-tokenize: transformers' ids.
  const std::string dataset_path = FreshTestDir("chat-data") + "/chat.jsonl";
  std::ofstream(dataset_path) << jsonl;
  CliRunOptions tool;
  tool.program = "loraplex-tokenize";
  CliResult shown =
      RunCli({"--model", model_dir, "--input", dataset_path}, tool);
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  std::istringstream out(shown.out);
  size_t index = 0;
  for (std::string row; std::getline(out, row); ++index) {
    ASSERT_LT(index, goldens.size());
    const nlohmann::json parsed = nlohmann::json::parse(row);
    EXPECT_EQ(parsed["ids"], nlohmann::json(goldens[index]["ids"]))
        << goldens[index]["conversation"];
    std::vector<int> mask =
        goldens[index]["prefix_mask"].get<std::vector<int>>();
    mask[0] = 0;
    EXPECT_EQ(parsed["mask"], nlohmann::json(mask))
        << goldens[index]["conversation"];
  }
  EXPECT_EQ(index, goldens.size());

  const std::string state = FreshTestDir("state");
  ServerProcessOptions options;
  options.state_dir = state;
  options.slots = 2;
  options.model_dir = model_dir;
  options.extra_args = {"--model-name=acme/chat-tiny"};
  auto server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ClientFor(**server);
  ASSERT_NE(client, nullptr);
  auto dataset = client->UploadDatasetContents(jsonl, "chat");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_examples(), static_cast<int64_t>(goldens.size()));
  // The server parsed the same tokens and targets.
  EXPECT_THAT((*server)->Log(),
              HasSubstr(absl::StrCat(goldens.size(), " examples, ", tokens,
                                     " tokens (", targets, " trained)")));
  EXPECT_THAT((*server)->Log(), HasSubstr("chat lines are rendered with"));

  v1::CreateJobRequest request =
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 6, 3);
  request.mutable_training()->set_seq_len(256);
  auto job = client->CreateJob(request);
  ASSERT_TRUE(job.ok()) << job.status();
  auto done = WaitForJob(*client, job->name());
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED)
      << done->error().message() << "\n"
      << (*server)->Log();
  auto events = client->ListAllJobEvents(job->name());
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_FALSE(events->empty());
  EXPECT_THAT(events->front().status_change().message(),
              Not(HasSubstr("no chat template")));

  const std::string exported = FreshTestDir("export");
  v1::ExportAdapterRequest export_request;
  export_request.set_job(done->name());
  auto files = client->ExportAdapter(export_request, exported);
  ASSERT_TRUE(files.ok()) << files.status();
  std::ifstream adapter_config(exported + "/adapter_config.json");
  const nlohmann::json peft = nlohmann::json::parse(adapter_config);
  EXPECT_EQ(peft["base_model_name_or_path"], "acme/chat-tiny");
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

// A construct the Jinja subset lacks: chat uploads fail naming it, text
// still trains, and the server starts.
TEST(ServiceChatTemplateTest, AnUnsupportedTemplateFailsOnlyChatUploads) {
  const std::string model_dir = WriteChatModel("chatml");
  std::ofstream(model_dir + "/chat_template.jinja")
      << "{% extends 'base.jinja' %}";
  const std::string state = FreshTestDir("state");
  ServerProcessOptions options;
  options.state_dir = state;
  options.slots = 1;
  options.model_dir = model_dir;
  auto server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ClientFor(**server);
  ASSERT_NE(client, nullptr);
  auto chat = client->UploadDatasetContents(
      R"({"messages": [{"role": "user", "content": "hi"}, )"
      R"({"role": "assistant", "content": "yo"}]})"
      "\n",
      "chat");
  ASSERT_FALSE(chat.ok());
  EXPECT_EQ(chat.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(chat.status().message()), HasSubstr("line 1: "));
  EXPECT_THAT(std::string(chat.status().message()),
              HasSubstr("chat_template.jinja: line 1: the tag \"extends\" is "
                        "not supported"));
  auto text = client->UploadDatasetContents("{\"text\": \"plain\"}\n", "text");
  EXPECT_TRUE(text.ok()) << text.status();
  EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
}

// Without a template chat lines keep the built-in format, and the job says
// so.
TEST(ServiceChatTemplateTest, WithoutATemplateTheJobSaysChatUsesTheBuiltIn) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(state, /*slots=*/1);
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  ASSERT_NE(client, nullptr);
  auto dataset = client->UploadDatasetContents(
      R"({"messages": [{"role": "user", "content": "hi"}, )"
      R"({"role": "assistant", "content": "yo", "weight": 1}]})"
      "\n",
      "chat");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto job = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 2, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  auto done = WaitForJob(*client, job->name());
  ASSERT_TRUE(done.ok()) << done.status();
  auto events = client->ListAllJobEvents(job->name());
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_FALSE(events->empty());
  EXPECT_THAT(events->front().status_change().message(),
              HasSubstr("training_dataset: the base model has no chat "
                        "template, so its 1 chat line uses loraplex's "
                        "built-in format"));
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

}  // namespace
}  // namespace loraplex
