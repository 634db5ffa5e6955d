// The co-batched training step: slots trained together end exactly where
// they would alone, retired slots leak nothing into the next job, and the
// model really learns.
#include "core/train/co_batch_step.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "adapters/slot_pool.h"
#include "core/lora/multi_lora.h"
#include "tests/common/tiny_model.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

const std::vector<Projection> kAll = {kAllProjections.begin(),
                                      kAllProjections.end()};

// Trains every attached slot of `pool` for `steps` co-batched steps.
void Train(SlotPool& pool, int steps, const CoBatchOptions& options,
           const LlamaModel& model = TinyModel()) {
  for (int i = 0; i < steps; ++i) {
    auto metrics = TrainCoBatchStep(model, pool.ActiveSlots(), options);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
  }
}

void PoisonWeights(TrainingSlot& slot) {
  torch::NoGradGuard no_grad;
  torch::Tensor b = slot.weights.modules()[0].b;
  b.fill_(std::numeric_limits<float>::quiet_NaN());
}

// Attaches a slot whose weights are NaN, so its loss is never finite: the
// neighbour the isolation tests train the others next to. Its slot index.
int AttachNanNeighbour(SlotPool& pool) {
  auto slot =
      pool.Attach(TrainRequest("nan", OptimizerFamily::kAdamW, 16, kAll,
                               Sequences(ReversalJsonl(5, 4), 16), 104));
  EXPECT_TRUE(slot.ok()) << slot.status();
  PoisonWeights(pool.slot(slot.value()));
  return *slot;
}

// The isolation identity in one dtype: the model, the slots' dtype and the
// bound of the largest element's difference relative to the tensor's
// largest value.
struct IsolationCase {
  const char* name;
  const LlamaModel& (*model)();
  torch::ScalarType dtype;
  double bound;
};

void PrintTo(const IsolationCase& c, std::ostream* os) { *os << c.name; }

class CoBatchIsolationTest : public ::testing::TestWithParam<IsolationCase> {};

