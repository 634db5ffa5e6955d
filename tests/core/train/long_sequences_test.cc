// Long sequences: activation checkpointing changes no gradient (bit for bit
// in fp64: the recomputation runs the same operations on the same inputs,
// dropout masks included) while keeping no layer's activations, and packed
// examples compute exactly what they compute alone (block-diagonal
// attention, positions restarting per example), on every family's layout:
// Llama, sliding-window layers (Mistral, Gemma 3, OLMo 3), LongRoPE with
// fused projections (Phi-3).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "adapters/slot_pool.h"
#include "core/data/sequences.h"
#include "core/lora/lora_weights.h"
#include "core/model/llama_model.h"
#include "core/train/co_batch_step.h"
#include "core/train/micro_batch.h"
#include "tests/common/golden_files.h"
#include "tests/common/tiny_model.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

// fp64 against fp64 computed with other shapes (other GEMM blockings), as
// a bound on the largest difference relative to the largest value.
constexpr double kFp64ShapeBound = 1e-11;
// fp32 slots after a few steps (as the isolation tests bound them).
constexpr double kFp32IsolationBound = 1e-5;

std::unique_ptr<LlamaModel> LoadBase(const std::string& base) {
  auto model = LlamaModel::Load(GoldenPath(base), {.dtype = torch::kFloat64});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

// An adapter on every module, the LM head included, with nonzero B.
std::unique_ptr<LoraWeights> MakeAdapter(const LlamaModel& model,
                                         double dropout, uint64_t seed) {
  LoraConfig config;
  config.rank = 4;
  config.alpha = 8.0;
  config.dropout = dropout;
  config.targets.push_back(Projection::kLmHead);
  auto weights = std::make_unique<LoraWeights>(model.config(), model.device(),
                                               model.logits_dtype());
  auto bound = weights->Bind(config);
  EXPECT_TRUE(bound.ok()) << bound.status();
  weights->InitPeft(seed);
  RandomizeB(*weights, seed, 0.05);
  return weights;
}

std::vector<int64_t> RandomIds(int64_t n, int64_t vocab, uint64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor ids = torch::randint(vocab, {n}, torch::kInt64);
  return std::vector<int64_t>(ids.data_ptr<int64_t>(),
                              ids.data_ptr<int64_t>() + n);
}

std::vector<torch::Tensor> Grads(const LoraWeights& weights) {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : weights.parameters()) {
    grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  return grads;
}

void DropGrads(const LoraWeights& weights) {
  for (torch::Tensor p : weights.parameters())
    p.mutable_grad() = torch::Tensor();
}

bool AllEqual(const std::vector<torch::Tensor>& a,
              const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return false;
    if (a[i].defined() && !torch::equal(a[i], b[i])) return false;
  }
  return true;
}

CoBatchOptions Checkpointed(int64_t every) {
  CoBatchOptions options;
  // Several micro-batches and loss chunks per pass.
  options.token_budget = 40;
  options.loss_chunk_tokens = 7;
  if (every == 0) {
    options.checkpointing.mode = CheckpointMode::kOff;
  } else {
    options.checkpointing.mode = CheckpointMode::kEvery;
    options.checkpointing.every = every;
  }
  return options;
}

// Names of every autograd node reachable from `output`.
std::multiset<std::string> GraphNodes(const torch::Tensor& output) {
  std::multiset<std::string> names;
  std::vector<torch::autograd::Node*> stack = {output.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    names.insert(node->name());
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      stack.push_back(edge.function.get());
    }
  }
  return names;
}

size_t CountContaining(const std::multiset<std::string>& names,
                       const std::string& part) {
  size_t count = 0;
  for (const std::string& name : names) {
    count += name.find(part) != std::string::npos ? 1 : 0;
  }
  return count;
}

class LongSequencesFamilyTest : public ::testing::TestWithParam<std::string> {};

// With every layer checkpointed the graph of a training forward keeps no
// layer's matrix products, only one recomputation node per layer; every
// other layer with every:2.
TEST_P(LongSequencesFamilyTest, CheckpointedLayersKeepNoActivations) {
  auto model = LoadBase(GetParam());
  ASSERT_NE(model, nullptr);
  auto adapter = MakeAdapter(*model, 0.0, 3);
  const int64_t layers = model->config().num_hidden_layers;
  const torch::Tensor ids =
      torch::tensor(RandomIds(12, model->config().vocab_size, 1)).view({1, 12});
  const torch::Tensor lengths = torch::tensor({int64_t{12}});
  LoraSegment segment;
  segment.weights = adapter.get();
  segment.rows = 1;
  segment.training = true;
  segment.row_ids = {0};
  const MultiLoraDelta delta({segment}, LoraKernel::kGrouped);
  auto count = [&](int64_t every, const std::string& part) {
    auto hidden =
        model->ForwardHidden(ids, lengths, &delta, {.checkpoint_every = every});
    EXPECT_TRUE(hidden.ok()) << hidden.status();
    return CountContaining(GraphNodes(*hidden), part);
  };
  EXPECT_GT(count(0, "Mm"), 0u);
  EXPECT_EQ(count(0, "Recompute"), 0u);
  EXPECT_EQ(count(1, "Mm"), 0u);
  EXPECT_EQ(count(1, "Recompute"), static_cast<size_t>(layers));
  EXPECT_EQ(count(2, "Recompute"), static_cast<size_t>((layers + 1) / 2));
  // Without grad mode nothing is recorded to recompute.
  torch::NoGradGuard no_grad;
  auto plain =
      model->ForwardHidden(ids, lengths, &delta, {.checkpoint_every = 1});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->requires_grad());
}

