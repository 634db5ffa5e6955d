// Multi-LoRA forward against PEFT's logits, segment isolation, and the
// memory cost of backward as slots are added.
#include "core/lora/multi_lora.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "adapters/peft_adapter.h"
#include "core/lora/lora_config.h"
#include "core/lora/lora_weights.h"
#include "core/model/llama_model.h"
#include "core/runtime/torch_compat.h"
#include "tests/common/golden_logits.h"
#include "tests/common/tiny_model.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

class PeftGoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    auto model = LlamaModel::Load(FixturePath("golden/llama_gqa"), {});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value().release();
  }
  static void TearDownTestSuite() { delete model_; }

  static std::unique_ptr<LoraWeights> LoadAdapter(const std::string& name) {
    auto adapter =
        LoadPeftAdapter(FixturePath("golden/peft/" + name), model_->config());
    EXPECT_TRUE(adapter.ok()) << adapter.status();
    auto weights = std::make_unique<LoraWeights>(model_->config(), torch::kCPU);
    EXPECT_TRUE(weights->Bind(adapter->config).ok());
    EXPECT_TRUE(CopyPeftAdapter(*adapter, *weights).ok());
    return weights;
  }

  static LlamaModel* model_;
};
LlamaModel* PeftGoldenTest::model_ = nullptr;

TEST_P(PeftGoldenTest, LogitsMatchPeft) {
  const GoldenLogits golden =
      ReadGoldenLogits(FixturePath("golden/peft/" + GetParam()));
  std::unique_ptr<LoraWeights> weights = LoadAdapter(GetParam());
  ASSERT_NE(weights, nullptr);
  MultiLoraDelta delta({{weights.get(), golden.input_ids.size(0)}});
  auto logits = model_->Forward(golden.input_ids, golden.lengths, &delta);
  ASSERT_TRUE(logits.ok()) << logits.status();
  for (int64_t row = 0; row < golden.input_ids.size(0); ++row) {
    EXPECT_LE(RowDiff(*logits, golden.logits.at("logits"), golden.lengths, row),
              1e-4)
        << "row " << row;
  }
  // The adapter matters: without it the logits are far from PEFT's.
  auto base = model_->Forward(golden.input_ids, golden.lengths);
  EXPECT_GT(RowDiff(*base, golden.logits.at("logits"), golden.lengths, 0),
            0.05);
}

INSTANTIATE_TEST_SUITE_P(Cases, PeftGoldenTest,
                         ::testing::Values("q_v_r4", "all_r8_rslora",
                                           "mlp_r2"));

// One co-batch, one adapter per row (and a base-only row): each row equals
// PEFT's logits for its own adapter.
TEST_F(PeftGoldenTest, EachSegmentSeesOnlyItsAdapter) {
  const std::vector<std::string> names = {"all_r8_rslora", "q_v_r4", "mlp_r2"};
  std::vector<std::unique_ptr<LoraWeights>> weights;
  std::vector<GoldenLogits> goldens;
  for (const std::string& name : names) {
    weights.push_back(LoadAdapter(name));
    ASSERT_NE(weights.back(), nullptr);
    goldens.push_back(ReadGoldenLogits(FixturePath("golden/peft/" + name)));
  }
  const GoldenLogits base = ReadGoldenLogits(FixturePath("golden/llama_gqa"));
  // Rows: base row 0 without adapter, then row r of the golden batch with
  // adapter r.
  torch::Tensor ids =
      torch::cat({base.input_ids.narrow(0, 0, 1), base.input_ids});
  torch::Tensor lengths =
      torch::cat({base.lengths.narrow(0, 0, 1), base.lengths});
  MultiLoraDelta delta({{nullptr, 1},
                        {weights[0].get(), 1},
                        {weights[1].get(), 1},
                        {weights[2].get(), 1}});
  auto logits = model_->Forward(ids, lengths, &delta);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_LE(RowDiff(logits->narrow(0, 0, 1), base.logits.at("logits"),
                    base.lengths, 0),
            1e-4);
  for (int64_t r = 0; r < 3; ++r) {
    torch::Tensor row = logits->narrow(0, r + 1, 1);
    EXPECT_LE(RowDiff(row, goldens[r].logits.at("logits").narrow(0, r, 1),
                      base.lengths.narrow(0, r, 1), 0),
              1e-4)
        << names[r];
  }
}