TEST_P(CoBatchIsolationTest, SlotsTrainedTogetherEqualSlotsTrainedAlone) {
  const IsolationCase& c = GetParam();
  const LlamaModel& model = c.model();
  const int kSteps = 6;
  const std::vector<SlotAttachRequest> requests = MixedTrainRequests();
  // Alone: each slot's batch cut into several micro-batches and loss chunks.
  CoBatchOptions small_budget;
  small_budget.token_budget = 40;
  small_budget.loss_chunk_tokens = 7;
  std::vector<std::vector<torch::Tensor>> alone_weights;
  for (const SlotAttachRequest& request : requests) {
    SlotPool alone(model.config(), {.capacity = 1, .dtype = c.dtype});
    ASSERT_TRUE(alone.Attach(request).ok());
    Train(alone, kSteps, small_budget, model);
    alone_weights.push_back(Snapshot(alone.slot(0).weights));
    // Training moved the weights (B starts at zero).
    EXPECT_GT(alone.slot(0).weights.modules()[0].b.abs().max().item<double>(),
              0.0);
  }
  // Together, with a neighbour whose loss is always NaN: under the same
  // budget (micro-batches hold pieces of one or two slots), and with no
  // budget (one micro-batch holds every slot's rows, one loss chunk). The
  // slots' rows then share other GEMMs, so the results differ from alone by
  // rounding only: ~1e-14 in fp64, where the identity is checked; ~1e-5 in
  // fp32 (more on some CPUs' BLAS kernels), a smoke test.
  CoBatchOptions no_budget;
  no_budget.token_budget = 0;
  for (const CoBatchOptions* options : {&small_budget, &no_budget}) {
    SCOPED_TRACE(
        absl::StrCat("together, token budget ", options->token_budget));
    SlotPool together(model.config(), {.capacity = 8, .dtype = c.dtype});
    for (const SlotAttachRequest& request : requests) {
      ASSERT_TRUE(together.Attach(request).ok());
    }
    const int poisoned = AttachNanNeighbour(together);
    for (int step = 0; step < kSteps; ++step) {
      auto metrics = TrainCoBatchStep(model, together.ActiveSlots(), *options);
      ASSERT_TRUE(metrics.ok()) << metrics.status();
      ASSERT_EQ(metrics->size(), 4u);
      for (int i = 0; i < 3; ++i) {
        EXPECT_FALSE((*metrics)[i].skipped) << requests[i].job_id;
        EXPECT_TRUE(std::isfinite((*metrics)[i].loss));
      }
      EXPECT_TRUE((*metrics)[3].skipped);
      EXPECT_EQ((*metrics)[3].skip_reason, "loss is not finite");
    }
    EXPECT_EQ(together.slot(poisoned).counters.skipped_steps, kSteps);
    EXPECT_EQ(together.slot(poisoned).scheduler->completed_steps(), 0);
    for (size_t i = 0; i < requests.size(); ++i) {
      const TrainingSlot& t = together.slot(static_cast<int>(i));
      EXPECT_EQ(t.weights.dtype(), c.dtype);
      EXPECT_EQ(t.counters.steps, kSteps);
      EXPECT_EQ(t.counters.skipped_steps, 0);
      EXPECT_EQ(t.scheduler->completed_steps(), kSteps);
      const double diff =
          MaxRelativeDiff(Snapshot(t.weights), alone_weights[i]);
      EXPECT_LE(diff, c.bound) << requests[i].job_id;
      RecordProperty(absl::StrCat(requests[i].job_id, "_budget_",
                                  options->token_budget, "_max_relative_diff"),
                     absl::StrCat(diff));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, CoBatchIsolationTest,
    ::testing::Values(IsolationCase{"fp64", &TinyModel64, torch::kFloat64,
                                    kFp64IdentityBound},
                      IsolationCase{"fp32", &TinyModel, torch::kFloat32,
                                    kFp32SmokeBound}),
    [](const ::testing::TestParamInfo<IsolationCase>& info) {
      return std::string(info.param.name);
    });

// Slots of `requests` trained `steps` steps together in one pool end where
// each ends trained alone, in fp64, and every slot moved its first B off
// zero.
void ExpectTrainedTogetherEqualAlone(
    const LlamaModel& model, const std::vector<SlotAttachRequest>& requests,
    int steps) {
  std::vector<std::vector<torch::Tensor>> alone_weights;
  for (const SlotAttachRequest& request : requests) {
    SlotPool alone(model.config(), {.capacity = 1, .dtype = torch::kFloat64});
    ASSERT_TRUE(alone.Attach(request).ok());
    Train(alone, steps, {}, model);
    alone_weights.push_back(Snapshot(alone.slot(0).weights));
  }
  SlotPool together(model.config(),
                    {.capacity = static_cast<int>(requests.size()),
                     .dtype = torch::kFloat64});
  for (const SlotAttachRequest& request : requests) {
    ASSERT_TRUE(together.Attach(request).ok());
  }
  Train(together, steps, {}, model);
  for (size_t i = 0; i < requests.size(); ++i) {
    const TrainingSlot& slot = together.slot(static_cast<int>(i));
    EXPECT_EQ(slot.counters.steps, steps);
    EXPECT_LE(MaxRelativeDiff(Snapshot(slot.weights), alone_weights[i]),
              kFp64IdentityBound)
        << requests[i].job_id;
    EXPECT_GT(slot.weights.modules()[0].b.abs().max().item<double>(), 0.0);
  }
}

// Lion slots (its sign update flips for an element only where the
// interpolated momentum is within rounding of zero) trained beside AdamW and
// Muon slots end where each ends alone, in fp64.
TEST(CoBatchStepTest, LionSlotsTrainedTogetherEqualSlotsTrainedAlone) {
  const LlamaModel& model = TinyModel64();
  std::vector<SlotAttachRequest> requests;
  requests.push_back(TrainRequest("lion", OptimizerFamily::kLion, 4, kAll,
                                  Sequences(ReversalJsonl(10, 1), 16), 301));
  requests.back().optimizer.lr = 1e-3;
  requests.back().optimizer.weight_decay = 0.1;
  requests.push_back(TrainRequest("lion-b", OptimizerFamily::kLion, 8,
                                  {Projection::kQ, Projection::kV},
                                  Sequences(ReversalJsonl(7, 2), 12), 302));
  requests.back().optimizer.lion_beta1 = 0.5;
  requests.push_back(TrainRequest("muon", OptimizerFamily::kMuon, 2, kAll,
                                  Sequences(ReversalJsonl(9, 3), 16), 303));
  requests.back().optimizer.scalar_optimizer = ScalarOptimizer::kLion;
  ExpectTrainedTogetherEqualAlone(model, requests, 5);
}

// SOAP slots (one with Lion for what is not a matrix and a basis refreshed
// every other step) trained beside AdamW and Muon slots end where each ends
// alone, in fp64. They precondition the rank side of each LoRA matrix
// (max_precond_dim = rank): its r×r factor has full rank once a gradient
// arrives. The long side's factor (in×in of a LoRA A) stays rank-deficient
// for in/r steps, and its eigenbasis on the null space is decided by
// rounding alone, so the last-bit differences between co-batched and alone
// gradients grow to the size of a step there (as in the reference; see
// soap_test.cc). Stepping slots together with the same gradients equals
// stepping each alone whatever SOAP's sides (SlotOptimizerTest).
TEST(CoBatchStepTest, SoapSlotsTrainedTogetherEqualSlotsTrainedAlone) {
  const LlamaModel& model = TinyModel64();
  std::vector<SlotAttachRequest> requests;
  requests.push_back(TrainRequest("soap", OptimizerFamily::kSoap, 4, kAll,
                                  Sequences(ReversalJsonl(10, 1), 16), 311));
  requests.back().optimizer.lr = 1e-3;
  requests.back().optimizer.weight_decay = 0.1;
  requests.back().optimizer.max_precond_dim = 4;
  requests.push_back(TrainRequest("soap-b", OptimizerFamily::kSoap, 8,
                                  {Projection::kQ, Projection::kV},
                                  Sequences(ReversalJsonl(7, 2), 12), 312));
  requests.back().optimizer.scalar_optimizer = ScalarOptimizer::kLion;
  requests.back().optimizer.max_precond_dim = 8;
  requests.back().optimizer.precondition_frequency = 2;
  requests.push_back(TrainRequest("adamw", OptimizerFamily::kAdamW, 2, kAll,
                                  Sequences(ReversalJsonl(9, 3), 16), 313));
  requests.push_back(TrainRequest("muon", OptimizerFamily::kMuon, 2, kAll,
                                  Sequences(ReversalJsonl(8, 4), 16), 314));
  ExpectTrainedTogetherEqualAlone(model, requests, 5);
}

// The isolation identity across devices: slots co-batched on the GPU, next
// to a neighbour whose loss is always NaN, end where each ends alone on the
// CPU — weights and optimizer state, dropout included. In fp64, where the
// two devices' kernels differ by rounding alone.
TEST(CoBatchStepTest, SlotsTogetherOnCudaEqualEachAloneOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const LlamaModel& cuda_model = TinyModelOn(CudaDevice(), torch::kFloat64);
  const int kSteps = 4;
  const std::vector<SlotAttachRequest> requests = MixedTrainRequests();
  CoBatchOptions options;
  options.token_budget = 40;
  options.loss_chunk_tokens = 7;
  std::vector<std::vector<torch::Tensor>> alone_weights;
  std::vector<std::vector<torch::Tensor>> alone_states;
  for (const SlotAttachRequest& request : requests) {
    SlotPool alone(TinyModel64().config(),
                   {.capacity = 1, .dtype = torch::kFloat64});
    ASSERT_TRUE(alone.Attach(request).ok());
    Train(alone, kSteps, options, TinyModel64());
    alone_weights.push_back(Snapshot(alone.slot(0).weights));
    alone_states.push_back(OptimizerStateTensors(*alone.slot(0).optimizer));
  }
  SlotPool together(
      cuda_model.config(),
      {.capacity = 4, .device = CudaDevice(), .dtype = torch::kFloat64});
  for (const SlotAttachRequest& request : requests) {
    ASSERT_TRUE(together.Attach(request).ok());
  }
  AttachNanNeighbour(together);
  for (int step = 0; step < kSteps; ++step) {
    auto metrics =
        TrainCoBatchStep(cuda_model, together.ActiveSlots(), options);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    ASSERT_EQ(metrics->size(), 4u);
    for (int i = 0; i < 3; ++i) EXPECT_FALSE((*metrics)[i].skipped);
    EXPECT_TRUE((*metrics)[3].skipped);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const TrainingSlot& slot = together.slot(static_cast<int>(i));
    EXPECT_TRUE(slot.weights.modules()[0].a.is_cuda());
    EXPECT_EQ(slot.counters.steps, kSteps);
    EXPECT_LE(MaxRelativeDiff(OnCpu(Snapshot(slot.weights)), alone_weights[i]),
              kFp64IdentityBound)
        << requests[i].job_id;
    EXPECT_LE(MaxRelativeDiff(OnCpu(OptimizerStateTensors(*slot.optimizer)),
                              alone_states[i]),
              kFp64IdentityBound)
        << requests[i].job_id;
  }
}

// All of a slot's optimizer state is zero: moments, momentum buffers and
// step counters.
// A forward/backward call's adapter and data on the tiny model: `count`
// random datums for `loss`.
struct CallFixture {
  std::unique_ptr<LoraWeights> adapter;
  std::vector<Datum> data;
  LossFnSpec loss;
};

CallFixture MakeCall(const LlamaModel& model, torch::ScalarType dtype,
                     const char* loss, LoraConfig lora, uint64_t seed) {
  CallFixture call;
  call.adapter =
      std::make_unique<LoraWeights>(model.config(), torch::kCPU, dtype);
  EXPECT_TRUE(call.adapter->Bind(lora).ok());
  call.adapter->InitPeft(seed);
  RandomizeB(*call.adapter, seed, 0.05);
  std::map<std::string, double> config;
  if (std::string(loss) == "dro") config["beta"] = 0.3;
  call.loss = *LossFnSpecOf(loss, config);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int64_t vocab = model.config().vocab_size;
  for (int length : {6, 13, 9}) {
    Datum datum;
    for (int i = 0; i < length; ++i) {
      datum.input_ids.push_back(static_cast<int64_t>(rng() % vocab));
      datum.target_tokens.push_back(static_cast<int64_t>(rng() % vocab));
      const double u = static_cast<double>(rng() % 1000) / 1000.0;
      if (LossFnTakesWeights(call.loss.fn)) {
        datum.weights.push_back(u - 0.3);
      } else {
        datum.sampler_logprobs.push_back(-4.0 - u);
        datum.advantages.push_back(1.0 - 2.0 * u);
      }
    }
    call.data.push_back(std::move(datum));
  }
  return call;
}

std::vector<torch::Tensor> Grads(const LoraWeights& weights) {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : weights.parameters()) {
    grads.push_back(p.grad().defined() ? p.grad().clone()
                                       : torch::zeros_like(p));
  }
  return grads;
}

// Jobs' steps and client forward/backward calls in one pass: each job's
// slot ends where it would alone, and each call's loss, logprobs and
// accumulated gradients equal those of the call alone (fp64). Without
// this, a call's rows would disturb a job's step or leak into another
// call's gradients.
TEST(CoBatchStepTest, JobsAndForwardBackwardCallsTogetherEqualEachAlone) {
  const LlamaModel& model = TinyModel64();
  const int kSteps = 3;
  const std::vector<SlotAttachRequest> requests = MixedTrainRequests();
  LoraConfig with_dropout;
  with_dropout.rank = 4;
  with_dropout.alpha = 8;
  with_dropout.dropout = 0.1;
  with_dropout.targets.push_back(Projection::kLmHead);
  LoraConfig attention;
  attention.rank = 2;
  attention.alpha = 2;
  attention.targets = {Projection::kQ, Projection::kV};
  auto calls_for = [&]() {
    std::vector<CallFixture> calls;
    calls.push_back(
        MakeCall(model, torch::kFloat64, "cross_entropy", with_dropout, 11));
    calls.push_back(MakeCall(model, torch::kFloat64, "ppo", attention, 12));
    calls.push_back(MakeCall(model, torch::kFloat64, "dro", with_dropout, 13));
    return calls;
  };
  auto call_of = [](CallFixture& c, int step) {
    ForwardBackwardCall call{c.adapter.get(), &c.data, c.loss};
    call.dropout_seed = 1000 + static_cast<uint64_t>(step);
    return call;
  };
  CoBatchOptions options;
  options.token_budget = 40;
  options.loss_chunk_tokens = 7;

  std::vector<std::vector<torch::Tensor>> slots_alone;
  for (const SlotAttachRequest& request : requests) {
    SlotPool alone(model.config(), {.capacity = 1, .dtype = torch::kFloat64});
    ASSERT_TRUE(alone.Attach(request).ok());
    Train(alone, kSteps, options, model);
    slots_alone.push_back(Snapshot(alone.slot(0).weights));
  }
  std::vector<CallFixture> calls_alone = calls_for();
  std::vector<std::vector<double>> losses_alone(calls_alone.size());
  for (int step = 0; step < kSteps; ++step) {
    for (size_t c = 0; c < calls_alone.size(); ++c) {
      auto result =
          RunCoBatchPass(model, {}, {call_of(calls_alone[c], step)}, options);
      ASSERT_TRUE(result.ok()) << result.status();
      losses_alone[c].push_back(result->calls[0].loss);
    }
  }

  SlotPool together(model.config(), {.capacity = 4, .dtype = torch::kFloat64});
  for (const SlotAttachRequest& request : requests) {
    ASSERT_TRUE(together.Attach(request).ok());
  }
  std::vector<CallFixture> calls = calls_for();
  for (int step = 0; step < kSteps; ++step) {
    std::vector<ForwardBackwardCall> pass;
    for (CallFixture& c : calls) pass.push_back(call_of(c, step));
    auto result = RunCoBatchPass(model, together.ActiveSlots(), pass, options);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->slots.size(), requests.size());
    ASSERT_EQ(result->calls.size(), calls.size());
    for (size_t c = 0; c < calls.size(); ++c) {
      EXPECT_NEAR(result->calls[c].loss, losses_alone[c][step],
                  kFp64IdentityBound * std::abs(losses_alone[c][step]))
          << "call " << c << " step " << step;
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_LE(
        MaxRelativeDiff(Snapshot(together.slot(static_cast<int>(i)).weights),
                        slots_alone[i]),
        kFp64IdentityBound)
        << requests[i].job_id;
  }
  for (size_t c = 0; c < calls.size(); ++c) {
    const std::vector<torch::Tensor> grads = Grads(*calls[c].adapter);
    EXPECT_GT(grads[0].abs().max().item<double>(), 0.0) << "call " << c;
    EXPECT_LE(MaxRelativeDiff(grads, Grads(*calls_alone[c].adapter)),
              kFp64IdentityBound)
        << "call " << c;
  }
}

void ExpectStateZero(const SlotOptimizer& optimizer) {
  for (const OptimizerChild& child : optimizer.children()) {
    for (const ParamStateRef& ref : child.states()) {
      ASSERT_NE(ref.step, nullptr);
      EXPECT_EQ(*ref.step, 0);
      for (const auto& [name, t] : ref.tensors) {
        if (absl::StartsWith(name, "eigenbasis")) {  // SOAP's: the identity.
          const torch::Tensor identity =
              torch::eye(t.size(-1), t.options()).expand_as(t);
          EXPECT_TRUE(torch::equal(t, identity)) << name;
          continue;
        }
        EXPECT_EQ(t.abs().max().item<double>(), 0.0) << name;
      }
    }
  }
}

class RetireReuseTest : public ::testing::TestWithParam<OptimizerFamily> {};

// A slot retired after one job and reused for another ends like a fresh
// one: equal (bound 0) or within `bound` of it relative to the largest
// value.
void ExpectReusedSlotEndsLikeAFreshOne(OptimizerFamily family,
                                       const LlamaModel& model,
                                       const SlotPoolOptions& options,
                                       double bound) {
  SlotAttachRequest job_x =
      TrainRequest("x", family, 8, kAll, Sequences(ReversalJsonl(9, 5), 16), 7);
  SlotAttachRequest job_y = TrainRequest(
      "y", family, 4, {Projection::kQ, Projection::kV, Projection::kUp},
      Sequences(ReversalJsonl(8, 6), 16), 8);
  job_y.lora.dropout = 0.2;

  SlotPool reused(model.config(), options);
  ASSERT_EQ(reused.Attach(job_x).value(), 0);
  Train(reused, 4, {}, model);
  const void* storage = reused.slot(0).weights.modules()[0].a.data_ptr();
  ASSERT_TRUE(reused.Retire(0).ok());
  EXPECT_EQ(reused.state(0), SlotState::kFree);
  ExpectStateZero(*reused.slot(0).optimizer);
  for (const torch::Tensor& p : reused.slot(0).optimizer->parameters()) {
    EXPECT_EQ(p.abs().max().item<double>(), 0.0);
    EXPECT_TRUE(!p.grad().defined() ||
                p.grad().abs().max().item<double>() == 0);
  }
  EXPECT_FALSE(reused.slot(0).scheduler.has_value());
  EXPECT_EQ(reused.slot(0).counters.steps, 0);

  ASSERT_EQ(reused.Attach(job_y).value(), 0);
  EXPECT_EQ(reused.slot(0).weights.modules()[0].a.data_ptr(), storage)
      << "a rank that fits reuses the slot's storage";
  Train(reused, 4, {}, model);

  SlotPool fresh(model.config(), options);
  ASSERT_TRUE(fresh.Attach(job_y).ok());
  Train(fresh, 4, {}, model);
  const std::vector<torch::Tensor> a = Snapshot(reused.slot(0).weights);
  const std::vector<torch::Tensor> b = Snapshot(fresh.slot(0).weights);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].device(), options.device);
    if (bound == 0) {
      EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
    } else {
      EXPECT_LE(MaxRelativeDiff(a[i], b[i]), bound) << "parameter " << i;
    }
  }
}