// Two adapters co-batched, one with dropout and cross-entropy, one with
// PPO (an RL loss), over several micro-batches: the losses, logprobs and
// every gradient with every layer or every other layer checkpointed equal
// those without, bit for bit.
TEST_P(LongSequencesFamilyTest, CheckpointedGradientsEqualBitForBitInFp64) {
  auto model = LoadBase(GetParam());
  ASSERT_NE(model, nullptr);
  const int64_t vocab = model->config().vocab_size;
  auto first = MakeAdapter(*model, 0.1, 5);
  auto second = MakeAdapter(*model, 0.0, 6);
  std::vector<Datum> ce_data;
  std::vector<Datum> rl_data;
  for (int d = 0; d < 4; ++d) {
    const int64_t n = 6 + 3 * d;
    Datum ce;
    ce.input_ids = RandomIds(n, vocab, 10 + d);
    ce.target_tokens = RandomIds(n, vocab, 20 + d);
    ce.weights.assign(n, 1.0);
    ce_data.push_back(ce);
    Datum rl;
    rl.input_ids = RandomIds(n, vocab, 30 + d);
    rl.target_tokens = RandomIds(n, vocab, 40 + d);
    for (int64_t i = 0; i < n; ++i) {
      rl.sampler_logprobs.push_back(-2.0 - 0.1 * static_cast<double>(i % 5));
      rl.advantages.push_back(i % 2 == 0 ? 1.0 : -0.5);
    }
    rl_data.push_back(rl);
  }
  auto ppo = LossFnSpecOf("ppo", {});
  ASSERT_TRUE(ppo.ok()) << ppo.status();
  std::vector<ForwardBackwardCall> calls = {
      {first.get(), &ce_data, LossFnSpec{}, true, 77},
      {second.get(), &rl_data, *ppo, true, 0}};
  auto run = [&](int64_t every) {
    DropGrads(*first);
    DropGrads(*second);
    auto result = RunCoBatchPass(*model, {}, calls, Checkpointed(every));
    EXPECT_TRUE(result.ok()) << result.status();
    return std::make_pair(result.ok() ? *std::move(result) : CoBatchResult{},
                          std::make_pair(Grads(*first), Grads(*second)));
  };
  const auto [plain, plain_grads] = run(0);
  ASSERT_EQ(plain.calls.size(), 2u);
  ASSERT_TRUE(plain_grads.first.front().defined());
  for (int64_t every : {1, 2}) {
    SCOPED_TRACE(every);
    const auto [result, grads] = run(every);
    ASSERT_EQ(result.calls.size(), 2u);
    for (size_t c = 0; c < 2; ++c) {
      EXPECT_EQ(result.calls[c].loss, plain.calls[c].loss);
      EXPECT_EQ(result.calls[c].logprobs, plain.calls[c].logprobs);
    }
    EXPECT_TRUE(AllEqual(grads.first, plain_grads.first));
    EXPECT_TRUE(AllEqual(grads.second, plain_grads.second));
  }
}

