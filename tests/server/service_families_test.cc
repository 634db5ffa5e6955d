// The real loraplex-server on a checkpoint directory of each model family
// beyond Llama's layout (the architecture of the family's golden fixture,
// random weights, a byte-level BPE tokenizer.json and a chat template in
// tokenizer_config.json, as a downloaded instruct model has them):
// GetServerInfo names the family, a chat job trains to SUCCEEDED, its
// adapter exports in PEFT's layout and the job's weights sample greedily
// as a forward pass of the base plus that adapter does. On a
// mixture-of-experts base (qwen3_moe) the default targets adapt attention
// and the experts (exported as PEFT's target_parameters), dropout with them
// is refused at CreateJob and CreateSession, a session trains too, and the
// job's step metrics carry its router statistics (tokens per expert).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/lora/multi_lora.h"
#include "core/model/model_config.h"
#include "core/model/model_presets.h"
#include "tests/common/cli_process.h"
#include "tests/common/golden_files.h"
#include "tests/common/test_dir.h"
#include "tests/server/chat_model_dir.h"
#include "tests/server/service_fixture.h"
#include "tests/server/session_requests.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

struct FamilyCase {
  const char* golden_base;  // tests/fixtures/golden/<base>/config.json.
  const char* template_name;
};

// The family's architecture at a vocabulary that holds the fixture
// tokenizer's 1015 tokens, written as a hub download is laid out.
std::string WriteFamilyModel(const FamilyCase& family) {
  auto config = LoadModelConfig(GoldenPath(family.golden_base));
  EXPECT_TRUE(config.ok()) << config.status();
  config->vocab_size = 1024;
  config->max_position_embeddings = 256;
  const std::string dir = FreshTestDir("family-model");
  EXPECT_TRUE(WriteRandomModel(*config, /*seed=*/3, dir).ok());
  WriteChatTokenizer(dir, family.template_name);
  return dir;
}

std::string ChatLines() {
  std::string jsonl;
  for (int i = 0; i < 6; ++i) {
    nlohmann::json line = {
        {"messages",
         {{{"role", "user"},
           {"content", absl::StrCat("What is ", i, " + ", i, "?")}},
          {{"role", "assistant"},
           {"content", absl::StrCat("It is ", 2 * i, ".")}}}}};
    jsonl += line.dump() + "\n";
  }
  return jsonl;
}

// A session with the default targets (on a mixture-of-experts base:
// attention and the experts) takes forward_backward and optim_step calls,
// and its loss falls.
void ExpectSessionTrains(LoraplexClient& client) {
  auto session = client.CreateSession(
      SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 1e-2, /*seed=*/5));
  ASSERT_TRUE(session.ok()) << session.status();
  std::vector<double> losses;
  int64_t seq = 0;
  for (int step = 0; step < 4; ++step) {
    auto fb = client.ForwardBackward(CrossEntropy(session->name(), ++seq));
    ASSERT_TRUE(fb.ok()) << fb.status();
    ASSERT_EQ(fb->forward_backward().outputs_size(), 2);
    losses.push_back(fb->forward_backward().loss());
    auto stepped = client.OptimStep(Step(session->name(), ++seq, 1e-2));
    ASSERT_TRUE(stepped.ok()) << stepped.status();
  }
  EXPECT_LT(losses.back(), losses.front());
}

// Each step event of the job (and the job's latest metrics) carries its
// router statistics on a mixture-of-experts base: tokens per expert, adding
// up to top_k × the step's tokens × the sparse layers; none on a dense one.
void ExpectRouterStatistics(LoraplexClient& client, const v1::Job& job,
                            const ModelConfig& config) {
  int64_t sparse_layers = 0;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (config.moe.num_experts > 0 && LayerIsSparse(config, layer)) {
      ++sparse_layers;
    }
  }
  auto events = client.ListAllJobEvents(job.name());
  ASSERT_TRUE(events.ok()) << events.status();
  int64_t tokens = 0;
  int steps = 0;
  for (const v1::JobEvent& event : *events) {
    if (!event.has_metrics()) continue;
    const v1::JobMetrics& m = event.metrics();
    const int64_t step_tokens = m.tokens() - tokens;
    tokens = m.tokens();
    ++steps;
    if (sparse_layers == 0) {
      EXPECT_EQ(m.expert_tokens_size(), 0);
      continue;
    }
    ASSERT_EQ(m.expert_tokens_size(), config.moe.num_experts);
    int64_t sum = 0;
    for (int64_t count : m.expert_tokens()) sum += count;
    EXPECT_EQ(sum, config.moe.top_k * step_tokens * sparse_layers)
        << "step " << m.step();
  }
  EXPECT_GT(steps, 0);
  if (sparse_layers > 0) {
    auto latest = client.GetJob(job.name());
    ASSERT_TRUE(latest.ok()) << latest.status();
    EXPECT_EQ(latest->metrics().expert_tokens_size(), config.moe.num_experts);
  }
}

