// The `loraplex` CLI end to end against the real loraplex-server (skipped
// until the server is built).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "client/quickstart_data.h"
#include "nlohmann/json.hpp"
#include "tests/common/cli_process.h"
#include "tests/common/server_process.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Files directly in `dir`.
std::vector<std::string> FileNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class CliServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerProcessOptions options;
    options.state_dir = FreshTestDir("state");
    state_dir_ = options.state_dir;
    auto server = ServerProcess::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
  }
  void TearDown() override {
    if (server_ != nullptr) {
      absl::Status stopped = server_->Stop();
      EXPECT_TRUE(stopped.ok()) << stopped << "\n" << server_->Log();
    }
  }

  CliResult Run(std::vector<std::string> args) {
    args.insert(args.begin(), {"--server", server_->address()});
    return RunCli(args);
  }

  std::string state_dir_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(CliServerTest, UploadTrainWaitAndExport) {
  const CliResult info = Run({"info"});
  ASSERT_EQ(info.exit_code, 0) << info.Describe() << server_->Log();

  const std::string dir = FreshTestDir();
  const std::string data_path = dir + "/reverse.jsonl";
  std::ofstream(data_path) << QuickstartDatasetJsonl();
  const CliResult upload = Run({"--json", "datasets", "upload", data_path});
  ASSERT_EQ(upload.exit_code, 0) << upload.Describe();
  const auto dataset = nlohmann::json::parse(upload.out);
  const std::string dataset_name = dataset["name"];
  EXPECT_EQ(dataset["numExamples"], std::to_string(kQuickstartExampleCount));

  const CliResult create =
      Run({"--json", "jobs", "create", "--dataset", dataset_name, "--rank", "4",
           "--targets", "q_proj,v_proj,lm_head", "--seq-len", "64",
           "--batch-size", "2", "--max-steps", "3", "--lr", "0.002", "--wait"});
  ASSERT_EQ(create.exit_code, 0) << create.Describe() << server_->Log();
  const auto job = nlohmann::json::parse(create.out);
  EXPECT_EQ(job["status"], "JOB_STATUS_SUCCEEDED");
  EXPECT_EQ(job["lora"]["rank"], "4");
  EXPECT_EQ(job["lora"]["targetModules"],
            nlohmann::json({"q_proj", "v_proj", "lm_head"}));
  const std::string job_name = job["name"];

  const CliResult list = Run({"jobs", "list"});
  EXPECT_EQ(list.exit_code, 0) << list.Describe();
  EXPECT_THAT(list.out, HasSubstr("SUCCEEDED"));

  const CliResult events = Run({"jobs", "events", job_name});
  EXPECT_EQ(events.exit_code, 0) << events.Describe();
  EXPECT_THAT(events.out, HasSubstr("step 3"));

  const std::string out_dir = dir + "/adapter";
  const CliResult exported =
      Run({"adapters", "export", job_name, "--out", out_dir});
  ASSERT_EQ(exported.exit_code, 0) << exported.Describe();
  EXPECT_THAT(exported.err, HasSubstr("LoRA on lm_head; PEFT loads it, vLLM"));
  EXPECT_EQ(FileNames(out_dir),
            (std::vector<std::string>{"adapter_config.json",
                                      "adapter_model.safetensors"}));

  const CliResult watch = Run({"jobs", "watch", job_name});
  EXPECT_EQ(watch.exit_code, 0) << watch.Describe();
  EXPECT_THAT(watch.out, HasSubstr("SUCCEEDED"));

  // Deleting the job keeps its adapter; then the adapter goes too.
  const CliResult removed = Run({"jobs", "rm", job_name});
  EXPECT_EQ(removed.exit_code, 0) << removed.Describe();
  EXPECT_EQ(removed.out, "Deleted " + job_name + "\n");
  const CliResult gone = Run({"jobs", "get", job_name});
  EXPECT_EQ(gone.exit_code, 1) << gone.Describe();
  EXPECT_THAT(gone.err, HasSubstr("NOT_FOUND"));
  const std::string adapter = job["adapter"];
  const CliResult removed_adapter = Run({"adapters", "rm", adapter});
  EXPECT_EQ(removed_adapter.exit_code, 0) << removed_adapter.Describe();
  EXPECT_THAT(Run({"adapters", "list"}).out, Not(HasSubstr(adapter.substr(9))));
}