TEST_P(RetireReuseTest, ReusedSlotEndsExactlyLikeAFreshOne) {
  ExpectReusedSlotEndsLikeAFreshOne(GetParam(), TinyModel(), {.capacity = 1},
                                    0.0);
}

// On the GPU, in fp64: its kernels need not repeat their rounding bit for
// bit between two pools, so the identity is checked far below what a
// leaked moment or momentum (1e-3 and more) would make.
TEST_P(RetireReuseTest, ReusedSlotEndsLikeAFreshOneOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectReusedSlotEndsLikeAFreshOne(
      GetParam(), TinyModelOn(CudaDevice(), torch::kFloat64),
      {.capacity = 1, .device = CudaDevice(), .dtype = torch::kFloat64},
      kFp64IdentityBound);
}

INSTANTIATE_TEST_SUITE_P(Families, RetireReuseTest,
                         ::testing::ValuesIn(kAllOptimizerFamilies));

// The step's loss and gradient are those of the masked mean cross-entropy
// of the slot's batch, computed here from full logits with plain autograd
// (in fp64, so the bounds hold on every CPU).
TEST(CoBatchStepTest, ReportedLossIsTheMaskedMeanOfTheBatch) {
  const LlamaModel& model = TinyModel64();
  SlotAttachRequest request =
      TrainRequest("a", OptimizerFamily::kAdamW, 4, kAll,
                   Sequences(ReversalJsonl(6, 9), 16), 3);
  SlotPool pool(model.config(), {.capacity = 1, .dtype = torch::kFloat64});
  ASSERT_TRUE(pool.Attach(request).ok());
  RandomizeB(pool.slot(0).weights, 4, 0.1);
  // The reference: plain autograd through full logits, one sequence at a
  // time, mean over all target tokens.
  auto cursor = DataCursor::Create(6, {3, 0, 0});
  torch::Tensor total = torch::zeros({}, torch::kFloat64);
  int64_t count = 0;
  MultiLoraDelta delta({{&pool.slot(0).weights, 1}});
  for (int64_t index : cursor->NextBatch(3)) {
    const Sequence& seq = request.data->sequences[index];
    const int64_t len = static_cast<int64_t>(seq.input_ids.size());
    torch::Tensor ids = torch::tensor(seq.input_ids).view({1, len});
    torch::Tensor logits =
        model.Forward(ids, torch::tensor({len}), &delta).value()[0];
    torch::Tensor log_probs =
        torch::log_softmax(logits.to(torch::kFloat64), -1);
    for (int64_t t = 1; t < len; ++t) {
      if (seq.loss_mask[t] == 0) continue;
      total = total - log_probs[t - 1][seq.input_ids[t]];
      ++count;
    }
  }
  torch::Tensor reference = total / static_cast<double>(count);
  reference.backward();
  double squared = 0.0;
  for (const torch::Tensor& p : pool.slot(0).weights.parameters()) {
    squared += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
  }
  pool.slot(0).optimizer->ZeroGrad();

  auto metrics = TrainCoBatchStep(model, pool.ActiveSlots(), {});
  ASSERT_TRUE(metrics.ok());
  EXPECT_NEAR((*metrics)[0].loss, reference.item<double>(),
              kFp64IdentityBound * reference.item<double>());
  EXPECT_EQ((*metrics)[0].target_tokens, count);
  EXPECT_NEAR((*metrics)[0].grad_norm, std::sqrt(squared),
              kFp64IdentityBound * std::sqrt(squared));
  EXPECT_NEAR((*metrics)[0].lr, 0.0, 1e-12);  // Warmup starts at init_lr 0.
}