LoraConfig Config(int64_t rank, std::vector<Projection> targets) {
  LoraConfig config;
  config.rank = rank;
  config.alpha = 2.0 * static_cast<double>(rank);
  config.targets = std::move(targets);
  return config;
}

// The batches the two kernels are compared on. kMixed mixes ranks, targets,
// scales, row counts and dropout, with a base-only segment and an empty one
// (several buckets). In kOneBucket and kOneBucketWithDropout all rows share
// one bucket (same rank, targets and row count; scales differ), the case
// where the grouped kernel works on the whole batch at once.
enum class BatchKind { kMixed, kOneBucket, kOneBucketWithDropout };

// The logits and every adapter gradient of one forward/backward over a
// batch of `kind`.
struct KernelRun {
  torch::Tensor logits;
  std::vector<torch::Tensor> grads;
};

KernelRun RunBatch(const LlamaModel& model, torch::ScalarType dtype,
                   LoraKernel kernel, BatchKind kind = BatchKind::kMixed) {
  const std::vector<Projection> qkv_up = {Projection::kQ, Projection::kK,
                                          Projection::kV, Projection::kUp};
  const std::vector<Projection> all(kAllProjections.begin(),
                                    kAllProjections.end());
  std::vector<LoraConfig> configs;
  if (kind == BatchKind::kMixed) {
    configs = {Config(4, qkv_up),
               Config(4, qkv_up),
               Config(8, all),
               Config(8, all),
               Config(2, {Projection::kV, Projection::kDown}),
               Config(4, qkv_up)};
    configs[1].alpha = 3.0;  // Same bucket as adapter 0, another scale.
    configs[2].dropout = configs[3].dropout = 0.25;
  } else {
    configs.assign(4, Config(4, all));
    configs[1].alpha = 3.0;
    if (kind == BatchKind::kOneBucketWithDropout) {
      for (LoraConfig& config : configs) config.dropout = 0.25;
    }
  }
  std::vector<std::unique_ptr<LoraWeights>> adapters;
  for (size_t i = 0; i < configs.size(); ++i) {
    // Made in fp64 and converted, so both dtypes hold the same values.
    LoraWeights wide(model.config(), torch::kCPU, torch::kFloat64);
    EXPECT_TRUE(wide.Bind(configs[i]).ok());
    wide.InitPeft(i + 1);
    RandomizeB(wide, 20 + i, 0.05);
    adapters.push_back(
        std::make_unique<LoraWeights>(model.config(), model.device(), dtype));
    EXPECT_TRUE(adapters.back()->Bind(configs[i]).ok());
    torch::NoGradGuard no_grad;
    for (size_t m = 0; m < wide.modules().size(); ++m) {
      adapters.back()->modules()[m].a.copy_(wide.modules()[m].a);
      adapters.back()->modules()[m].b.copy_(wide.modules()[m].b);
    }
  }
  std::vector<LoraSegment> segments;
  if (kind == BatchKind::kMixed) {
    segments = {{adapters[0].get(), 2},
                {nullptr, 1},
                {adapters[1].get(), 2},
                {adapters[2].get(), 2, true, 11, {0, 4}},
                {adapters[3].get(), 2, true, 12, {3, 5}},
                {adapters[4].get(), 2},
                {adapters[5].get(), 1},
                {adapters[4].get(), 0}};
  } else {
    const bool training = kind == BatchKind::kOneBucketWithDropout;
    for (size_t i = 0; i < adapters.size(); ++i) {
      segments.push_back({adapters[i].get(), 3, training, 30 + i, {0, 1, 2}});
    }
  }
  torch::manual_seed(9);
  const torch::Device device = model.device();
  const torch::Tensor ids =
      torch::randint(0, 259, {12, 9}, torch::kInt64).to(device);
  const torch::Tensor lengths =
      torch::tensor({9, 7, 9, 5, 9, 8, 9, 6, 9, 9, 4, 9}, torch::kInt64)
          .to(device);
  MultiLoraDelta delta(segments, kernel);
  auto logits = model.Forward(ids, lengths, &delta);
  EXPECT_TRUE(logits.ok()) << logits.status();
  const torch::Tensor weights =
      torch::randn(logits->sizes(), torch::kFloat64).to(logits->options());
  (*logits * weights).sum().backward();
  KernelRun run{logits->detach().to(torch::kCPU, torch::kFloat64), {}};
  for (const auto& adapter : adapters) {
    for (const torch::Tensor& p : adapter->parameters()) {
      EXPECT_TRUE(p.grad().defined());
      run.grads.push_back(p.grad().to(torch::kCPU, torch::kFloat64));
    }
  }
  return run;
}

double MaxDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// The grouped kernel against the per-slot reference on batches of `kind`:
// equal to rounding in fp64; in fp32, and over a bf16 base (whose outputs
// take the fp32 terms converted), no further from the fp64 result than the
// reference is.
void ExpectGroupedLikePerSlot(BatchKind kind) {
  const KernelRun reference =
      RunBatch(TinyModel64(), torch::kFloat64, LoraKernel::kPerSlot, kind);
  const KernelRun grouped =
      RunBatch(TinyModel64(), torch::kFloat64, LoraKernel::kGrouped, kind);
  EXPECT_LE(MaxDiff(grouped.logits, reference.logits),
            1e-12 * reference.logits.abs().max().item<double>());
  ASSERT_EQ(grouped.grads.size(), reference.grads.size());
  for (size_t i = 0; i < reference.grads.size(); ++i) {
    const double scale = reference.grads[i].abs().max().item<double>();
    EXPECT_GT(scale, 0) << "gradient " << i;
    EXPECT_LE(MaxDiff(grouped.grads[i], reference.grads[i]), 1e-12 * scale)
        << "gradient " << i;
  }

  for (torch::ScalarType base : {torch::kFloat32, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(base));
    const LlamaModel& model = TinyModelOn(torch::kCPU, base);
    const KernelRun per_slot =
        RunBatch(model, torch::kFloat32, LoraKernel::kPerSlot, kind);
    const KernelRun grouped_narrow =
        RunBatch(model, torch::kFloat32, LoraKernel::kGrouped, kind);
    const double floor = MaxDiff(per_slot.logits, reference.logits);
    EXPECT_GT(floor, 0);
    EXPECT_LE(MaxDiff(grouped_narrow.logits, reference.logits), 4 * floor);
    for (size_t i = 0; i < reference.grads.size(); ++i) {
      const double grad_floor =
          MaxDiff(per_slot.grads[i], reference.grads[i]) +
          1e-7 * reference.grads[i].abs().max().item<double>();
      EXPECT_LE(MaxDiff(grouped_narrow.grads[i], reference.grads[i]),
                4 * grad_floor)
          << "gradient " << i;
    }
  }
}

TEST(MultiLoraTest, GroupedKernelEqualsThePerSlotKernel) {
  ExpectGroupedLikePerSlot(BatchKind::kMixed);
}

// One bucket holding every row: the grouped kernel adds its terms to the
// whole base outputs, without splitting them by segment.
TEST(MultiLoraTest, GroupedKernelEqualsThePerSlotKernelInOneBucket) {
  ExpectGroupedLikePerSlot(BatchKind::kOneBucket);
  ExpectGroupedLikePerSlot(BatchKind::kOneBucketWithDropout);
}