// --version, the start-up log and `loraplex info` name the LibTorch this
// was built against (LORAPLEX_TEST_TORCH_VERSION, from CMake's find_package),
// the BLAS and the threads the server runs with.
TEST_F(CliServerTest, SaysWhatTheServerRunsOn) {
  const std::string torch = LORAPLEX_TEST_TORCH_VERSION;
  CliRunOptions server_program;
  server_program.program = "loraplex-server";
  const CliResult version = RunCli({"--version"}, server_program);
  ASSERT_EQ(version.exit_code, 0) << version.Describe();
  EXPECT_THAT(version.out, HasSubstr("loraplex-server 0."));
  EXPECT_THAT(version.out,
              HasSubstr("model families: llama, qwen2, mistral, qwen3, olmo2, "
                        "olmo3, gemma3_text"));
  EXPECT_THAT(version.out, HasSubstr("LibTorch: " + torch));
  EXPECT_THAT(version.out, HasSubstr("BLAS: "));
  EXPECT_THAT(version.out, Not(HasSubstr("BLAS: unknown")));
  EXPECT_THAT(version.out, HasSubstr(" intra-op thread(s)"));
  // Passive OpenMP waiting only where the BLAS has threads of its own
  // (OpenBLAS); with LibTorch's MKL it would slow every parallel region.
  if (const char* inherited = std::getenv("OMP_WAIT_POLICY")) {
    EXPECT_THAT(version.out,
                HasSubstr(std::string("OMP_WAIT_POLICY ") + inherited));
  } else if (version.out.find("BLAS: MKL") != std::string::npos) {
    EXPECT_THAT(version.out, HasSubstr("OMP_WAIT_POLICY unset"));
  } else {
    EXPECT_THAT(version.out, HasSubstr("OMP_WAIT_POLICY passive"));
  }

  EXPECT_THAT(server_->Log(), HasSubstr("LibTorch: " + torch));
  const CliResult info = Run({"info"});
  ASSERT_EQ(info.exit_code, 0) << info.Describe();
  EXPECT_THAT(info.out, HasSubstr(torch));
  EXPECT_THAT(info.out, HasSubstr("BLAS:"));
  const CliResult json = Run({"--json", "info"});
  ASSERT_EQ(json.exit_code, 0) << json.Describe();
  const auto runtime = nlohmann::json::parse(json.out)["runtime"];
  EXPECT_EQ(runtime["torchVersion"], torch);
  // This server runs with one thread per core (the default) unless
  // LORAPLEX_TEST_THREADS says otherwise.
  const int threads = TestThreadsOverride().value_or(
      static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(runtime["intraOpThreads"], threads) << json.out;
}

TEST_F(CliServerTest, SampleStreamsTextAndPrintsJson) {
  // Streamed text equals the whole response's text (greedy, the same
  // request).
  const CliResult streamed =
      Run({"sample", "--prompt", "reverse: lamp\n", "--temperature", "0",
           "--max-tokens", "6", "--ignore-eos"});
  ASSERT_EQ(streamed.exit_code, 0) << streamed.Describe() << server_->Log();
  const CliResult json = Run(
      {"--json", "sample", "--prompt", "reverse: lamp\n", "--temperature", "0",
       "--max-tokens", "6", "--ignore-eos", "--logprobs", "3", "--seed", "9"});
  ASSERT_EQ(json.exit_code, 0) << json.Describe();
  const auto response = nlohmann::json::parse(json.out);
  ASSERT_EQ(response["samples"].size(), 1u);
  const auto& sample = response["samples"][0];
  EXPECT_EQ(sample["tokens"].size(), 6u);
  EXPECT_EQ(sample["logprobs"].size(), 6u);
  EXPECT_EQ(sample["topLogprobs"][0]["alternatives"].size(), 3u);
  EXPECT_EQ(sample["stopReason"], "STOP_REASON_LENGTH");
  EXPECT_EQ(response["seed"], "9");
  EXPECT_EQ(streamed.out, sample["text"].get<std::string>() + "\n");

  const CliResult several = Run({"sample", "--prompt", "a", "-n", "2",
                                 "--max-tokens", "3", "--seed", "1"});
  EXPECT_EQ(several.exit_code, 0) << several.Describe();
  EXPECT_THAT(several.out, HasSubstr("--- sample 2 ---"));

  const CliResult two_prompts =
      Run({"sample", "--prompt", "a", "--tokens", "1,2"});
  EXPECT_EQ(two_prompts.exit_code, 2);
  EXPECT_THAT(two_prompts.err, HasSubstr("exactly one of --prompt"));
  const CliResult bad_ids = Run({"sample", "--tokens", "1,x"});
  EXPECT_EQ(bad_ids.exit_code, 2);
  EXPECT_THAT(bad_ids.err, HasSubstr("\"x\" is not a token id"));
  const CliResult no_job = Run({"sample", "--prompt", "a", "--job", "nope"});
  EXPECT_EQ(no_job.exit_code, 1);
  EXPECT_THAT(no_job.err, HasSubstr("NOT_FOUND"));
}

TEST_F(CliServerTest, QuickstartUsesTheRunningServer) {
  const std::string dir = FreshTestDir("quickstart");
  const CliResult result = Run({"quickstart", "--dir", dir, "--steps", "3"});
  ASSERT_EQ(result.exit_code, 0) << result.Describe() << server_->Log();
  EXPECT_THAT(result.out, Not(HasSubstr("Started loraplex-server")));
  std::vector<std::string> job_dirs = FileNames(dir + "/adapters");
  ASSERT_EQ(job_dirs.size(), 3u) << result.Describe();
  for (const std::string& job_dir : job_dirs) {
    EXPECT_EQ(FileNames(dir + "/adapters/" + job_dir),
              (std::vector<std::string>{"adapter_config.json",
                                        "adapter_model.safetensors"}));
  }
  for (const char* text : {"adamw", "muon", "adam", "LOSS", "->"}) {
    EXPECT_THAT(result.out, HasSubstr(text));
  }
  // It ends by sampling each trained adapter once.
  for (const std::string& job_dir : job_dirs) {
    EXPECT_THAT(result.out,
                HasSubstr("Sample " + job_dir + ": \"reverse: lamp\\n\" -> \""))
        << result.out;
  }
}

// On a model with fewer positions than the default seq_len (512), a job
// that leaves seq_len unset gets the model's max_position_embeddings:
// `adapters attach DIR --evaluate DS` and `jobs create` work without
// --seq-len, and a --seq-len past the model is refused naming the field.
TEST_F(CliServerTest, DefaultSeqLenFitsAModelWithFewerPositions) {
  // The built-in tiny model (written by the fixture's server) with 256
  // positions.
  const std::string model_dir = FreshTestDir("short-model");
  std::filesystem::copy(state_dir_ + "/models/tiny", model_dir,
                        std::filesystem::copy_options::recursive);
  nlohmann::json config;
  std::ifstream(model_dir + "/config.json") >> config;
  ASSERT_TRUE(config.contains("max_position_embeddings"));
  config["max_position_embeddings"] = 256;
  std::ofstream(model_dir + "/config.json") << config.dump(2);
  ServerProcessOptions options;
  options.state_dir = FreshTestDir("short-state");
  options.model_dir = model_dir;
  auto server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--server", (*server)->address()});
    return RunCli(args);
  };

  const std::string dir = FreshTestDir();
  std::ofstream(dir + "/reverse.jsonl") << QuickstartDatasetJsonl();
  const CliResult upload =
      run({"--json", "datasets", "upload", dir + "/reverse.jsonl"});
  ASSERT_EQ(upload.exit_code, 0) << upload.Describe();
  const std::string dataset = nlohmann::json::parse(upload.out)["name"];

  // An adapter to attach, trained with a seq_len that fits.
  const CliResult train = run({"--json", "jobs", "create", "--dataset", dataset,
                               "--rank", "4", "--seq-len", "64", "--batch-size",
                               "2", "--max-steps", "2", "--wait"});
  ASSERT_EQ(train.exit_code, 0) << train.Describe() << (*server)->Log();
  const auto trained = nlohmann::json::parse(train.out);
  EXPECT_EQ(trained["training"]["seqLen"], "64");
  const std::string adapter_dir = dir + "/adapter";
  const CliResult exported =
      run({"adapters", "export", trained["name"].get<std::string>(), "--out",
           adapter_dir});
  ASSERT_EQ(exported.exit_code, 0) << exported.Describe();

  const CliResult attach = run({"--json", "adapters", "attach", adapter_dir,
                                "--evaluate", dataset, "--wait"});
  ASSERT_EQ(attach.exit_code, 0) << attach.Describe() << (*server)->Log();
  const auto evaluated = nlohmann::json::parse(attach.out);
  EXPECT_EQ(evaluated["status"], "JOB_STATUS_SUCCEEDED");
  EXPECT_EQ(evaluated["training"]["seqLen"], "256");

  const CliResult create =
      run({"--json", "jobs", "create", "--dataset", dataset, "--rank", "4",
           "--batch-size", "2", "--max-steps", "2", "--wait"});
  ASSERT_EQ(create.exit_code, 0) << create.Describe() << (*server)->Log();
  const auto job = nlohmann::json::parse(create.out);
  EXPECT_EQ(job["status"], "JOB_STATUS_SUCCEEDED");
  EXPECT_EQ(job["training"]["seqLen"], "256");

  // A seq_len asked for is never changed.
  for (const std::string command : {"attach", "create"}) {
    std::vector<std::string> args =
        command == "attach"
            ? std::vector<std::string>{"adapters", "attach", adapter_dir,
                                       "--evaluate", dataset}
            : std::vector<std::string>{"jobs", "create", "--dataset", dataset};
    args.insert(args.end(), {"--seq-len", "512"});
    const CliResult refused = run(args);
    EXPECT_EQ(refused.exit_code, 1) << refused.Describe();
    EXPECT_THAT(refused.err, HasSubstr("INVALID_ARGUMENT"));
    EXPECT_THAT(refused.err,
                HasSubstr("training.seq_len must be at most the base model's "
                          "max_position_embeddings (256), got 512"));
  }
  const absl::Status stopped = (*server)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

TEST(CliQuickstartTest, StartsAndStopsItsOwnServer) {
  const std::string dir = FreshTestDir();
  // Port 1 on loopback: nothing listens there.
  const CliResult result = RunCli(
      {"--server", "127.0.0.1:1", "quickstart", "--dir", dir, "--steps", "2"});
  ASSERT_EQ(result.exit_code, 0) << result.Describe();
  EXPECT_THAT(result.out, HasSubstr("Started loraplex-server"));
  EXPECT_THAT(result.out, HasSubstr("Stopping the loraplex-server"));
  EXPECT_EQ(FileNames(dir + "/adapters").size(), 3u);
  EXPECT_TRUE(std::filesystem::exists(dir + "/state/server.log"));
}

// `loraplex chat` talks turn by turn with the model's chat template: each
// reply equals `loraplex sample --messages` of the conversation so far
// (greedy), /reset starts over, and a bad flag is a usage error.
TEST(CliChatTest, RepliesTurnByTurnAsSampleDoes) {
  const std::string model_dir = FreshTestDir("chat-model");
  CliRunOptions make_model;
  make_model.program = "loraplex-make-model";
  const CliResult made = RunCli(
      {"--preset", "tiny", "--seed", "7", "--out", model_dir}, make_model);
  ASSERT_EQ(made.exit_code, 0) << made.Describe();
  // A template written for this test.
  std::ofstream(model_dir + "/chat_template.jinja")
      << "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n"
         "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
  ServerProcessOptions options;
  options.state_dir = FreshTestDir("state");
  options.model_dir = model_dir;
  auto server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();

  const std::vector<std::string> params = {"--temperature", "0", "--max-tokens",
                                           "5"};
  auto sample = [&](const nlohmann::json& messages) {
    const std::string file = FreshTestDir("messages") + "/m.json";
    std::ofstream(file) << messages.dump();
    std::vector<std::string> args = {"--server", address,      "--json",
                                     "sample",   "--messages", file};
    args.insert(args.end(), params.begin(), params.end());
    const CliResult result = RunCli(args);
    EXPECT_EQ(result.exit_code, 0) << result.Describe();
    return nlohmann::json::parse(result.out, nullptr, false)["samples"][0]
        .value("text", std::string("?"));
  };
  const nlohmann::json system = {{"role", "system"}, {"content", "be brief"}};
  const nlohmann::json hello = {{"role", "user"}, {"content", "hello"}};
  const std::string first = sample({system, hello});
  const std::string third = sample({system,
                                    hello,
                                    {{"role", "assistant"}, {"content", first}},
                                    {{"role", "user"}, {"content", "again"}}});
  // A line starting with a space is a message, even when a command follows.
  const std::string fourth =
      sample({system,
              hello,
              {{"role", "assistant"}, {"content", first}},
              {{"role", "user"}, {"content", "again"}},
              {{"role", "assistant"}, {"content", third}},
              {{"role", "user"}, {"content", " /bogus"}}});

  CliRunOptions chat_options;
  chat_options.input =
      "hello\n/reset\n\nhello\nagain\n/bogus\n /bogus\n/exit\nignored\n";
  std::vector<std::string> args = {"--server", address, "chat", "--system",
                                   "be brief"};
  args.insert(args.end(), params.begin(), params.end());
  const CliResult chat = RunCli(args, chat_options);
  ASSERT_EQ(chat.exit_code, 0) << chat.Describe();
  // Replies only on stdout: the first, the same after /reset, then the
  // answers to "again" and " /bogus" with the whole conversation before
  // them.
  EXPECT_EQ(chat.out,
            first + "\n" + first + "\n" + third + "\n" + fourth + "\n");
  EXPECT_THAT(chat.err, HasSubstr("(the conversation starts over)"));
  EXPECT_THAT(chat.err, HasSubstr("unknown command /bogus"));

  const CliResult two_weights =
      RunCli({"--server", address, "chat", "--job", "j1", "--adapter", "a1"},
             chat_options);
  EXPECT_EQ(two_weights.exit_code, 2) << two_weights.Describe();
  EXPECT_THAT(two_weights.err, HasSubstr("at most one of --adapter"));
  const absl::Status stopped = (*server)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace loraplex