// A step drops its slots' gradients instead of zeroing them: the next
// backward pass takes its gradients as they come, with no kernel per
// parameter to zero them and none to add into them.
TEST(CoBatchStepTest, AStepLeavesNoGradientsBehind) {
  const LlamaModel& model = TinyModel();
  SlotPool pool(model.config(), {.capacity = 2});
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(pool.Attach(TrainRequest(absl::StrCat("g", i),
                                         OptimizerFamily::kAdamW, 4, kAll,
                                         Sequences(ReversalJsonl(6, i), 16), i))
                    .ok());
  }
  const torch::Tensor before = pool.slot(1).weights.modules()[0].b.clone();
  for (int step = 0; step < 2; ++step) {
    auto metrics = TrainCoBatchStep(model, pool.ActiveSlots(), {});
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    for (const SlotStepMetrics& m : *metrics) EXPECT_FALSE(m.skipped);
    for (TrainingSlot* slot : pool.ActiveSlots()) {
      for (const torch::Tensor& p : slot->weights.parameters()) {
        EXPECT_FALSE(p.grad().defined());
      }
    }
  }
  EXPECT_FALSE(torch::equal(pool.slot(1).weights.modules()[0].b, before));
}

TEST(CoBatchStepTest, EvalLossMatchesTheTrainingLossWithoutDropout) {
  SlotAttachRequest request =
      TrainRequest("a", OptimizerFamily::kMuon, 4, kAll,
                   Sequences(ReversalJsonl(3, 10), 16), 5);
  request.training.batch_size = 3;
  const LlamaModel& model = TinyModel64();
  SlotPool pool(model.config(), {.capacity = 1, .dtype = torch::kFloat64});
  ASSERT_TRUE(pool.Attach(request).ok());
  RandomizeB(pool.slot(0).weights, 6, 0.1);  // The adapter changes the loss.
  auto eval = EvalLoss(model, &pool.slot(0).weights, request.data->sequences,
                       {.token_budget = 20});
  ASSERT_TRUE(eval.ok()) << eval.status();
  auto base = EvalLoss(model, nullptr, request.data->sequences, {});
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_GT(std::abs(*eval - *base), 1e-3);
  auto metrics = TrainCoBatchStep(model, pool.ActiveSlots(), {});
  ASSERT_TRUE(metrics.ok());
  // The batch is the whole data set (3 of 3), in another order and other
  // micro-batches.
  EXPECT_NEAR((*metrics)[0].loss, *eval, kFp64IdentityBound * *eval);
  EXPECT_FALSE(EvalLoss(model, nullptr, {}, {}).ok());
}