// One row holding three examples computes, for each, the hidden states the
// example gets alone: it attends only to itself and its positions restart
// at 0. Padding after a packed row changes nothing either. Without the
// segments the later examples see the earlier ones (the test can tell).
TEST_P(LongSequencesFamilyTest, PackedRowEqualsItsExamplesAlone) {
  auto model = LoadBase(GetParam());
  ASSERT_NE(model, nullptr);
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int64_t> sizes = {5, 9, 4};
  std::vector<std::vector<int64_t>> examples;
  std::vector<int64_t> packed;
  std::vector<int64_t> segments;
  for (size_t e = 0; e < sizes.size(); ++e) {
    examples.push_back(RandomIds(sizes[e], vocab, 50 + e));
    packed.insert(packed.end(), examples.back().begin(), examples.back().end());
    segments.insert(segments.end(), sizes[e], static_cast<int64_t>(e));
  }
  const int64_t total = static_cast<int64_t>(packed.size());
  // Row 0: the packed row; row 1: a shorter unpacked row (padding).
  torch::Tensor ids = torch::zeros({2, total}, torch::kInt64);
  ids[0].copy_(torch::tensor(packed));
  ids[1].narrow(0, 0, 7).copy_(torch::tensor(RandomIds(7, vocab, 60)));
  const torch::Tensor lengths = torch::tensor({total, int64_t{7}});
  torch::Tensor segment_ids = torch::zeros({2, total}, torch::kInt64);
  segment_ids[0].copy_(torch::tensor(segments));
  auto hidden =
      model->ForwardHidden(ids, lengths, nullptr, {.segment_ids = segment_ids});
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  auto crossed = model->ForwardHidden(ids, lengths);
  ASSERT_TRUE(crossed.ok());
  int64_t at = 0;
  for (size_t e = 0; e < examples.size(); ++e) {
    const int64_t n = sizes[e];
    auto alone = model->ForwardHidden(torch::tensor(examples[e]).view({1, n}),
                                      torch::tensor({n}));
    ASSERT_TRUE(alone.ok());
    const torch::Tensor got = (*hidden)[0].narrow(0, at, n);
    const double scale = alone->abs().max().item<double>();
    EXPECT_LE((got - (*alone)[0]).abs().max().item<double>(),
              kFp64ShapeBound * scale)
        << "example " << e;
    if (e > 0) {
      EXPECT_GT(((*crossed)[0].narrow(0, at, n) - (*alone)[0])
                    .abs()
                    .max()
                    .item<double>(),
                1e-6 * scale)
          << "example " << e;
    }
    at += n;
  }
  auto unpacked_row = model->ForwardHidden(ids[1].narrow(0, 0, 7).view({1, 7}),
                                           torch::tensor({int64_t{7}}));
  ASSERT_TRUE(unpacked_row.ok());
  EXPECT_LE(((*hidden)[1].narrow(0, 0, 7) - (*unpacked_row)[0])
                .abs()
                .max()
                .item<double>(),
            kFp64ShapeBound * unpacked_row->abs().max().item<double>());
}

INSTANTIATE_TEST_SUITE_P(Families, LongSequencesFamilyTest,
                         ::testing::Values("llama_gqa", "mistral_window",
                                           "gemma3_text_window", "olmo3_window",
                                           "phi3_longrope"));

