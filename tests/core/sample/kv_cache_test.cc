// Prefill + cached decode against the plain forward pass (itself checked
// against transformers in llama_golden_test): in fp64 the logits of every
// decoded token equal those of one forward over the whole sequence, for
// left-padded rows of different lengths, a sliding window shorter than the
// sequence, RoPE scaling, adapters per row, and rows dropped mid-decode.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "core/lora/multi_lora.h"
#include "core/model/llama_model.h"
#include "tests/common/golden_files.h"

namespace loraplex {
namespace {

std::unique_ptr<LlamaModel> LoadFp64(const std::string& name) {
  auto model = LlamaModel::Load(GoldenPath(name), {.dtype = torch::kFloat64});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// Logits of the last position of `tokens` from one plain forward pass.
torch::Tensor PlainLastLogits(const LlamaModel& model,
                              const std::vector<int64_t>& tokens,
                              const LoraWeights* adapter) {
  torch::Tensor ids = torch::tensor(tokens, torch::kInt64).unsqueeze(0);
  torch::Tensor lengths =
      torch::tensor({static_cast<int64_t>(tokens.size())}, torch::kInt64);
  MultiLoraDelta delta({{.weights = adapter, .rows = 1}});
  auto logits = model.Forward(ids, lengths, adapter ? &delta : nullptr);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return (*logits)[0][tokens.size() - 1];
}

void ExpectCachedEqualsPlain(const std::string& name, bool with_adapter) {
  std::unique_ptr<LlamaModel> model = LoadFp64(name);
  ASSERT_NE(model, nullptr);
  const ModelConfig& config = model->config();
  LoraWeights adapter(config, torch::kCPU, torch::kFloat64);
  LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 8;
  ASSERT_TRUE(adapter.Bind(lora).ok());
  adapter.InitPeft(11);
  for (const torch::Tensor& p : adapter.parameters()) {
    torch::NoGradGuard no_grad;
    p.normal_(0, 0.3);
  }
  // Row 1 uses the adapter, rows 0 and 2 the base.
  std::vector<const LoraWeights*> adapters = {
      nullptr, with_adapter ? &adapter : nullptr, nullptr};
  std::vector<std::vector<int64_t>> sequences = {
      {5, 17, 99, 3}, {42, 7, 7, 100, 64, 1, 90, 12, 33}, {77}};
  const int64_t width = 9;
  torch::Tensor ids = torch::zeros({3, width}, torch::kInt64);
  torch::Tensor valid = torch::zeros({3, width}, torch::kBool);
  for (int64_t r = 0; r < 3; ++r) {
    const int64_t n = static_cast<int64_t>(sequences[r].size());
    ids[r].narrow(0, width - n, n).copy_(torch::tensor(sequences[r]));
    valid[r].narrow(0, width - n, n).fill_(true);
  }
  KvCache cache(config, 3, /*capacity=*/4, torch::kFloat64, torch::kCPU);
  auto segments = [&](const std::vector<int64_t>& rows) {
    std::vector<LoraSegment> list;
    for (int64_t r : rows) list.push_back({.weights = adapters[r], .rows = 1});
    return MultiLoraDelta(list);
  };
  std::vector<int64_t> rows = {0, 1, 2};
  MultiLoraDelta prefill_delta = segments(rows);
  auto hidden = model->ForwardCached(ids, valid, cache, &prefill_delta);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  torch::Tensor logits = model->Logits(hidden->select(1, width - 1));
  for (int step = 0; step < 14; ++step) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t r = rows[i];
      torch::Tensor plain = PlainLastLogits(*model, sequences[r], adapters[r]);
      EXPECT_LT((logits[i] - plain).abs().max().item<double>(), 1e-10)
          << name << " row " << r << " step " << step;
      EXPECT_EQ(cache.next_positions()[i].item<int64_t>(),
                static_cast<int64_t>(sequences[r].size()));
      sequences[r].push_back(logits[i].argmax().item<int64_t>());
    }
    if (step == 5) {
      // Row 0 finishes: the cache keeps rows 1 and 2.
      cache.KeepRows({1, 2});
      rows = {1, 2};
    }
    torch::Tensor next =
        torch::empty({static_cast<int64_t>(rows.size()), 1}, torch::kInt64);
    for (size_t i = 0; i < rows.size(); ++i) {
      next[i][0] = sequences[rows[i]].back();
    }
    MultiLoraDelta delta = segments(rows);
    hidden = model->ForwardCached(next, torch::Tensor(), cache, &delta);
    ASSERT_TRUE(hidden.ok()) << hidden.status();
    logits = model->Logits(hidden->select(1, 0));
  }
}

TEST(KvCacheTest, DecodeEqualsPlainForwardWithGroupedQueryHeads) {
  ExpectCachedEqualsPlain("llama_gqa", /*with_adapter=*/true);
}

TEST(KvCacheTest, DecodeEqualsPlainForwardPastTheSlidingWindow) {
  ExpectCachedEqualsPlain("mistral_window", /*with_adapter=*/true);
}

TEST(KvCacheTest, DecodeEqualsPlainForwardWithRopeScalingAndBiases) {
  ExpectCachedEqualsPlain("llama_tied_llama3", /*with_adapter=*/false);
  ExpectCachedEqualsPlain("qwen2_bias_sharded", /*with_adapter=*/true);
}

TEST(KvCacheTest, PositionsPastTheModelAreRefused) {
  std::unique_ptr<LlamaModel> model = LoadFp64("llama_gqa");
  ASSERT_NE(model, nullptr);
  const int64_t max = model->config().max_position_embeddings;
  KvCache cache(model->config(), 1, max, torch::kFloat64, torch::kCPU);
  torch::Tensor ids = torch::full({1, max}, 5, torch::kInt64);
  ASSERT_TRUE(model->ForwardCached(ids, torch::Tensor(), cache).ok());
  auto past = model->ForwardCached(torch::full({1, 1}, 5, torch::kInt64),
                                   torch::Tensor(), cache);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("max_position_embeddings"),
            std::string::npos);
  KvCache other(model->config(), 1, 4, torch::kFloat64, torch::kCPU);
  auto bad_id = model->ForwardCached(
      torch::full({1, 1}, model->config().vocab_size, torch::kInt64),
      torch::Tensor(), other);
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loraplex