// Evaluation on the GPU: the same loss as on the CPU, with and without the
// adapter (fp64).
TEST(CoBatchStepTest, EvalLossOnCudaEqualsTheCpuLoss) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  SlotAttachRequest request =
      TrainRequest("a", OptimizerFamily::kMuon, 4, kAll,
                   Sequences(ReversalJsonl(5, 10), 16), 5);
  SlotPool cpu(TinyModel64().config(),
               {.capacity = 1, .dtype = torch::kFloat64});
  SlotPool cuda(
      TinyModel64().config(),
      {.capacity = 1, .device = CudaDevice(), .dtype = torch::kFloat64});
  ASSERT_TRUE(cpu.Attach(request).ok());
  ASSERT_TRUE(cuda.Attach(request).ok());
  RandomizeB(cpu.slot(0).weights, 6, 0.1);
  RandomizeB(cuda.slot(0).weights, 6, 0.1);
  const LlamaModel& cuda_model = TinyModelOn(CudaDevice(), torch::kFloat64);
  for (bool adapter : {false, true}) {
    auto on_cpu =
        EvalLoss(TinyModel64(), adapter ? &cpu.slot(0).weights : nullptr,
                 request.data->sequences, {.token_budget = 20});
    auto on_cuda =
        EvalLoss(cuda_model, adapter ? &cuda.slot(0).weights : nullptr,
                 request.data->sequences, {.token_budget = 20});
    ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
    ASSERT_TRUE(on_cuda.ok()) << on_cuda.status();
    EXPECT_NEAR(*on_cuda, *on_cpu, kFp64IdentityBound * *on_cpu)
        << "adapter " << adapter;
  }
}

