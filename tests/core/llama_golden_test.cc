// The decoder's logits against Hugging Face transformers on the committed
// golden checkpoints (tools/golden/make_model_golden.py).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/model/llama_model.h"
#include "core/safetensors/safetensors.h"
#include "tests/common/golden_logits.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

std::string FixtureDir(const std::string& name) {
  return std::string(LORAPLEX_SOURCE_DIR) + "/tests/fixtures/golden/" + name;
}

torch::Tensor RunModel(const std::string& dir, const GoldenLogits& golden,
                       std::optional<torch::ScalarType> dtype,
                       const torch::Device& device = torch::kCPU) {
  ModelLoadOptions options;
  options.dtype = dtype;
  options.device = device;
  auto model = LlamaModel::Load(dir, options);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return torch::Tensor();
  torch::NoGradGuard no_grad;
  auto logits =
      (*model)->Forward(golden.input_ids.to(device), golden.lengths.to(device));
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (!logits.ok()) return torch::Tensor();
  EXPECT_EQ(logits->device(), device);
  return logits->cpu();
}

class GoldenFp32Test : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenFp32Test, LogitsMatchTransformers) {
  const std::string dir = FixtureDir(GetParam());
  const GoldenLogits golden = ReadGoldenLogits(dir);
  torch::Tensor logits = RunModel(dir, golden, torch::kFloat32);
  ASSERT_TRUE(logits.defined());
  ASSERT_EQ(logits.sizes(), golden.logits.at("logits").sizes());
  EXPECT_LE(MaxValidDiff(logits, golden.logits.at("logits"), golden.lengths),
            1e-4);
  // The fp64 engine (the equivalence tests' mode) computes the same model.
  torch::Tensor logits64 = RunModel(dir, golden, torch::kFloat64);
  ASSERT_TRUE(logits64.defined());
  EXPECT_EQ(logits64.scalar_type(), torch::kFloat64);
  EXPECT_LE(MaxValidDiff(logits64, golden.logits.at("logits"), golden.lengths),
            1e-4);
}

// The same on the GPU (attention through its SDPA kernels, cuBLAS GEMMs).
TEST_P(GoldenFp32Test, LogitsMatchTransformersOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  const std::string dir = FixtureDir(GetParam());
  const GoldenLogits golden = ReadGoldenLogits(dir);
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kFloat64}) {
    torch::Tensor logits = RunModel(dir, golden, dtype, cuda);
    ASSERT_TRUE(logits.defined());
    ASSERT_EQ(logits.sizes(), golden.logits.at("logits").sizes());
    EXPECT_LE(MaxValidDiff(logits, golden.logits.at("logits"), golden.lengths),
              1e-4)
        << c10::toString(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, GoldenFp32Test,
    ::testing::Values("llama_gqa", "llama_tied_llama3", "llama_linear_mqa",
                      "qwen2_bias_sharded", "mistral_window", "llama_bf16",
                      "qwen3_tied", "qwen3_bias", "olmo2_post_norm",
                      "olmo3_window", "gemma3_text_window", "qwen3_bf16",
                      "gemma3_text_bf16", "phi3_longrope", "phi3_tied",
                      "gemma3_mm", "gemma3_mm_v4", "qwen3_moe",
                      "qwen3_moe_fused", "qwen3_moe_bf16", "gpt_oss",
                      "gpt_oss_mxfp4"));

class GoldenBf16Test : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenBf16Test, Bf16ComputeStaysNearTransformersBf16) {
  const std::string dir = FixtureDir(GetParam());
  const GoldenLogits golden = ReadGoldenLogits(dir);
  torch::Tensor logits = RunModel(dir, golden, std::nullopt);  // As stored.
  ASSERT_TRUE(logits.defined());
  const torch::Tensor& reference = golden.logits.at("logits_bf16");
  const torch::Tensor& exact = golden.logits.at("logits");
  // bf16 keeps 8 mantissa bits; HF's own bf16 run is ~3e-2 from fp32 here.
  // Ours must be as close to HF-bf16 as HF-bf16 is to the fp32 truth.
  const double hf_error = MaxValidDiff(reference, exact, golden.lengths);
  EXPECT_LE(MaxValidDiff(logits, reference, golden.lengths),
            std::max(0.05, 1.5 * hf_error));
  EXPECT_LE(MaxValidDiff(logits, exact, golden.lengths),
            std::max(0.05, 1.5 * hf_error));
}