class ServiceFamiliesTest : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(ServiceFamiliesTest, TrainsExportsAndSamplesAChatJob) {
  const FamilyCase& family = GetParam();
  const std::string model_dir = WriteFamilyModel(family);
  auto model_config = LoadModelConfig(model_dir);
  ASSERT_TRUE(model_config.ok()) << model_config.status();

  auto server =
      StartServer(FreshTestDir("state"), /*slots=*/2,
                  {"--model", model_dir, "--model-name=acme/family-tiny"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  ASSERT_NE(client, nullptr);

  auto info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->base_model().family(), model_config->model_type);
  EXPECT_EQ(info->base_model().num_hidden_layers(),
            model_config->num_hidden_layers);

  auto dataset = client->UploadDatasetContents(ChatLines(), "chat");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  if (model_config->fused_projections) {
    // Part of a fused module alone is refused when the job is created.
    v1::CreateJobRequest partial =
        JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 4, 7);
    partial.mutable_lora()->add_target_modules("q_proj");
    auto refused = client->CreateJob(partial);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(),
                ::testing::HasSubstr("stores q_proj, k_proj, v_proj as one "
                                     "matrix, qkv_proj"));
  }
  if (model_config->moe.num_experts > 0) {
    // The default targets adapt the experts, which take no dropout.
    v1::CreateJobRequest dropout =
        JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 4, 7);
    dropout.mutable_lora()->set_dropout(0.1);
    auto refused = client->CreateJob(dropout);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(),
                ::testing::HasSubstr("lora.dropout must be 0 when the "
                                     "experts are adapted"));
    v1::CreateSessionRequest session =
        SessionRequest(v1::OPTIMIZER_FAMILY_ADAMW, 1e-2, /*seed=*/5);
    session.mutable_lora()->set_dropout(0.1);
    auto refused_session = client->CreateSession(session);
    ASSERT_FALSE(refused_session.ok());
    EXPECT_EQ(refused_session.status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused_session.status().message(),
                ::testing::HasSubstr("lora.dropout must be 0"));
    ExpectSessionTrains(*client);
  }
  v1::CreateJobRequest request =
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_MUON, 4, 4, 7);
  request.mutable_training()->set_seq_len(64);
  auto done = TrainToSuccess(*client, request, *server);
  ASSERT_TRUE(done.ok()) << done.status();
  ExpectRouterStatistics(*client, *done, *model_config);

  const std::string exported = FreshTestDir("export");
  v1::ExportAdapterRequest export_request;
  export_request.set_job(done->name());
  auto files = client->ExportAdapter(export_request, exported);
  ASSERT_TRUE(files.ok()) << files.status();
  auto adapter = LoadPeftAdapter(exported, *model_config);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->base_model_name_or_path, "acme/family-tiny");
  // Every projection of the family's layers (Phi-3's fused ones, the
  // experts' and the dense layers' MLP of a mixture-of-experts base
  // included).
  std::set<Projection> projections;
  for (int64_t layer = 0; layer < model_config->num_hidden_layers; ++layer) {
    for (Projection p : LayerProjections(*model_config, layer)) {
      projections.insert(p);
    }
  }
  EXPECT_EQ(adapter->config.targets.size(), projections.size());
  if (model_config->moe.num_experts > 0) {
    nlohmann::json config;
    std::ifstream(exported + "/adapter_config.json") >> config;
    EXPECT_THAT(config["target_parameters"],
                ::testing::UnorderedElementsAre("mlp.experts.gate_up_proj",
                                                "mlp.experts.down_proj"))
        << config.dump();
  }

  // Greedy samples from the job equal a forward pass of the base plus the
  // exported adapter, token by token.
  v1::SampleRequest sample;
  sample.set_job(done->name());
  sample.set_text("What is 2 + 2?");
  sample.set_max_tokens(6);
  sample.set_temperature(0);
  sample.set_ignore_eos(true);
  auto sampled = client->Sample(sample);
  ASSERT_TRUE(sampled.ok()) << sampled.status();
  ASSERT_EQ(sampled->samples_size(), 1);
  std::vector<int64_t> ids(sampled->prompt_tokens().begin(),
                           sampled->prompt_tokens().end());
  ASSERT_FALSE(ids.empty());

  auto model = LlamaModel::Load(model_dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  LoraWeights weights((*model)->config(), torch::kCPU);
  ASSERT_TRUE(weights.Bind(adapter->config).ok());
  ASSERT_TRUE(CopyPeftAdapter(*adapter, weights).ok());
  torch::NoGradGuard no_grad;
  for (int64_t token : sampled->samples(0).tokens()) {
    torch::Tensor input = torch::tensor(ids, torch::kInt64).unsqueeze(0);
    torch::Tensor lengths =
        torch::tensor({static_cast<int64_t>(ids.size())}, torch::kInt64);
    MultiLoraDelta delta({{&weights, 1}});
    auto logits = (*model)->Forward(input, lengths, &delta);
    ASSERT_TRUE(logits.ok()) << logits.status();
    // The sampler's choice is the argmax here, up to the rounding that
    // separates a KV-cache decode from a full forward pass.
    const torch::Tensor last =
        (*logits)[0][static_cast<int64_t>(ids.size()) - 1];
    EXPECT_GE(last[token].item<double>(), last.max().item<double>() - 1e-4)
        << "after " << ids.size() << " tokens";
    ids.push_back(token);
  }
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

// Four two-turn conversations whose assistant messages carry reasoning.
std::string ReasoningChatJsonl() {
  std::string jsonl;
  for (int i = 0; i < 4; ++i) {
    nlohmann::ordered_json line = {
        {"messages",
         {{{"role", "user"},
           {"content", absl::StrCat("Count to ", i + 2, ".")}},
          {{"role", "assistant"},
           {"reasoning_content", "Count up from one."},
           {"content", "1, 2."}},
          {{"role", "user"}, {"content", "Again, backwards."}},
          {{"role", "assistant"},
           {"reasoning_content", "Reverse it."},
           {"content", "2, 1."}}}}};
    jsonl += line.dump() + "\n";
  }
  return jsonl;
}

// A one-slot server on a Qwen3-style directory with a reasoning template.
std::unique_ptr<ServerProcess> StartReasoningServer() {
  return StartServer(FreshTestDir("state"), /*slots=*/1,
                     {"--model", WriteFamilyModel({"qwen3_tied", "qwen3"})});
}

// A Qwen3-style directory with a reasoning template: multi-turn lines with
// reasoning content, which the template renders differently once later turns
// follow, train one example per assistant turn to SUCCEEDED; and
// `loraplex sample --messages` renders with enable_thinking=false when asked.
TEST(ServiceFamiliesChatTest, ReasoningChatTrainsPerTurnAndSamplesWithKwargs) {
  auto server = StartReasoningServer();
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  ASSERT_NE(client, nullptr);

  auto dataset =
      client->UploadDatasetContents(ReasoningChatJsonl(), "reasoning");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_examples(), 8);  // Two turns a line.
  EXPECT_THAT(server->Log(),
              ::testing::HasSubstr(
                  "4 of 4 lines became one example per assistant turn"));
  v1::CreateJobRequest request =
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 3, 5);
  request.mutable_training()->set_seq_len(128);
  auto done = TrainToSuccess(*client, request, *server);
  ASSERT_TRUE(done.ok()) << done.status();
  auto events = client->ListAllJobEvents(done->name());
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_FALSE(events->empty());
  EXPECT_THAT(events->front().status_change().message(),
              ::testing::HasSubstr("4 of its 4 lines became one example per "
                                   "trained assistant turn"));

  const std::string messages = FreshTestDir("messages") + "/chat.json";
  std::ofstream(messages) << R"([{"role": "user", "content": "Count to 3."}])";
  auto sample = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "--server", server->address(), "--json",
        "sample",   "--messages",      messages,
        "--job",    done->name(),      "--max-tokens",
        "2",        "--temperature",   "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunCli(args);
  };
  const CliResult plain = sample({});
  ASSERT_EQ(plain.exit_code, 0) << plain.Describe();
  const CliResult no_thinking =
      sample({"--chat-template-kwargs", R"({"enable_thinking": false})"});
  ASSERT_EQ(no_thinking.exit_code, 0) << no_thinking.Describe();
  const auto plain_json = nlohmann::json::parse(plain.out);
  const auto no_thinking_json = nlohmann::json::parse(no_thinking.out);
  // The template's generation prompt gains an empty think block.
  ASSERT_TRUE(plain_json.contains("promptTokens")) << plain.out;
  EXPECT_GT(no_thinking_json["promptTokens"].size(),
            plain_json["promptTokens"].size());
  const CliResult bad = sample({"--chat-template-kwargs", "[1]"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.err, ::testing::HasSubstr(
                           "messages.chat_template_kwargs must be a JSON "
                           "object"));
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

// The upload's chat_template_kwargs and turns act on every chat line: turns
// "last" keeps one example a conversation, enable_thinking=false changes
// what the template renders and so what trains; a job over the dataset
// trains. Bad values name the header's field.
TEST(ServiceFamiliesChatTest, UploadLevelKwargsAndTurnsApplyToEveryLine) {
  auto server = StartReasoningServer();
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  ASSERT_NE(client, nullptr);
  const std::string jsonl = ReasoningChatJsonl();
  // "N tokens (M trained)" of the server's log line for the upload.
  auto trained_tokens = [&](const std::string& id) -> std::string {
    const std::string log = server->Log();
    const size_t at = log.find(absl::StrCat("dataset ", id));
    if (at == std::string::npos) return "";
    const size_t open = log.find(" tokens (", at);
    return log.substr(open, log.find(" trained)", open) - open);
  };
  auto last = client->UploadDatasetContents(jsonl, "last", {"", "last"});
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->num_examples(), 4);  // One turn a line, not two.

  // The CLI's flags, on the same file.
  const std::string file = FreshTestDir("upload") + "/chat.jsonl";
  std::ofstream(file) << jsonl;
  const CliResult uploaded =
      RunCli({"--server", server->address(), "--json", "datasets", "upload",
              file, "--turns", "last", "--chat-template-kwargs",
              R"({"enable_thinking": false})"});
  ASSERT_EQ(uploaded.exit_code, 0) << uploaded.Describe();
  const auto no_thinking = nlohmann::json::parse(uploaded.out);
  EXPECT_EQ(no_thinking["numExamples"], "4") << uploaded.out;
  const std::string no_thinking_id =
      no_thinking["name"].get<std::string>().substr(sizeof("datasets/") - 1);
  const std::string last_id = last->name().substr(sizeof("datasets/") - 1);
  ASSERT_FALSE(trained_tokens(last_id).empty()) << server->Log();
  // The generation prompt's empty think block is a prefix the answer shares.
  EXPECT_NE(trained_tokens(no_thinking_id), trained_tokens(last_id))
      << server->Log();

  // A job over it parses the stored file with the stored defaults.
  v1::CreateJobRequest request =
      JobRequest(no_thinking["name"].get<std::string>(),
                 v1::OPTIMIZER_FAMILY_ADAMW, 4, 3, 2);
  request.mutable_training()->set_seq_len(128);
  auto done = TrainToSuccess(*client, request, *server);
  ASSERT_TRUE(done.ok()) << done.status();
  for (const auto& [options, reason] :
       std::vector<std::pair<DatasetUploadOptions, std::string>>{
           {{"", "first"}, "header.turns must be \"all\" or \"last\""},
           {{"[1]", ""},
            "header.chat_template_kwargs must be a JSON object"}}) {
    auto bad = client->UploadDatasetContents(jsonl, "bad", options);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(bad.status().message()),
                ::testing::HasSubstr(reason));
  }
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

INSTANTIATE_TEST_SUITE_P(
    Families, ServiceFamiliesTest,
    ::testing::Values(FamilyCase{"qwen3_tied", "qwen3"},
                      FamilyCase{"olmo2_post_norm", "chatml"},
                      FamilyCase{"olmo3_window", "chatml"},
                      FamilyCase{"gemma3_text_window", "gemma"},
                      FamilyCase{"phi3_tied", "chatml"},
                      FamilyCase{"gemma3_mm", "gemma"},
                      FamilyCase{"qwen3_moe", "qwen3"},
                      FamilyCase{"gpt_oss", "chatml"}),
    [](const ::testing::TestParamInfo<FamilyCase>& info) {
      return std::string(info.param.golden_base);
    });

}  // namespace
}  // namespace loraplex