// Loss falls well below its start on the reversal task, for AdamW and Muon
// trained side by side.
// Trains AdamW and Muon slots of `pool_options` on `model` side by side.
void ExpectLearnsToReverseStrings(const LlamaModel& model,
                                  const SlotPoolOptions& pool_options) {
  auto train = Sequences(ReversalJsonl(2048, 20), 24);
  auto held_out = Sequences(ReversalJsonl(32, 21), 24);
  SlotPool pool(model.config(), pool_options);
  for (OptimizerFamily family :
       {OptimizerFamily::kAdamW, OptimizerFamily::kMuon}) {
    SlotAttachRequest request = TrainRequest(
        std::string(OptimizerFamilyName(family)), family, 16, kAll, train, 1);
    request.lora.alpha = 32;
    request.optimizer.lr = family == OptimizerFamily::kMuon ? 1e-2 : 3e-3;
    request.optimizer.weight_decay = 0.0;
    request.schedule.warmup_steps = 10;
    request.schedule.total_steps = 300;
    request.training.batch_size = 16;
    request.training.seq_len = 24;
    request.training.max_steps = 300;
    ASSERT_TRUE(pool.Attach(request).ok());
  }
  std::vector<double> before;
  for (int s = 0; s < 2; ++s) {
    before.push_back(
        EvalLoss(model, &pool.slot(s).weights, held_out->sequences, {})
            .value());
  }
  std::vector<std::vector<double>> losses(2);
  while (!pool.ActiveSlots().empty()) {
    auto metrics = TrainCoBatchStep(model, pool.ActiveSlots(), {});
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    for (int s = 0; s < 2; ++s) losses[s].push_back((*metrics)[s].loss);
  }
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(pool.job_id(s));
    ASSERT_EQ(losses[s].size(), 300u);
    double first = 0.0;
    double last = 0.0;
    for (int i = 0; i < 10; ++i) first += losses[s][i] / 10;
    for (int i = 290; i < 300; ++i) last += losses[s][i] / 10;
    EXPECT_LT(last, 0.6 * first) << "first " << first << " last " << last;
    const double after =
        EvalLoss(model, &pool.slot(s).weights, held_out->sequences, {}).value();
    EXPECT_LT(after, 0.6 * before[s])
        << "held-out " << before[s] << " -> " << after;
  }
}