TEST_P(GoldenBf16Test, Bf16ComputeStaysNearTransformersBf16OnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = FixtureDir(GetParam());
  const GoldenLogits golden = ReadGoldenLogits(dir);
  torch::Tensor logits =
      RunModel(dir, golden, std::nullopt, torch::Device(torch::kCUDA, 0));
  ASSERT_TRUE(logits.defined());
  const torch::Tensor& reference = golden.logits.at("logits_bf16");
  const torch::Tensor& exact = golden.logits.at("logits");
  const double hf_error = MaxValidDiff(reference, exact, golden.lengths);
  EXPECT_LE(MaxValidDiff(logits, exact, golden.lengths),
            std::max(0.05, 1.5 * hf_error));
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, GoldenBf16Test,
                         ::testing::Values("llama_bf16", "qwen3_bf16",
                                           "gemma3_text_bf16",
                                           "qwen3_moe_bf16"));

// Most checkpoints in the wild carry the 4.x keys (rope_theta, rope_scaling,
// torch_dtype); the fixtures were written with the 5.x rope_parameters key.
// Rewriting a config into 4.x form must give the same logits.
TEST(GoldenTest, LegacyRopeKeysGiveSameLogits) {
  const std::string source = FixtureDir("llama_tied_llama3");
  const fs::path copy = FreshTestDir();
  for (const auto& entry : fs::directory_iterator(source)) {
    fs::copy(entry.path(), copy / entry.path().filename());
  }
  nlohmann::json config;
  std::ifstream(copy / "config.json") >> config;
  nlohmann::json rope = config["rope_parameters"];
  ASSERT_TRUE(rope.is_object());
  config.erase("rope_parameters");
  config["rope_theta"] = rope["rope_theta"];
  rope.erase("rope_theta");
  rope["type"] = rope["rope_type"];  // Old checkpoints spell it "type".
  rope.erase("rope_type");
  config["rope_scaling"] = rope;
  config["torch_dtype"] = config["dtype"];
  config.erase("dtype");
  std::ofstream(copy / "config.json") << config.dump(2);

  const GoldenLogits golden = ReadGoldenLogits(copy.string());
  torch::Tensor logits = RunModel(copy.string(), golden, std::nullopt);
  ASSERT_TRUE(logits.defined());
  EXPECT_LE(MaxValidDiff(logits, golden.logits.at("logits"), golden.lengths),
            1e-4);
}

// A multimodal gemma3 checkpoint is checked on its text tensors only, named
// as its layout stores them; the vision tower and projector are never
// unexpected.
TEST(GoldenTest, Gemma3MultimodalErrorsNameTheTextTensorsOnly) {
  using Case = std::pair<std::string, std::string>;
  for (const auto& [fixture, text] :
       {Case{"gemma3_mm", "model.language_model."},
        Case{"gemma3_mm_v4", "language_model.model."}}) {
    SCOPED_TRACE(fixture);
    const std::string source = FixtureDir(fixture);
    const fs::path copy = FreshTestDir();
    auto original = SafetensorsFile::Open(source + "/model.safetensors");
    ASSERT_TRUE(original.ok());
    std::vector<NamedTensor> tensors;
    int vision = 0;
    for (const auto& info : (*original)->tensors()) {
      if (info.name == text + "layers.1.mlp.up_proj.weight") continue;
      torch::Tensor value = (*original)->Load(info.name).value();
      if (info.name == text + "norm.weight") value = torch::zeros({5});
      vision += info.name.find("vision_tower.") != std::string::npos;
      tensors.push_back({info.name, value});
    }
    EXPECT_GT(vision, 0);
    tensors.push_back(
        {text + "layers.9.mlp.up_proj.weight", torch::zeros({2})});
    ASSERT_TRUE(
        WriteSafetensors((copy / "model.safetensors").string(), tensors).ok());
    fs::copy(source + "/config.json", copy / "config.json");
    auto model = LlamaModel::Load(copy.string(), ModelLoadOptions{});
    ASSERT_FALSE(model.ok());
    const std::string message(model.status().message());
    EXPECT_NE(message.find("gemma3, 3 layers): 1 missing tensor(s): " + text +
                           "layers.1.mlp.up_proj.weight; 1 tensor(s) with the "
                           "wrong shape: " +
                           text +
                           "norm.weight is [5], expected [32]; 1 "
                           "unexpected tensor(s): " +
                           text + "layers.9.mlp.up_proj.weight"),
              std::string::npos)
        << message;
  }
}