// Both kernels on the GPU, against each other and against the per-slot
// kernel on the CPU, in fp64 (the devices' GEMMs round differently).
TEST(MultiLoraTest, GroupedKernelEqualsThePerSlotKernelOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const LlamaModel& cuda_model = TinyModelOn(CudaDevice(), torch::kFloat64);
  for (BatchKind kind : {BatchKind::kMixed, BatchKind::kOneBucket,
                         BatchKind::kOneBucketWithDropout}) {
    const KernelRun reference =
        RunBatch(TinyModel64(), torch::kFloat64, LoraKernel::kPerSlot, kind);
    for (LoraKernel kernel : {LoraKernel::kPerSlot, LoraKernel::kGrouped}) {
      const KernelRun run = RunBatch(cuda_model, torch::kFloat64, kernel, kind);
      EXPECT_LE(
          MaxDiff(run.logits, reference.logits),
          kFp64IdentityBound * reference.logits.abs().max().item<double>());
      ASSERT_EQ(run.grads.size(), reference.grads.size());
      for (size_t i = 0; i < reference.grads.size(); ++i) {
        EXPECT_LE(
            MaxDiff(run.grads[i], reference.grads[i]),
            kFp64IdentityBound * reference.grads[i].abs().max().item<double>())
            << "gradient " << i;
      }
    }
  }
}

TEST(MultiLoraTest, InitMatchesPeftStatistics) {
  const LlamaModel& model = TinyModel();
  LoraWeights weights(model.config(), torch::kCPU);
  ASSERT_TRUE(
      weights.Bind(Config(8, {Projection::kQ, Projection::kDown})).ok());
  weights.InitPeft(3);
  for (const LoraModule& m : weights.modules()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(m.a.size(1)));
    EXPECT_LE(m.a.abs().max().item<double>(), bound);
    EXPECT_GT(m.a.abs().max().item<double>(), 0.8 * bound);
    EXPECT_EQ(m.b.abs().max().item<double>(), 0.0);
    EXPECT_TRUE(m.a.requires_grad() && m.a.is_leaf());
  }
  // Seeded: the same seed gives the same A, another seed a different one.
  LoraWeights again(model.config(), torch::kCPU);
  ASSERT_TRUE(again.Bind(weights.config()).ok());
  again.InitPeft(3);
  EXPECT_TRUE(torch::equal(again.modules()[0].a, weights.modules()[0].a));
  again.InitPeft(4);
  EXPECT_FALSE(torch::equal(again.modules()[0].a, weights.modules()[0].a));
}

TEST(MultiLoraTest, BindReusesStorageWhenTheRankFits) {
  LoraWeights weights(TinyModel().config(), torch::kCPU);
  auto first = weights.Bind(Config(16, {Projection::kQ}));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, 2);  // One block per layer.
  const void* data = weights.modules()[0].a.data_ptr();
  auto smaller = weights.Bind(Config(4, {Projection::kQ}));
  ASSERT_TRUE(smaller.ok());
  EXPECT_EQ(*smaller, 0);
  EXPECT_EQ(weights.modules()[0].a.data_ptr(), data);
  EXPECT_EQ(weights.modules()[0].a.sizes(), (std::vector<int64_t>{4, 64}));
  auto larger = weights.Bind(Config(32, {Projection::kQ, Projection::kV}));
  ASSERT_TRUE(larger.ok());
  EXPECT_EQ(*larger, 4);
  EXPECT_FALSE(weights.Bind(Config(0, {Projection::kQ})).ok());
  EXPECT_TRUE(weights.bound());  // A rejected config keeps the old binding.
}