TEST(CoBatchStepTest, LearnsToReverseStrings) {
  ExpectLearnsToReverseStrings(TinyModel(), {.capacity = 2});
}

// On the GPU with the base in bf16 and the adapters in fp32 (as the server
// runs a bf16 checkpoint or --dtype bfloat16 there).
TEST(CoBatchStepTest, LearnsWithABf16BaseAndFp32AdaptersOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const LlamaModel& model = TinyModelOn(CudaDevice(), torch::kBFloat16);
  ASSERT_EQ(model.dtype(), torch::kBFloat16);
  SlotPool probe(
      model.config(),
      {.capacity = 1, .device = CudaDevice(), .dtype = torch::kBFloat16});
  ASSERT_TRUE(
      probe
          .Attach(TrainRequest("probe", OptimizerFamily::kAdamW, 4, kAll,
                               Sequences(ReversalJsonl(4, 1), 16), 1))
          .ok());
  EXPECT_EQ(probe.slot(0).weights.dtype(), torch::kFloat32);
  ExpectLearnsToReverseStrings(
      model,
      {.capacity = 2, .device = CudaDevice(), .dtype = torch::kBFloat16});
}

// A failing step (here: a token id the model rejects, slipped past the
// pool's checks) leaves every slot exactly as it was.
TEST(CoBatchStepTest, AFailedStepChangesNothing) {
  SlotPool pool(TinyModel().config(), {.capacity = 2});
  for (OptimizerFamily family :
       {OptimizerFamily::kAdamW, OptimizerFamily::kMuon}) {
    ASSERT_TRUE(pool.Attach(TrainRequest("a", family, 4, kAll,
                                         Sequences(ReversalJsonl(5, 1), 16), 1))
                    .ok());
  }
  Train(pool, 2, {});
  auto bad = std::make_shared<SequenceSet>(*pool.slot(1).data);
  bad->sequences[0].input_ids[1] = 9999;
  bad->sequences[1].input_ids[1] = 9999;
  const auto good = pool.slot(1).data;
  pool.slot(1).data = bad;
  struct Saved {
    std::vector<torch::Tensor> weights;
    std::vector<torch::Tensor> state;
    DataCursorState cursor;
    int64_t steps;
    int64_t schedule;
  };
  auto save = [&](int s) {
    return Saved{Snapshot(pool.slot(s).weights),
                 OptimizerStateTensors(*pool.slot(s).optimizer),
                 pool.slot(s).cursor->state(), pool.slot(s).counters.steps,
                 pool.slot(s).scheduler->completed_steps()};
  };
  const Saved before0 = save(0);
  const Saved before1 = save(1);
  auto result = TrainCoBatchStep(TinyModel(), pool.ActiveSlots(), {});
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()),
              ::testing::HasSubstr("token ids must lie in [0, 259)"));
  for (const auto& [s, before] : {std::pair{0, &before0}, {1, &before1}}) {
    const Saved after = save(s);
    EXPECT_EQ(MaxRelativeDiff(after.weights, before->weights), 0.0);
    EXPECT_EQ(MaxRelativeDiff(after.state, before->state), 0.0);
    EXPECT_EQ(after.cursor.epoch, before->cursor.epoch);
    EXPECT_EQ(after.cursor.position, before->cursor.position);
    EXPECT_EQ(after.steps, before->steps);
    EXPECT_EQ(after.schedule, before->schedule);
    for (const torch::Tensor& p : pool.slot(s).weights.parameters()) {
      EXPECT_TRUE(!p.grad().defined() ||
                  p.grad().abs().max().item<double>() == 0.0);
    }
  }
  pool.slot(1).data = good;
  EXPECT_TRUE(TrainCoBatchStep(TinyModel(), pool.ActiveSlots(), {}).ok());
}

