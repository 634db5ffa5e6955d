// The command-line tools, run as real processes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "core/safetensors/safetensors.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr.
};

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    result.output.append(buffer, n);
  }
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string Tool(const std::string& name) {
  return std::string(LORAPLEX_BIN_DIR) + "/" + name;
}

// A path that does not exist yet, inside a fresh directory.
std::string Temp(const std::string& name) {
  return (fs::path(FreshTestDir(name)) / name).string();
}

TEST(MakeModelToolTest, WritesTinyModel) {
  const std::string out = Temp("tiny");
  CommandResult result = RunCommand(Tool("loraplex-make-model") +
                                    " --preset tiny --seed 5 --out " + out);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("wrote tiny model (seed 5"));
  EXPECT_TRUE(fs::exists(out + "/config.json"));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/loraplex_tokenizer.json"));
}

TEST(MakeModelToolTest, RejectsUnknownPreset) {
  CommandResult result = RunCommand(Tool("loraplex-make-model") +
                                    " --preset giant --out " + Temp("giant"));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.output, HasSubstr("--preset"));
}

// Runs loraplex-forward on the rows of `golden_dir`/golden.safetensors and
// checks its logits against the stored ones.
void ExpectGoldenLogits(const std::string& golden_dir,
                        const std::string& extra_args) {
  const std::string model =
      std::string(LORAPLEX_SOURCE_DIR) + "/tests/fixtures/golden/llama_gqa";
  auto golden =
      SafetensorsFile::Open(golden_dir + "/golden.safetensors").value();
  torch::Tensor ids = golden->Load("input_ids").value();
  torch::Tensor lengths = golden->Load("lengths").value();
  torch::Tensor expected = golden->Load("logits").value();
  std::string rows;
  for (int64_t r = 0; r < ids.size(0); ++r) {
    if (r > 0) rows += ";";
    for (int64_t t = 0; t < lengths[r].item<int64_t>(); ++t) {
      if (t > 0) rows += ",";
      rows += std::to_string(ids[r][t].item<int64_t>());
    }
  }
  const std::string out = Temp("logits.safetensors");
  CommandResult result =
      RunCommand(Tool("loraplex-forward") + " --model " + model + extra_args +
                 " --ids '" + rows + "' --threads 1 --out " + out);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("row 2 (1 tokens) next-token top-5:"));
  auto written = SafetensorsFile::Open(out);
  ASSERT_TRUE(written.ok()) << written.status();
  torch::Tensor logits = (*written)->Load("logits").value();
  EXPECT_TRUE(torch::equal((*written)->Load("lengths").value(), lengths));
  for (int64_t r = 0; r < ids.size(0); ++r) {
    const int64_t len = lengths[r].item<int64_t>();
    EXPECT_LE((logits[r].narrow(0, 0, len) - expected[r].narrow(0, 0, len))
                  .abs()
                  .max()
                  .item<double>(),
              1e-4);
  }
}

TEST(ForwardToolTest, LogitsMatchTransformersGolden) {
  ExpectGoldenLogits(
      std::string(LORAPLEX_SOURCE_DIR) + "/tests/fixtures/golden/llama_gqa",
      "");
}

TEST(ForwardToolTest, AdapterLogitsMatchPeftGolden) {
  const std::string adapter = std::string(LORAPLEX_SOURCE_DIR) +
                              "/tests/fixtures/golden/peft/all_r8_rslora";
  ExpectGoldenLogits(adapter, " --adapter " + adapter);
}

TEST(ForwardToolTest, EncodesTextWithTheModelTokenizer) {
  const std::string model = Temp("text_model");
  ASSERT_EQ(
      RunCommand(Tool("loraplex-make-model") + " --out " + model).exit_code, 0);
  const std::string out = Temp("text.safetensors");
  CommandResult result =
      RunCommand(Tool("loraplex-forward") + " --model " + model +
                 " --text 'hi there' --dtype bf16 --out " + out);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("row 0 (9 tokens) next-token top-5:"));
  auto written = SafetensorsFile::Open(out);
  ASSERT_TRUE(written.ok());
  torch::Tensor ids = (*written)->Load("input_ids").value();
  EXPECT_EQ(ids[0][0].item<int64_t>(), 256);  // BOS, then bytes.
  EXPECT_EQ(ids[0][1].item<int64_t>(), 'h');
}

TEST(ForwardToolTest, BadInputsFailWithClearMessages) {
  const std::string model =
      std::string(LORAPLEX_SOURCE_DIR) + "/tests/fixtures/golden/llama_gqa";
  const std::string out = Temp("bad.safetensors");
  CommandResult bad_id = RunCommand(Tool("loraplex-forward") + " --model " +
                                    model + " --ids '1,2;3,x' --out " + out);
  EXPECT_EQ(bad_id.exit_code, 1);
  EXPECT_THAT(bad_id.output,
              HasSubstr("--ids: row 2: \"x\" is not an integer"));

  CommandResult out_of_vocab =
      RunCommand(Tool("loraplex-forward") + " --model " + model +
                 " --ids 1,500 --out " + out);
  EXPECT_EQ(out_of_vocab.exit_code, 1);
  EXPECT_THAT(out_of_vocab.output, HasSubstr("token ids must lie in [0, 128)"));

  CommandResult cuda =
      RunCommand(Tool("loraplex-forward") + " --model " + model +
                 " --ids 1 --device cuda --out " + out);
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(cuda.exit_code, 1);
    EXPECT_THAT(cuda.output, HasSubstr("no CUDA support"));
  }

  CommandResult no_model = RunCommand(Tool("loraplex-forward") + " --model " +
                                      Temp("absent") + " --ids 1 --out " + out);
  EXPECT_EQ(no_model.exit_code, 1);
  EXPECT_THAT(no_model.output, HasSubstr("config.json: cannot be read"));
  EXPECT_FALSE(fs::exists(out));

  CommandResult bad_adapter =
      RunCommand(Tool("loraplex-forward") + " --model " + model +
                 " --adapter " + Temp("absent") + " --ids 1 --out " + out);
  EXPECT_EQ(bad_adapter.exit_code, 1);
  EXPECT_THAT(bad_adapter.output, HasSubstr("adapter_config.json"));
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace loraplex