// fp16 checkpoints load and compute in fp32 by default (CPU kernels for
// half precision are slow or missing). Rounding the weights to fp16 moves the
// logits a little; the reference is still HF's fp32 run.
TEST(GoldenTest, Fp16CheckpointComputesInFp32) {
  const std::string source = FixtureDir("llama_gqa");
  const fs::path copy = FreshTestDir();
  {
    auto original = SafetensorsFile::Open(source + "/model.safetensors");
    ASSERT_TRUE(original.ok());
    std::vector<NamedTensor> half;
    for (const auto& info : (*original)->tensors()) {
      half.push_back({info.name, (*original)->Load(info.name).value().to(
                                     torch::kFloat16)});
    }
    ASSERT_TRUE(
        WriteSafetensors((copy / "model.safetensors").string(), half).ok());
  }
  nlohmann::json config;
  std::ifstream(source + "/config.json") >> config;
  config["dtype"] = "float16";
  std::ofstream(copy / "config.json") << config.dump(2);
  fs::copy(source + "/golden.safetensors", copy / "golden.safetensors");

  const GoldenLogits golden = ReadGoldenLogits(copy.string());
  auto model = LlamaModel::Load(copy.string(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->dtype(), torch::kFloat32);
  torch::NoGradGuard no_grad;
  auto logits = (*model)->Forward(golden.input_ids, golden.lengths);
  ASSERT_TRUE(logits.ok()) << logits.status();
  const double error =
      MaxValidDiff(*logits, golden.logits.at("logits"), golden.lengths);
  EXPECT_LE(error, 2e-2);
  EXPECT_GT(error, 0.0);  // The weights really were rounded.
}

TEST(GoldenTest, ForwardHiddenThenLogitsEqualsForward) {
  const std::string dir = FixtureDir("llama_gqa");
  const GoldenLogits golden = ReadGoldenLogits(dir);
  auto model = LlamaModel::Load(dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  torch::NoGradGuard no_grad;
  auto hidden = (*model)->ForwardHidden(golden.input_ids, golden.lengths);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  EXPECT_EQ(hidden->size(2), (*model)->config().hidden_size);
  EXPECT_LE(MaxValidDiff((*model)->Logits(*hidden), golden.logits.at("logits"),
                         golden.lengths),
            1e-4);
}

TEST(GoldenTest, PaddingDoesNotChangeValidPositions) {
  const std::string dir = FixtureDir("mistral_window");
  const GoldenLogits golden = ReadGoldenLogits(dir);
  auto model = LlamaModel::Load(dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  torch::NoGradGuard no_grad;
  auto batch = (*model)->Forward(golden.input_ids, golden.lengths);
  ASSERT_TRUE(batch.ok());
  // Row 2 has one token, so its padding queries lie outside the sliding
  // window of every valid key; they must still stay finite.
  EXPECT_TRUE(torch::isfinite(*batch).all().item<bool>());
  for (int64_t row = 0; row < golden.lengths.size(0); ++row) {
    const int64_t len = golden.lengths[row].item<int64_t>();
    torch::Tensor ids = golden.input_ids[row].narrow(0, 0, len).unsqueeze(0);
    auto alone = (*model)->Forward(ids, torch::full({1}, len, torch::kInt64));
    ASSERT_TRUE(alone.ok());
    EXPECT_LE(((*alone)[0] - (*batch)[row].narrow(0, 0, len))
                  .abs()
                  .max()
                  .item<double>(),
              1e-5)
        << "row " << row;
  }
}

TEST(GoldenTest, WeightsAreFrozen) {
  auto model = LlamaModel::Load(FixtureDir("qwen2_bias_sharded"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelWeights& weights = (*model)->weights();
  EXPECT_FALSE(weights.embed_tokens.requires_grad());
  for (const LayerWeights& layer : weights.layers) {
    for (Projection p : LayerProjections((*model)->config())) {
      EXPECT_FALSE(layer.at(p).weight.requires_grad());
    }
    EXPECT_TRUE(layer.at(Projection::kQ).bias.defined());
    EXPECT_FALSE(layer.at(Projection::kO).bias.defined());
  }
}

TEST(GoldenTest, TiedEmbeddingsShareStorage) {
  auto model = LlamaModel::Load(FixtureDir("llama_tied_llama3"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(
      (*model)->weights().lm_head.is_same((*model)->weights().embed_tokens));
}

TEST(GoldenTest, BadBatchesAreRejected) {
  auto model = LlamaModel::Load(FixtureDir("llama_gqa"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  torch::Tensor ids = torch::zeros({2, 4}, torch::kInt64);
  auto too_long = (*model)->Forward(ids, torch::tensor({4, 5}, torch::kInt64));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("lengths must lie in [1, 4]"),
            std::string::npos)
      << too_long.status();
  auto empty_row = (*model)->Forward(ids, torch::tensor({4, 0}, torch::kInt64));
  EXPECT_EQ(empty_row.status().code(), absl::StatusCode::kInvalidArgument);
  torch::Tensor big = torch::full({2, 4}, 128, torch::kInt64);
  auto out_of_vocab =
      (*model)->Forward(big, torch::tensor({4, 4}, torch::kInt64));
  EXPECT_NE(out_of_vocab.status().message().find("token ids must lie in"),
            std::string::npos)
      << out_of_vocab.status();
  auto wrong_dtype = (*model)->Forward(ids.to(torch::kInt32),
                                       torch::tensor({4, 4}, torch::kInt64));
  EXPECT_EQ(wrong_dtype.status().code(), absl::StatusCode::kInvalidArgument);
}

// gpt-oss's attention sinks (an explicit attention path, not SDPA) on the
// other ways attention runs: decoding through the KV cache (past the
// sliding window, left-padded prefill), packed rows, and the unmasked
// causal path of long unpadded rows.
std::unique_ptr<LlamaModel> LoadGptOssFp64() {
  auto model =
      LlamaModel::Load(FixtureDir("gpt_oss"), {torch::kCPU, torch::kFloat64});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

TEST(GoldenTest, GptOssCachedDecodingMatchesTransformers) {
  std::unique_ptr<LlamaModel> model = LoadGptOssFp64();
  ASSERT_NE(model, nullptr);
  torch::NoGradGuard no_grad;
  const GoldenLogits golden = ReadGoldenLogits(FixtureDir("gpt_oss"));
  const torch::Tensor& want = golden.logits.at("logits");
  const int64_t rows = golden.input_ids.size(0);
  const int64_t prefill = 2;
  // Prefill each row's first two tokens, left-padded where it has fewer.
  torch::Tensor ids = torch::zeros({rows, prefill}, torch::kInt64);
  torch::Tensor valid = torch::zeros({rows, prefill}, torch::kBool);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = std::min(prefill, golden.lengths[r].item<int64_t>());
    ids[r].narrow(0, prefill - n, n).copy_(golden.input_ids[r].narrow(0, 0, n));
    valid[r].narrow(0, prefill - n, n).fill_(true);
  }
  KvCache cache(model->config(), rows, /*capacity=*/3, torch::kFloat64,
                torch::kCPU);
  auto hidden = model->ForwardCached(ids, valid, cache);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  torch::Tensor logits = model->Logits(*hidden);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = std::min(prefill, golden.lengths[r].item<int64_t>());
    EXPECT_LE((logits[r].narrow(0, prefill - n, n) - want[r].narrow(0, 0, n))
                  .abs()
                  .max()
                  .item<double>(),
              1e-4)
        << "row " << r << " prefill";
  }
  for (int64_t t = prefill; t < golden.input_ids.size(1); ++t) {
    hidden = model->ForwardCached(golden.input_ids.narrow(1, t, 1).contiguous(),
                                  torch::Tensor(), cache);
    ASSERT_TRUE(hidden.ok()) << hidden.status();
    logits = model->Logits(*hidden);
    for (int64_t r = 0; r < rows; ++r) {
      if (t >= golden.lengths[r].item<int64_t>()) continue;
      EXPECT_LE((logits[r][0] - want[r][t]).abs().max().item<double>(), 1e-4)
          << "row " << r << " position " << t;
    }
  }
}

TEST(GoldenTest, GptOssPackedRowEqualsEachExampleAlone) {
  std::unique_ptr<LlamaModel> model = LoadGptOssFp64();
  ASSERT_NE(model, nullptr);
  torch::NoGradGuard no_grad;
  const GoldenLogits golden = ReadGoldenLogits(FixtureDir("gpt_oss"));
  const int64_t rows = golden.input_ids.size(0);
  std::vector<torch::Tensor> ids, segments;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = golden.lengths[r].item<int64_t>();
    ids.push_back(golden.input_ids[r].narrow(0, 0, n));
    segments.push_back(torch::full({n}, r, torch::kInt64));
  }
  const torch::Tensor packed = torch::cat(ids).unsqueeze(0);
  const int64_t total = packed.size(1);
  ForwardOptions options;
  options.segment_ids = torch::cat(segments).unsqueeze(0);
  auto hidden =
      model->ForwardHidden(packed, torch::tensor({total}), nullptr, options);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  const torch::Tensor logits = model->Logits(*hidden)[0];
  int64_t at = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = golden.lengths[r].item<int64_t>();
    EXPECT_LE((logits.narrow(0, at, n) -
               golden.logits.at("logits")[r].narrow(0, 0, n))
                  .abs()
                  .max()
                  .item<double>(),
              1e-4)
        << "example " << r;
    at += n;
  }
}

TEST(GoldenTest, GptOssLongRowsWithoutMaskEqualMaskedOnes) {
  std::unique_ptr<LlamaModel> loaded = LoadGptOssFp64();
  ASSERT_NE(loaded, nullptr);
  torch::NoGradGuard no_grad;
  // Room for a row long enough that its full layers attend without a mask
  // (kCpuCausalKernelTokens) and one more padded column that needs one.
  ModelConfig config = loaded->config();
  config.max_position_embeddings = kCpuCausalKernelTokens + 1;
  LlamaModel model(config, loaded->weights(), torch::kFloat64, torch::kCPU);
  const int64_t n = kCpuCausalKernelTokens;
  torch::Tensor ids = torch::randint(
      config.vocab_size, {1, n}, torch::TensorOptions().dtype(torch::kInt64));
  auto unmasked = model.Forward(ids, torch::tensor({n}));
  ASSERT_TRUE(unmasked.ok()) << unmasked.status();
  auto masked =
      model.Forward(torch::cat({ids, torch::zeros({1, 1}, torch::kInt64)}, 1),
                    torch::tensor({n}));
  ASSERT_TRUE(masked.ok()) << masked.status();
  EXPECT_LE((*unmasked - masked->narrow(1, 0, n)).abs().max().item<double>(),
            1e-10);
}

// MXFP4 experts that do not fit the config are named, with what was found.
TEST(GoldenTest, GptOssMxfp4MismatchesAreNamed) {
  const std::string source = FixtureDir("gpt_oss_mxfp4");
  const fs::path copy = FreshTestDir();
  auto original = SafetensorsFile::Open(source + "/model.safetensors");
  ASSERT_TRUE(original.ok());
  const std::string experts = "model.layers.0.mlp.experts.";
  std::vector<NamedTensor> tensors;
  for (const auto& info : (*original)->tensors()) {
    torch::Tensor value = (*original)->Load(info.name).value();
    if (info.name == experts + "gate_up_proj_scales") {
      value = value.to(torch::kFloat32);
    } else if (info.name == experts + "down_proj_blocks") {
      value = value.narrow(2, 0, 1).contiguous();
    }
    tensors.push_back({info.name, value});
  }
  ASSERT_TRUE(
      WriteSafetensors((copy / "model.safetensors").string(), tensors).ok());
  fs::copy(source + "/config.json", copy / "config.json");
  auto model = LlamaModel::Load(copy.string(), ModelLoadOptions{});
  ASSERT_FALSE(model.ok());
  const std::string message(model.status().message());
  EXPECT_NE(
      message.find("1 tensor(s) with the wrong shape: " + experts +
                   "down_proj_blocks is [8, 64, 1, 16], expected [8, "
                   "64, 2, 16]; 1 tensor(s) of the wrong dtype: " +
                   experts + "gate_up_proj_scales is F32, MXFP4 needs U8"),
      std::string::npos)
      << message;
}

}  // namespace
}  // namespace loraplex