// The gradient of each adapter comes only from its own rows: the loss of
// segment 0 gives adapter 1 no gradient at all, and adapter 0's gradient
// is the same whatever is in the other rows.
TEST(MultiLoraTest, GradientsStayInTheirSegment) {
  const LlamaModel& model = TinyModel();
  LoraWeights a(model.config(), torch::kCPU);
  LoraWeights b(model.config(), torch::kCPU);
  ASSERT_TRUE(a.Bind(Config(4, {Projection::kQ, Projection::kK, Projection::kV,
                                Projection::kUp, Projection::kLmHead}))
                  .ok());
  ASSERT_TRUE(b.Bind(Config(2, {Projection::kV, Projection::kDown,
                                Projection::kLmHead}))
                  .ok());
  a.InitPeft(1);
  b.InitPeft(2);
  RandomizeB(a, 5, 0.05);
  RandomizeB(b, 6, 0.05);
  torch::manual_seed(0);
  torch::Tensor ids = torch::randint(0, 259, {3, 9}, torch::kInt64);
  torch::Tensor lengths = torch::tensor({9, 6, 9}, torch::kInt64);
  auto row0_loss = [&](const torch::Tensor& input) {
    MultiLoraDelta delta({{&a, 1}, {&b, 2}});
    auto logits = model.Forward(input, lengths, &delta);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return (*logits)[0].pow(2).mean();
  };
  row0_loss(ids).backward();
  for (const torch::Tensor& p : b.parameters()) {
    EXPECT_TRUE(!p.grad().defined() || p.grad().abs().max().item<double>() == 0)
        << "a neighbour's rows reached adapter b";
  }
  std::vector<torch::Tensor> first;
  for (const torch::Tensor& p : a.parameters()) {
    first.push_back(p.grad().clone());
    p.mutable_grad().zero_();
  }
  torch::Tensor other = ids.clone();
  other.narrow(0, 1, 2).random_(0, 259);
  row0_loss(other).backward();
  const std::vector<torch::Tensor> params = a.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i].grad(), first[i], 1e-6, 1e-7));
  }
}

// Backward allocates memory in proportion to the rows, not rows × slots:
// 8 slots of one row each allocate about what one slot of 8 rows does. The
// x[a:b] slicing pattern would allocate a full-size zero gradient per slot
// and module, several times more.
TEST(MultiLoraTest, BackwardMemoryDoesNotGrowWithSlotCount) {
  const LlamaModel& model = TinyModel();
  const int64_t rows = 8;
  std::vector<std::unique_ptr<LoraWeights>> adapters;
  for (int i = 0; i < rows; ++i) {
    adapters.push_back(
        std::make_unique<LoraWeights>(model.config(), torch::kCPU));
    ASSERT_TRUE(adapters.back()->Bind(LoraConfig{}).ok());
    adapters.back()->InitPeft(i);
  }
  torch::manual_seed(1);
  torch::Tensor ids = torch::randint(0, 259, {rows, 32}, torch::kInt64);
  torch::Tensor lengths = torch::full({rows}, 32, torch::kInt64);
  auto backward_bytes = [&](std::vector<LoraSegment> segments, int64_t* grads) {
    MultiLoraDelta delta(std::move(segments));
    auto logits = model.Forward(ids, lengths, &delta);
    EXPECT_TRUE(logits.ok()) << logits.status();
    torch::Tensor loss = logits->pow(2).mean();
    CpuAllocationCounter counter;
    loss.backward();
    *grads = 0;
    for (const auto& adapter : adapters) {
      for (const torch::Tensor& p : adapter->parameters()) {
        if (p.grad().defined()) *grads += p.grad().numel();
      }
    }
    return counter.bytes();
  };
  std::vector<LoraSegment> many;
  for (int i = 0; i < rows; ++i) many.push_back({adapters[i].get(), 1});
  int64_t grads_many = 0;
  int64_t grads_one = 0;
  const int64_t bytes_many = backward_bytes(many, &grads_many);
  for (auto& adapter : adapters) {
    for (const torch::Tensor& p : adapter->parameters()) {
      if (p.grad().defined()) p.mutable_grad().reset();
    }
  }
  const int64_t bytes_one =
      backward_bytes({{adapters[0].get(), rows}}, &grads_one);
  // Every slot's gradient exists and has exactly its parameters' size.
  int64_t params_per_slot = 0;
  for (const torch::Tensor& p : adapters[0]->parameters()) {
    params_per_slot += p.numel();
  }
  EXPECT_EQ(grads_many, rows * params_per_slot);
  EXPECT_EQ(grads_one, params_per_slot);
  // Activation-sized buffers dominate; the extra per-slot gradients are
  // small (rows * params_per_slot floats).
  const int64_t extra = (rows - 1) * params_per_slot * 4;
  EXPECT_GT(bytes_one, 0);
  EXPECT_LE(bytes_many, 1.3 * bytes_one + 2 * extra)
      << "bytes with 8 slots " << bytes_many << ", with 1 slot " << bytes_one;
}