TEST(CoBatchStepTest, RejectsRepeatedOrMisshapenSlots) {
  SlotPool pool(TinyModel().config(), {.capacity = 1});
  ASSERT_TRUE(pool.Attach(TrainRequest("a", OptimizerFamily::kAdamW, 4, kAll,
                                       Sequences(ReversalJsonl(3, 1), 16), 1))
                  .ok());
  TrainingSlot* slot = &pool.slot(0);
  auto repeated = TrainCoBatchStep(TinyModel(), {slot, slot}, {});
  EXPECT_EQ(repeated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(repeated.status().message()),
              ::testing::HasSubstr("repeats slot 0"));
  auto gqa = LlamaModel::Load(FixturePath("golden/llama_gqa"), {});
  ASSERT_TRUE(gqa.ok());
  auto other = TrainCoBatchStep(**gqa, {slot}, {});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(other.status().message()),
              ::testing::HasSubstr("shaped for another base model"));
  EXPECT_EQ(slot->counters.steps, 0);
}

TEST(CoBatchStepTest, RefusesSlotsThatCannotTrain) {
  SlotPool pool(TinyModel().config(), {.capacity = 1});
  SlotAttachRequest request =
      TrainRequest("a", OptimizerFamily::kAdamW, 4, kAll,
                   Sequences(ReversalJsonl(3, 1), 16), 1);
  request.training.max_steps = 1;
  ASSERT_TRUE(pool.Attach(request).ok());
  TrainingSlot* slot = &pool.slot(0);
  ASSERT_TRUE(TrainCoBatchStep(TinyModel(), {slot}, {}).ok());
  EXPECT_TRUE(slot->done());
  EXPECT_TRUE(pool.ActiveSlots().empty());
  auto again = TrainCoBatchStep(TinyModel(), {slot}, {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace loraplex
