// Adapters of different ranks and target sets co-batched over a
// mixture-of-experts base (the qwen3_moe golden checkpoint, float64): each
// call's loss and gradients are those it has alone, whatever micro-batches
// mix its rows with the others', and an adapter whose experts hold NaN
// leaves its neighbours' results untouched. A job step's router statistics
// count each slot's own real tokens per expert.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "adapters/slot_pool.h"
#include "core/lora/lora_weights.h"
#include "core/model/experts.h"
#include "core/model/llama_model.h"
#include "core/model/model_presets.h"
#include "core/train/co_batch_step.h"
#include "tests/common/golden_files.h"
#include "tests/common/test_dir.h"
#include "tests/common/tiny_model.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

std::unique_ptr<LlamaModel> LoadMoe() {
  auto model =
      LlamaModel::Load(GoldenPath("qwen3_moe"), {torch::kCPU, torch::kFloat64});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

// An adapter of `rank` on `targets`, A as PEFT initialises it and B drawn
// too (PEFT's zero B would make every expert term vanish).
std::unique_ptr<LoraWeights> Adapter(const LlamaModel& model, int64_t rank,
                                     std::vector<Projection> targets,
                                     uint64_t seed) {
  auto weights = std::make_unique<LoraWeights>(model.config(), model.device(),
                                               torch::kFloat64);
  LoraConfig config;
  config.rank = rank;
  config.alpha = 2.0 * rank;
  config.targets = std::move(targets);
  EXPECT_TRUE(weights->Bind(config).ok());
  weights->InitPeft(seed);
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (const LoraModule& m : weights->modules()) {
    torch::Tensor b = m.b;
    b.copy_(torch::randn(b.sizes(), b.options()) * 0.3);
  }
  return weights;
}

std::vector<Datum> Data(int64_t first_token, std::vector<int64_t> lengths) {
  std::vector<Datum> data;
  for (int64_t length : lengths) {
    Datum datum;
    for (int64_t i = 0; i < length; ++i) {
      datum.input_ids.push_back((first_token + 7 * i) % 128);
      datum.target_tokens.push_back((first_token + 5 * i + 3) % 128);
      datum.weights.push_back(1.0);
    }
    first_token += 11;
    data.push_back(std::move(datum));
  }
  return data;
}

LossFnSpec CrossEntropy() { return *LossFnSpecOf("cross_entropy", {}); }

struct Slot {
  int64_t rank;
  std::vector<Projection> targets;
  uint64_t seed;
  std::vector<Datum> data;
};

std::vector<Slot> Slots() {
  using P = Projection;
  return {
      {4,
       {P::kQ, P::kK, P::kV, P::kO, P::kExpertGateUp, P::kExpertDown},
       11,
       Data(3, {6, 9})},
      {2, {P::kExpertDown}, 12, Data(40, {7, 4, 8})},
      {8, {P::kQ, P::kV, P::kExpertGateUp}, 13, Data(77, {5})},
  };
}

// Every gradient of `b` equals `a`'s within 1e-10.
void ExpectSameGradients(const LoraWeights& a, const LoraWeights& b) {
  ASSERT_EQ(a.modules().size(), b.modules().size());
  for (size_t i = 0; i < a.modules().size(); ++i) {
    for (bool is_a : {true, false}) {
      const torch::Tensor& x = is_a ? a.modules()[i].a : a.modules()[i].b;
      const torch::Tensor& y = is_a ? b.modules()[i].a : b.modules()[i].b;
      ASSERT_TRUE(x.grad().defined() && y.grad().defined());
      EXPECT_LE((x.grad() - y.grad()).abs().max().item<double>(), 1e-10)
          << "module " << i << (is_a ? " A" : " B");
    }
  }
}

TEST(MoeCoBatchTest, MixedRanksAndTargetsEqualEachAlone) {
  auto model = LoadMoe();
  ASSERT_NE(model, nullptr);
  const std::vector<Slot> slots = Slots();
  std::vector<std::unique_ptr<LoraWeights>> alone, together;
  std::vector<double> alone_loss;
  for (const Slot& slot : slots) {
    alone.push_back(Adapter(*model, slot.rank, slot.targets, slot.seed));
    auto result = RunCoBatchPass(
        *model, {}, {{alone.back().get(), &slot.data, CrossEntropy()}},
        CoBatchOptions{});
    ASSERT_TRUE(result.ok()) << result.status();
    alone_loss.push_back(result->calls[0].loss);
    together.push_back(Adapter(*model, slot.rank, slot.targets, slot.seed));
  }
  // The expert terms matter: another B gives another loss.
  {
    auto other = Adapter(*model, slots[1].rank, slots[1].targets, 99);
    auto result = RunCoBatchPass(
        *model, {}, {{other.get(), &slots[1].data, CrossEntropy()}},
        CoBatchOptions{});
    ASSERT_TRUE(result.ok());
    EXPECT_GT(std::abs(result->calls[0].loss - alone_loss[1]), 1e-6);
  }
  for (int64_t budget : {0, 16}) {  // One micro-batch; several that mix.
    SCOPED_TRACE(budget);
    std::vector<ForwardBackwardCall> calls;
    for (size_t s = 0; s < slots.size(); ++s) {
      for (const torch::Tensor& p : together[s]->parameters()) {
        torch::Tensor param = p;
        if (param.grad().defined()) param.mutable_grad().zero_();
      }
      calls.push_back({together[s].get(), &slots[s].data, CrossEntropy()});
    }
    CoBatchOptions options;
    if (budget > 0) options.token_budget = budget;
    auto both = RunCoBatchPass(*model, {}, calls, options);
    ASSERT_TRUE(both.ok()) << both.status();
    for (size_t s = 0; s < slots.size(); ++s) {
      EXPECT_NEAR(both->calls[s].loss, alone_loss[s], 1e-10) << "slot " << s;
      ExpectSameGradients(*alone[s], *together[s]);
    }
  }
}

TEST(MoeCoBatchTest, NanExpertsStayInTheirOwnSlot) {
  auto model = LoadMoe();
  ASSERT_NE(model, nullptr);
  const std::vector<Slot> slots = Slots();
  auto alone = Adapter(*model, slots[0].rank, slots[0].targets, 21);
  auto result = RunCoBatchPass(*model, {},
                               {{alone.get(), &slots[0].data, CrossEntropy()}},
                               CoBatchOptions{});
  ASSERT_TRUE(result.ok());

  auto healthy = Adapter(*model, slots[0].rank, slots[0].targets, 21);
  // Same rank, so both share one bucket of expert groups.
  auto broken = Adapter(*model, slots[0].rank, slots[0].targets, 22);
  {
    torch::NoGradGuard no_grad;
    for (const LoraModule& m : broken->modules()) {
      if (!IsExpertProjection(m.projection)) continue;
      torch::Tensor a = m.a;
      torch::Tensor b = m.b;
      a.fill_(std::numeric_limits<double>::quiet_NaN());
      b.fill_(std::numeric_limits<double>::quiet_NaN());
    }
  }
  auto both = RunCoBatchPass(*model, {},
                             {{broken.get(), &slots[1].data, CrossEntropy()},
                              {healthy.get(), &slots[0].data, CrossEntropy()}},
                             CoBatchOptions{});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_TRUE(std::isnan(both->calls[0].loss));
  EXPECT_NEAR(both->calls[1].loss, result->calls[0].loss, 1e-10);
  ExpectSameGradients(*alone, *healthy);
}

// The qwen3_moe architecture (a dense layer among routed ones) with random
// weights at the byte tokenizer's vocabulary, float64.
std::unique_ptr<LlamaModel> ByteVocabularyMoe() {
  auto config = LoadModelConfig(GoldenPath("qwen3_moe"));
  EXPECT_TRUE(config.ok()) << config.status();
  config->vocab_size = 320;
  const std::string dir = FreshTestDir("moe-bytes");
  EXPECT_TRUE(WriteRandomModel(*config, /*seed=*/9, dir).ok());
  auto model = LlamaModel::Load(dir, {torch::kCPU, torch::kFloat64});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

// Sums the experts' pair counts of every layer it sees.
class PairCounts : public RoutingObserver {
 public:
  explicit PairCounts(int64_t experts) : counts(experts, 0) {}
  void Observe(int /*layer*/, const ExpertRouting& routing) override {
    for (size_t e = 0; e < counts.size(); ++e) counts[e] += routing.counts[e];
  }
  std::vector<int64_t> counts;
};

// Router statistics of a job step: each slot's tokens per expert, summed
// over the sparse layers, count its real tokens only (rows of different
// lengths are padded; micro-batches mix slots; checkpointed layers route
// again in the backward pass), add up to top_k × tokens × sparse layers,
// and equal the routing of each of its sequences run alone, unpadded.
TEST(MoeCoBatchTest, StepMetricsCountEachSlotsTokensPerExpert) {
  auto model = ByteVocabularyMoe();
  ASSERT_NE(model, nullptr);
  const ModelConfig& config = model->config();
  int64_t sparse_layers = 0;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    sparse_layers += LayerIsSparse(config, layer) ? 1 : 0;
  }
  ASSERT_EQ(sparse_layers, 2);
  const std::vector<Projection> all(kAllProjections.begin(),
                                    kAllProjections.end());
  // Each slot's batch is its whole dataset, so its first step sees every
  // sequence.
  std::vector<SlotAttachRequest> requests;
  requests.push_back(TrainRequest("a", OptimizerFamily::kAdamW, 4, all,
                                  Sequences(ReversalJsonl(3, 1), 16), 101));
  requests.push_back(
      TrainRequest("b", OptimizerFamily::kMuon, 8,
                   {Projection::kQ, Projection::kV, Projection::kExpertDown},
                   Sequences(ReversalJsonl(3, 2), 12), 102));
  for (SlotAttachRequest& request : requests) {
    request.training.batch_size = 3;
  }
  // What each slot's sequences route to alone, with its initial weights.
  std::vector<std::vector<int64_t>> expected;
  std::vector<int64_t> tokens;
  for (const SlotAttachRequest& request : requests) {
    SlotPool pool(config, {.capacity = 1});
    ASSERT_TRUE(pool.Attach(request).ok());
    PairCounts direct(config.moe.num_experts);
    MultiLoraDelta delta({{&pool.slot(0).weights, 1}});
    delta.set_routing_observer(&direct);
    int64_t total = 0;
    torch::NoGradGuard no_grad;
    for (const Sequence& seq : request.data->sequences) {
      const int64_t n = static_cast<int64_t>(seq.input_ids.size());
      ASSERT_TRUE(model
                      ->ForwardHidden(torch::tensor(seq.input_ids).unsqueeze(0),
                                      torch::tensor(std::vector<int64_t>{n}),
                                      &delta)
                      .ok());
      total += n;
    }
    expected.push_back(direct.counts);
    tokens.push_back(total);
  }
  ASSERT_NE(tokens[0], tokens[1]);
  for (const char* mode : {"one micro-batch", "mixed", "checkpointed"}) {
    SCOPED_TRACE(mode);
    SlotPool pool(config, {.capacity = 2});
    for (const SlotAttachRequest& request : requests) {
      ASSERT_TRUE(pool.Attach(request).ok());
    }
    CoBatchOptions options;
    options.token_budget = std::string(mode) == "mixed" ? 40 : 0;
    if (std::string(mode) == "checkpointed") {
      options.checkpointing.mode = CheckpointMode::kEvery;
      options.checkpointing.every = 1;
    }
    auto metrics = TrainCoBatchStep(*model, pool.ActiveSlots(), options);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    for (size_t s = 0; s < requests.size(); ++s) {
      const SlotStepMetrics& m = (*metrics)[s];
      EXPECT_EQ(m.tokens, tokens[s]);
      EXPECT_EQ(m.expert_tokens, expected[s]) << "slot " << s;
      int64_t sum = 0;
      for (int64_t count : m.expert_tokens) sum += count;
      EXPECT_EQ(sum, config.moe.top_k * m.tokens * sparse_layers);
    }
  }
  // A dense base reports none.
  SlotPool dense(TinyModel().config(), {.capacity = 1});
  ASSERT_TRUE(dense
                  .Attach(TrainRequest("d", OptimizerFamily::kAdamW, 4,
                                       {Projection::kQ},
                                       Sequences(ReversalJsonl(3, 1), 16), 7))
                  .ok());
  auto metrics = TrainCoBatchStep(TinyModel(), dense.ActiveSlots(), {});
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_TRUE((*metrics)[0].expert_tokens.empty());
}

}  // namespace
}  // namespace loraplex