// The grouped kernel hands each LoRA matrix its gradient in the matrix's
// own layout, a view of one buffer per projection group (A) or projection
// (B) that all the bucket's adapters share, so the backward pass keeps it as
// it is. Through a plain stack and transpose each gradient arrives
// transposed and is copied apart: one copy (on a GPU, one kernel) per LoRA
// matrix and step.
TEST(MultiLoraTest, GroupedGradientsReachTheMatricesWithoutCopies) {
  const LlamaModel& model = TinyModel();
  const std::vector<Projection> all(kAllProjections.begin(),
                                    kAllProjections.end());
  std::vector<std::unique_ptr<LoraWeights>> adapters;
  std::vector<LoraSegment> segments;
  for (int i = 0; i < 3; ++i) {
    adapters.push_back(
        std::make_unique<LoraWeights>(model.config(), torch::kCPU));
    ASSERT_TRUE(adapters.back()->Bind(Config(4, all)).ok());
    adapters.back()->InitPeft(i + 1);
    RandomizeB(*adapters.back(), 10 + i, 0.05);
    segments.push_back({adapters.back().get(), 1});
  }
  torch::manual_seed(2);
  const torch::Tensor ids = torch::randint(0, 259, {3, 9}, torch::kInt64);
  const torch::Tensor lengths = torch::tensor({9, 6, 9}, torch::kInt64);
  MultiLoraDelta delta(segments);
  auto logits = model.Forward(ids, lengths, &delta);
  ASSERT_TRUE(logits.ok()) << logits.status();
  logits->pow(2).mean().backward();

  const std::vector<LoraModule>& first = adapters[0]->modules();
  for (size_t m = 0; m < first.size(); ++m) {
    SCOPED_TRACE("module " + std::to_string(m));
    for (const auto& adapter : adapters) {
      const LoraModule& module = adapter->modules()[m];
      for (const torch::Tensor* param : {&module.a, &module.b}) {
        ASSERT_TRUE(param->grad().defined());
        EXPECT_GT(param->grad().abs().max().item<double>(), 0);
        EXPECT_EQ(param->grad().strides(), param->strides());
      }
      EXPECT_TRUE(module.a.grad().is_alias_of(first[m].a.grad()));
      EXPECT_TRUE(module.b.grad().is_alias_of(first[m].b.grad()));
    }
  }
  // q, k and v read one input, so their A matrices form one operand.
  EXPECT_TRUE(first[0].a.grad().is_alias_of(first[2].a.grad()));
}