// The rows of `sequences` as the job step makes them (cross-entropy on
// every target, weight 1).
std::vector<Row> RowsOf(const std::vector<Sequence>& sequences) {
  std::vector<Row> rows;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const Sequence& seq = sequences[i];
    Row row{0, static_cast<int64_t>(i), &seq.input_ids, {}, &seq.segments};
    for (size_t t = 1; t < seq.input_ids.size(); ++t) {
      if (seq.loss_mask[t] == 0) continue;
      row.targets.positions.push_back(static_cast<int64_t>(t) - 1);
      row.targets.labels.push_back(seq.input_ids[t]);
      row.targets.weights.push_back(1.0);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// What one backward pass over `sequences` gives: the summed loss and every
// LoRA gradient of `adapter` (on the CPU). Micro-batches of `budget` padded
// tokens (0: one), loss chunks of 11 targets; layers checkpointed every
// `every` (0: none); dropout seeded by `seed` when given.
std::pair<double, std::vector<torch::Tensor>> BackwardOver(
    const LlamaModel& model, const LoraWeights& adapter,
    const std::vector<Sequence>& sequences, int64_t every, int64_t budget,
    std::optional<uint64_t> seed = std::nullopt) {
  DropGrads(adapter);
  PassOwners owners{{&adapter}, {}, {LossFnSpec{}}};
  if (seed.has_value()) owners.dropout_seeds = {*seed};
  const std::vector<Row> rows = RowsOf(sequences);
  PassSums sums{{0.0}};
  MicroBatchOptions options;
  options.loss_chunk_tokens = 11;
  options.checkpointing.mode =
      every == 0 ? CheckpointMode::kOff : CheckpointMode::kEvery;
  options.checkpointing.every = std::max<int64_t>(1, every);
  for (const std::vector<Piece>& micro : PlanMicroBatches(rows, budget)) {
    absl::Status status =
        RunMicroBatch(model, micro, owners, true, options, sums);
    EXPECT_TRUE(status.ok()) << status;
  }
  return {sums.losses[0], OnCpu(Grads(adapter))};
}

// The reversal task's examples, packed and unpacked into rows of 64.
struct PackedAndNot {
  SequenceSet packed;
  SequenceSet unpacked;
};

PackedAndNot ReversalRows() {
  ByteTokenizer tokenizer;
  auto dataset = ParseJsonlDataset(ReversalJsonl(9, 4), tokenizer);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  auto packed = BuildSequences(*dataset, {64, true});
  auto unpacked = BuildSequences(*dataset, {64, false});
  EXPECT_TRUE(packed.ok() && unpacked.ok());
  return {*std::move(packed), *std::move(unpacked)};
}

// A dataset's examples packed into few rows give the loss and gradients of
// the same examples in rows of their own (fp64), with and without
// checkpointing.
TEST(LongSequencesTest, PackedMicroBatchEqualsTheExamplesUnpacked) {
  const LlamaModel& model = TinyModel64();
  auto adapter = MakeAdapter(model, 0.0, 9);
  const PackedAndNot rows = ReversalRows();
  ASSERT_LT(rows.packed.sequences.size(), rows.unpacked.sequences.size());
  ASSERT_EQ(rows.packed.num_target_tokens, rows.unpacked.num_target_tokens);
  const auto [loss, grads] =
      BackwardOver(model, *adapter, rows.unpacked.sequences, 0, 0);
  for (int64_t every : {0, 1}) {
    const auto [packed_loss, packed_grads] =
        BackwardOver(model, *adapter, rows.packed.sequences, every, 0);
    EXPECT_NEAR(packed_loss, loss, kFp64ShapeBound * std::abs(loss));
    EXPECT_LE(MaxRelativeDiff(packed_grads, grads), kFp64ShapeBound);
  }
}

// Slots of every optimizer family trained co-batched (one with LoRA
// dropout, one adapting the LM head) end on the same weights with and
// without checkpointing: bit for bit in fp64, within fp32 rounding in fp32.
TEST(LongSequencesTest, CheckpointedSlotsTrainToTheSameWeights) {
  for (torch::ScalarType dtype : {torch::kFloat64, torch::kFloat32}) {
    const LlamaModel& model =
        dtype == torch::kFloat64 ? TinyModel64() : TinyModel();
    auto train = [&](int64_t every) {
      SlotPool pool(model.config(), {.capacity = 3, .dtype = dtype});
      for (const SlotAttachRequest& request : MixedTrainRequests()) {
        EXPECT_TRUE(pool.Attach(request).ok());
      }
      for (int step = 0; step < 3; ++step) {
        auto metrics =
            TrainCoBatchStep(model, pool.ActiveSlots(), Checkpointed(every));
        EXPECT_TRUE(metrics.ok()) << metrics.status();
      }
      std::vector<torch::Tensor> weights;
      for (int s = 0; s < 3; ++s) {
        for (torch::Tensor& t : Snapshot(pool.slot(s).weights)) {
          weights.push_back(t);
        }
      }
      return weights;
    };
    const std::vector<torch::Tensor> plain = train(0);
    for (int64_t every : {1, 2}) {
      const std::vector<torch::Tensor> checkpointed = train(every);
      if (dtype == torch::kFloat64) {
        EXPECT_TRUE(AllEqual(checkpointed, plain)) << "every " << every;
      } else {
        // Equal here too; the bound allows for BLAS kernels whose rounding
        // depends on operand alignment.
        EXPECT_LE(MaxRelativeDiff(checkpointed, plain), kFp32IsolationBound)
            << "every " << every;
      }
    }
  }
}

// On a GPU (the next GPU run; skipped without one): co-batched calls with
// checkpointing give the gradients they give without, bit for bit in fp64,
// and a packed micro-batch the loss and gradients of its examples unpacked.
TEST(LongSequencesTest, CheckpointingAndPackingOnCudaChangeNothing) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const LlamaModel& model = TinyModelOn(CudaDevice(), torch::kFloat64);
  auto adapter = MakeAdapter(model, 0.1, 9);
  const PackedAndNot rows = ReversalRows();
  // With dropout: checkpointing recomputes the same masks.
  const auto [loss, grads] =
      BackwardOver(model, *adapter, rows.unpacked.sequences, 0, 40, 17);
  const auto [checkpointed_loss, checkpointed_grads] =
      BackwardOver(model, *adapter, rows.unpacked.sequences, 1, 40, 17);
  EXPECT_EQ(checkpointed_loss, loss);
  EXPECT_TRUE(AllEqual(checkpointed_grads, grads));
  // Without dropout (its masks follow positions, which packing moves).
  const auto [plain_loss, plain_grads] =
      BackwardOver(model, *adapter, rows.unpacked.sequences, 0, 40);
  const auto [packed_loss, packed_grads] =
      BackwardOver(model, *adapter, rows.packed.sequences, 1, 40);
  EXPECT_NEAR(packed_loss, plain_loss, kFp64ShapeBound * std::abs(plain_loss));
  EXPECT_LE(MaxRelativeDiff(packed_grads, plain_grads), kFp64ShapeBound);
}

}  // namespace
}  // namespace loraplex
