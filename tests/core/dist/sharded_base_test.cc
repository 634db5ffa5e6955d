// A sharded frozen base (core/model/sharded_base.h) in one process: the
// shards of every rank gathered give back each layer's tensors bit for bit
// (the ranks' shards are gathered from models loaded side by side), a
// rank holds about 1/N of the layers plus one layer's buffer, and a
// forward that not every rank runs is refused instead of waiting.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/llama_model.h"
#include "core/model/model_presets.h"
#include "core/train/co_batch_step.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

std::string TinyModelDir(const std::string& preset = "tiny") {
  const std::string dir = absl::StrCat(
      ::testing::TempDir(), "/loraplex-sharded-", getpid(), "/", preset);
  EXPECT_TRUE(WritePresetModel(preset, 7, dir).ok());
  return dir;
}

std::unique_ptr<LlamaModel> LoadWhole(const std::string& dir) {
  auto model = LlamaModel::Load(dir, {.dtype = torch::kFloat64});
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

using Ranks = std::vector<std::unique_ptr<LlamaModel>>;

// The N ranks' models of one process: rank r's all-gather concatenates the
// ranks' shards of the layer whose shard it is given.
std::shared_ptr<Ranks> LoadRanks(const std::string& dir, int world) {
  auto ranks = std::make_shared<Ranks>();
  std::weak_ptr<Ranks> weak = ranks;
  for (int rank = 0; rank < world; ++rank) {
    BaseSharding sharding;
    sharding.rank = rank;
    sharding.world_size = world;
    sharding.all_gather = [weak, rank](const torch::Tensor& shard,
                                       torch::Tensor& full) {
      std::shared_ptr<Ranks> ranks = weak.lock();
      const ShardedBase& own = *(*ranks)[rank]->sharded_base();
      for (int64_t layer = 0; layer < own.num_layers(); ++layer) {
        if (!own.shard(layer).is_same(shard)) continue;
        std::vector<torch::Tensor> shards;
        for (const auto& model : *ranks) {
          shards.push_back(model->sharded_base()->shard(layer));
        }
        full.copy_(torch::cat(shards));
        return;
      }
      TORCH_CHECK(false, "not a shard of this rank");
    };
    auto model = LlamaModel::Load(
        dir, {.dtype = torch::kFloat64, .shard_base = sharding});
    EXPECT_TRUE(model.ok()) << model.status();
    ranks->push_back(std::move(model).value());
  }
  return ranks;
}

TEST(ShardedBaseTest, GatheredLayersAreTheWholeModelsBitForBit) {
  const std::string dir = TinyModelDir();
  const std::unique_ptr<LlamaModel> whole = LoadWhole(dir);
  for (int world : {1, 2, 3, 4}) {
    const std::shared_ptr<Ranks> held_ranks = LoadRanks(dir, world);
    const Ranks& ranks = *held_ranks;
    for (int rank = 0; rank < world; ++rank) {
      ShardedBase& base = *ranks[rank]->sharded_base();
      ShardedBase::AllRanks all_ranks(base);
      for (int64_t layer = 0; layer < base.num_layers(); ++layer) {
        LayerWeights gathered = base.Gather(layer);
        LayerWeights expected = whole->weights().layers[layer];
        const std::vector<torch::Tensor*> got = LayerTensorSlots(gathered);
        const std::vector<torch::Tensor*> want = LayerTensorSlots(expected);
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i]->defined(), want[i]->defined());
          if (!want[i]->defined()) continue;
          EXPECT_EQ(got[i]->sizes(), want[i]->sizes());
          EXPECT_EQ(got[i]->strides(), want[i]->strides());
          EXPECT_TRUE(torch::equal(*got[i], *want[i]))
              << "world " << world << " rank " << rank << " layer " << layer
              << " tensor " << i;
        }
      }
      EXPECT_EQ(ranks[rank]->weights().embed_tokens.sizes(),
                whole->weights().embed_tokens.sizes());
    }
  }
}

TEST(ShardedBaseTest, ForwardEqualsTheWholeModel) {
  const std::string dir = TinyModelDir();
  const std::unique_ptr<LlamaModel> whole = LoadWhole(dir);
  const torch::Tensor ids =
      torch::arange(24, torch::kInt64).remainder(200).view({2, 12}) + 3;
  const torch::Tensor lengths = torch::tensor({12, 7}, torch::kInt64);
  const torch::Tensor expected = whole->Forward(ids, lengths).value();
  const std::shared_ptr<Ranks> held_ranks = LoadRanks(dir, 3);
  const Ranks& ranks = *held_ranks;
  ShardedBase::AllRanks all_ranks(*ranks[1]->sharded_base());
  absl::StatusOr<torch::Tensor> logits = ranks[1]->Forward(ids, lengths);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_LE(MaxRelativeDiff(*logits, expected), 1e-13);
  // Each layer once: no backward without grad mode.
  EXPECT_EQ(all_ranks.gathers(), ranks[1]->sharded_base()->num_layers());
}

class ShardedBaseMemoryTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardedBaseMemoryTest, RankHoldsItsShareOfTheLayersPlusOneLayersBuffer) {
  const std::string dir = TinyModelDir(GetParam());
  const std::unique_ptr<LlamaModel> whole = LoadWhole(dir);
  const ModelWeights& w = whole->weights();
  const int64_t replicated =
      (w.embed_tokens.numel() + w.final_norm.numel() +
       (w.lm_head.is_same(w.embed_tokens) ? 0 : w.lm_head.numel())) *
      8;
  const int64_t all = whole->FrozenWeightBytes();
  std::vector<int64_t> layer_numel;
  int64_t layers_bytes = 0;
  for (const LayerWeights& layer : w.layers) {
    LayerWeights copy = layer;
    int64_t numel = 0;
    for (torch::Tensor* t : LayerTensorSlots(copy)) {
      if (t->defined()) numel += t->numel();
    }
    layer_numel.push_back(numel);
    layers_bytes += numel * 8;
  }
  EXPECT_EQ(all, replicated + layers_bytes);
  for (int world : {1, 2, 3, 4}) {
    const std::shared_ptr<Ranks> held_ranks = LoadRanks(dir, world);
    const Ranks& ranks = *held_ranks;
    int64_t shards = 0;
    int64_t largest = 0;
    for (int64_t numel : layer_numel) {
      const int64_t shard = (numel + world - 1) / world;
      shards += shard * 8;
      largest = std::max(largest, shard);
    }
    const int64_t buffer = world * largest * 8;
    for (int rank = 0; rank < world; ++rank) {
      const int64_t held = ranks[rank]->FrozenWeightBytes();
      EXPECT_EQ(held, replicated + shards + buffer);
      EXPECT_EQ(ranks[rank]->sharded_base()->WholeLayerBytes(), layers_bytes);
      // 1/N of the layers, at most one element of padding per layer and
      // rank, and one layer's buffer.
      EXPECT_GE(shards * world, layers_bytes);
      EXPECT_LE(
          shards * world,
          layers_bytes + static_cast<int64_t>(layer_numel.size()) * world * 8);
      EXPECT_LE(buffer, world * 8 + layers_bytes / layer_numel.size() + 8);
    }
    std::printf(
        "%s fp64, %d rank(s): %lld frozen bytes per rank of %lld whole "
        "(%.3f; layers %lld -> shard %lld + buffer %lld, replicated %lld)\n",
        GetParam().c_str(), world,
        static_cast<long long>(ranks[0]->FrozenWeightBytes()),
        static_cast<long long>(all),
        static_cast<double>(ranks[0]->FrozenWeightBytes()) / all,
        static_cast<long long>(layers_bytes), static_cast<long long>(shards),
        static_cast<long long>(buffer), static_cast<long long>(replicated));
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, ShardedBaseMemoryTest,
                         ::testing::Values("tiny", "small"));

TEST(ShardedBaseTest, ForwardsNotEveryRankRunsAreRefused) {
  const std::string dir = TinyModelDir();
  const std::shared_ptr<Ranks> held_ranks = LoadRanks(dir, 2);
  const Ranks& ranks = *held_ranks;
  const LlamaModel& model = *ranks[0];
  const torch::Tensor ids = torch::full({1, 4}, 5, torch::kInt64);
  const torch::Tensor lengths = torch::tensor({4}, torch::kInt64);
  absl::StatusOr<torch::Tensor> forward = model.Forward(ids, lengths);
  EXPECT_EQ(forward.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(forward.status().message().find("sharded over 2 ranks"),
            std::string::npos)
      << forward.status();
  KvCache cache(model.config(), 1, 8, model.dtype(), model.device());
  EXPECT_EQ(model.ForwardCached(ids, {}, cache).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Evaluation runs on one rank: refused.
  auto data = Sequences(ReversalJsonl(3, 1), 16);
  EXPECT_EQ(EvalLoss(model, nullptr, data->sequences, CoBatchOptions{})
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  // A training step without data parallel over the shard's ranks: refused
  // before anything changes.
  SlotPool pool(model.config(), {.capacity = 1, .dtype = model.dtype()});
  ASSERT_TRUE(pool.Attach(TrainRequest("job", OptimizerFamily::kAdamW, 4,
                                       {Projection::kQ}, data, 1))
                  .ok());
  absl::StatusOr<std::vector<SlotStepMetrics>> step =
      TrainCoBatchStep(model, pool.ActiveSlots(), CoBatchOptions{});
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.slot(0).counters.steps, 0);
  EXPECT_EQ(ranks[0]->sharded_base()->InAllRanksScope(), false);
}

// One rank: the sharded path (every layer gathered and recomputed in the
// backward pass) trains as the whole model does.
// Two co-batched slots' losses over 3 steps and their final weights.
std::vector<torch::Tensor> TrainTwoSlots(const LlamaModel& model,
                                         std::vector<double>& losses) {
  SlotPool pool(model.config(), {.capacity = 2, .dtype = model.dtype()});
  for (SlotAttachRequest& request : MixedTrainRequests()) {
    EXPECT_TRUE(pool.Attach(request).ok());
    if (pool.ActiveSlots().size() == 2) break;
  }
  CoBatchOptions options;
  options.token_budget = 64;
  for (int step = 0; step < 3; ++step) {
    auto metrics = TrainCoBatchStep(model, pool.ActiveSlots(), options);
    EXPECT_TRUE(metrics.ok()) << metrics.status();
    if (!metrics.ok()) break;
    for (const SlotStepMetrics& m : *metrics) losses.push_back(m.loss);
  }
  std::vector<torch::Tensor> weights;
  for (int slot : {0, 1}) {
    for (const torch::Tensor& p : pool.slot(slot).weights.parameters()) {
      weights.push_back(p.detach().clone());
    }
  }
  return weights;
}

void ExpectTrainsAsTheWholeModel(const LlamaModel& sharded,
                                 const LlamaModel& whole) {
  std::vector<double> whole_losses, sharded_losses;
  const std::vector<torch::Tensor> expected =
      TrainTwoSlots(whole, whole_losses);
  const std::vector<torch::Tensor> got = TrainTwoSlots(sharded, sharded_losses);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_LE(MaxRelativeDiff(got, expected), kFp64IdentityBound);
  ASSERT_EQ(sharded_losses.size(), whole_losses.size());
  for (size_t i = 0; i < whole_losses.size(); ++i) {
    EXPECT_NEAR(sharded_losses[i], whole_losses[i],
                kFp64IdentityBound * std::abs(whole_losses[i]));
  }
}

TEST(ShardedBaseTest, OneRankTrainsAsTheWholeModel) {
  const std::string dir = TinyModelDir();
  const std::unique_ptr<LlamaModel> whole = LoadWhole(dir);
  const std::shared_ptr<Ranks> held_ranks = LoadRanks(dir, 1);
  ExpectTrainsAsTheWholeModel(*(*held_ranks)[0], *whole);
}

// With start_all_gather, the next layer is gathered while one runs: here a
// started gather fills the buffer with NaN and writes the layer only when
// waited for, so a layer used before its gather is waited for, or the
// buffer of the layer still running overwritten, changes the results.
TEST(ShardedBaseTest, PrefetchedGathersTrainAsTheWholeModel) {
  const std::string dir = TinyModelDir();
  const std::unique_ptr<LlamaModel> whole = LoadWhole(dir);
  BaseSharding sharding;
  sharding.all_gather = [](const torch::Tensor& shard, torch::Tensor& full) {
    full.copy_(shard);
  };
  int started = 0;
  sharding.start_all_gather = [&started](const torch::Tensor& shard,
                                         torch::Tensor& full) {
    ++started;
    full.fill_(std::numeric_limits<double>::quiet_NaN());
    return std::function<void()>([shard, full]() mutable {
      torch::NoGradGuard no_grad;
      full.copy_(shard);
    });
  };
  auto sharded =
      LlamaModel::Load(dir, {.dtype = torch::kFloat64, .shard_base = sharding});
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  ExpectTrainsAsTheWholeModel(**sharded, *whole);
  const ShardedBase& base = *(*sharded)->sharded_base();
  EXPECT_GT(base.prefetched_gathers(), 0);
  EXPECT_GE(started, base.prefetched_gathers());
}

}  // namespace
}  // namespace loraplex