// One adapter in two segments of a bucket (two forward/backward calls of one
// session in a pass): its matrices appear twice in the grouped operands, and
// their gradients add up, as the per-slot kernel's do (fp64).
TEST(MultiLoraTest, GroupedKernelAddsTheGradientsOfAnAdapterInTwoSegments) {
  const LlamaModel& model = TinyModel64();
  const std::vector<Projection> all(kAllProjections.begin(),
                                    kAllProjections.end());
  LoraWeights twice(model.config(), torch::kCPU, torch::kFloat64);
  LoraWeights once(model.config(), torch::kCPU, torch::kFloat64);
  ASSERT_TRUE(twice.Bind(Config(4, all)).ok());
  ASSERT_TRUE(once.Bind(Config(4, all)).ok());
  twice.InitPeft(1);
  once.InitPeft(2);
  RandomizeB(twice, 3, 0.05);
  RandomizeB(once, 4, 0.05);
  torch::manual_seed(6);
  const torch::Tensor ids = torch::randint(0, 259, {6, 9}, torch::kInt64);
  const torch::Tensor lengths =
      torch::tensor({9, 7, 9, 5, 9, 8}, torch::kInt64);
  const torch::Tensor weights = torch::randn({6, 9, 259}, torch::kFloat64);
  auto run = [&](LoraKernel kernel) {
    for (const LoraWeights* w : {&twice, &once}) {
      for (torch::Tensor p : w->parameters())
        p.mutable_grad() = torch::Tensor();
    }
    MultiLoraDelta delta({{&twice, 2}, {&once, 2}, {&twice, 2}}, kernel);
    auto logits = model.Forward(ids, lengths, &delta);
    EXPECT_TRUE(logits.ok()) << logits.status();
    (*logits * weights).sum().backward();
    std::vector<torch::Tensor> grads;
    for (const LoraWeights* w : {&twice, &once}) {
      for (const torch::Tensor& p : w->parameters()) {
        EXPECT_TRUE(p.grad().defined());
        grads.push_back(p.grad().clone());
      }
    }
    return grads;
  };
  const std::vector<torch::Tensor> reference = run(LoraKernel::kPerSlot);
  const std::vector<torch::Tensor> grouped = run(LoraKernel::kGrouped);
  ASSERT_EQ(grouped.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    const double scale = reference[i].abs().max().item<double>();
    EXPECT_GT(scale, 0) << "gradient " << i;
    EXPECT_LE(MaxDiff(grouped[i], reference[i]), 1e-12 * scale)
        << "gradient " << i;
  }
}

TEST(MultiLoraTest, DropoutIsSeededPerRowAndOffInEvaluation) {
  const LlamaModel& model = TinyModel();
  LoraWeights a(model.config(), torch::kCPU);
  LoraConfig config = Config(4, {Projection::kQ, Projection::kV});
  config.dropout = 0.5;
  ASSERT_TRUE(a.Bind(config).ok());
  a.InitPeft(1);
  RandomizeB(a, 2, 0.05);
  torch::manual_seed(3);
  torch::Tensor ids = torch::randint(0, 259, {2, 8}, torch::kInt64);
  torch::Tensor lengths = torch::tensor({8, 5}, torch::kInt64);
  auto run = [&](bool training, uint64_t seed, std::vector<int64_t> row_ids) {
    LoraSegment segment{&a, 2, training, seed, row_ids};
    MultiLoraDelta delta({segment});
    torch::NoGradGuard no_grad;
    return model.Forward(ids, lengths, &delta).value();
  };
  torch::Tensor eval = run(false, 1, {0, 1});
  torch::Tensor trained = run(true, 1, {0, 1});
  EXPECT_FALSE(torch::allclose(eval, trained));
  EXPECT_TRUE(torch::equal(trained, run(true, 1, {0, 1})));
  EXPECT_FALSE(torch::allclose(trained, run(true, 2, {0, 1})));
  // A row's mask depends on its id, not its position in the batch.
  torch::Tensor swapped = run(true, 1, {1, 0});
  EXPECT_FALSE(torch::allclose(trained[0], swapped[0]));
}

// LoRA on the LM head alone: it changes only the logits (not the hidden
// states), its dropout acts in training only, and each row's mask is its
// own.
TEST(MultiLoraTest, LmHeadAdapterChangesTheLogitsWithItsOwnDropout) {
  const LlamaModel& model = TinyModel();
  LoraWeights a(model.config(), torch::kCPU);
  LoraConfig config = Config(4, {Projection::kLmHead});
  config.dropout = 0.5;
  ASSERT_TRUE(a.Bind(config).ok());
  ASSERT_EQ(a.modules().size(), 1u);
  a.InitPeft(1);
  RandomizeB(a, 2, 0.05);
  torch::manual_seed(3);
  torch::Tensor ids = torch::randint(0, 259, {2, 8}, torch::kInt64);
  torch::Tensor lengths = torch::tensor({8, 5}, torch::kInt64);
  torch::NoGradGuard no_grad;
  auto run = [&](bool training, std::vector<int64_t> row_ids) {
    LoraSegment segment{&a, 2, training, 1, row_ids};
    MultiLoraDelta delta({segment});
    EXPECT_TRUE(torch::equal(model.ForwardHidden(ids, lengths, &delta).value(),
                             model.ForwardHidden(ids, lengths).value()));
    return model.Forward(ids, lengths, &delta).value();
  };
  const torch::Tensor base = model.Forward(ids, lengths).value();
  const torch::Tensor eval = run(false, {0, 1});
  // Closed form: base logits + scale · h Aᵀ Bᵀ.
  const torch::Tensor hidden = model.ForwardHidden(ids, lengths).value();
  const LoraModule& head = *a.lm_head();
  EXPECT_TRUE(torch::allclose(
      eval, base + a.scale() * hidden.matmul(head.a.t()).matmul(head.b.t()),
      1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(eval, base));
  const torch::Tensor trained = run(true, {0, 1});
  EXPECT_FALSE(torch::allclose(eval, trained));
  EXPECT_TRUE(torch::equal(trained, run(true, {0, 1})));
  EXPECT_FALSE(torch::allclose(trained[0], run(true, {1, 0})[0]));
}

// A bf16 base: the LoRA branch runs in fp32 and its output is added in
// bf16; logits stay close to the fp32 model's.
TEST(MultiLoraTest, Bf16BaseWithAdapter) {
  ModelLoadOptions options;
  options.dtype = torch::kBFloat16;
  auto bf16 = LlamaModel::Load(TinyModelDir(), options);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  const LlamaModel& fp32 = TinyModel();
  LoraWeights weights(fp32.config(), torch::kCPU);
  ASSERT_TRUE(weights.Bind(LoraConfig{}).ok());
  weights.InitPeft(1);
  RandomizeB(weights, 2, 0.05);
  torch::manual_seed(5);
  torch::Tensor ids = torch::randint(0, 259, {2, 12}, torch::kInt64);
  torch::Tensor lengths = torch::tensor({12, 7}, torch::kInt64);
  MultiLoraDelta delta({{&weights, 2}});
  auto low = (*bf16)->Forward(ids, lengths, &delta);
  auto high = fp32.Forward(ids, lengths, &delta);
  ASSERT_TRUE(low.ok()) << low.status();
  ASSERT_TRUE(high.ok());
  const double scale = high->abs().max().item<double>();
  EXPECT_LE(RowDiff(*low, *high, lengths, 0), 0.05 * scale);
  auto base = fp32.Forward(ids, lengths);
  EXPECT_GT(RowDiff(*base, *high, lengths, 0), 0.05 * scale)
      << "the adapter should matter more than bf16 rounding";
  // Gradients reach the fp32 LoRA weights through the bf16 base.
  low->pow(2).mean().backward();
  EXPECT_EQ(weights.modules()[0].a.grad().scalar_type(), torch::kFloat32);
  EXPECT_GT(weights.modules()[0].b.grad().abs().max().item<double>(), 0.0);
}

TEST(MultiLoraTest, SegmentsMustCoverTheBatch) {
  LoraWeights weights(TinyModel().config(), torch::kCPU);
  ASSERT_TRUE(weights.Bind(LoraConfig{}).ok());
  MultiLoraDelta delta({{&weights, 3}});
  auto logits = TinyModel().Forward(torch::zeros({2, 4}, torch::kInt64),
                                    torch::full({2}, 4, torch::kInt64), &delta);
  ASSERT_FALSE(logits.ok());
  EXPECT_THAT(
      std::string(logits.status().message()),
      ::testing::HasSubstr("segments cover 3 rows but the batch has 2"));
}

}  // namespace
}  // namespace loraplex
